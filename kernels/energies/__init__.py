"""Built-in energies: one ``@wp.func`` per file, each with its data struct (if any).

Use them as ``problem.add_term(elements, energy=mass_spring, data=MassSpringData(wp.float64, ...))``. Each
file's docstring gives the formula, the units of the parameters, the source paper and the
invariants.

An energy that serves float32 and float64 problems is written once: its data struct is declared over
``wp.Float`` with :func:`~warp_meshad.kernels.dtype_struct.dtype_struct` and the energy takes ``data: Any``;
``Data(dtype, field=value, ...)`` then makes the data of a problem's scalar type (``mass_spring``,
``inertia_gravity``, ``sphere_barrier`` and ``symmetric_dirichlet`` are written so). The other energies' data
structs are float64.

- :func:`mass_spring` (edges): k/2 (|x_a - x_b| - r_e)^2.
- :func:`symmetric_dirichlet` (faces, uv variables): A_f (|J|_F^2 + |J^-1|_F^2), +inf if flipped.
- :func:`dirichlet` / :func:`weighted_dirichlet` (edges): w_e/2 |x_a - x_b|^2.
- :func:`surface_area` (faces, 3D): 1/2 |(x_1 - x_0) x (x_2 - x_0)|.
- :func:`stable_neo_hookean` (tets): V_t (mu/2 (I_C - 3) - mu (J - 1) + lam/2 (J - 1)^2), finite when inverted.
- :func:`arap_tet` (tets): mu V_t |F - R(F)|^2, R(F) the closest rotation (no stored rotations).

Energies of the deformation gradient F (``problem.add_deformation_term(elements, energy=..., rest_inverse=D_m^-1,
data=...)``: fewer duals, dF/dx applied by the toolkit, PSD projection of the small F Hessian), each beside its
corner form with the same data: :func:`stable_neo_hookean_F`, :func:`arap_tet_F` (F 3x3),
:func:`neo_hookean_membrane_F` (F 3x2, as two columns), :func:`symmetric_dirichlet_F` (F 2x2).
:func:`stable_neo_hookean_F_hessian_proj` is stable Neo-Hookean's projected F Hessian in closed form (Smith et al.
2019): ``add_deformation_term(..., projection=stable_neo_hookean_F_hessian_proj)`` replaces the 9 x 9 Jacobi
projection with it.

Every name of ``__all__`` is imported from this package, its one import path
(``from warp_meshad.kernels.energies import mass_spring``); the files are where the names are defined. Importing the
package imports none of the energies: each name comes from its file when first used (an app pays for its own
energies only).
"""

import importlib as _importlib
import sys as _sys
import types as _types

# each energy (and its data struct) and the file that defines it, imported on first use (PEP 562): an app pays only
# for the energies it uses
_HOMES = {
    "ArapData": "arap",
    "arap": "arap",
    "ArapTetData": "arap_tet",
    "arap_tet": "arap_tet",
    "arap_tet_F": "arap_tet",
    "InertiaGravityData": "backward_euler",
    "inertia_gravity": "backward_euler",
    "DirichletData": "dirichlet",
    "dirichlet": "dirichlet",
    "weighted_dirichlet": "dirichlet",
    "DiscreteShellsBendingData": "discrete_shells_bending",
    "discrete_shells_bending": "discrete_shells_bending",
    "discrete_shells_rest_state": "discrete_shells_bending",
    "GroundPlaneData": "ground_plane",
    "ground_plane_barrier": "ground_plane",
    "BarrierData": "ipc_barrier",
    "EdgeEdgeBarrierData": "ipc_barrier",
    "edge_edge_barrier": "ipc_barrier",
    "ipc_barrier": "ipc_barrier",
    "point_triangle_barrier": "ipc_barrier",
    "MassSpringData": "mass_spring",
    "mass_spring": "mass_spring",
    "NeoHookeanMembraneData": "neo_hookean_membrane",
    "neo_hookean_membrane": "neo_hookean_membrane",
    "neo_hookean_membrane_F": "neo_hookean_membrane",
    "PolyCurlData": "polycurl",
    "polycurl": "polycurl",
    "polyvector_smoothness": "polycurl",
    "PolyVectorFaceData": "polyvector_barrier",
    "polyvector_barrier": "polyvector_barrier",
    "polyvector_closeness": "polyvector_barrier",
    "SphereBarrierData": "sphere_barrier",
    "sphere_barrier": "sphere_barrier",
    "SphereEmbeddingData": "sphere_embedding",
    "sphere_embedding": "sphere_embedding",
    "sphere_retract": "sphere_embedding",
    "StableNeoHookeanData": "stable_neo_hookean",
    "stable_neo_hookean": "stable_neo_hookean",
    "stable_neo_hookean_F": "stable_neo_hookean",
    "stable_neo_hookean_F_hessian_proj": "stable_neo_hookean",
    "stable_neo_hookean_lame": "stable_neo_hookean",
    "surface_area": "surface_area",
    "SymmetricDirichletData": "symmetric_dirichlet",
    "symmetric_dirichlet": "symmetric_dirichlet",
    "symmetric_dirichlet_F": "symmetric_dirichlet",
}

__all__ = [
    "ArapData",
    "ArapTetData",
    "BarrierData",
    "DirichletData",
    "DiscreteShellsBendingData",
    "EdgeEdgeBarrierData",
    "GroundPlaneData",
    "InertiaGravityData",
    "MassSpringData",
    "NeoHookeanMembraneData",
    "PolyCurlData",
    "PolyVectorFaceData",
    "SphereBarrierData",
    "SphereEmbeddingData",
    "StableNeoHookeanData",
    "SymmetricDirichletData",
    "arap",
    "arap_tet",
    "arap_tet_F",
    "dirichlet",
    "discrete_shells_bending",
    "discrete_shells_rest_state",
    "edge_edge_barrier",
    "ground_plane_barrier",
    "inertia_gravity",
    "ipc_barrier",
    "mass_spring",
    "neo_hookean_membrane",
    "neo_hookean_membrane_F",
    "point_triangle_barrier",
    "polycurl",
    "polyvector_barrier",
    "polyvector_closeness",
    "polyvector_smoothness",
    "sphere_barrier",
    "sphere_embedding",
    "sphere_retract",
    "stable_neo_hookean",
    "stable_neo_hookean_F",
    "stable_neo_hookean_F_hessian_proj",
    "stable_neo_hookean_lame",
    "surface_area",
    "symmetric_dirichlet",
    "symmetric_dirichlet_F",
    "weighted_dirichlet",
]


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # later look-ups find it without this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(_types.ModuleType):
    """This package's module type: most energies share their file's name (``mass_spring`` in ``mass_spring.py``), and
    the import system binds a submodule to its package's attribute of that name once the file has run; the energy
    keeps the name instead (as when the names were imported eagerly)."""

    def __setattr__(self, name, value):
        if isinstance(value, _types.ModuleType) and _HOMES.get(name) == name and value.__name__ == f"{__name__}.{name}":
            value = getattr(value, name)
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package

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
"""

from .dirichlet import DirichletData, dirichlet, weighted_dirichlet
from .mass_spring import MassSpringData, mass_spring
from .surface_area import surface_area
from .symmetric_dirichlet import SymmetricDirichletData, symmetric_dirichlet, symmetric_dirichlet_F

__all__ = [
    "DirichletData",
    "MassSpringData",
    "SymmetricDirichletData",
    "dirichlet",
    "mass_spring",
    "surface_area",
    "symmetric_dirichlet",
    "symmetric_dirichlet_F",
    "weighted_dirichlet",
]

from .arap import ArapData, arap  # noqa: E402

__all__ += ["ArapData", "arap"]

from .discrete_shells_bending import (  # noqa: E402
    DiscreteShellsBendingData,
    discrete_shells_bending,
    discrete_shells_rest_state,
)
from .ground_plane import GroundPlaneData, ground_plane_barrier  # noqa: E402
from .ipc_barrier import (  # noqa: E402
    BarrierData,
    EdgeEdgeBarrierData,
    edge_edge_barrier,
    ipc_barrier,
    point_triangle_barrier,
)
from .neo_hookean_membrane import NeoHookeanMembraneData, neo_hookean_membrane, neo_hookean_membrane_F  # noqa: E402

__all__ += [
    "BarrierData",
    "DiscreteShellsBendingData",
    "EdgeEdgeBarrierData",
    "GroundPlaneData",
    "NeoHookeanMembraneData",
    "discrete_shells_bending",
    "discrete_shells_rest_state",
    "edge_edge_barrier",
    "ground_plane_barrier",
    "ipc_barrier",
    "neo_hookean_membrane",
    "neo_hookean_membrane_F",
    "point_triangle_barrier",
]

from .polycurl import PolyCurlData, polycurl, polyvector_smoothness  # noqa: E402
from .polyvector_barrier import PolyVectorFaceData, polyvector_barrier, polyvector_closeness  # noqa: E402
from .sphere_embedding import SphereEmbeddingData, sphere_embedding, sphere_retract  # noqa: E402

__all__ += [
    "PolyCurlData",
    "PolyVectorFaceData",
    "SphereEmbeddingData",
    "polycurl",
    "polyvector_barrier",
    "polyvector_closeness",
    "polyvector_smoothness",
    "sphere_embedding",
    "sphere_retract",
]

from .arap_tet import ArapTetData, arap_tet, arap_tet_F  # noqa: E402
from .stable_neo_hookean import (  # noqa: E402
    StableNeoHookeanData,
    stable_neo_hookean,
    stable_neo_hookean_F,
    stable_neo_hookean_F_hessian_proj,
    stable_neo_hookean_lame,
)

__all__ += ["ArapTetData", "StableNeoHookeanData", "arap_tet", "arap_tet_F", "stable_neo_hookean",
            "stable_neo_hookean_F", "stable_neo_hookean_F_hessian_proj", "stable_neo_hookean_lame"]  # fmt: skip

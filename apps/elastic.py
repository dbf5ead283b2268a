"""Volumetric elasticity on tet meshes: backward Euler written as one minimization per time step, projected Newton.

Run: ``warp-meshad run configs/elastic/bar_twist.yaml`` (``--viewer`` to watch it, ``--test`` for the small size);
``configs/elastic/bunny.yaml`` for a tetrahedralized Stanford bunny.

Each time step h minimizes, over the positions x of the tet mesh's vertices (pinned vertices held fixed),

    E(x) = sum_i m_i / (2 h^2) |x_i - x~_i|^2 - sum_i m_i g . x_i     (inertia and gravity, per vertex)
         + sum_t V_t psi(F_t)                                         (elasticity, per tet: stable Neo-Hookean or ARAP)

with x~ = x^n + h v^n; then v^{n+1} = (x^{n+1} - x^n) / h. Masses are lumped (density x a quarter of each incident
tet's rest volume); F_t = Ds(x) Dm^-1 against the rest shape (the input mesh, scaled and moved by ``size`` and
``center``). Pins are the vertices on chosen sides of the bounding box; one pinned side may be driven: turned by
``twist`` degrees about its normal axis through its centroid and pulled outward by ``stretch`` x the mesh's extent
along that axis, both reached linearly over ``ramp_steps`` steps. The driven vertices are moved before each solve and
held there by the solver.

The viewer, the screenshot and ``final.obj`` show the boundary surface (:meth:`TetMesh.boundary_mesh`).
"""

from __future__ import annotations

import math
import pathlib
from typing import ClassVar, Literal, Optional

import numpy as np
from pydantic import Field
import warp as wp

import warp_meshad as wm
from warp_meshad.app import App as _AppBase
from warp_meshad.app import AppConfig, ConfigError, ConfigModel
from warp_meshad.dynamics import add_inertia_gravity, predict_positions, update_velocities
from warp_meshad.kernels.energies import (
    ArapTetData,
    StableNeoHookeanData,
    arap_tet_F,
    stable_neo_hookean_F,
    stable_neo_hookean_F_hessian_proj,
    stable_neo_hookean_lame,
)

__all__ = ["App", "BarConfig", "ElasticConfig"]

_SURFACE_SUFFIXES = (".obj", ".off", ".ply")
Side = Literal["x_min", "x_max", "y_min", "y_max", "z_min", "z_max"]


class BarConfig(ConfigModel):
    """The built-in generator ``mesh: bar``: a box along x split into tets (:meth:`TetMesh.box`).

    Attributes:
        nx, ny, nz: vertices along x, y and z (>= 2 each).
        length, width, height: extents along x, y and z [m].
    """

    nx: int = 25
    ny: int = 6
    nz: int = 6
    length: float = 1.0
    width: float = 0.2
    height: float = 0.2


class ElasticConfig(AppConfig):
    """Config of the elastic app (fields beyond :class:`AppConfig`).

    Attributes:
        mesh: ``"bar"`` (the built-in generator, sized by ``bar``) or a tet mesh file (``.msh``, ``.vtk``, ``.vtu``,
            ``.mesh``, read with :meth:`TetMesh.from_file`). A surface file (``.obj``, ``.off``, ``.ply``) is read and
            validated like every app's mesh, then refused: tetrahedralize it first (assets/meshes/README.md says how
            bunny-tet.msh was made).
        bar: size of the generated bar.
        dtype: only ``"float64"`` (the tet energies are float64).
        solver: only ``"newton"`` (projected Newton, ``linear_solver``).
        project_hessian: project element Hessians to PSD (projected Newton; the elastic Hessians are indefinite):
            the 9 x 9 Hessian in F of each tet, in closed form for stable Neo-Hookean
            (:func:`...energies.stable_neo_hookean_F_hessian_proj`), by a Jacobi eigen-decomposition for ARAP.
        material: ``"stable_neo_hookean"`` (:func:`...energies.stable_neo_hookean_F`, with its Lame
            reparametrization of ``young`` and ``poisson``) or ``"arap"`` (:func:`...energies.arap_tet_F` with
            mu = young / (2 (1 + poisson))); both as energies of the deformation gradient
            (``Problem.add_deformation_term``).
        young: Young's modulus Y [Pa]; poisson: Poisson's ratio nu.
        density: mass density [kg/m^3].
        time_step: h [s].
        tolerance: Newton decrement 0.5 |d . g| at which a step's solve stops [J].
        gravity: acceleration of gravity [m/s^2].
        size: scale the mesh so its largest bounding-box extent is this [m] (null: as given).
        center: move the mesh's bounding-box center here [m] (null: leave it).
        pins: sides of the bounding box whose vertices are fixed (``x_min`` ... ``z_max``).
        pin_depth: a side's vertices lie within this fraction of the mesh's extent along the side's axis.
        pinned_vertices: more fixed vertex indices.
        driven_side: one of ``pins`` moved by ``twist`` and ``stretch`` (null: every pin stays put).
        twist: total rotation of the driven side about its outward axis through its centroid [degrees].
        stretch: total outward displacement of the driven side, a fraction of the mesh's extent along its axis.
        ramp_steps: steps over which twist and stretch are reached (null: all ``steps``).
        keep_start_factors: a step whose solve starts where the last one ended (no driven side) takes its first
            Newton direction from the factorization that solve ended with (``NewtonSolver(keep_start_factors=...)``:
            the inertia target and gravity do not enter the Hessian), saving one factorization per step after the
            first; the same iterates. Default true: bunny's 40 steps on an H200 took a median 0.379 s with it and
            0.397 s without (benchmarks/README.md, "The apps as a user runs them").
    """

    device_loop_supported: ClassVar[bool] = True
    app: str = "elastic"
    mesh: str = "bar"
    bar: BarConfig = Field(default_factory=BarConfig)
    dtype: Literal["float64"] = "float64"
    solver: Literal["newton"] = "newton"
    project_hessian: bool = True
    keep_start_factors: bool = True
    steps: int = 40
    iterations: int = 30
    tolerance: float = 1e-6
    material: Literal["stable_neo_hookean", "arap"] = "stable_neo_hookean"
    young: float = 1e5
    poisson: float = 0.4
    density: float = 1000.0
    time_step: float = 0.02
    gravity: tuple[float, float, float] = (0.0, -9.81, 0.0)
    size: Optional[float] = None
    center: Optional[tuple[float, float, float]] = None
    pins: list[Side] = Field(default_factory=lambda: ["x_min"])
    pin_depth: float = 1e-6
    pinned_vertices: list[int] = Field(default_factory=list)
    driven_side: Optional[Side] = None
    twist: float = 0.0
    stretch: float = 0.0
    ramp_steps: Optional[int] = None

    mesh_generators: ClassVar[tuple[str, ...]] = ("bar",)
    mesh_suffixes: ClassVar[tuple[str, ...]] = (".msh", ".vtk", ".vtu", ".mesh", ".obj", ".off", ".ply")

    def validate(self):
        errors = super().validate()
        if self.mesh == "bar":
            for k in ("nx", "ny", "nz"):
                if getattr(self.bar, k) < 2:
                    errors.append((f"bar.{k}", f"expected an int >= 2, got {getattr(self.bar, k)}"))
            for k in ("length", "width", "height"):
                if not getattr(self.bar, k) > 0.0:
                    errors.append((f"bar.{k}", f"expected a number > 0, got {getattr(self.bar, k)}"))
        for key in ("young", "density", "time_step"):
            if not getattr(self, key) > 0.0:
                errors.append((key, f"expected a number > 0, got {getattr(self, key)}"))
        if not -1.0 < self.poisson < 0.5:
            errors.append(("poisson", f"expected a number in (-1, 0.5), got {self.poisson}"))
        if self.size is not None and not self.size > 0.0:
            errors.append(("size", f"expected a number > 0 or null, got {self.size}"))
        if not 0.0 <= self.pin_depth < 1.0:
            errors.append(("pin_depth", f"expected a number in [0, 1), got {self.pin_depth}"))
        if any(i < 0 for i in self.pinned_vertices):
            errors.append(("pinned_vertices", f"expected indices >= 0, got {self.pinned_vertices}"))
        if self.driven_side is not None and self.driven_side not in self.pins:
            errors.append(("driven_side", f"expected one of pins {list(self.pins)} or null, got {self.driven_side!r}"))
        if self.driven_side is None and (self.twist != 0.0 or self.stretch != 0.0):
            errors.append(("driven_side", "twist and stretch move the driven side: name one of pins"))
        if self.ramp_steps is not None and self.ramp_steps < 1:
            errors.append(("ramp_steps", f"expected an int >= 1 or null, got {self.ramp_steps}"))
        return errors


def _rotation(axis: int, angle: float) -> np.ndarray:
    """Rotation by ``angle`` [rad] about coordinate axis ``axis`` (right-handed)."""
    c, s = math.cos(angle), math.sin(angle)
    i, j = (axis + 1) % 3, (axis + 2) % 3
    r = np.eye(3)
    r[i, i], r[i, j], r[j, i], r[j, j] = c, -s, s, c
    return r


def _side_vertices(x: np.ndarray, side: str, depth: float) -> np.ndarray:
    """Vertices within ``depth`` x the extent of the bounding box side ``side`` (e.g. ``"x_min"``)."""
    axis = "xyz".index(side[0])
    coord = x[:, axis]
    lo, hi = float(coord.min()), float(coord.max())
    band = max(depth, 1e-9) * (hi - lo)
    return np.flatnonzero(coord <= lo + band if side.endswith("min") else coord >= hi - band)


class App(_AppBase):
    """The elastic app: one backward Euler step of a tet mesh per :meth:`step`.

    Attributes (beyond :class:`~warp_meshad.app.App`):
        tet_mesh: the :class:`warp_meshad.TetMesh` (rest shape); ``mesh`` is its boundary surface.
        problem: the :class:`warp_meshad.Problem` of one time step (its target x~ changes every step).
        x, v: positions and velocities of all tet vertices, wp.array [vertex_count] of vec3d.
        x0: the rest positions (numpy), ``pinned`` the pinned vertex indices, ``driven`` those of the driven side.
    """

    name = "elastic"
    config_class = ElasticConfig

    def load_mesh(self):
        """Builds :attr:`tet_mesh` (the bar, or the file, scaled by ``size`` and moved to ``center``) and returns its
        boundary surface."""
        c = self.config
        where = c.origin("mesh")
        try:
            path = c.mesh_path()
            if path is None:
                b = c.bar
                mesh = wm.TetMesh.box(b.nx, b.ny, b.nz, b.length, b.width, b.height)
            elif path.suffix.lower() in _SURFACE_SUFFIXES:
                surface = wm.TriMesh.from_file(path)  # a broken surface reports its MeshError, as in every app
                raise ConfigError(where, "mesh", (
                    f"{path}: a triangle surface ({surface.vertex_count} vertices, {surface.face_count} faces), not a "
                    f"tet mesh; the elastic app needs tetrahedra: a .msh/.vtk/.vtu/.mesh file (tetrahedralize the "
                    f"surface first, e.g. with fTetWild as assets/meshes/README.md describes for bunny-tet.msh)"))
            else:
                mesh = wm.TetMesh.from_file(path)
            x = np.array(mesh.vertices)
            lo, hi = x.min(axis=0), x.max(axis=0)
            if c.size is not None:
                x = 0.5 * (lo + hi) + (x - 0.5 * (lo + hi)) * (c.size / float((hi - lo).max()))
            if c.center is not None:
                x += np.asarray(c.center, dtype=np.float64) - 0.5 * (lo + hi)
            if c.size is not None or c.center is not None:
                mesh = wm.TetMesh(x, mesh.tets, source=mesh.source)
            self.tet_mesh = mesh
            return mesh.boundary_mesh()
        except wm.MeshError as exc:
            raise ConfigError(where, "mesh", str(exc)) from None

    def __init__(self, config: ElasticConfig, prepared: dict | None = None):
        super().__init__(config, prepared)
        c = self.config
        mesh = self.tet_mesh
        n = mesh.vertex_count
        if any(i >= n for i in c.pinned_vertices):
            raise ConfigError(c.origin("pinned_vertices"), "pinned_vertices",
                              f"indices must be < vertex_count {n}, got {c.pinned_vertices}")
        dev = self.device
        self.x0 = np.array(mesh.vertices)
        sides = {s: _side_vertices(self.x0, s, c.pin_depth) for s in c.pins}
        pinned = set(int(i) for i in c.pinned_vertices)
        for s in c.pins:
            pinned.update(int(i) for i in sides[s])
        self.pinned = np.array(sorted(pinned), dtype=np.int64)
        self.driven = sides[c.driven_side] if c.driven_side is not None else np.zeros(0, dtype=np.int64)
        self.rest_volumes = mesh.volumes()
        self.masses = c.density * mesh.vertex_volumes()

        self.problem = wm.Problem(n, 3, wp.float64, dev, deterministic=self.config.deterministic)
        if c.material == "stable_neo_hookean":
            self.mu, self.lam = stable_neo_hookean_lame(c.young, c.poisson)
            elastic = StableNeoHookeanData()
            elastic.lam = wp.float64(self.lam)
            energy, projection = stable_neo_hookean_F, stable_neo_hookean_F_hessian_proj  # analytic eigensystem
        else:
            self.mu, self.lam = c.young / (2.0 * (1.0 + c.poisson)), 0.0
            elastic = ArapTetData()
            energy, projection = arap_tet_F, None  # Jacobi on the 9 x 9 F Hessian
        elastic.mu = wp.float64(self.mu)
        elastic.rest_inverse = wp.array(mesh.rest_matrix_inverses(), dtype=wp.mat33d, device=dev)
        elastic.volume = wp.array(self.rest_volumes, dtype=wp.float64, device=dev)
        # energies of F (9 duals, dF/dx applied by the toolkit): the projected Hessian projects the F Hessian
        self.problem.add_deformation_term(mesh.tets, energy, rest_inverse=elastic.rest_inverse, data=elastic,
                                          name=c.material, projection=projection)  # fmt: skip

        self.x = wp.array(self.x0, dtype=wp.vec3d, device=dev)
        self.v = wp.zeros(n, dtype=wp.vec3d, device=dev)
        self.inertia = add_inertia_gravity(self.problem, mesh.vertex_indices, self.x, self.masses, c.gravity,
                                           c.time_step)

        self.solver = wm.NewtonSolver(self.problem, linear_solver=c.linear_solver,
                                      projection=wm.Projection() if c.project_hessian else None,
                                      fixed=self.pinned if self.pinned.size else None,
                                      device_loop=c.device_loop_option(dev),
                                      keep_start_factors=c.keep_start_factors)

    # -- driven pins -------------------------------------------------------------------------------------------------

    def _ramp(self, step: int) -> float:
        c = self.config
        ramp = c.ramp_steps if c.ramp_steps is not None else max(c.steps, 1)
        return min(step / ramp, 1.0)

    def driven_positions(self, step: int) -> np.ndarray:
        """Prescribed positions of the driven vertices after ``step`` steps, float64 (len(driven), 3)."""
        c = self.config
        rest = self.x0[self.driven]
        if c.driven_side is None or not rest.size:
            return rest
        axis = "xyz".index(c.driven_side[0])
        outward = 1.0 if c.driven_side.endswith("max") else -1.0
        s = self._ramp(step)
        center = rest.mean(axis=0)
        rot = _rotation(axis, outward * math.radians(c.twist) * s)
        offset = np.zeros(3)
        offset[axis] = outward * c.stretch * s * float(np.ptp(self.x0[:, axis]))
        return center + (rest - center) @ rot.T + offset

    # -- the interface -----------------------------------------------------------------------------------------------

    def step(self) -> dict:
        """One backward Euler time step: move the driven pins, predict x~, minimize E with Newton, update velocities."""
        c = self.config
        if self.driven.size:
            x = self.x.numpy()
            x[self.driven] = self.driven_positions(self.steps_done + 1)
            self.x.assign(x)
        predict_positions(self.x, self.v, c.time_step, self.inertia.target)
        x_old = wp.clone(self.x)
        result = self.solver.solve(self.x, max_iterations=c.iterations, tolerance=c.tolerance)
        wp.copy(self.x, result.x)
        update_velocities(self.x, x_old, c.time_step, self.v)
        ratio = self.volume_ratios()
        return self.record(result, time=(self.steps_done + 1) * c.time_step, min_volume_ratio=float(ratio.min()),
                           max_volume_ratio=float(ratio.max()))

    def tet_positions(self) -> np.ndarray:
        """Positions of all tet vertices, float64 (vertex_count, 3)."""
        return self.x.numpy().astype(np.float64)

    def positions(self) -> np.ndarray:
        """Positions of the boundary surface's vertices (:attr:`mesh`), float64."""
        return self.tet_positions()[self.mesh.vertex_map]

    def volume_ratios(self, x=None) -> np.ndarray:
        """Per tet: signed volume / rest volume (det F); <= 0 for an inverted tet."""
        x = self.tet_positions() if x is None else x
        return self.tet_mesh.volumes(x) / self.rest_volumes

    def quantities(self) -> dict:
        x = self.tet_positions()
        return {
            "volume ratio det F of the face's tet [1]": ("faces",
                                                         self.volume_ratios(x)[self.tet_mesh.boundary_face_tets]),
            "displacement [m]": ("vertices", np.linalg.norm(x - self.x0, axis=1)[self.mesh.vertex_map]),
        }

    def check_final(self) -> None:
        """Energy decreased in every step's solve, no NaN, no inverted tet, pins where they belong (fixed ones unmoved,
        the driven side at its prescribed place), and without a driven side the mesh moved along gravity."""
        super().check_final()
        c = self.config
        x = self.tet_positions()
        ratio = self.volume_ratios(x)
        inverted = np.flatnonzero(ratio <= 0.0)
        assert inverted.size == 0, (
            f"elastic: {inverted.size} inverted tets (e.g. tet {inverted[:5].tolist()}, volume ratio "
            f"{ratio[inverted[0]] if inverted.size else 0:.3g})")
        scale = float(np.ptp(self.x0, axis=0).max())
        still = np.setdiff1d(self.pinned, self.driven)
        if still.size:
            moved = np.abs(x[still] - self.x0[still]).max()
            assert moved <= 1e-9 * scale, f"elastic: fixed pinned vertices moved by {moved:.3e} m"
        if self.driven.size:
            off = np.abs(x[self.driven] - self.driven_positions(self.steps_done)).max()
            assert off <= 1e-9 * scale, f"elastic: the driven side is {off:.3e} m off its prescribed place"
        g = np.asarray(c.gravity, dtype=np.float64)
        free = self.pinned.size < len(x)
        if self.steps_done > 0 and np.linalg.norm(g) > 0 and c.driven_side is None and free:
            down = g / np.linalg.norm(g)
            drop = float((x @ down).mean() - (self.x0 @ down).mean())
            assert drop > 0.0, f"elastic: the mean position did not move along gravity (moved {drop:.3e} m)"

    def extra_metrics(self) -> dict:
        c = self.config
        x = self.tet_positions()
        ratio = self.volume_ratios(x)
        m = self.tet_mesh
        return {
            "tet_mesh": {"vertex_count": m.vertex_count, "tet_count": m.tet_count,
                         "boundary_face_count": int(m.boundary_faces.shape[0])},
            "material": {"name": c.material, "mu": self.mu, "lambda": self.lam, "young": c.young,
                         "poisson": c.poisson},
            "pinned_vertices": int(self.pinned.size),
            "driven_vertices": int(self.driven.size),
            "twist_degrees": c.twist * self._ramp(self.steps_done) if c.driven_side else 0.0,
            "min_volume_ratio": float(ratio.min()),
            "max_volume_ratio": float(ratio.max()),
            "max_displacement": float(np.linalg.norm(x - self.x0, axis=1).max()),
            "total_mass": float(self.masses.sum()),
            "linear_solver": getattr(getattr(self.solver, "linear_solver", None), "name", None),
        }

    def describe(self) -> str:
        c = self.config
        m = self.tet_mesh
        mesh = (f"{c.bar.nx}x{c.bar.ny}x{c.bar.nz} bar" if c.mesh == "bar" else pathlib.Path(c.mesh).name)
        steps = f"{c.steps} step{'' if c.steps == 1 else 's'}"
        return (f"{self.name}/{c.scene or 'custom'}: {mesh} ({m.vertex_count} vertices, {m.tet_count} tets, "
                f"{self.mesh.face_count} boundary faces), {c.material}, solver {c.solver}, {steps}, on {self.device} "
                f"({self.device_reason})")

"""Parametrization: a flip-free map of a disk-topology mesh to the plane that minimizes the symmetric Dirichlet energy.

Run: ``warp-meshad run configs/param/bunny_cut.yaml`` (``--viewer`` to watch the distortion fall, ``--test`` for the
small size).

Over the uv coordinates u of the vertices,

    E(u) = sum_f A_f (|J_f|_F^2 + |J_f^-1|_F^2),    J_f = [u_1 - u_0, u_2 - u_0] D_m,f^-1,    +inf if det J_f <= 0

(Smith & Schaefer 2015; :mod:`warp_meshad.kernels.energies.symmetric_dirichlet`), summed with the rest areas A_f and
not normalized, as TinyAD's parametrization example writes it. E >= 4 A (A = total area), with equality exactly at an
isometry (a planar mesh). The start is the uniform-weight Tutte embedding (boundary on the unit circle by arc length,
flip-free), optionally scaled to the mesh's total area; projected Newton then runs with TinyAD's settings: element
Hessians clamped to eigenvalues >= 1e-9, Armijo backtracking (shrink 0.8, c = 1e-4, 64 tries), stop when the Newton
decrement ``-d.g / 2`` drops below ``tolerance`` (TinyAD's ``newton_decrement(d, g) < eps``).

Outputs: ``final.obj`` is the input surface with the uv coordinates as texture coordinates (``vt``, one per vertex).
The viewer and ``screenshot.png`` show the surface with the uv map as a checker and, beside it, the flat uv layout
twice: with the checker, and coloured by the per-face distortion ``log10(E_f / (4 A_f))`` (0 where a face maps
isometrically) with its colour bar; the viewer also offers ``E_f / A_f`` and the uv / surface area ratio.
"""

from __future__ import annotations

import math
import pathlib
import time
from typing import ClassVar, Literal, Optional

import numpy as np
import warp as wp

import warp_meshad as wm
from warp_meshad.app import App as _AppBase
from warp_meshad.app import AppConfig, BatchStepParts
from warp_meshad.kernels.energies import SymmetricDirichletData, symmetric_dirichlet

__all__ = ["App", "ParamConfig", "face_distortion", "signed_uv_areas"]

_WOODY = str(pathlib.Path(__file__).resolve().parents[1] / "assets" / "meshes" / "woody.obj")


class ParamConfig(AppConfig):
    """Config of the param app (fields beyond :class:`AppConfig`).

    Attributes:
        mesh: a disk-topology triangle mesh (one boundary loop; default: woody.obj).
        dtype: ``"float64"`` (the app solves in float64).
        solver: ``"newton"`` (projected Newton, assembled Hessian, ``linear_solver``) or ``"lbfgs"``.
        steps: rounds of at most ``iterations`` solver iterations (the viewer redraws after each); a round after
            convergence takes no step.
        iterations: iteration cap per round.
        tolerance: Newton: stop when the Newton decrement -d.g/2 < tolerance [energy units, length^2];
            L-BFGS: stop when the gradient norm <= tolerance.
        projection: per-element Hessian projection of projected Newton: ``"clamp"`` (TinyAD's default) or ``"abs"``.
        projection_eps: eigenvalues below it are clamped to it (``"clamp"``).
        initial_scale: scale of the Tutte embedding: ``"area"`` (uv area = the surface's total area, so the start
            is near the right size) or ``"unit"`` (the unit disk, as TinyAD's examples start).
        expected_energy_per_area: known minimum of E / A for this mesh (from TinyAD's projected Newton); when set,
            ``check_final`` requires the final E / A within ``expected_rtol`` of it. Null: no such check.
        expected_rtol: relative tolerance of that check.
        pin_vertex: Newton: this vertex keeps its start uv; null (the default): no pin. The energy does not see
            translations, so without a pin the projected Hessian is singular along them (its clamped eigenvalues
            ~projection_eps) and cuDSS factorizes by LU; one pin removes that gauge (the same minimum and
            iteration count on the CPU) and cuDSS then factorizes by Cholesky. Not the default: in the captured
            device loop on an H200, 3 of 34 pinned param/armadillo runs stopped early at a wrong point (two of them
            at the same E/A 4.144334) and none of 14 unpinned ones; why is not known.
        hessian_shift: Newton: ``sigma >= 0`` added to the projected Hessian's diagonal
            (``NewtonSolver(hessian_shift=...)``): the translations then have eigenvalues ~sigma instead of
            ~projection_eps, so cuDSS can factor by Cholesky without a pin; the minimum is the same. 0 (the
            default): no shift, LU.
    """

    device_loop_supported: ClassVar[bool] = True
    app: str = "param"
    mesh: str = _WOODY
    dtype: Literal["float64"] = "float64"
    solver: Literal["newton", "lbfgs"] = "newton"
    steps: int = 1
    iterations: int = 1000
    tolerance: float = 1e-6
    projection: Literal["clamp", "abs"] = "clamp"
    projection_eps: float = 1e-9
    initial_scale: Literal["area", "unit"] = "area"
    expected_energy_per_area: Optional[float] = None
    expected_rtol: float = 1e-5
    pin_vertex: Optional[int] = None
    hessian_shift: float = 0.0

    def validate(self):
        errors = super().validate()
        if self.mesh == "grid":
            errors.append(("mesh", "expected a mesh file (a disk-topology surface); the param app has no generator"))
        if self.mesh_format != "obj":
            errors.append(("mesh_format", f"expected 'obj' (the uv coordinates are written as OBJ texture "
                                          f"coordinates), got {self.mesh_format!r}"))
        if not self.projection_eps > 0.0:
            errors.append(("projection_eps", f"expected a number > 0, got {self.projection_eps}"))
        if self.expected_energy_per_area is not None and not self.expected_energy_per_area >= 4.0:
            errors.append(("expected_energy_per_area", f"expected a number >= 4 (the isometric lower bound) or "
                                                       f"null, got {self.expected_energy_per_area}"))
        if not self.expected_rtol > 0.0:
            errors.append(("expected_rtol", f"expected a number > 0, got {self.expected_rtol}"))
        if self.pin_vertex is not None and not self.pin_vertex >= 0:
            errors.append(("pin_vertex", f"expected a vertex index >= 0 or null, got {self.pin_vertex}"))
        if not (math.isfinite(self.hessian_shift) and self.hessian_shift >= 0.0):
            errors.append(("hessian_shift", f"expected a finite number >= 0, got {self.hessian_shift}"))
        return errors


def signed_uv_areas(uv: np.ndarray, faces: np.ndarray) -> np.ndarray:
    """Signed area of every face in the uv plane (positive: counter-clockwise, as the surface), shape (face_count,).

    Args:
        uv: uv coordinates, shape (vertex_count, 2).
        faces: vertex indices, shape (face_count, 3).
    """
    a, b, c = uv[faces[:, 0]], uv[faces[:, 1]], uv[faces[:, 2]]
    e1, e2 = b - a, c - a
    return 0.5 * (e1[:, 0] * e2[:, 1] - e1[:, 1] * e2[:, 0])


def face_distortion(uv: np.ndarray, faces: np.ndarray, rest_inverse: np.ndarray) -> np.ndarray:
    """Per face |J|_F^2 + |J^-1|_F^2 (the symmetric Dirichlet density E_f / A_f; 4 at an isometry, +inf if flipped).

    Args:
        uv: uv coordinates, shape (vertex_count, 2).
        faces: vertex indices, shape (face_count, 3).
        rest_inverse: D_m^-1 per face, shape (face_count, 2, 2).
    """
    a, b, c = uv[faces[:, 0]], uv[faces[:, 1]], uv[faces[:, 2]]
    ds = np.stack([b - a, c - a], axis=2)  # columns u1 - u0, u2 - u0
    jac = ds @ rest_inverse
    det = np.linalg.det(jac)
    fro = np.einsum("fij,fij->f", jac, jac)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(det > 0.0, fro + fro / (det * det), np.inf)


def _start(mesh, c: ParamConfig) -> np.ndarray:
    """The Tutte embedding, scaled to the surface's area for ``initial_scale: area``; float64 (vertex_count, 2)."""
    uv = wm.tutte_embedding(mesh)
    if c.initial_scale == "area":
        uv = uv * np.sqrt(mesh.total_area() / signed_uv_areas(uv, mesh.faces).sum())
    return uv


class App(_AppBase):
    """The param app: each :meth:`step` runs up to ``config.iterations`` solver iterations on the uv coordinates.

    Attributes (beyond :class:`~warp_meshad.app.App`):
        problem: the :class:`warp_meshad.Problem` (vec2d variables, one symmetric Dirichlet term over the faces).
        uv: uv coordinates, wp.array [vertex_count] of vec2d; ``uv0`` the Tutte start (numpy).
        total_area: A, the surface's total area [length^2].
        rest_inverse: D_m^-1 per face, numpy (face_count, 2, 2).
        newton_decrements: Newton decrement per iteration, all rounds.
        solve_seconds: wall time of the solver calls, all rounds; ``solve_cpu_seconds`` their process CPU time (all
            threads; a fairer measure on a busy machine).
    """

    name = "param"
    config_class = ParamConfig
    continuous_objective = True

    @classmethod
    def _prepare_checked(cls, config: ParamConfig) -> dict:
        """The mesh and its Tutte start (``{"mesh", "uv0"}``), see :meth:`warp_meshad.app.App.prepare`."""
        prepared = super()._prepare_checked(config)
        prepared["uv0"] = _start(prepared["mesh"], config)
        return prepared

    def __init__(self, config: ParamConfig, prepared: dict | None = None):
        super().__init__(config, prepared)
        c = self.config
        mesh = self.mesh
        self.require_nondegenerate(faces="the symmetric Dirichlet energy inverts each face's rest frame")
        dev = self.device
        self.total_area = mesh.total_area()
        self.rest_inverse = mesh.face_rest_frame_inverses()
        uv = self.prepared["uv0"] if "uv0" in self.prepared else _start(mesh, c)
        self.uv0 = uv
        self.uv = wp.array(uv, dtype=wp.vec2d, device=dev)
        self.lap("start point")

        data = SymmetricDirichletData(wp.float64, rest_inverse=wp.array(self.rest_inverse, dtype=wp.mat22d, device=dev),
                                      area=wp.array(mesh.face_areas(), dtype=wp.float64, device=dev))
        self.problem = wm.Problem(mesh.vertex_count, 2, wp.float64, dev, deterministic=self.config.deterministic)
        self.problem.add_term(mesh.faces, symmetric_dirichlet, data, name="symmetric_dirichlet")
        if c.pin_vertex is not None and c.pin_vertex >= mesh.vertex_count:
            raise ValueError(f"param: pin_vertex: expected a vertex index below {mesh.vertex_count} (the vertices of "
                             f"{c.mesh}), got {c.pin_vertex}")
        self.pinned = None if c.pin_vertex is None else np.array([c.pin_vertex], dtype=np.int32)
        self.lap("problem")
        if c.solver == "newton":
            self.solver = wm.NewtonSolver(self.problem, linear_solver=c.linear_solver,
                                          projection=wm.Projection(mode=c.projection, eps=c.projection_eps),
                                          fixed=self.pinned, device_loop=c.device_loop_option(dev),
                                          hessian_shift=c.hessian_shift)
        else:
            self.solver = wm.LBFGSSolver(self.problem)
        self.lap("solver")
        self.newton_decrements: list[float] = []
        self.solve_seconds = 0.0
        self.solve_cpu_seconds = 0.0

    def step(self) -> dict:
        """Up to ``config.iterations`` iterations from the current uv (no energy-change test, as TinyAD)."""
        t0, c0 = time.perf_counter(), time.process_time()
        result = self.solver.solve(self.uv, **self._solve_options())
        return self._take(result, time.perf_counter() - t0, time.process_time() - c0)

    def _solve_options(self) -> dict:
        c = self.config
        return {"max_iterations": c.iterations, "tolerance": c.tolerance, "energy_tolerance": 0.0}

    def _take(self, result, seconds: float, cpu_seconds: float) -> dict:
        self.solve_seconds += seconds
        self.solve_cpu_seconds += cpu_seconds
        wp.copy(self.uv, result.x)
        self.newton_decrements.extend(float(v) for v in result.newton_decrements)
        return self.record(result, energy_per_area=result.energies[-1] / self.total_area)

    def batch_step_parts(self):
        """Projected Newton steps batch (``warp-meshad batch``); L-BFGS runs mesh by mesh."""
        c = self.config
        if c.solver != "newton":
            return None
        return BatchStepParts(self.problem, self.uv, self.pinned, solver=self.solver, solve=self._solve_options())

    def finish_batch_step(self, result, seconds: float, cpu_seconds: float) -> dict:
        return self._take(result, seconds, cpu_seconds)

    def uv_coordinates(self) -> np.ndarray:
        """Current uv coordinates, float64 numpy (vertex_count, 2)."""
        return self.uv.numpy().astype(np.float64)

    def positions(self) -> np.ndarray:
        """The surface (unchanged by the app); the uv coordinates are :meth:`uv_coordinates`."""
        return np.array(self.mesh.vertices, dtype=np.float64)

    def save_options(self) -> dict:
        return {"uv": self.uv_coordinates()}

    def quantities(self) -> dict:
        uv = self.uv_coordinates()
        dist = face_distortion(uv, self.mesh.faces, self.rest_inverse)
        return {  # log10: 0 at an isometry; shows the long tail
            "distortion log10(E_f / (4 A_f)), symmetric Dirichlet [1]": ("faces", np.log10(dist / 4.0)),
            "distortion E_f / A_f, symmetric Dirichlet (4: isometric) [1]": ("faces", dist),
            "uv area / surface area [1]": ("faces", signed_uv_areas(uv, self.mesh.faces) / self.mesh.face_areas()),
        }

    @property
    def energy_per_area(self) -> float:
        """E / A at the end of the last step (>= 4)."""
        return self.energy / self.total_area

    def check_final(self) -> None:
        """No flipped or degenerate triangle in uv, finite energies that never rose, and E / A within
        ``expected_rtol`` of ``expected_energy_per_area`` when the config gives it."""
        super().check_final()
        uv = self.uv_coordinates()
        assert np.all(np.isfinite(uv)), f"param: {int(np.sum(~np.isfinite(uv)))} non-finite uv coordinates"
        areas = signed_uv_areas(uv, self.mesh.faces)
        assert np.all(areas > 0.0), (f"param: {int(np.sum(areas <= 0.0))} flipped or degenerate uv triangles "
                                     f"(face {int(np.argmin(areas))}: signed area {areas.min():.3e})")
        energies = [e for rec in self.history for e in rec["energies"]]
        rises = np.diff(energies)
        tol = 1e-12 * abs(energies[0])
        assert np.all(rises <= tol), f"param: energy rose at iteration {int(np.argmax(rises > tol)) + 1}"
        if sum(r["iterations"] for r in self.history) > 0:
            assert energies[-1] < energies[0], f"param: energy did not decrease ({energies[0]} -> {energies[-1]})"
        ratio = self.energy_per_area
        assert ratio >= 4.0 * (1.0 - 1e-12), f"param: E/A = {ratio!r} is below the isometric lower bound 4"
        expected = self.config.expected_energy_per_area
        if expected is not None:
            rel = abs(ratio - expected) / expected
            last = self.history[-1] if self.history else {}
            assert rel <= self.config.expected_rtol, (
                f"param: E/A = {ratio:.9f}, expected {expected:.9f} (relative error {rel:.2e} > "
                f"{self.config.expected_rtol:g}; the solver stopped on {last.get('reason')!r} after "
                f"{sum(r['iterations'] for r in self.history)} iterations)")

    def extra_metrics(self) -> dict:
        backend = getattr(self.solver, "linear_solver", None)  # L-BFGS and Newton-CG have none
        uv = self.uv_coordinates()
        areas = signed_uv_areas(uv, self.mesh.faces)
        expected = self.config.expected_energy_per_area
        ratio = self.energy_per_area
        return {
            "total_area": self.total_area,
            "initial_scale": self.config.initial_scale,
            "start_energy_per_area": self.history[0]["energies"][0] / self.total_area if self.history else None,
            "energy_per_area": ratio,
            "expected_energy_per_area": expected,
            "energy_per_area_relative_error": None if expected is None else abs(ratio - expected) / expected,
            "newton_decrements": self.newton_decrements,
            "final_newton_decrement": self.newton_decrements[-1] if self.newton_decrements else None,
            "flipped_faces": int(np.sum(areas <= 0.0)),
            "min_uv_area_ratio": float((areas / self.mesh.face_areas()).min()),
            "solve_seconds": self.solve_seconds,
            "solve_cpu_seconds": self.solve_cpu_seconds,
            "linear_solver": getattr(backend, "name", None),
            "cudss_skipped_reason": getattr(backend, "cudss_skipped_reason", None),
        }

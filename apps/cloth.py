"""Mass-spring cloth: backward Euler written as one minimization per time step, solved by projected Newton.

Run: ``warp-meshad run configs/cloth/hanging.yaml`` (``--viewer`` to watch it, ``--test`` for the small size).

Each time step h minimizes, over the positions x (pinned vertices held fixed),

    E(x) = sum_i m_i / (2 h^2) |x_i - x~_i|^2 - sum_i m_i g . x_i     (inertia and gravity, per vertex)
         + sum_e k / 2 (|x_a - x_b| - L_e)^2                           (springs on the edges, rest lengths L_e)
         + sum_i b(|x_i - c| - r)                                      (optional: log barrier against a sphere)

with x~ = x^n + h v^n; then v^{n+1} = (x^{n+1} - x^n) / h. Masses are lumped from the rest areas (a third of each
face's share of ``mass``); the rest shape is the input mesh.
"""

from __future__ import annotations

from typing import Literal, Optional

import numpy as np
from pydantic import Field
import warp as wp

import warp_meshad as wm
from warp_meshad.app import App as _AppBase
from warp_meshad.app import AppConfig, ConfigError, ConfigModel
from warp_meshad.dynamics import add_inertia_gravity, predict_positions, update_velocities
from warp_meshad.kernels.energies import MassSpringData, SphereBarrierData, mass_spring, sphere_barrier

__all__ = ["App", "ClothConfig", "SphereConfig"]


class SphereConfig(ConfigModel):
    """A static sphere the cloth collides with through a smooth log barrier (:mod:`...energies.sphere_barrier`).

    Attributes:
        center: sphere center [m].
        radius: sphere radius [m].
        activation_distance: the barrier acts below this distance to the surface [m].
        stiffness: barrier stiffness kappa [J/m^2].
    """

    center: tuple[float, float, float] = (0.0, 0.0, 0.0)
    radius: float = 0.25
    activation_distance: float = 0.01
    stiffness: float = 10.0


class ClothConfig(AppConfig):
    """Config of the cloth app (fields beyond :class:`AppConfig`).

    Attributes:
        solver: ``"newton"`` (assembled Hessian, ``linear_solver``) or ``"newton_cg"`` (matrix-free).
        project_hessian: project element Hessians to PSD (projected Newton; compressed springs are indefinite).
        time_step: h [s].
        mass: total mass of the cloth [kg].
        stiffness: spring constant k of every edge [N/m].
        gravity: acceleration of gravity [m/s^2].
        layout: ``"vertical"``: the mesh as given (a grid lies in the xy-plane, y up); ``"horizontal"``: rotated by
            -90 degrees about x (a grid then lies in the xz-plane with normal +y).
        center: move the cloth's bounding-box center here [m] (null: leave it).
        pins: which vertices are fixed: ``"top_corners"`` (the two ends of the top row, top = against gravity),
            ``"top_edge"`` (the whole top row) or ``"none"``; ``pinned_vertices`` adds indices.
        pinned_vertices: more fixed vertex indices.
        sphere: a static sphere to collide with, or null.
        keep_start_factors: Newton: a step's solve starts where the last one ended, and that solve's last
            factorization is of the same matrix (the inertia target and gravity do not enter the Hessian), so the
            step's first direction is solved with those factors (``NewtonSolver(keep_start_factors=...)``): one
            factorization fewer per step after the first, the same iterates (cloth/hanging on a 2-core CPU: 182
            iterations and the same E either way, its 40 steps 2.54-2.79 s -> 2.38-2.46 s;
            benchmarks/history/2026-12-03_apps_solve_time.md). Default true (the host loop's
            ``LinearSolver.resolve``, on cuDSS too).
    """

    app: str = "cloth"
    solver: Literal["newton", "newton_cg"] = "newton"
    project_hessian: bool = True
    keep_start_factors: bool = True
    steps: int = 40
    iterations: int = 30
    tolerance: float = 1e-5
    time_step: float = 0.02
    mass: float = 1.0
    stiffness: float = 1000.0
    gravity: tuple[float, float, float] = (0.0, -9.81, 0.0)
    layout: Literal["vertical", "horizontal"] = "vertical"
    center: Optional[tuple[float, float, float]] = None
    pins: Literal["top_corners", "top_edge", "none"] = "top_corners"
    pinned_vertices: list[int] = Field(default_factory=list)
    sphere: Optional[SphereConfig] = None

    def validate(self):
        errors = super().validate()
        for key in ("time_step", "mass", "stiffness"):
            if not getattr(self, key) > 0.0:
                errors.append((key, f"expected a number > 0, got {getattr(self, key)}"))
        if self.sphere is not None:
            for key in ("radius", "activation_distance", "stiffness"):
                if not getattr(self.sphere, key) > 0.0:
                    errors.append((f"sphere.{key}", f"expected a number > 0, got {getattr(self.sphere, key)}"))
        if any(i < 0 for i in self.pinned_vertices):
            errors.append(("pinned_vertices", f"expected indices >= 0, got {self.pinned_vertices}"))
        return errors


def _place(vertices: np.ndarray, layout: str, center) -> np.ndarray:
    x = np.array(vertices, dtype=np.float64)
    if layout == "horizontal":
        x = np.stack([x[:, 0], x[:, 2], -x[:, 1]], axis=1)  # rotate -90 degrees about x: normal +z -> +y
    if center is not None:
        lo, hi = x.min(axis=0), x.max(axis=0)
        x += np.asarray(center, dtype=np.float64) - 0.5 * (lo + hi)
    return x


def _pinned(x: np.ndarray, gravity, pins: str, extra) -> np.ndarray:
    """Indices of the pinned vertices: the top row (against gravity), or its two ends."""
    idx = set(int(i) for i in extra)
    if pins != "none":
        g = np.asarray(gravity, dtype=np.float64)
        up = -g / np.linalg.norm(g) if np.linalg.norm(g) > 0 else np.array([0.0, 1.0, 0.0])
        height = x @ up
        extent = float(np.ptp(x, axis=0).max()) or 1.0
        top = np.flatnonzero(height >= height.max() - 1e-6 * extent)
        if pins == "top_edge":
            idx.update(int(i) for i in top)
        else:
            spread = np.ptp(x[top], axis=0)
            axis = int(np.argmax(spread))
            idx.update({int(top[np.argmin(x[top, axis])]), int(top[np.argmax(x[top, axis])])})
    return np.array(sorted(idx), dtype=np.int64)


class App(_AppBase):
    """The cloth app: one backward Euler step per :meth:`step`.

    Attributes (beyond :class:`~warp_meshad.app.App`):
        problem: the :class:`warp_meshad.Problem` of one time step (its target x~ changes every step).
        x, v: positions and velocities, wp.array [vertex_count] of vec3.
        x0: the start positions (numpy), ``pinned`` the pinned vertex indices.
    """

    name = "cloth"
    config_class = ClothConfig

    def __init__(self, config: ClothConfig, prepared: dict | None = None):
        super().__init__(config, prepared)
        c = self.config
        self.require_nondegenerate(faces="the vertex masses are lumped from the face areas",
                                   edges="a spring's force acts along its edge")
        if any(i >= self.mesh.vertex_count for i in c.pinned_vertices):
            raise ConfigError(c.origin("pinned_vertices"), "pinned_vertices",
                              f"indices must be < vertex_count {self.mesh.vertex_count}, got {c.pinned_vertices}")
        f64 = self.dtype == wp.float64
        vec3 = wp.vec3d if f64 else wp.vec3f
        scalar = self.dtype
        dev = self.device
        self.x0 = _place(self.mesh.vertices, c.layout, c.center)
        self.pinned = _pinned(self.x0, c.gravity, c.pins, c.pinned_vertices)
        n = self.mesh.vertex_count

        areas = self.mesh.face_areas()
        vertex_area = np.bincount(self.mesh.faces.ravel(), weights=np.repeat(areas / 3.0, 3), minlength=n)
        self.masses = c.mass * vertex_area / vertex_area.sum()
        self.rest = self.mesh.edge_lengths()
        self.lap("start point")

        self.problem = wm.Problem(n, 3, self.dtype, dev, deterministic=self.config.deterministic)
        springs = MassSpringData(scalar)
        springs.rest = wp.array(self.rest, dtype=scalar, device=dev)
        springs.stiffness = scalar(c.stiffness)
        self.problem.add_term(self.mesh.edges, mass_spring, springs, name="springs")

        self.x = wp.array(self.x0, dtype=vec3, device=dev)
        self.v = wp.zeros(n, dtype=vec3, device=dev)
        self.inertia = add_inertia_gravity(self.problem, self.mesh.vertex_indices, self.x, self.masses, c.gravity,
                                           c.time_step)

        bound = None
        if c.sphere is not None:
            s = c.sphere
            barrier = SphereBarrierData(scalar)
            barrier.center = vec3(*s.center)
            barrier.radius = scalar(s.radius)
            barrier.activation_distance = scalar(s.activation_distance)
            barrier.stiffness = scalar(s.stiffness)
            self.problem.add_term(self.mesh.vertex_indices, sphere_barrier, barrier, name="sphere_barrier")
            gap = np.linalg.norm(self.x0 - np.asarray(s.center), axis=1) - s.radius
            if gap.min() <= 0.0:
                raise ConfigError(c.origin("sphere"), "sphere",
                                  f"the cloth starts inside the sphere (vertex {int(gap.argmin())} is "
                                  f"{-gap.min():.3g} m inside)")
            bound = self._sphere_step_bound
        self.lap("problem")

        fixed = self.pinned if self.pinned.size else None
        if c.solver == "newton":
            self.solver = wm.NewtonSolver(self.problem, linear_solver=c.linear_solver,
                                          projection=wm.Projection() if c.project_hessian else None, fixed=fixed,
                                          step_bound_fn=bound, keep_start_factors=c.keep_start_factors)
        else:
            self.solver = wm.NewtonCGSolver(self.problem, fixed=fixed, step_bound_fn=bound)
        self.lap("solver")

    def _sphere_step_bound(self, x: wp.array, d: wp.array) -> float:
        """Continuous collision detection: 0.9 x the first time any vertex would reach the sphere along x + t d."""
        s = self.config.sphere
        p = x.numpy().astype(np.float64) - np.asarray(s.center)
        q = d.numpy().astype(np.float64)
        a = np.einsum("ij,ij->i", q, q)
        b = np.einsum("ij,ij->i", p, q)
        cc = np.einsum("ij,ij->i", p, p) - s.radius**2
        disc = b * b - a * cc
        hit = (a > 0.0) & (b < 0.0) & (disc >= 0.0)
        if not np.any(hit):
            return np.inf
        t = (-b[hit] - np.sqrt(disc[hit])) / a[hit]
        t = t[t >= 0.0]
        return 0.9 * float(t.min()) if t.size else np.inf

    def step(self) -> dict:
        """One backward Euler time step: predict x~, minimize E with Newton, update the velocities."""
        c = self.config
        predict_positions(self.x, self.v, c.time_step, self.inertia.target)
        result = self.solver.solve(self.x, max_iterations=c.iterations, tolerance=c.tolerance)
        update_velocities(result.x, self.x, c.time_step, self.v)
        wp.copy(self.x, result.x)
        return self.record(result, time=(self.steps_done + 1) * c.time_step)

    def positions(self) -> np.ndarray:
        return self.x.numpy().astype(np.float64)

    def stretch(self, x=None) -> np.ndarray:
        """Per edge: current length / rest length."""
        x = self.positions() if x is None else x
        e = self.mesh.edges
        return np.linalg.norm(x[e[:, 0]] - x[e[:, 1]], axis=1) / self.rest

    def quantities(self) -> dict:
        x = self.positions()
        face_stretch = self.stretch(x)[self.mesh.face_edges].mean(axis=1)
        return {
            "stretch: edge length / rest length, mean of the face's edges [1]": ("faces", face_stretch),
            "speed [m/s]": ("vertices", np.linalg.norm(self.v.numpy().astype(np.float64), axis=1)),
        }

    def spheres(self):
        s = self.config.sphere
        return [] if s is None else [(np.asarray(s.center, dtype=np.float64), s.radius)]

    def check_final(self) -> None:
        """Energy decreased in every step's solve, no NaN, pins unmoved, the cloth fell, no vertex inside the sphere,
        no spring stretched beyond twice its rest length."""
        super().check_final()
        x = self.positions()
        scale = float(np.ptp(self.x0, axis=0).max())
        if self.pinned.size:
            moved = np.abs(x[self.pinned] - self.x0[self.pinned]).max()
            assert moved <= 1e-9 * scale, f"cloth: pinned vertices moved by {moved:.3e} m"
        g = np.asarray(self.config.gravity, dtype=np.float64)
        if self.steps_done > 0 and np.linalg.norm(g) > 0 and not np.all(np.isin(np.arange(len(x)), self.pinned)):
            down = g / np.linalg.norm(g)
            drop = float((x @ down).mean() - (self.x0 @ down).mean())
            assert drop > 0.0, f"cloth: the mean position did not move along gravity (moved {drop:.3e} m)"
        s = self.config.sphere
        if s is not None:
            gap = np.linalg.norm(x - np.asarray(s.center), axis=1) - s.radius
            assert gap.min() > 0.0, f"cloth: vertex {int(gap.argmin())} is {-gap.min():.3e} m inside the sphere"
        stretch = self.stretch(x)
        assert stretch.max() < 2.0, f"cloth: a spring is stretched to {stretch.max():.3f} x its rest length"

    def extra_metrics(self) -> dict:
        backend = getattr(self.solver, "linear_solver", None)  # L-BFGS and Newton-CG have none
        x = self.positions()
        g = np.asarray(self.config.gravity, dtype=np.float64)
        down = g / np.linalg.norm(g) if np.linalg.norm(g) > 0 else np.zeros(3)
        out = {
            "pinned_vertices": self.pinned.tolist(),
            "max_stretch": float(self.stretch(x).max()),
            "mean_drop": float(((x - self.x0) @ down).mean()),
            "linear_solver": getattr(backend, "name", None),
            "cudss_skipped_reason": getattr(backend, "cudss_skipped_reason", None),
        }
        s = self.config.sphere
        if s is not None:
            out["min_sphere_distance"] = float((np.linalg.norm(x - np.asarray(s.center), axis=1) - s.radius).min())
        return out

"""Surface smoothing: minimize the surface area (faces) or the Dirichlet energy (edges) by gradient descent.

Run: ``warp-meshad run configs/smoothing/spot_area.yaml`` (``--viewer`` to watch the surface shrink).

Energies, over the vertex positions x of a triangle mesh:

    area:       E(x) = sum_f 1/2 |(x_1 - x_0) x (x_2 - x_0)|        (gradient descent: mean-curvature flow)
    dirichlet:  E(x) = sum_e 1/2 |x_a - x_b|^2                       (gradient descent: umbrella-Laplacian smoothing)

``benchmarks/smoothing_hand.py`` times these gradients against hand-written Warp kernels.
"""

from __future__ import annotations

import pathlib
from typing import ClassVar, Literal

import numpy as np
import warp as wp

import warp_meshad as wm
from warp_meshad.app import App as _AppBase
from warp_meshad.app import AppConfig
from warp_meshad.kernels.energies import dirichlet, surface_area

__all__ = ["App", "SmoothingConfig"]

_SPOT = str(pathlib.Path(__file__).resolve().parents[1] / "assets" / "meshes" / "spot.obj")


class SmoothingConfig(AppConfig):
    """Config of the smoothing app (fields beyond :class:`AppConfig`).

    Attributes:
        mesh: a closed or open triangle mesh (default: spot.obj).
        dtype: ``"float64"`` (the built-in energies are float64).
        energy: ``"area"`` (sum of face areas) or ``"dirichlet"`` (sum over edges of 1/2 |x_a - x_b|^2).
        solver: ``"gradient_descent"`` or ``"lbfgs"``.
        step_size: first trial step of each line search (gradient descent) or of the first L-BFGS step [m per unit
            gradient].
        steps: rounds of ``iterations`` solver iterations (the viewer redraws after each).
        tolerance: stop when the gradient norm falls to it.
        fix_boundary: hold the boundary vertices of an open mesh fixed (minimal surfaces).
    """

    app: str = "smoothing"
    mesh: str = _SPOT
    dtype: Literal["float64"] = "float64"
    energy: Literal["area", "dirichlet"] = "dirichlet"
    solver: Literal["gradient_descent", "lbfgs"] = "gradient_descent"
    device_loop_supported: ClassVar[bool] = True
    step_size: float = 0.1
    steps: int = 20
    iterations: int = 10
    tolerance: float = 1e-8
    fix_boundary: bool = True

    def validate(self):
        errors = super().validate()
        if not self.step_size > 0.0:
            errors.append(("step_size", f"expected a number > 0, got {self.step_size}"))
        return errors


class App(_AppBase):
    """The smoothing app: each :meth:`step` runs ``config.iterations`` solver iterations.

    Attributes (beyond :class:`~warp_meshad.app.App`):
        problem: the :class:`warp_meshad.Problem`.
        x: positions, wp.array [vertex_count] of vec3d; ``x0`` the start (numpy).
    """

    name = "smoothing"
    config_class = SmoothingConfig
    continuous_objective = True

    def __init__(self, config: SmoothingConfig, prepared: dict | None = None):
        super().__init__(config, prepared)
        c = self.config
        mesh = self.mesh
        if c.energy == "area":
            self.require_nondegenerate(faces="the area energy's gradient is each face's unit normal")
        self.problem = wm.Problem(mesh.vertex_count, 3, wp.float64, self.device, deterministic=c.deterministic)
        if c.energy == "area":
            self.problem.add_term(mesh.faces, surface_area, name="area")
        else:
            self.problem.add_term(mesh.edges, dirichlet, name="dirichlet")
        self.x0 = np.array(mesh.vertices, dtype=np.float64)
        self.x = wp.array(self.x0, dtype=wp.vec3d, device=self.device)
        boundary = mesh.boundary_vertices if c.fix_boundary else np.zeros(0, dtype=np.int64)
        self.fixed = np.asarray(boundary, dtype=np.int64)
        fixed = self.fixed if self.fixed.size else None
        loop = c.device_loop_option(self.device, poll=False)
        if c.solver == "gradient_descent":
            self.solver = wm.GradientDescentSolver(self.problem, step=c.step_size, fixed=fixed, device_loop=loop)
        else:
            self.solver = wm.LBFGSSolver(self.problem, initial_step=c.step_size, fixed=fixed, device_loop=loop)

    def step(self) -> dict:
        """``config.iterations`` iterations of the solver from the current positions."""
        c = self.config
        result = self.solver.solve(self.x, max_iterations=c.iterations, tolerance=c.tolerance)
        wp.copy(self.x, result.x)
        return self.record(result)

    def positions(self) -> np.ndarray:
        return self.x.numpy().astype(np.float64)

    def quantities(self) -> dict:
        x = self.positions()
        return {"displacement [mesh length units]": ("vertices", np.linalg.norm(x - self.x0, axis=1))}

    def check_final(self) -> None:
        """The energy decreased monotonically over all iterations, no NaN, fixed vertices did not move."""
        super().check_final()
        energies = [e for rec in self.history for e in rec["energies"]]
        steps = np.diff(energies)
        tol = 1e-12 * max(1.0, abs(energies[0])) if energies else 0.0
        assert np.all(steps <= tol), f"smoothing: energy rose at iteration {int(np.argmax(steps > tol)) + 1}"
        if sum(r["iterations"] for r in self.history) > 0:
            assert energies[-1] < energies[0], f"smoothing: energy did not decrease ({energies[0]} -> {energies[-1]})"
        if self.fixed.size:
            moved = np.abs(self.positions()[self.fixed] - self.x0[self.fixed]).max()
            assert moved == 0.0, f"smoothing: fixed boundary vertices moved by {moved:.3e}"

    def extra_metrics(self) -> dict:
        return {
            "start_energy": self.history[0]["energies"][0] if self.history else None,
            "fixed_vertex_count": int(self.fixed.size),
        }

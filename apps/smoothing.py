"""Surface smoothing: minimize the surface area (faces) or the Dirichlet energy (edges) by gradient descent.

Run: ``warp-meshad run configs/smoothing/spot_area.yaml`` (``--viewer`` to watch the surface shrink).

Energies, over the vertex positions x of a triangle mesh:

    area:       E(x) = sum_f 1/2 |(x_1 - x_0) x (x_2 - x_0)|        (gradient descent: mean-curvature flow)
    dirichlet:  E(x) = sum_e 1/2 |x_a - x_b|^2                       (gradient descent: umbrella-Laplacian smoothing)

The gradient comes from the AD engine (``gradient: ad``) or from a plain hand-written Warp kernel (``gradient:
hand``): for the Dirichlet energy dE/dx_a = sum_{e=(a,b)} (x_a - x_b); for the area dA_f/dx_i = 1/2 n_f x (x_{i+2} -
x_{i+1}) (corners counter-clockwise, n_f the unit normal). Whichever drives the solver, the run compares both at the
start point (largest difference) and times them; ``metrics.json`` records it under ``gradient_comparison``.
"""

from __future__ import annotations

import pathlib
import time
from typing import Literal

import numpy as np
import warp as wp

import warp_meshad as wm
from warp_meshad.app import App as _AppBase
from warp_meshad.app import AppConfig
from warp_meshad.kernels.energies import dirichlet, surface_area

__all__ = ["App", "HandGradientProblem", "SmoothingConfig"]

_SPOT = str(pathlib.Path(__file__).resolve().parents[1] / "assets" / "meshes" / "spot.obj")


class SmoothingConfig(AppConfig):
    """Config of the smoothing app (fields beyond :class:`AppConfig`).

    Attributes:
        mesh: a closed or open triangle mesh (default: spot.obj).
        dtype: ``"float64"`` (the built-in energies are float64).
        energy: ``"area"`` (sum of face areas) or ``"dirichlet"`` (sum over edges of 1/2 |x_a - x_b|^2).
        gradient: ``"ad"`` (the AD engine) or ``"hand"`` (a hand-written Warp kernel).
        solver: ``"gradient_descent"`` or ``"lbfgs"``.
        step_size: first trial step of each line search (gradient descent) or of the first L-BFGS step [m per unit
            gradient].
        steps: rounds of ``iterations`` solver iterations (the viewer redraws after each).
        tolerance: stop when the gradient norm falls to it.
        fix_boundary: hold the boundary vertices of an open mesh fixed (minimal surfaces).
        timing_repeats: evaluations averaged when timing the AD and the hand-written gradient.
    """

    app: str = "smoothing"
    mesh: str = _SPOT
    dtype: Literal["float64"] = "float64"
    energy: Literal["area", "dirichlet"] = "dirichlet"
    gradient: Literal["ad", "hand"] = "ad"
    solver: Literal["gradient_descent", "lbfgs"] = "gradient_descent"
    step_size: float = 0.1
    steps: int = 20
    iterations: int = 10
    tolerance: float = 1e-8
    fix_boundary: bool = True
    timing_repeats: int = 20

    def validate(self):
        errors = super().validate()
        if not self.step_size > 0.0:
            errors.append(("step_size", f"expected a number > 0, got {self.step_size}"))
        if self.timing_repeats < 1:
            errors.append(("timing_repeats", f"expected an int >= 1, got {self.timing_repeats}"))
        return errors


@wp.kernel(enable_backward=False)
def _dirichlet_hand(
    edges: wp.array2d(dtype=wp.int32),
    x: wp.array(dtype=wp.vec3d),
    with_gradient: int,
    energy: wp.array(dtype=wp.float64),
    grad: wp.array(dtype=wp.vec3d),
):
    # one thread per edge: E_e = 1/2 |x_a - x_b|^2, dE/dx_a = x_a - x_b = -dE/dx_b
    e = wp.tid()
    a = edges[e, 0]
    b = edges[e, 1]
    d = x[a] - x[b]
    wp.atomic_add(energy, 0, wp.float64(0.5) * wp.dot(d, d))
    if with_gradient != 0:
        wp.atomic_add(grad, a, d)
        wp.atomic_sub(grad, b, d)


@wp.kernel(enable_backward=False)
def _area_hand(
    faces: wp.array2d(dtype=wp.int32),
    x: wp.array(dtype=wp.vec3d),
    with_gradient: int,
    energy: wp.array(dtype=wp.float64),
    grad: wp.array(dtype=wp.vec3d),
):
    # one thread per face: A = 1/2 |N|, N = (x1 - x0) x (x2 - x0); dA/dx_i = 1/2 n x (x_{i+2} - x_{i+1})
    f = wp.tid()
    i0 = faces[f, 0]
    i1 = faces[f, 1]
    i2 = faces[f, 2]
    x0 = x[i0]
    x1 = x[i1]
    x2 = x[i2]
    nrm = wp.cross(x1 - x0, x2 - x0)
    twice = wp.length(nrm)
    wp.atomic_add(energy, 0, wp.float64(0.5) * twice)
    if with_gradient != 0:
        n = nrm / twice
        h = wp.float64(0.5)
        wp.atomic_add(grad, i0, h * wp.cross(n, x2 - x1))
        wp.atomic_add(grad, i1, h * wp.cross(n, x0 - x2))
        wp.atomic_add(grad, i2, h * wp.cross(n, x1 - x0))


class HandGradientProblem:
    """The smoothing energy with a hand-written gradient, shaped like :class:`warp_meshad.Problem` for the solvers
    (``eval``, ``eval_with_gradient``; float64, vec3d variables).

    Args:
        mesh: the triangle mesh (its edges or faces are the elements).
        energy: ``"dirichlet"`` or ``"area"``.
        device: Warp device.
    """

    def __init__(self, mesh, energy: str, device):
        self.variable_count = mesh.vertex_count
        self.variable_dim = 3
        self.variable_type = wp.vec3d
        self.dtype = wp.float64
        self.device = wp.get_device(device)
        if energy == "dirichlet":
            self.kernel, elements = _dirichlet_hand, mesh.edges
        elif energy == "area":
            self.kernel, elements = _area_hand, mesh.faces
        else:
            raise ValueError(f"energy: expected 'dirichlet' or 'area', got {energy!r}")
        self.elements = wp.array(elements, dtype=wp.int32, device=self.device)
        self._energy = wp.zeros(1, dtype=wp.float64, device=self.device)
        self._grad = wp.zeros(self.variable_count, dtype=wp.vec3d, device=self.device)

    def _launch(self, x, with_gradient: int) -> float:
        self._energy.zero_()
        if with_gradient:
            self._grad.zero_()
        wp.launch(self.kernel, dim=self.elements.shape[0], inputs=[self.elements, x, with_gradient, self._energy,
                                                                   self._grad], device=self.device)
        return float(self._energy.numpy()[0])

    def eval(self, x) -> float:
        """Energy at x (wp.array [vertex_count] of vec3d)."""
        return self._launch(x, 0)

    def eval_with_gradient(self, x):
        """(energy, gradient); the gradient is this object's buffer, overwritten by the next call."""
        return self._launch(x, 1), self._grad


class App(_AppBase):
    """The smoothing app: each :meth:`step` runs ``config.iterations`` solver iterations.

    Attributes (beyond :class:`~warp_meshad.app.App`):
        problem: the AD :class:`warp_meshad.Problem`; ``hand`` the :class:`HandGradientProblem`.
        x: positions, wp.array [vertex_count] of vec3d; ``x0`` the start (numpy).
    """

    name = "smoothing"
    config_class = SmoothingConfig
    continuous_objective = True

    def __init__(self, config: SmoothingConfig):
        super().__init__(config)
        c = self.config
        mesh = self.mesh
        self.problem = wm.Problem(mesh.vertex_count, 3, wp.float64, self.device)
        if c.energy == "area":
            self.problem.add_term(mesh.faces, surface_area, name="area")
        else:
            self.problem.add_term(mesh.edges, dirichlet, name="dirichlet")
        self.hand = HandGradientProblem(mesh, c.energy, self.device)
        self.x0 = np.array(mesh.vertices, dtype=np.float64)
        self.x = wp.array(self.x0, dtype=wp.vec3d, device=self.device)
        boundary = mesh.boundary_vertices if c.fix_boundary else np.zeros(0, dtype=np.int64)
        self.fixed = np.asarray(boundary, dtype=np.int64)
        fixed = self.fixed if self.fixed.size else None
        driver = self.problem if c.gradient == "ad" else self.hand
        if c.solver == "gradient_descent":
            self.solver = wm.GradientDescentSolver(driver, step=c.step_size, fixed=fixed)
        else:
            self.solver = wm.LBFGSSolver(driver, initial_step=c.step_size, fixed=fixed)
        self.comparison = None

    def compare_gradients(self) -> dict:
        """AD vs hand-written gradient at the current point: largest difference and mean time per evaluation."""
        x = self.x
        timings = {}
        grads = {}
        for label, p in (("ad", self.problem), ("hand", self.hand)):
            f, g = p.eval_with_gradient(x)  # warm-up (compiles on first use)
            wp.synchronize_device(self.device)
            t0 = time.perf_counter()
            for _ in range(self.config.timing_repeats):
                f, g = p.eval_with_gradient(x)
            wp.synchronize_device(self.device)
            timings[label] = (time.perf_counter() - t0) * 1000.0 / self.config.timing_repeats
            grads[label] = (f, g.numpy().copy())
        (fa, ga), (fh, gh) = grads["ad"], grads["hand"]
        scale = max(float(np.abs(gh).max()), 1e-300)
        return {
            "energy": self.config.energy,
            "ad_ms": timings["ad"],
            "hand_ms": timings["hand"],
            "ad_over_hand": timings["ad"] / max(timings["hand"], 1e-12),
            "max_abs_difference": float(np.abs(ga - gh).max()),
            "max_relative_difference": float(np.abs(ga - gh).max() / scale),
            "energy_difference": abs(fa - fh),
            "repeats": self.config.timing_repeats,
        }

    def step(self) -> dict:
        """``config.iterations`` iterations of the solver from the current positions."""
        if self.comparison is None:
            self.comparison = self.compare_gradients()
        c = self.config
        result = self.solver.solve(self.x, max_iterations=c.iterations, tolerance=c.tolerance)
        wp.copy(self.x, result.x)
        return self.record(result)

    def positions(self) -> np.ndarray:
        return self.x.numpy().astype(np.float64)

    def quantities(self) -> dict:
        x = self.positions()
        return {"displacement": ("vertices", np.linalg.norm(x - self.x0, axis=1))}

    def check_final(self) -> None:
        """The energy decreased monotonically over all iterations, no NaN, the AD and hand-written gradients agree,
        fixed vertices did not move."""
        super().check_final()
        energies = [e for rec in self.history for e in rec["energies"]]
        steps = np.diff(energies)
        tol = 1e-12 * max(1.0, abs(energies[0])) if energies else 0.0
        assert np.all(steps <= tol), f"smoothing: energy rose at iteration {int(np.argmax(steps > tol)) + 1}"
        if sum(r["iterations"] for r in self.history) > 0:
            assert energies[-1] < energies[0], f"smoothing: energy did not decrease ({energies[0]} -> {energies[-1]})"
        cmp = self.comparison
        if cmp is not None:
            assert cmp["max_relative_difference"] < 1e-9, f"smoothing: AD and hand-written gradients differ: {cmp}"
        if self.fixed.size:
            moved = np.abs(self.positions()[self.fixed] - self.x0[self.fixed]).max()
            assert moved == 0.0, f"smoothing: fixed boundary vertices moved by {moved:.3e}"

    def extra_metrics(self) -> dict:
        if self.comparison is None:
            self.comparison = self.compare_gradients()
        return {
            "gradient_comparison": self.comparison,
            "start_energy": self.history[0]["energies"][0] if self.history else None,
            "fixed_vertex_count": int(self.fixed.size),
        }

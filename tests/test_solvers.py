"""Nonlinear solvers: quadratic in one Newton step, symmetric Dirichlet on woody to its 4*area optimum, L-BFGS / GD
decrease, Gauss-Newton trilateration, pins, SciPy vs Warp CG, stopping reasons; steepest-descent fallbacks, capped
CG solves and the 'auto' back-end's cuDSS report in the SolveResult. Every test runs on the test device
($WARP_MESHAD_TEST_DEVICE); the gpu-marked ones need CUDA (cuDSS, 'auto' on a GPU)."""

import os
import pathlib
import warnings
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sps
import scipy.sparse.linalg as spla
import warp as wp

from warp_meshad._src.solve import linear as linear
from warp_meshad._src.solve.linear import LinearSolveError, LinearSolver, registry
from warp_meshad._src.problem.problem import Problem
from warp_meshad._src.solve.options import LineSearch, Projection
from warp_meshad._src.solve.solvers import (
    GaussNewtonSolver,
    GradientDescentSolver,
    LBFGSSolver,
    NewtonCGSolver,
    NewtonHooks,
    NewtonSolver,
    SolveResult,
)
from warp_meshad.kernels import ad

wp.config.log_level = wp.LOG_WARNING

MESHES = pathlib.Path(__file__).resolve().parents[1] / "assets" / "meshes"
DEVICE = os.environ.get("WARP_MESHAD_TEST_DEVICE", "cpu")  # of the module-scoped woody problem

pytestmark = pytest.mark.device


# ----------------------------------------------------------------------------------------------------------------------
# A quadratic: anchors w_i/2 |x_i - t_i|^2 plus zero-rest springs 1/2 |x_a - x_b|^2 on a chain
# ----------------------------------------------------------------------------------------------------------------------


@wp.struct
class AnchorData:
    target: wp.array(dtype=wp.vec3d)
    stiffness: wp.array(dtype=wp.float64)


@wp.func
def anchor_energy(e: int, xa: Any, data: AnchorData):
    d = xa - data.target[e]
    return wp.float64(0.5) * data.stiffness[e] * ad.dot(d, d)


@wp.func
def chain_spring(e: int, xa: Any, xb: Any):
    d = xa - xb
    return wp.float64(0.5) * ad.dot(d, d)


def quadratic_problem(n=8, seed=0, device="cpu", stiffness=None):
    """(problem, K, rhs, x0): anchors + chain springs, minimized where K x = rhs; ``stiffness`` of the anchors
    (default random in [0.5, 2]; below -4 everywhere makes K negative definite: Newton's direction ascends)."""
    rng = np.random.default_rng(seed)
    targets = rng.standard_normal((n, 3))
    stiffness = rng.uniform(0.5, 2.0, n) if stiffness is None else np.full(n, float(stiffness))
    problem = Problem(n, 3, wp.float64, device)
    data = AnchorData()
    data.target = wp.array(targets, dtype=wp.vec3d, device=device)
    data.stiffness = wp.array(stiffness, dtype=wp.float64, device=device)
    problem.add_term(np.arange(n)[:, None], anchor_energy, data)
    chain = np.stack([np.arange(n - 1), np.arange(1, n)], axis=1)
    problem.add_term(chain, chain_spring)
    # dense per-coordinate system: (diag(w) + L) x = diag(w) t
    L = np.zeros((n, n))
    for a, b in chain:
        L[a, a] += 1
        L[b, b] += 1
        L[a, b] -= 1
        L[b, a] -= 1
    K = np.diag(stiffness) + L
    x0 = wp.array(rng.standard_normal((n, 3)), dtype=wp.vec3d, device=device)
    return problem, K, stiffness[:, None] * targets, x0


def test_quadratic_converges_in_one_newton_step(device):
    problem, K, rhs, x0 = quadratic_problem(device=device)
    x0_np = x0.numpy().copy()
    result = NewtonSolver(problem, linear_solver="scipy", projection=None).solve(x0, tolerance=1e-10)
    assert isinstance(result, SolveResult)
    assert result.converged and result.iterations == 1, (result.iterations, result.reason)
    assert result.reason in ("gradient_norm", "newton_decrement")
    assert result.step_sizes == [1.0]
    np.testing.assert_allclose(result.x.numpy(), np.linalg.solve(K, rhs), rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(x0.numpy(), x0_np)  # the input is untouched
    assert result.energies[1] < result.energies[0]
    assert set(result.time_ms) >= {"derivatives", "linear_solve", "line_search", "total"}
    assert result.linear_solver == "scipy" and result.cudss_skipped_reason is None  # named, not picked by 'auto'
    assert result.steepest_descent_fallbacks == 0 and result.fallback_reasons == {}
    assert result.linear_converged == [True] and result.linear_solves_capped == 0


@pytest.mark.parametrize("device_loop", [False, True], ids=["host_loop", "device_loop"])
def test_hessian_shift_solves_the_shifted_system(device, device_loop):
    """``hessian_shift=sigma``: the direction solves (H + sigma I) d = -g; on a convex quadratic the full step is
    accepted, so one iteration lands on x0 - (K + sigma I)^-1 (K x0 - rhs), in the host and the device loop."""
    problem, K, rhs, x0 = quadratic_problem(device=device)
    sigma = 0.5
    result = NewtonSolver(problem, linear_solver="scipy", projection=None, hessian_shift=sigma,
                          device_loop=device_loop).solve(x0, max_iterations=1, tolerance=0.0)
    assert result.iterations == 1 and result.step_sizes == [1.0]
    x = x0.numpy()
    expected = x - np.linalg.solve(K + sigma * np.eye(len(K)), K @ x - rhs)
    np.testing.assert_allclose(result.x.numpy(), expected, rtol=1e-10, atol=1e-12)
    assert np.abs(expected - np.linalg.solve(K, rhs)).max() > 1e-3  # not the unshifted Newton step


def test_hessian_shift_is_checked():
    problem, _, _, _ = quadratic_problem()
    for bad in (-1e-3, float("nan"), float("inf"), "x"):
        with pytest.raises(ValueError, match=r"hessian_shift: expected a finite number >= 0"):
            NewtonSolver(problem, linear_solver="scipy", hessian_shift=bad)


def test_hessian_shift_with_projection_asks_cudss_for_cholesky(monkeypatch):
    """A shifted projected Hessian is SPD: a back-end named "cudss" (or "auto") gets matrix_type="spd_or_general"
    (Cholesky, LU if one fails) unless the caller names one; an unprojected Hessian may be indefinite: no change."""
    from warp_meshad._src.solve import solvers

    seen = []

    def fake(name, **options):
        seen.append(options)
        return linear.ScipySolver()

    monkeypatch.setattr(solvers, "make_linear_solver", fake)
    problem, _, _, _ = quadratic_problem()
    NewtonSolver(problem, linear_solver="cudss", hessian_shift=1e-8)
    NewtonSolver(problem, linear_solver="auto", hessian_shift=1e-8, linear_solver_options={"matrix_type": "general"})
    NewtonSolver(problem, linear_solver="cudss")
    NewtonSolver(problem, linear_solver="cudss", projection=None, hessian_shift=1e-8)
    assert [o.get("matrix_type") for o in seen] == ["spd_or_general", "general", None, None]


def test_newton_hooks_run_in_order_and_steer_the_loop(device):
    """The shells app's hooks: refresh before the derivatives, the line search's own trial energy (here rejecting its
    first trial), the step bound after it, and an extra stop test on the direction."""
    problem, K, rhs, x0 = quadratic_problem(seed=3, device=device)
    order, points, trials = [], [], []

    def before_derivatives(x):
        order.append("before_derivatives")
        points.append(x.numpy().copy())

    def line_search_energy(x, d):
        order.append("line_search_energy")

        def energy(y):
            trials.append(y.numpy().copy())
            return float("inf") if len(trials) == 1 else problem.eval(y)

        return energy

    def step_bound(x, d):
        order.append("step_bound")
        return 1.0

    def stop(x, d):
        order.append("stop")
        return "second_point" if len(points) == 2 else None

    hooks = NewtonHooks(before_derivatives=before_derivatives, line_search_energy=line_search_energy, stop=stop)
    solver = NewtonSolver(problem, linear_solver="scipy", projection=None, line_search=LineSearch(shrink=0.5),
                          step_bound_fn=step_bound, hooks=hooks)
    result = solver.solve(x0, tolerance=0.0, gradient_tolerance=0.0, energy_tolerance=0.0)
    assert order == ["before_derivatives", "stop", "line_search_energy", "step_bound", "before_derivatives", "stop"]
    assert result.converged and result.reason == "second_point" and result.iterations == 1
    assert result.step_sizes == [0.5] and result.line_search_tries == [2] and len(trials) == 2
    x_half = x0.numpy() + 0.5 * (np.linalg.solve(K, rhs) - x0.numpy())  # half the exact Newton step
    np.testing.assert_allclose(result.x.numpy(), x_half, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(points[0], x0.numpy())
    np.testing.assert_allclose(points[1], x_half, rtol=1e-10, atol=1e-12)
    assert result.time_ms["before_derivatives"] >= 0.0
    plain = NewtonSolver(problem, linear_solver="scipy", projection=None).solve(x0, max_iterations=1)
    assert "before_derivatives" not in plain.time_ms
    with pytest.raises(TypeError, match="hooks: expected a NewtonHooks or None, got dict"):
        NewtonSolver(problem, hooks={"stop": stop})


def test_pins_never_move_and_free_part_is_optimal(device):
    problem, K, rhs, x0 = quadratic_problem(seed=1, device=device)
    fixed = [0, 5]
    result = NewtonSolver(problem, linear_solver="scipy", projection=None, fixed=fixed).solve(x0, tolerance=1e-10)
    assert result.converged
    x = result.x.numpy()
    np.testing.assert_array_equal(x[fixed], x0.numpy()[fixed])
    free = np.setdiff1d(np.arange(K.shape[0]), fixed)
    expected = np.linalg.solve(K[np.ix_(free, free)], rhs[free] - K[np.ix_(free, fixed)] @ x0.numpy()[fixed])
    np.testing.assert_allclose(x[free], expected, rtol=1e-9, atol=1e-11)


def test_scipy_and_cg_newton_agree(device):
    problem, K, rhs, x0 = quadratic_problem(seed=2, device=device)
    r_scipy = NewtonSolver(problem, linear_solver="scipy").solve(x0, tolerance=1e-12)
    r_cg = NewtonSolver(problem, linear_solver="cg", linear_solver_options={"tol": 1e-12}).solve(x0, tolerance=1e-12)
    assert r_scipy.converged and r_cg.converged and r_cg.linear_solver == "cg"
    assert r_cg.linear_solves_capped == 0 and all(r_cg.linear_converged) and len(r_cg.linear_converged) >= 1
    np.testing.assert_allclose(r_cg.x.numpy(), r_scipy.x.numpy(), rtol=1e-8, atol=1e-9)


def test_newton_cg_matrix_free_solves_quadratic(device):
    problem, K, rhs, x0 = quadratic_problem(seed=3, device=device)
    result = NewtonCGSolver(problem, forcing=1e-3).solve(x0, tolerance=1e-12, gradient_tolerance=1e-9)
    assert result.converged, result.reason
    np.testing.assert_allclose(result.x.numpy(), np.linalg.solve(K, rhs), rtol=1e-7, atol=1e-8)
    assert sum(result.linear_iterations) >= 1 and result.steepest_descent_fallbacks == 0


def test_stopping_rules_non_finite_and_caps(device):
    problem, K, rhs, x0 = quadratic_problem(seed=4, device=device)
    bad = x0.numpy().copy()
    bad[2, 1] = np.nan
    with pytest.raises(ValueError, match=r"NewtonSolver.solve\(x=...\): expected finite values, got NaN or inf at 1 "
                                         r"variable, first x\[2\]"):
        NewtonSolver(problem, linear_solver="scipy").solve(wp.array(bad, dtype=wp.vec3d, device=device))
    # asked not to check, the solve starts and stops on its first non-finite evaluation
    result = NewtonSolver(problem, linear_solver="scipy", projection=None).solve(
        wp.array(bad, dtype=wp.vec3d, device=device), check_finite=False)
    assert not result.converged and result.reason in ("non_finite_energy", "non_finite_gradient")
    assert result.iterations == 0
    result = NewtonSolver(problem, linear_solver="scipy", projection=None).solve(x0, max_iterations=0)
    assert result.reason == "max_iterations" and result.iterations == 0 and len(result.energies) == 1
    stops = []
    result = NewtonCGSolver(problem, cg_maxiter=2).solve(
        x0, tolerance=0.0, energy_tolerance=0.0, callback=lambda i, x, f: stops.append(i) or i == 2
    )
    assert result.reason == "callback" and stops == [1, 2]
    with pytest.raises(TypeError, match=r"NewtonSolver\(projection=...\): expected a Projection or None, got 'clamp' "
                                        r"\(Projection\(mode=...\) holds the mode\)"):
        NewtonSolver(problem, projection="clamp")
    with pytest.raises(ValueError, match=r"x: expected shape \(8,\), got \(3,\)"):
        NewtonSolver(problem, linear_solver="scipy").solve(wp.zeros(3, dtype=wp.vec3d, device=device))
    with pytest.raises(ValueError, match="cg_maxiter: expected an int >= 1 or None, got 0"):
        NewtonCGSolver(problem, cg_maxiter=0)


# ----------------------------------------------------------------------------------------------------------------------
# Symmetric Dirichlet parametrization of woody (planar disk: the optimum is an isometry, energy 4 * area)
# ----------------------------------------------------------------------------------------------------------------------


@wp.struct
class SymDirichletData:
    rest_inv: wp.array(dtype=wp.mat22d)
    area: wp.array(dtype=wp.float64)


@wp.func
def sym_dirichlet(e: int, a: Any, b: Any, c: Any, data: SymDirichletData):
    """area * (|J|_F^2 + |J^-1|_F^2), +inf on an inverted triangle."""
    J = ad.matmul(ad.mat22_cols(b - a, c - a), data.rest_inv[e])
    E = data.area[e] * (ad.frobenius_sq(J) + ad.frobenius_sq(ad.inverse(J)))
    return ad.where(ad.det(J) > wp.float64(0.0), E, wp.float64(wp.inf))


def _read_obj(path):
    verts, faces = [], []
    for line in path.read_text().splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "v":
            verts.append([float(v) for v in parts[1:4]])
        elif parts[0] == "f":
            faces.append([int(p.split("/")[0]) - 1 for p in parts[1:4]])
    return np.array(verts), np.array(faces, dtype=np.int64)


def _signed_areas(uv, F):
    d1 = uv[F[:, 1]] - uv[F[:, 0]]
    d2 = uv[F[:, 2]] - uv[F[:, 0]]
    return 0.5 * (d1[:, 0] * d2[:, 1] - d1[:, 1] * d2[:, 0])


def _tutte(V, F):
    """Uniform Tutte embedding: boundary loop on a circle by arc length, interior vertices at neighbour averages."""
    n = len(V)
    e = np.sort(np.concatenate([F[:, [0, 1]], F[:, [1, 2]], F[:, [2, 0]]]), axis=1)
    edges, count = np.unique(e, axis=0, return_counts=True)
    adjacency = {}
    for a, b in edges[count == 1]:
        adjacency.setdefault(a, []).append(b)
        adjacency.setdefault(b, []).append(a)
    loop, prev = [edges[count == 1][0][0]], None
    while True:
        nxt = [v for v in adjacency[loop[-1]] if v != prev][0]
        if nxt == loop[0]:
            break
        prev = loop[-1]
        loop.append(nxt)
    loop = np.array(loop)
    seg = np.linalg.norm(V[np.roll(loop, -1)] - V[loop], axis=1)
    t = np.concatenate([[0.0], np.cumsum(seg)[:-1]]) / seg.sum() * 2 * np.pi
    uv = np.zeros((n, 2))
    uv[loop] = np.stack([np.cos(t), np.sin(t)], axis=1)
    W = sps.coo_matrix((np.ones(2 * len(edges)), (np.r_[edges[:, 0], edges[:, 1]], np.r_[edges[:, 1], edges[:, 0]])),
                       shape=(n, n)).tocsr()
    L = (sps.diags(np.asarray(W.sum(axis=1)).ravel()) - W).tocsr()
    interior = np.setdiff1d(np.arange(n), loop)
    uv[interior] = spla.spsolve(L[interior][:, interior].tocsc(), -(L[interior][:, loop] @ uv[loop]))
    if _signed_areas(uv, F).sum() < 0:
        uv[:, 1] *= -1.0
    return uv


@pytest.fixture(scope="module")
def woody():
    return woody_problem(DEVICE)


def woody_problem(device):
    """(problem, faces, Tutte uv scaled to the surface's area, area) for woody.obj, on ``device``."""
    V, F = _read_obj(MESHES / "woody.obj")
    e1 = V[F[:, 1]] - V[F[:, 0]]
    e2 = V[F[:, 2]] - V[F[:, 0]]
    normal = np.cross(e1, e2)
    area = 0.5 * np.linalg.norm(normal, axis=1)
    ex = e1 / np.linalg.norm(e1, axis=1)[:, None]
    ey = np.cross(normal / (2 * area)[:, None], ex)
    rest = np.zeros((len(F), 2, 2))  # columns: the two edges in the triangle's own 2D frame
    rest[:, 0, 0] = np.linalg.norm(e1, axis=1)
    rest[:, 0, 1] = (e2 * ex).sum(axis=1)
    rest[:, 1, 1] = (e2 * ey).sum(axis=1)
    uv = _tutte(V, F)
    uv *= np.sqrt(area.sum() / _signed_areas(uv, F).sum())  # same total area as the surface
    assert (_signed_areas(uv, F) > 0).all()
    problem = Problem(len(V), 2, wp.float64, device)
    data = SymDirichletData()
    data.rest_inv = wp.array(np.linalg.inv(rest), dtype=wp.mat22d, device=device)
    data.area = wp.array(area, dtype=wp.float64, device=device)
    problem.add_term(F, sym_dirichlet, data)
    return problem, F, uv, float(area.sum())


def _assert_monotone(energies):
    e = np.asarray(energies)
    assert np.all(np.isfinite(e))
    assert np.all(np.diff(e) <= 1e-12 * np.abs(e[:-1])), e


def test_projected_newton_symmetric_dirichlet_woody(woody):
    problem, F, uv, area = woody
    x0 = wp.array(uv, dtype=wp.vec2d, device=problem.device)
    result = NewtonSolver(problem, linear_solver="scipy", projection=Projection()).solve(x0, max_iterations=50,
                                                                                    tolerance=1e-6)
    assert result.converged, result.reason
    _assert_monotone(result.energies)
    assert result.energies[-1] < 0.5 * result.energies[0]
    # woody is planar, so the optimum is an isometry: energy 4 * area, every triangle positively oriented
    np.testing.assert_allclose(result.energies[-1], 4.0 * area, rtol=1e-6)
    assert (_signed_areas(result.x.numpy(), F) > 0).all()
    assert len(result.newton_decrements) == result.iterations + (result.reason == "newton_decrement")


@pytest.mark.parametrize("solver_cls", [LBFGSSolver, GradientDescentSolver, NewtonCGSolver])
def test_first_order_and_matrix_free_decrease_energy(woody, solver_cls):
    problem, F, uv, area = woody
    x0 = wp.array(uv, dtype=wp.vec2d, device=problem.device)
    result = solver_cls(problem).solve(x0, max_iterations=15)
    _assert_monotone(result.energies)
    assert result.iterations >= 1 and result.energies[-1] < result.energies[0]
    assert result.energies[-1] >= 4.0 * area * (1 - 1e-9)
    assert (_signed_areas(result.x.numpy(), F) > 0).all()


def test_pinned_parametrization_keeps_pins(woody):
    problem, F, uv, area = woody
    x0 = wp.array(uv, dtype=wp.vec2d, device=problem.device)
    fixed = np.array([0, 10, 100])
    for solver in (NewtonSolver(problem, linear_solver="scipy", fixed=fixed), LBFGSSolver(problem, fixed=fixed)):
        result = solver.solve(x0, max_iterations=5)
        assert result.energies[-1] < result.energies[0]
        np.testing.assert_array_equal(result.x.numpy()[fixed], uv[fixed])


# ----------------------------------------------------------------------------------------------------------------------
# Gauss-Newton: trilateration (distances to anchors), a zero-residual nonlinear least-squares problem
# ----------------------------------------------------------------------------------------------------------------------


@wp.struct
class RangeData:
    anchor: wp.array(dtype=wp.vec2d)
    distance: wp.array(dtype=wp.float64)


@wp.func
def range_residual(e: int, p: Any, data: RangeData):
    return ad.length(p - data.anchor[e]) - data.distance[e]


def test_gauss_newton_trilateration(device):
    anchors = np.array([[0.0, 0.0], [4.0, 0.0], [0.0, 3.0], [5.0, 5.0]])
    answer = np.array([1.5, 2.0])
    problem = Problem(1, 2, wp.float64, device)
    data = RangeData()
    data.anchor = wp.array(anchors, dtype=wp.vec2d, device=device)
    data.distance = wp.array(np.linalg.norm(anchors - answer, axis=1), dtype=wp.float64, device=device)
    problem.add_residual_term(np.zeros((len(anchors), 1), dtype=np.int32), range_residual, data, weight=2.0)
    x0 = wp.array([[3.0, 0.5]], dtype=wp.vec2d, device=device)
    result = GaussNewtonSolver(problem, linear_solver="scipy").solve(x0, max_iterations=30, tolerance=1e-14,
                                                                     gradient_tolerance=1e-10)
    assert result.converged, result.reason
    np.testing.assert_allclose(result.x.numpy()[0], answer, rtol=0, atol=1e-8)
    assert result.energies[-1] < 1e-15
    _assert_monotone(result.energies)
    damped = GaussNewtonSolver(problem, linear_solver="scipy", damping=1e-3).solve(x0, max_iterations=60,
                                                                                   gradient_tolerance=1e-9)
    np.testing.assert_allclose(damped.x.numpy()[0], answer, rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------------------------------------------------
# Failures made visible: steepest-descent fallbacks, CG solves at their cap, why 'auto' did not pick cuDSS
# ----------------------------------------------------------------------------------------------------------------------


class _FailingSolver(LinearSolver):
    """A back-end whose every solve fails, as a singular matrix makes SuperLU or cuDSS fail."""

    name = "failing"

    def solve(self, A, b, x):
        raise LinearSolveError("failing: always")


def test_newton_direction_that_ascends_falls_back_to_minus_g_and_is_counted(device):
    # anchors of stiffness -5 (and springs of Laplacian eigenvalues <= 4): H is negative definite, so H d = -g gives
    # d . g = -g^T H^-1 g > 0, an ascent direction; the iteration steps along -g instead and says so
    problem, K, rhs, x0 = quadratic_problem(seed=7, device=device, stiffness=-5.0)
    assert np.linalg.eigvalsh(K).max() < 0.0
    result = NewtonSolver(problem, linear_solver="scipy", projection=None).solve(x0, max_iterations=2)
    assert result.iterations == 2 and result.energies[-1] < result.energies[0]
    assert result.steepest_descent_fallbacks == 2 and result.fallback_reasons == {"not_descent_direction": 2}
    assert result.linear_converged == [True, True] and result.linear_solves_capped == 0  # the solves were fine
    # projected, the Hessian is PSD: Newton's own direction descends, nothing falls back
    projected = NewtonSolver(problem, linear_solver="scipy", projection=Projection()).solve(x0, max_iterations=1)
    assert projected.steepest_descent_fallbacks == 0 and projected.fallback_reasons == {}


def test_failed_linear_solve_falls_back_to_minus_g_and_is_counted(device):
    problem, K, rhs, x0 = quadratic_problem(seed=8, device=device)
    result = NewtonSolver(problem, linear_solver=_FailingSolver(), projection=None).solve(
        x0, max_iterations=3, tolerance=0.0, energy_tolerance=0.0)
    # the solve goes on along -g (it used to stop with reason "linear_solve_failed")
    assert result.iterations == 3 and result.reason == "max_iterations"
    assert result.steepest_descent_fallbacks == 3 and result.fallback_reasons == {"linear_solve_failed": 3}
    assert result.linear_converged == [False] * 3 and result.linear_iterations == [0] * 3
    assert result.linear_solves_capped == 0  # failed, not capped
    _assert_monotone(result.energies)
    assert result.energies[-1] < result.energies[0]
    g = problem.eval_with_gradient(x0)[1].numpy()
    # the first step is alpha * (-g) from x0, alpha the accepted Armijo step
    np.testing.assert_allclose(result.energies[1], problem.eval(wp.array(
        x0.numpy() - result.step_sizes[0] * g, dtype=wp.vec3d, device=device)), rtol=1e-12)


def test_cg_solves_stopped_at_their_cap_are_counted(device):
    problem, K, rhs, x0 = quadratic_problem(seed=9, device=device)
    capped = NewtonSolver(problem, linear_solver="cg", linear_solver_options={
        "maxiter": 1, "preconditioner": "none", "tol": 1e-14}).solve(x0, max_iterations=3, tolerance=0.0)
    assert capped.iterations >= 2 and len(capped.linear_converged) == capped.iterations
    assert capped.linear_solves_capped == capped.iterations and not any(capped.linear_converged)
    assert capped.linear_iterations == [1] * capped.iterations
    assert capped.steepest_descent_fallbacks == 0  # one CG step from 0 is -g scaled: it descends
    # the inner CG of Newton-CG: a cap of one iteration cannot meet the forcing tolerance on this system
    inner = NewtonCGSolver(problem, cg_maxiter=1, forcing=1e-6).solve(x0, max_iterations=2, tolerance=0.0)
    assert inner.linear_solves_capped == inner.iterations == 2 and inner.linear_converged == [False, False]
    uncapped = NewtonCGSolver(problem, forcing=1e-6).solve(x0, max_iterations=2, tolerance=0.0)
    assert uncapped.linear_solves_capped == 0 and uncapped.linear_converged == [True] * uncapped.iterations


def test_newton_cg_negative_curvature_first_direction_is_a_counted_fallback(device):
    problem, K, rhs, x0 = quadratic_problem(seed=10, device=device, stiffness=-5.0)
    result = NewtonCGSolver(problem).solve(x0, max_iterations=1, tolerance=0.0)
    assert result.iterations == 1 and result.energies[1] < result.energies[0]
    assert result.steepest_descent_fallbacks == 1 and result.fallback_reasons == {"negative_curvature": 1}
    assert result.linear_iterations == [1] and result.linear_converged == [True]  # stopped by curvature, not the cap


def test_lbfgs_and_gradient_descent_report_no_fallbacks_on_a_convex_problem(device):
    problem, K, rhs, x0 = quadratic_problem(seed=11, device=device)
    for solver in (LBFGSSolver(problem), GradientDescentSolver(problem, step=0.2)):
        result = solver.solve(x0, max_iterations=5, tolerance=0.0)
        assert result.iterations == 5 and result.energies[-1] < result.energies[0]
        assert result.steepest_descent_fallbacks == 0 and result.linear_converged == []


def test_auto_linear_solver_reports_why_cudss_is_not_used(device, monkeypatch):
    monkeypatch.setattr(registry, "_warned_auto", set())
    problem, K, rhs, x0 = quadratic_problem(seed=12, device=device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        solver = NewtonSolver(problem, linear_solver="auto")
        NewtonSolver(problem, linear_solver="auto")  # a second 'auto' on the same device warns no more
    result = solver.solve(x0, tolerance=1e-10)
    assert result.converged and result.linear_solver == solver.linear_solver.name
    reason = solver.linear_solver.cudss_skipped_reason
    assert result.cudss_skipped_reason == reason
    ours = [w for w in caught if "cuDSS is not used" in str(w.message)]
    if wp.get_device(device).is_cpu:
        assert result.linear_solver == "qdldl" and "the device is the CPU" in reason
        assert ours == []  # expected on the CPU: a field, no warning
    elif result.linear_solver == "cudss":
        assert reason is None and ours == []
    else:
        assert reason.startswith("cuDSS ") and len(ours) == 1 and reason in str(ours[0].message)


# ----------------------------------------------------------------------------------------------------------------------
# GPU (need a CUDA device whatever the test device; skipped, saying so, without one)
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("linear_solver", ["auto", "cg", "cudss"])
def test_gpu_newton_quadratic(linear_solver):
    if linear_solver == "cudss":
        pytest.importorskip("nvmath", reason="the cudss back-end needs nvmath-python (pip install warp-meshad[cudss])")
    problem, K, rhs, x0 = quadratic_problem(seed=5, device="cuda:0")
    result = NewtonSolver(problem, linear_solver=linear_solver, linear_solver_options=(
        {"tol": 1e-12} if linear_solver == "cg" else None)).solve(x0, tolerance=1e-10)
    assert result.converged and result.steepest_descent_fallbacks == 0 and result.linear_solves_capped == 0
    if linear_solver != "auto":
        assert result.linear_solver == linear_solver
    np.testing.assert_allclose(result.x.numpy(), np.linalg.solve(K, rhs), rtol=1e-7, atol=1e-8)


@pytest.mark.gpu
@pytest.mark.parametrize("solver_cls", [NewtonCGSolver, LBFGSSolver])
def test_gpu_matrix_free_and_lbfgs_quadratic(solver_cls):
    problem, K, rhs, x0 = quadratic_problem(seed=6, device="cuda:0")
    result = solver_cls(problem).solve(x0, max_iterations=200, tolerance=1e-12, gradient_tolerance=1e-8)
    assert result.converged, result.reason
    np.testing.assert_allclose(result.x.numpy(), np.linalg.solve(K, rhs), rtol=1e-6, atol=1e-6)


def _counting_backend(backend):
    """Count a linear back-end's factorizing solves and its solves with kept factors."""
    counts = {"solve": 0, "resolve": 0}
    solve, resolve = backend.solve, backend.resolve

    def counted_solve(A, b, x):
        counts["solve"] += 1
        return solve(A, b, x)

    def counted_resolve(A, b, x):
        counts["resolve"] += 1
        return resolve(A, b, x)

    backend.solve, backend.resolve = counted_solve, counted_resolve
    return counts


@pytest.mark.parametrize("device_loop", [False, True], ids=["host_loop", "device_loop"])
def test_keep_start_factors_solves_a_run_that_starts_at_the_factored_point_without_factorizing(device, device_loop):
    """Time steps of a quadratic whose anchors move between solves (the data enters the gradient only): every solve
    ends by factorizing at its last point for the stop test; with keep_start_factors the next solve, which starts
    there, takes its first direction from the kept factors. Same iterates as without; a start elsewhere factorizes."""
    runs = {}
    for keep in (False, True):
        problem, _, _, x0 = quadratic_problem(device=device)
        data = problem.terms[0].data
        targets = data.target.numpy()
        solver = NewtonSolver(problem, linear_solver="scipy", projection=None, keep_start_factors=keep,
                              device_loop=device_loop)
        counts = _counting_backend(solver.linear_solver)
        x, results = x0, []
        for step in range(3):
            data.target.assign(targets + 0.1 * (step + 1))
            results.append(solver.solve(x, tolerance=1e-12, gradient_tolerance=0.0))
            x = results[-1].x
        moved = wp.clone(x)
        moved.assign(moved.numpy() + 0.01)  # a start that is not the factored point
        results.append(solver.solve(moved, tolerance=1e-12, gradient_tolerance=0.0))
        runs[keep] = (results, dict(counts), solver.kept_solves)
    (plain, plain_counts, _), (kept, kept_counts, kept_solves) = runs[False], runs[True]
    for a, b in zip(plain, kept):
        assert a.iterations == b.iterations and a.reason == b.reason
        np.testing.assert_allclose(b.energies, a.energies, rtol=1e-12)
        np.testing.assert_allclose(b.x.numpy(), a.x.numpy(), rtol=1e-10, atol=1e-12)
    assert plain_counts["resolve"] == 0 and kept_solves == kept_counts["resolve"] == 2  # steps 2 and 3
    assert kept_counts["solve"] == plain_counts["solve"] - 2

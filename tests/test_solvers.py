"""Nonlinear solvers: quadratic in one Newton step, symmetric Dirichlet on woody to its 4*area optimum, L-BFGS / GD
decrease, Gauss-Newton trilateration, pins, SciPy vs Warp CG, stopping reasons."""

import pathlib
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sps
import scipy.sparse.linalg as spla
import warp as wp

from warp_meshad._src.problem import Problem
from warp_meshad._src.solvers import (
    GaussNewtonSolver,
    GradientDescentSolver,
    LBFGSSolver,
    NewtonCGSolver,
    NewtonSolver,
    SolveResult,
)
from warp_meshad.kernels import ad

wp.config.log_level = wp.LOG_WARNING

MESHES = pathlib.Path(__file__).resolve().parents[1] / "assets" / "meshes"


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


def quadratic_problem(n=8, seed=0, device="cpu"):
    rng = np.random.default_rng(seed)
    targets = rng.standard_normal((n, 3))
    stiffness = rng.uniform(0.5, 2.0, n)
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


def test_quadratic_converges_in_one_newton_step():
    problem, K, rhs, x0 = quadratic_problem()
    x0_np = x0.numpy().copy()
    result = NewtonSolver(problem, linear_solver="scipy", project_hessian=False).solve(x0, tolerance=1e-10)
    assert isinstance(result, SolveResult)
    assert result.converged and result.iterations == 1, (result.iterations, result.reason)
    assert result.reason in ("gradient_norm", "newton_decrement")
    assert result.step_sizes == [1.0]
    np.testing.assert_allclose(result.x.numpy(), np.linalg.solve(K, rhs), rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(x0.numpy(), x0_np)  # the input is untouched
    assert result.energies[1] < result.energies[0]
    assert set(result.time_ms) >= {"derivatives", "linear_solve", "line_search", "total"}
    assert result.linear_solver == "scipy"


def test_pins_never_move_and_free_part_is_optimal():
    problem, K, rhs, x0 = quadratic_problem(seed=1)
    fixed = [0, 5]
    result = NewtonSolver(problem, linear_solver="scipy", project_hessian=False, fixed=fixed).solve(x0, tolerance=1e-10)
    assert result.converged
    x = result.x.numpy()
    np.testing.assert_array_equal(x[fixed], x0.numpy()[fixed])
    free = np.setdiff1d(np.arange(K.shape[0]), fixed)
    expected = np.linalg.solve(K[np.ix_(free, free)], rhs[free] - K[np.ix_(free, fixed)] @ x0.numpy()[fixed])
    np.testing.assert_allclose(x[free], expected, rtol=1e-9, atol=1e-11)


def test_scipy_and_cg_newton_agree():
    problem, K, rhs, x0 = quadratic_problem(seed=2)
    r_scipy = NewtonSolver(problem, linear_solver="scipy").solve(x0, tolerance=1e-12)
    r_cg = NewtonSolver(problem, linear_solver="cg", linear_solver_options={"tol": 1e-12}).solve(x0, tolerance=1e-12)
    assert r_scipy.converged and r_cg.converged and r_cg.linear_solver == "cg"
    np.testing.assert_allclose(r_cg.x.numpy(), r_scipy.x.numpy(), rtol=1e-8, atol=1e-9)


def test_newton_cg_matrix_free_solves_quadratic():
    problem, K, rhs, x0 = quadratic_problem(seed=3)
    result = NewtonCGSolver(problem, forcing=1e-3).solve(x0, tolerance=1e-12, gradient_tolerance=1e-9)
    assert result.converged, result.reason
    np.testing.assert_allclose(result.x.numpy(), np.linalg.solve(K, rhs), rtol=1e-7, atol=1e-8)
    assert sum(result.linear_iterations) >= 1


def test_stopping_rules_non_finite_and_caps():
    problem, K, rhs, x0 = quadratic_problem(seed=4)
    bad = x0.numpy().copy()
    bad[2, 1] = np.nan
    result = NewtonSolver(problem, linear_solver="scipy", project_hessian=False).solve(wp.array(bad, dtype=wp.vec3d))
    assert not result.converged and result.reason in ("non_finite_energy", "non_finite_gradient")
    assert result.iterations == 0
    result = NewtonSolver(problem, linear_solver="scipy", project_hessian=False).solve(x0, max_iterations=0)
    assert result.reason == "max_iterations" and result.iterations == 0 and len(result.energies) == 1
    stops = []
    result = NewtonCGSolver(problem, cg_maxiter=2).solve(
        x0, tolerance=0.0, energy_tolerance=0.0, callback=lambda i, x, f: stops.append(i) or i == 2
    )
    assert result.reason == "callback" and stops == [1, 2]
    with pytest.raises(ValueError, match="projection"):
        NewtonSolver(problem, projection="flip")
    with pytest.raises(ValueError, match=r"x: expected shape \(8,\), got \(3,\)"):
        NewtonSolver(problem, linear_solver="scipy").solve(wp.zeros(3, dtype=wp.vec3d))


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
    return woody_problem()


def woody_problem():
    """(problem, faces, Tutte uv scaled to the surface's area, area) for woody.obj."""
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
    problem = Problem(len(V), 2, wp.float64, "cpu")
    data = SymDirichletData()
    data.rest_inv = wp.array(np.linalg.inv(rest), dtype=wp.mat22d)
    data.area = wp.array(area, dtype=wp.float64)
    problem.add_term(F, sym_dirichlet, data)
    return problem, F, uv, float(area.sum())


def _assert_monotone(energies):
    e = np.asarray(energies)
    assert np.all(np.isfinite(e))
    assert np.all(np.diff(e) <= 1e-12 * np.abs(e[:-1])), e


def test_projected_newton_symmetric_dirichlet_woody(woody):
    problem, F, uv, area = woody
    x0 = wp.array(uv, dtype=wp.vec2d)
    result = NewtonSolver(problem, linear_solver="scipy", project_hessian=True).solve(x0, max_iterations=50,
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
    x0 = wp.array(uv, dtype=wp.vec2d)
    result = solver_cls(problem).solve(x0, max_iterations=15)
    _assert_monotone(result.energies)
    assert result.iterations >= 1 and result.energies[-1] < result.energies[0]
    assert result.energies[-1] >= 4.0 * area * (1 - 1e-9)
    assert (_signed_areas(result.x.numpy(), F) > 0).all()


def test_pinned_parametrization_keeps_pins(woody):
    problem, F, uv, area = woody
    x0 = wp.array(uv, dtype=wp.vec2d)
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


def test_gauss_newton_trilateration():
    anchors = np.array([[0.0, 0.0], [4.0, 0.0], [0.0, 3.0], [5.0, 5.0]])
    answer = np.array([1.5, 2.0])
    problem = Problem(1, 2, wp.float64, "cpu")
    if not hasattr(problem, "eval_gauss_newton"):
        pytest.skip("Problem.eval_gauss_newton not available yet")
    data = RangeData()
    data.anchor = wp.array(anchors, dtype=wp.vec2d)
    data.distance = wp.array(np.linalg.norm(anchors - answer, axis=1), dtype=wp.float64)
    problem.add_residual_term(np.zeros((len(anchors), 1), dtype=np.int32), range_residual, data, weight=2.0)
    x0 = wp.array([[3.0, 0.5]], dtype=wp.vec2d)
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
# GPU (run on a CUDA host)
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(wp.get_cuda_device_count() == 0, reason="needs a CUDA device")
@pytest.mark.parametrize("linear_solver", ["auto", "cg"])
def test_gpu_newton_quadratic(linear_solver):
    problem, K, rhs, x0 = quadratic_problem(seed=5, device="cuda:0")
    result = NewtonSolver(problem, linear_solver=linear_solver, linear_solver_options=(
        {"tol": 1e-12} if linear_solver == "cg" else None)).solve(x0, tolerance=1e-10)
    assert result.converged
    np.testing.assert_allclose(result.x.numpy(), np.linalg.solve(K, rhs), rtol=1e-7, atol=1e-8)


@pytest.mark.gpu
@pytest.mark.skipif(wp.get_cuda_device_count() == 0, reason="needs a CUDA device")
@pytest.mark.parametrize("solver_cls", [NewtonCGSolver, LBFGSSolver])
def test_gpu_matrix_free_and_lbfgs_quadratic(solver_cls):
    problem, K, rhs, x0 = quadratic_problem(seed=6, device="cuda:0")
    result = solver_cls(problem).solve(x0, max_iterations=200, tolerance=1e-12, gradient_tolerance=1e-8)
    assert result.converged, result.reason
    np.testing.assert_allclose(result.x.numpy(), np.linalg.solve(K, rhs), rtol=1e-6, atol=1e-6)

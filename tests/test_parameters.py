"""Parameter derivatives (add_term(..., parameters=...)) and implicit differentiation through a solve."""

import re
from typing import Any

import numpy as np
import pytest
import warp as wp

import warp_meshad as wm
from warp_meshad.kernels import ad

pytestmark = pytest.mark.device  # problems and arrays made without a device go to $WARP_MESHAD_TEST_DEVICE


@wp.struct
class SpringParams:
    rest: wp.array(dtype=wp.float64)
    k: wp.float64
    anchor: wp.vec3d


@wp.func
def spring_param(e: int, xa: Any, xb: Any, data: SpringParams):
    l = ad.length(xa - xb)
    d = l - data.rest[e]
    return 0.5 * data.k * d * d + 0.1 * ad.length_sq(xa - data.anchor) * data.rest[e]


def spring_problem(mesh, device=None, parameters=("rest", "k", "anchor")):
    data = SpringParams()
    data.rest = wp.array(0.9 * mesh.edge_lengths(), dtype=wp.float64, device=device)
    data.k = wp.float64(3.0)
    data.anchor = wp.vec3d(0.2, -0.1, 0.3)
    p = wm.Problem(mesh.vertex_count, 3, dtype=wp.float64, device=device)
    p.add_term(mesh.edges, spring_param, data, parameters=parameters)
    return p


def grad_at(p, X, theta):
    p.set_parameters(theta)
    f, g = p.eval_with_gradient(wp.array(X, dtype=wp.vec3d, device=p.device))
    return f, g.numpy().reshape(-1).copy()


def test_parameter_layout_and_round_trip():
    mesh = wm.TriMesh.grid(3, 3)
    p = spring_problem(mesh)
    m = mesh.edge_count
    assert p.parameter_count == m + 1 + 3
    assert p.parameter_slice(0, "rest") == slice(0, m) and p.parameter_slice(0, "anchor") == slice(m + 1, m + 4)
    theta = p.get_parameters()
    np.testing.assert_allclose(theta[:m], 0.9 * mesh.edge_lengths())
    np.testing.assert_allclose(theta[m:], [3.0, 0.2, -0.1, 0.3])
    p.set_parameters(theta * 2.0)
    np.testing.assert_allclose(p.get_parameters(), theta * 2.0)


def test_parameter_derivatives_match_central_differences():
    mesh = wm.TriMesh.grid(3, 4)
    p = spring_problem(mesh)
    rng = np.random.default_rng(1)
    X = mesh.vertices + 0.1 * rng.normal(size=mesh.vertices.shape)
    theta = p.get_parameters()
    f, dE, M = p.eval_parameter_derivatives(wp.array(X, dtype=wp.vec3d))
    dE, M = dE.numpy().copy(), wm.to_scipy(M).toarray()
    assert M.shape == (3 * mesh.vertex_count, p.parameter_count)
    f0, _ = grad_at(p, X, theta)
    assert f == pytest.approx(f0, rel=1e-12)
    h = 1e-6
    fd_e, fd_m = np.zeros_like(dE), np.zeros_like(M)
    for j in range(theta.size):
        tp, tm = theta.copy(), theta.copy()
        tp[j] += h
        tm[j] -= h
        (fp, gp), (fm, gm) = grad_at(p, X, tp), grad_at(p, X, tm)
        fd_e[j] = (fp - fm) / (2 * h)
        fd_m[:, j] = (gp - gm) / (2 * h)
    np.testing.assert_allclose(dE, fd_e, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(M, fd_m, rtol=1e-6, atol=1e-7)
    assert np.abs(M[:, :-4]).max() > 0.1 and np.abs(M[:, -4:]).max() > 0.1  # both kinds of field take part


def test_bad_parameters_are_refused_with_the_field_and_the_line():
    mesh = wm.TriMesh.grid(2, 2)
    with pytest.raises(ValueError, match=r"'stiff' is not a field of .*SpringParams.*\['anchor', 'k', 'rest'\]"):
        spring_problem(mesh, parameters=("stiff",))
    data = SpringParams()
    data.rest = wp.array(np.ones(3), dtype=wp.float64)
    p = wm.Problem(mesh.vertex_count, 3, dtype=wp.float64)
    with pytest.raises(ValueError, match=r"per-element field 'rest' must be a 1-d array of %d values" % mesh.edge_count):
        p.add_term(mesh.edges, spring_param, data, parameters="rest")
    with pytest.raises(ValueError, match="no data was given"):
        p.add_term(mesh.edges, spring_plain, parameters="rest")
    p2 = spring_problem(mesh, parameters=())
    with pytest.raises(ValueError, match="no term has parameters"):
        p2.eval_parameter_derivatives(wp.array(mesh.vertices, dtype=wp.vec3d))


@wp.func
def spring_plain(e: int, xa: Any, xb: Any):
    return ad.length_sq(xa - xb)


@wp.func
def spring_read_elsewhere(e: int, xa: Any, xb: Any, data: SpringParams):
    return ad.length_sq(xa - xb) * data.rest[0]


def test_a_parameter_read_at_another_index_names_the_line():
    mesh = wm.TriMesh.grid(2, 2)
    data = SpringParams()
    data.rest = wp.array(np.ones(mesh.edge_count), dtype=wp.float64)
    p = wm.Problem(mesh.vertex_count, 3, dtype=wp.float64)
    p.add_term(mesh.edges, spring_read_elsewhere, data, parameters=["rest"])
    line = spring_read_elsewhere.func.__code__.co_firstlineno + 2
    with pytest.raises(ValueError, match=rf"test_parameters.py:{line}: .*must be read as data.rest\[e\]"):
        p.eval_parameter_derivatives(wp.array(mesh.vertices, dtype=wp.vec3d))


@wp.struct
class Gravity:
    mass: wp.float64


@wp.func
def gravity(e: int, x: Any, data: Gravity):
    return data.mass * 9.81 * x[2]


@wp.struct
class Springs:
    rest: wp.array(dtype=wp.float64)
    k: wp.float64


@wp.func
def spring(e: int, xa: Any, xb: Any, data: Springs):
    d = ad.length(xa - xb) - data.rest[e]
    return 0.5 * data.k * d * d


def hanging_cloth(n=5):
    """Static hanging cloth: springs with per-edge rest lengths and a shared stiffness (the parameters), gravity,
    the top row pinned."""
    mesh = wm.TriMesh.grid(n, n)
    X = mesh.vertices.copy()
    X[:, 2] = 0.0
    X[:, 1], X[:, 2] = 0.0, mesh.vertices[:, 1]  # hang in the x-z plane
    springs = Springs()
    springs.rest = wp.array(np.linalg.norm(X[mesh.edges[:, 0]] - X[mesh.edges[:, 1]], axis=1), dtype=wp.float64)
    springs.k = wp.float64(200.0)
    g = Gravity()
    g.mass = wp.float64(0.05)
    p = wm.Problem(mesh.vertex_count, 3, dtype=wp.float64)
    p.add_term(mesh.edges, spring, springs, parameters=["rest", "k"])
    p.add_term(np.arange(mesh.vertex_count).reshape(-1, 1), gravity, g)
    top = np.flatnonzero(np.isclose(X[:, 2], X[:, 2].max()))
    return mesh, X, p, top


def solve(p, X, top, solver=None):
    s = solver or wm.NewtonSolver(p, linear_solver="scipy", fixed=top)
    r = s.solve(wp.array(X, dtype=wp.vec3d), max_iterations=100, tolerance=1e-14, gradient_tolerance=1e-11)
    assert r.converged, r
    return r.x


def check_against_whole_solves(p, X, fixed, loss, grad, directions, h):
    """grad . direction against the central difference (L(theta + h d) - L(theta - h d)) / 2h, each L after a whole
    solve from X; theta is put back after each."""
    theta = p.get_parameters()
    for direction in directions:
        p.set_parameters(theta + h * direction)
        Lp, _ = loss(solve(p, X, fixed))
        p.set_parameters(theta - h * direction)
        Lm, _ = loss(solve(p, X, fixed))
        p.set_parameters(theta)
        fd = (Lp - Lm) / (2 * h)
        assert abs(fd) > 1e-6
        np.testing.assert_allclose(grad @ direction, fd, rtol=1e-5)


def test_implicit_gradient_matches_finite_differences_of_the_whole_solve():
    mesh, X, p, top = hanging_cloth()
    target = X + np.array([0.0, 0.0, -0.05])

    def loss(x):
        d = x.numpy() - target
        return 0.5 * float((d * d).sum()), d

    theta = p.get_parameters()
    x_star = solve(p, X, top)
    L0, dL = loss(x_star)
    grad = wm.implicit_gradient(p, x_star, dL, fixed=top)
    assert grad.shape == (p.parameter_count,)
    rng = np.random.default_rng(0)
    directions = [d / np.linalg.norm(d) for d in (rng.normal(size=theta.size), np.eye(theta.size)[-1],
                                                   np.eye(theta.size)[3])]  # fmt: skip
    check_against_whole_solves(p, X, top, loss, grad, directions, h=1e-5)
    # several losses share one call
    both = wm.implicit_gradient(p, x_star, [dL, 2.0 * dL], fixed=top)
    np.testing.assert_allclose(both, np.stack([grad, 2.0 * grad]), rtol=1e-9, atol=1e-14)
    # the solve's own back-end, its factors reused: an exact Newton solve that stopped on its decrement factored
    # H(x*) last, so they give the same gradient without a factorization (a projected one would give an approximation)
    newton = wm.NewtonSolver(p, linear_solver="qdldl", fixed=top, projection=None)
    x_star2 = solve(p, X, top, newton)
    _, dL2 = loss(x_star2)
    ref = wm.implicit_gradient(p, x_star2, dL2, fixed=top)
    np.testing.assert_allclose(ref, grad, rtol=1e-4, atol=1e-9)  # another minimizer within the solve's tolerance
    calls = []
    newton.linear_solver.solve = lambda *a: calls.append(a)  # a factorization would come through here
    reused = wm.implicit_gradient(p, x_star2, dL2, fixed=top, linear_solver=newton.linear_solver,
                                  reuse_factorization=True)  # fmt: skip
    assert not calls
    np.testing.assert_allclose(reused, ref, rtol=1e-8, atol=1e-13)


def test_implicit_gradient_through_a_tet_bar_solve():
    """A tet bar hanging from one end (stable Neo-Hookean, gravity): theta = the shared stiffness mu and every tet's
    rest volume; dL/dtheta against central differences of the whole solve."""
    from warp_meshad.kernels.energies import StableNeoHookeanData, stable_neo_hookean

    mesh = wm.TetMesh.box(4, 2, 2, width=3.0)
    X = mesh.vertices
    data = StableNeoHookeanData()
    data.rest_inverse = wp.array(mesh.rest_matrix_inverses(), dtype=wp.mat33d)
    data.volume = wp.array(mesh.volumes(), dtype=wp.float64)
    data.mu = wp.float64(20.0)
    data.lam = wp.float64(60.0)
    g = Gravity()
    g.mass = wp.float64(0.5)
    p = wm.Problem(mesh.vertex_count, 3, dtype=wp.float64)
    p.add_term(mesh.tets, stable_neo_hookean, data, parameters=("volume", "mu"))
    p.add_term(np.arange(mesh.vertex_count).reshape(-1, 1), gravity, g)
    pinned = np.flatnonzero(X[:, 0] == 0.0)
    target = X + np.array([0.0, 0.0, -0.2])

    def loss(x):
        d = x.numpy() - target
        return 0.5 * float((d * d).sum()), d

    theta = p.get_parameters()
    assert theta.size == mesh.tet_count + 1
    x_star = solve(p, X, pinned)
    assert np.abs(x_star.numpy()[:, 2] - X[:, 2]).max() > 0.05  # it sags
    _, dL = loss(x_star)
    grad = wm.implicit_gradient(p, x_star, dL, fixed=pinned)
    rng = np.random.default_rng(2)
    directions = [np.eye(theta.size)[-1] * theta[-1], rng.normal(size=theta.size) * theta]
    check_against_whole_solves(p, X, pinned, loss, grad, directions, h=1e-6)


@wp.struct
class ChainSprings:
    rest: wp.array(dtype=wp.float64)


@wp.func
def chain_spring(e: int, xa: Any, xb: Any, data: ChainSprings):
    d = xb - xa - data.rest[e]
    return 0.5 * d * d


def free_chain(n=6):
    """Scalar variables on a line joined by springs, nothing pinned: H is the chain's graph Laplacian, exactly
    singular along the free translation x + t."""
    data = ChainSprings()
    data.rest = wp.array(np.ones(n - 1), dtype=wp.float64)
    p = wm.Problem(n, 1, dtype=wp.float64)
    p.add_term(np.stack([np.arange(n - 1), np.arange(1, n)], axis=1), chain_spring, data, parameters=["rest"])
    return p, wp.array(np.arange(n, dtype=np.float64), dtype=wp.float64, device=p.device)  # the minimizers: x + t


@pytest.mark.parametrize("backend", ["scipy", "qdldl"])
def test_implicit_gradient_at_a_singular_hessian_says_what_to_fix(backend):
    """A free translation (issue 21 point 6): whether the back-end fails (SuperLU: exactly singular) or returns a
    solution with a large residual, the error says x* is not a strict minimizer or rigid motions are free, what to
    fix, and ends with the back-end's message."""
    p, x_star = free_chain()
    dL = np.linspace(1.0, 2.0, p.variable_count)  # not orthogonal to the translation: no lambda solves it
    with pytest.raises(wm.LinearSolveError) as info:
        wm.implicit_gradient(p, x_star, dL, linear_solver=backend)
    msg = str(info.value)
    assert msg.startswith("implicit_gradient: the adjoint solve H(x*) lambda = dL/dx failed: the Hessian at x_star "
                          "is singular on the free variables, so x_star is not a strict minimizer, or free rigid "
                          "motions remain (nothing pins the translations and rotations). Pin them (fixed=[...] "
                          "indices, as in the solve), add a term that holds them (a regularizer"), msg
    assert "Back-end: scipy: " in msg, msg  # qdldl falls back to SuperLU on a zero pivot
    grad = wm.implicit_gradient(p, x_star, dL, fixed=[0], linear_solver=backend)  # one pin: a strict minimizer
    # L = sum_i c_i x_i with x_0 pinned, x_i = x_0 + sum_{e < i} rest_e: dL/drest_e = sum_{i > e} c_i
    np.testing.assert_allclose(grad, np.cumsum(dL[::-1])[::-1][1:], rtol=1e-12)


def test_implicit_gradient_residual_rule_catches_a_silent_solution():
    """Springs in 3D with nothing pinned: SuperLU factors H(x*) (rounding hides its 6 zero eigenvalues) and returns
    lambda ~ 1e25 without an error; the residual rule (ADJOINT_RESIDUAL) turns that into the singular-Hessian error."""
    mesh, X, p, _ = hanging_cloth(4)
    p = wm.Problem(mesh.vertex_count, 3, dtype=wp.float64)
    springs = Springs()
    springs.rest = wp.array(0.9 * mesh.edge_lengths(), dtype=wp.float64)
    springs.k = wp.float64(5.0)
    p.add_term(mesh.edges, spring, springs, parameters=["rest", "k"])
    x_star = solve(p, X, None)
    with pytest.raises(wm.LinearSolveError, match=r"free rigid motions remain .* Back-end: scipy: relative residual "
                                                  r"\|\|H lambda - dL/dx\|\| / \|\|dL/dx\|\| = \S+, expected <= 1e-06$"):
        wm.implicit_gradient(p, x_star, np.ones((mesh.vertex_count, 3)), linear_solver="scipy")


def test_implicit_gradient_warns_when_x_star_is_not_a_minimizer():
    """Issue 21 point 9, both sides of the rule: x* moved by d from the minimizer lies |H^-1 g| ~ |d| from it; the
    warning comes when that exceeds STATIONARITY_TOLERANCE (1e-6) times the extent of x* (1.02 for this cloth)."""
    import warnings

    from warp_meshad._src.solve.implicit import STATIONARITY_TOLERANCE

    mesh, X, p, top = hanging_cloth()
    x_hat = solve(p, X, top).numpy()
    extent = float(np.ptp(x_hat, axis=0).max())  # the sagging cloth's height
    free = np.ones(mesh.vertex_count, dtype=bool)
    free[top] = False
    direction = np.where(free[:, None], np.random.default_rng(3).uniform(-1.0, 1.0, X.shape), 0.0)
    direction /= np.abs(direction).max()

    def gradient_at(scale):
        x = wp.array(x_hat + scale * STATIONARITY_TOLERANCE * extent * direction, dtype=wp.vec3d)
        return wm.implicit_gradient(p, x, x.numpy() - X, fixed=top)

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no warning of ours below the threshold
        gradient_at(0.5)
    with pytest.warns(UserWarning) as record:
        gradient_at(2.0)
    msg = str(record[0].message)
    assert record[0].filename == __file__  # it points at the caller's line
    assert re.fullmatch(
        r"implicit_gradient: x_star is not a minimizer: \|g\(x\*\)\|_inf = \S+ on the free variables, so x\* lies "
        r"\|H\^-1 g\|_inf = \S+ from the minimizer, above 1e-06 x the extent of x\* \(1\.02\) = 1\.024e-06; the gradient "
        r"is off by a relative amount of the order of that step over the element size\. Solve to a small gradient "
        r"first \(solve\(\.\.\., gradient_tolerance=\.\.\.\), as energy_tolerance may stop a solve before its "
        r"gradient is small\)\.", msg), msg
    np.testing.assert_allclose(float(re.search(r"lies \|H\^-1 g\|_inf = (\S+)", msg).group(1)), 2e-6 * extent, rtol=0.05)

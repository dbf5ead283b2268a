"""Vector operations of the solvers (solve/vector_ops.py) against numpy, on scalar and vec3 block vectors."""

import numpy as np
import warp as wp
import warp.sparse as wps

import warp_meshad as wm
from warp_meshad._src.solve.vector_ops import add_to_diagonal, axpy_into, dot, lincomb_into, norm, scale_into

wp.config.log_level = wp.LOG_WARNING


def _vectors(seed=0):
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=(5, 3)), rng.normal(size=(5, 3))
    return a, b, wp.array(a, dtype=wp.vec3d), wp.array(b, dtype=wp.vec3d)


def test_axpy_into_scalar_and_vector():
    x = wp.array(np.arange(6.0).reshape(2, 3), dtype=wp.vec3d)
    d = wp.array(np.ones((2, 3)), dtype=wp.vec3d)
    out = wp.empty_like(x)
    axpy_into(out, x, 0.5, d)
    np.testing.assert_allclose(out.numpy(), np.arange(6.0).reshape(2, 3) + 0.5)
    xs = wp.array([1.0, 2.0], dtype=wp.float32)
    outs = wp.empty_like(xs)
    axpy_into(outs, xs, -2.0, xs)
    np.testing.assert_allclose(outs.numpy(), [-1.0, -2.0])


def test_scale_lincomb_dot_norm_match_numpy():
    a, b, wa, wb = _vectors()
    out = wp.empty_like(wa)
    np.testing.assert_allclose(scale_into(out, -2.5, wa).numpy(), -2.5 * a, rtol=1e-15)
    np.testing.assert_allclose(lincomb_into(out, 0.5, wa, -3.0, wb).numpy(), 0.5 * a - 3.0 * b, rtol=1e-14)
    np.testing.assert_allclose(dot(wa, wb), np.sum(a * b), rtol=1e-14)
    np.testing.assert_allclose(norm(wa), np.linalg.norm(a), rtol=1e-14)
    # out may alias an input
    lincomb_into(wa, 1.0, wa, 1.0, wb)
    np.testing.assert_allclose(wa.numpy(), a + b, rtol=1e-14)
    assert np.isnan(norm(wp.array([[np.nan, 0.0, 0.0]], dtype=wp.vec3d)))


def test_add_to_diagonal_touches_only_stored_diagonal_blocks():
    rows, cols = np.array([0, 0, 1, 2]), np.array([0, 1, 0, 1])  # block row 2 stores no diagonal block
    blocks = np.arange(36.0).reshape(4, 3, 3)
    A = wps.bsr_from_triplets(3, 3, wp.array(rows, dtype=int), wp.array(cols, dtype=int),
                              wp.array(blocks, dtype=wp.mat33d), prune_numerical_zeros=False)
    add_to_diagonal(A, 2.0)
    expected = np.zeros((9, 9))
    for r, c, block in zip(rows, cols, blocks):
        expected[3 * r:3 * r + 3, 3 * c:3 * c + 3] += block + (2.0 * np.eye(3) if r == c else 0.0)
    np.testing.assert_allclose(wm.to_scipy(A).toarray(), expected)


def test_solvers_refuse_a_start_point_with_nan_or_inf():
    import pytest

    from warp_meshad.kernels.energies import dirichlet

    mesh = wm.TriMesh.grid(3, 3)
    X = mesh.vertices.copy()
    X[4, 1] = np.nan
    X[7, 2] = np.inf
    p = wm.Problem(mesh.vertex_count, 3, wp.float64)
    p.add_term(mesh.edges, dirichlet)
    x = wp.array(X, dtype=wp.vec3d)
    with pytest.raises(ValueError, match=r"NewtonSolver.solve\(x=...\): expected finite values, got NaN or inf at 2 "
                                         r"variables, first x\[4\] = \[0.5, nan, 0.0\]"):
        wm.NewtonSolver(p, linear_solver="scipy").solve(x)
    with pytest.raises(ValueError, match=r"LBFGSSolver.solve\(x=...\): expected finite values"):
        wm.LBFGSSolver(p).solve(x)
    f = p.eval(x)  # the evaluations do not check (documented): NaN comes through
    assert np.isnan(f)
    r = wm.GradientDescentSolver(p).solve(x, max_iterations=0, check_finite=False)  # asked not to check
    assert r.iterations == 0

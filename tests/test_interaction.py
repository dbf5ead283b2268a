"""Interaction terms: elements that change at run time (contact pairs)."""

from typing import Any

import numpy as np
import pytest
import warp as wp

import warp_meshad as wm
from warp_meshad.kernels import ad

# every test runs on the test device (the device fixture, or Warp's default device that conftest sets to it)
pytestmark = pytest.mark.device


@wp.func
def pair_attraction(e: int, a: Any, b: Any):
    """1/2 |a - b|^2 + 1/(|a - b|^2 + 1): non-trivial gradient and Hessian."""
    d = ad.length_sq(a - b)
    return 0.5 * d + 1.0 / (d + 1.0)


def dense(H):
    return wm.to_scipy(H).toarray()


def static_problem(n, static_el, pairs, device):
    p = wm.Problem(n, 3, device=device)
    p.add_term(static_el, pair_attraction)
    if len(pairs):
        p.add_term(pairs, pair_attraction, weight=2.0)
    return p


def test_interaction_term_matches_static_terms_after_pairs_change(device):
    rng = np.random.default_rng(0)
    n = 12
    x = wp.array(rng.normal(size=(n, 3)), dtype=wp.vec3d, device=device)
    v = wp.array(rng.normal(size=(n, 3)), dtype=wp.vec3d, device=device)
    chain = np.stack([np.arange(n - 1), np.arange(1, n)], 1)
    p = wm.Problem(n, 3, device=device)
    p.add_term(chain, pair_attraction)
    k = p.add_interaction_term(pair_attraction, valence=2, weight=2.0, capacity=4)
    for pairs in (np.zeros((0, 2), int), np.array([[0, 5], [3, 9]]), np.array([[1, 7], [2, 11], [0, 5], [4, 10], [6, 8]])):
        p.set_interaction_elements(k, pairs)
        ref = static_problem(n, chain, pairs, device)
        f, g, H = p.eval_with_hessian(x)
        g, Hd = g.numpy().copy(), dense(H)
        offsets, columns = H.offsets.numpy()[: H.nrow + 1].copy(), H.columns.numpy()[: H.nnz].copy()
        fr, gr, Hr = ref.eval_with_hessian(x)
        np.testing.assert_allclose(f, fr, rtol=1e-12)
        np.testing.assert_allclose(g, gr.numpy(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(Hd, dense(Hr), rtol=1e-12, atol=1e-12)
        # the pattern equals one rebuilt from scratch
        np.testing.assert_array_equal(offsets, Hr.offsets.numpy()[: Hr.nrow + 1])
        np.testing.assert_array_equal(columns, Hr.columns.numpy()[: Hr.nnz])
        np.testing.assert_allclose(p.eval(x), fr, rtol=1e-12)
        np.testing.assert_allclose(p.eval_with_gradient(x)[1].numpy(), gr.numpy(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(
            p.hessian_vector_product(x, v).numpy().ravel(), dense(Hr) @ v.numpy().ravel(), rtol=1e-10, atol=1e-10
        )


def test_capacity_grows_and_no_pair_is_dropped(device):
    rng = np.random.default_rng(1)
    n = 40
    X = rng.normal(size=(n, 3))
    x = wp.array(X, dtype=wp.vec3d, device=device)
    p = wm.Problem(n, 3, device=device)
    k = p.add_interaction_term(pair_attraction, valence=2, capacity=2)
    pairs = np.stack([np.arange(0, 30), np.arange(10, 40)], 1)  # 30 pairs, 15x the capacity
    p.set_interaction_elements(k, pairs)
    assert p.terms[k].capacity >= 30
    d = np.sum((X[pairs[:, 0]] - X[pairs[:, 1]]) ** 2, 1)
    np.testing.assert_allclose(p.eval(x), np.sum(0.5 * d + 1.0 / (d + 1.0)), rtol=1e-12)
    # repeated pairs are each accumulated, never overwritten
    p.set_interaction_elements(k, np.concatenate([pairs, pairs[:3]]))
    extra = np.sum(0.5 * d[:3] + 1.0 / (d[:3] + 1.0))
    np.testing.assert_allclose(p.eval(x), np.sum(0.5 * d + 1.0 / (d + 1.0)) + extra, rtol=1e-12)
    f, g, H = p.eval_with_hessian(x)
    np.testing.assert_allclose(f, np.sum(0.5 * d + 1.0 / (d + 1.0)) + extra, rtol=1e-12)


def test_set_interaction_elements_rejects_bad_input(device):
    p = wm.Problem(5, 3, device=device)
    p.add_term(np.array([[0, 1]]), pair_attraction)
    k = p.add_interaction_term(pair_attraction, valence=2)
    with pytest.raises(ValueError, match=r"index of an interaction term, got 0"):
        p.set_interaction_elements(0, np.array([[0, 1]]))
    with pytest.raises(ValueError, match=r"shape \(k, 2\), got \(2, 3\)"):
        p.set_interaction_elements(k, np.array([[0, 1, 2], [1, 2, 3]]))
    with pytest.raises(ValueError, match=r"out of range \[0, 5\)"):
        p.set_interaction_elements(k, np.array([[0, 5]]))
    with pytest.raises(NotImplementedError, match="deterministic"):
        wm.Problem(5, 3, device=device, deterministic=True).add_interaction_term(pair_attraction, valence=2)


@wp.func
def triangle_energy(e: int, a: Any, b: Any, c: Any):
    """A non-trivial energy of three variables (a bumpy area-like term)."""
    u = b - a
    w = c - a
    d = ad.length_sq(ad.cross(u, w))
    return 0.25 * d + 1.0 / (ad.length_sq(u) + 1.0)


def assert_matches_static(p, x, v, static_terms, dynamic_terms, device, proj=True):
    """p's values, gradient, Hessian, pattern and Hessian-vector product equal those of a problem
    built from scratch with every term static (terms: (elements, energy, weight))."""
    n = p.variable_count
    ref = wm.Problem(n, 3, device=device)
    for el, energy, weight in static_terms + [t for t in dynamic_terms if len(t[0])]:
        ref.add_term(el, energy, weight=weight)
    f, g, H = p.eval_with_hessian(x)
    g, Hd = g.numpy().copy(), dense(H)
    offsets, columns = H.offsets.numpy()[: H.nrow + 1].copy(), H.columns.numpy()[: H.nnz].copy()
    fr, gr, Hr = ref.eval_with_hessian(x)
    np.testing.assert_allclose(f, fr, rtol=1e-12)
    np.testing.assert_allclose(g, gr.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(Hd, dense(Hr), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(offsets, Hr.offsets.numpy()[: Hr.nrow + 1])
    np.testing.assert_array_equal(columns, Hr.columns.numpy()[: Hr.nnz])
    assert p.hessian_block_count == ref.hessian_block_count
    np.testing.assert_allclose(
        p.hessian_vector_product(x, v).numpy().ravel(), dense(Hr) @ v.numpy().ravel(), rtol=1e-10, atol=1e-10
    )
    np.testing.assert_allclose(dense(p.eval_gauss_newton(x)[2]), dense(Hr), rtol=1e-12, atol=1e-12)
    if proj:
        _, _, Hp = p.eval_with_hessian_proj(x)
        _, _, Hpr = ref.eval_with_hessian_proj(x)
        np.testing.assert_allclose(dense(Hp), dense(Hpr), rtol=1e-10, atol=1e-10)


def test_elements_as_device_array(device):
    rng = np.random.default_rng(2)
    n = 12
    x = wp.array(rng.normal(size=(n, 3)), dtype=wp.vec3d, device=device)
    v = wp.array(rng.normal(size=(n, 3)), dtype=wp.vec3d, device=device)
    chain = np.stack([np.arange(n - 1), np.arange(1, n)], 1)
    p = wm.Problem(n, 3, device=device)
    p.add_term(chain, pair_attraction)
    k = p.add_interaction_term(pair_attraction, valence=2, weight=2.0, capacity=2)
    pairs = np.array([[0, 5], [3, 9], [1, 7], [2, 11], [4, 10]], dtype=np.int32)
    p.set_interaction_elements(k, wp.array(pairs, dtype=wp.int32, device=device))
    assert p.terms[k].elements_np is None and p.terms[k].count == 5 and p.terms[k].capacity >= 5
    assert_matches_static(p, x, v, [(chain, pair_attraction, 1.0)], [(pairs, pair_attraction, 2.0)], device)
    # a strided view of a device array is read in place
    wide = wp.array(np.concatenate([pairs, pairs], 1)[::-1].copy(), dtype=wp.int32, device=device)
    p.set_interaction_elements(k, wide[:, 2:4])
    assert_matches_static(p, x, v, [(chain, pair_attraction, 1.0)], [(pairs[::-1], pair_attraction, 2.0)], device)


def test_many_changes_in_a_row_match_a_rebuild_from_scratch(device):
    rng = np.random.default_rng(3)
    n = 30
    x = wp.array(rng.normal(size=(n, 3)), dtype=wp.vec3d, device=device)
    v = wp.array(rng.normal(size=(n, 3)), dtype=wp.vec3d, device=device)
    tris = np.stack([np.arange(0, n - 2, 2), np.arange(1, n - 1, 2), np.arange(2, n, 2)], 1)
    p = wm.Problem(n, 3, device=device)
    p.add_term(tris, triangle_energy)
    k2 = p.add_interaction_term(pair_attraction, valence=2, weight=0.5, capacity=3)
    k3 = p.add_interaction_term(triangle_energy, valence=3, weight=1.5, capacity=1)
    previous = None
    for it in range(8):
        # sizes grow past the capacities, shrink to zero, repeat pairs, reverse them, touch static blocks
        m2 = [4, 17, 0, 9, 40, 3, 25, 1][it]
        m3 = [1, 0, 6, 13, 2, 0, 30, 5][it]
        pairs = rng.integers(0, n, size=(m2, 2)).astype(np.int32)
        if m2 > 4:
            pairs[:2] = pairs[2:4, ::-1]  # the same pairs reversed
            pairs[4] = tris[0, :2]  # a pair already in the static pattern
        triples = rng.integers(0, n, size=(m3, 3)).astype(np.int32)
        as_device = it % 2 == 1
        p.set_interaction_elements(k2, wp.array(pairs, dtype=wp.int32, device=device) if as_device else pairs)
        p.set_interaction_elements(k3, wp.array(triples, dtype=wp.int32, device=device) if as_device else triples)
        assert_matches_static(
            p, x, v, [(tris, triangle_energy, 1.0)], [(pairs, pair_attraction, 0.5), (triples, triangle_energy, 1.5)],
            device, proj=it < 3,
        )  # fmt: skip
        _, _, H = p.eval_with_hessian(x)
        if previous is not None:
            # double buffered: the previous evaluation's matrix keeps its own pattern
            assert H is not previous[0]
            np.testing.assert_array_equal(previous[0].offsets.numpy()[: n + 1], previous[1])
        previous = (H, H.offsets.numpy()[: n + 1].copy())
        # unchanged elements: no rebuild, the same matrix
        rebuilds = p._storage.pattern.rebuilds
        assert p.eval_with_hessian(x)[2] is H and p._storage.pattern.rebuilds == rebuilds
    assert p.terms[k2].capacity >= 40 and p.terms[k3].capacity >= 30


def test_zero_elements(device):
    rng = np.random.default_rng(4)
    n = 10
    x = wp.array(rng.normal(size=(n, 3)), dtype=wp.vec3d, device=device)
    v = wp.array(rng.normal(size=(n, 3)), dtype=wp.vec3d, device=device)
    chain = np.stack([np.arange(n - 1), np.arange(1, n)], 1)
    p = wm.Problem(n, 3, device=device)
    p.add_term(chain, pair_attraction)
    k = p.add_interaction_term(pair_attraction, valence=2)
    static = [(chain, pair_attraction, 1.0)]
    assert_matches_static(p, x, v, static, [], device)  # never set
    p.set_interaction_elements(k, np.array([[0, 7], [2, 9]]))
    assert_matches_static(p, x, v, static, [(np.array([[0, 7], [2, 9]]), pair_attraction, 1.0)], device)
    for empty in (np.zeros((0, 2), int), [], wp.zeros((0, 2), dtype=wp.int32, device=device)):
        p.set_interaction_elements(k, empty)
        assert p.terms[k].count == 0
        assert_matches_static(p, x, v, static, [], device)
    # a problem whose only term is an interaction term
    q = wm.Problem(n, 3, device=device)
    kq = q.add_interaction_term(pair_attraction, valence=2)
    f, g, H = q.eval_with_hessian(x)
    assert f == 0.0 and not np.any(g.numpy()) and H.nnz == n and not np.any(dense(H))
    q.set_interaction_elements(kq, wp.array(np.array([[1, 3]]), dtype=wp.int32, device=device))
    assert q.eval_with_hessian(x)[2].nnz == n + 2


def test_duplicate_pairs_are_accumulated(device):
    rng = np.random.default_rng(5)
    n = 8
    X = rng.normal(size=(n, 3))
    x = wp.array(X, dtype=wp.vec3d, device=device)
    v = wp.array(rng.normal(size=(n, 3)), dtype=wp.vec3d, device=device)
    p = wm.Problem(n, 3, device=device)
    p.add_term(np.array([[0, 1]]), pair_attraction)
    k = p.add_interaction_term(pair_attraction, valence=2, capacity=1)
    once = np.array([[2, 5]], dtype=np.int32)
    twice = np.array([[2, 5], [2, 5], [5, 2]], dtype=np.int32)  # the pair three times, once reversed
    p.set_interaction_elements(k, wp.array(once, dtype=wp.int32, device=device))
    f1, g1, H1 = p.eval_with_hessian(x)
    g1, H1 = g1.numpy().copy(), dense(H1)
    p.set_interaction_elements(k, wp.array(twice, dtype=wp.int32, device=device))
    f3, g3, H3 = p.eval_with_hessian(x)
    d = np.sum((X[2] - X[5]) ** 2)
    e_pair = 0.5 * d + 1.0 / (d + 1.0)
    np.testing.assert_allclose(f3 - f1, 2.0 * e_pair, rtol=1e-12)
    f0, g0, H0 = wm.Problem(n, 3, device=device), None, None
    f0.add_term(np.array([[0, 1]]), pair_attraction)
    _, g0, H0 = f0.eval_with_hessian(x)
    np.testing.assert_allclose(g3.numpy() - g0.numpy(), 3.0 * (g1 - g0.numpy()), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dense(H3) - dense(H0), 3.0 * (H1 - dense(H0)), rtol=1e-12, atol=1e-12)
    assert H3.nnz == n + 2 + 2  # the pair's two blocks, once
    assert_matches_static(p, x, v, [(np.array([[0, 1]]), pair_attraction, 1.0)], [(twice, pair_attraction, 1.0)], device)


def test_out_of_range_index_in_a_device_array(device):
    rng = np.random.default_rng(6)
    n = 12
    x = wp.array(rng.normal(size=(n, 3)), dtype=wp.vec3d, device=device)
    v = wp.array(rng.normal(size=(n, 3)), dtype=wp.vec3d, device=device)
    p = wm.Problem(n, 3, device=device)
    p.add_term(np.array([[0, 1]]), pair_attraction)
    k = p.add_interaction_term(pair_attraction, valence=2, capacity=2)  # the bad elements grow the buffers
    bad = wp.array(np.array([[0, 5], [-1, 3], [2, 12], [4, 4]]), dtype=wp.int32, device=device)
    msg = r"set_interaction_elements\(elements=\.\.\.\) has 2 indices out of range \[0, 12\): first elements\[1, 0\] = -1"
    with pytest.raises(ValueError, match=msg):  # here on the CPU, at the latest by the next eval on a GPU
        p.set_interaction_elements(k, bad)
        p.eval(x)
    # every evaluation raises until valid elements are set
    for call in (lambda: p.eval(x), lambda: p.eval_with_gradient(x), lambda: p.eval_with_hessian(x),
                 lambda: p.hessian_vector_product(x, v)):  # fmt: skip
        with pytest.raises(ValueError, match=msg):
            call()
    with pytest.raises(ValueError, match=r"must have shape \(k, 2\), got \(2, 3\)"):
        p.set_interaction_elements(k, wp.zeros((2, 3), dtype=wp.int32, device=device))
    good = np.array([[0, 5], [1, 3]])
    p.set_interaction_elements(k, wp.array(good, dtype=wp.int32, device=device))
    assert_matches_static(p, x, v, [(np.array([[0, 1]]), pair_attraction, 1.0)], [(good, pair_attraction, 1.0)], device)


@wp.func
def anchor(e: int, a: Any):
    return ad.length_sq(a)


def test_rebuilt_matrix_works_with_solvers_and_bsr_mv(device):
    import warp.sparse as wps

    rng = np.random.default_rng(7)
    n = 20
    x = wp.array(rng.normal(size=(n, 3)), dtype=wp.vec3d, device=device)
    b = wp.array(rng.normal(size=(n, 3)), dtype=wp.vec3d, device=device)
    chain = np.stack([np.arange(n - 1), np.arange(1, n)], 1)
    p = wm.Problem(n, 3, device=device)
    p.add_term(chain, pair_attraction)
    p.add_term(np.arange(n)[:, None], anchor)  # well conditioned
    k = p.add_interaction_term(pair_attraction, valence=2, capacity=2)
    solvers = [wm.make_linear_solver("scipy")] if not wp.get_device(device).is_cuda else []
    solvers.append(wm.make_linear_solver("cg", tol=1e-12, maxiter=2000))
    # same pair count each time, so only the pattern (not nnz) tells the patterns apart; a solve every other
    # rebuild sees the same (double-buffered) matrix object again with another pattern
    sets = ([[0, 7], [3, 12]], [[1, 9], [4, 15]], [[2, 18], [6, 11]], [[0, 7], [3, 12]], [[5, 10], [8, 16]])
    for it, pairs in enumerate(sets):
        p.set_interaction_elements(k, wp.array(np.array(pairs), dtype=wp.int32, device=device))
        # async assembly: nnz is an upper bound until synced; to_scipy and bsr_mv work either way
        _, _, H = p.assemble_hessian(x, projection="clamp")
        assert H.nnz >= n + 2 * (n - 1) + 4
        Hd = dense(H)
        y = wps.bsr_mv(H, b)
        np.testing.assert_allclose(y.numpy().ravel(), Hd @ b.numpy().ravel(), rtol=1e-12, atol=1e-12)
        assert H.nnz_sync() == n + 2 * (n - 1) + 4
        _, _, H = p.eval_with_hessian_proj(x)
        assert H.nnz == n + 2 * (n - 1) + 4
        for solver in solvers if it % 2 == 0 else []:
            d = wp.zeros(n, dtype=wp.vec3d, device=device)
            solver.solve(H, b, d)
            np.testing.assert_allclose(d.numpy().ravel(), np.linalg.solve(Hd, b.numpy().ravel()), rtol=1e-8, atol=1e-10)

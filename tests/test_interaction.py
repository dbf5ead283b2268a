"""Interaction terms: elements that change at run time (contact pairs)."""

from typing import Any

import numpy as np
import pytest
import warp as wp

import warp_meshad as wm
from warp_meshad.kernels import ad


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

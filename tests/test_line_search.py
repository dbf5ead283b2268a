"""Armijo backtracking: sufficient decrease, +inf/NaN rejection, step bound, no-step flag."""

import math

import numpy as np
import pytest
import warp as wp

from warp_meshad._src.solve.line_search import armijo

wp.config.log_level = wp.LOG_WARNING


def _quadratic(center):
    """f(y) = 1/2 |y - center|^2 on a vec3d array, evaluated on the host."""

    def energy(y):
        return 0.5 * float(np.sum((y.numpy() - center) ** 2))

    return energy


def test_full_newton_step_accepted_on_quadratic():
    center = np.array([[1.0, 2.0, 3.0], [-1.0, 0.0, 0.5]])
    x = wp.zeros(2, dtype=wp.vec3d)
    d = wp.array(center, dtype=wp.vec3d)  # exact Newton step
    f = _quadratic(center)
    f0 = f(x)
    res = armijo(f, x, d, f0, -2.0 * f0)  # g.d = -|center|^2 = -2 f0
    assert res.accepted and res.alpha == 1.0 and res.tries == 1
    assert res.f_new == pytest.approx(0.0, abs=1e-14)
    np.testing.assert_array_equal(x.numpy(), 0.0)  # x untouched


def test_backtracks_until_sufficient_decrease():
    center = np.ones((1, 3))
    x = wp.zeros(1, dtype=wp.vec3d)
    d = wp.array(10.0 * center, dtype=wp.vec3d)  # overshoots by 10x
    f = _quadratic(center)
    f0 = f(x)
    dd = -10.0 * 3.0
    out = wp.empty_like(x)
    res = armijo(f, x, d, f0, dd, out=out)
    assert res.accepted and res.tries > 1
    assert res.alpha == pytest.approx(0.8 ** (res.tries - 1))
    assert res.f_new <= f0 + 1e-4 * res.alpha * dd
    np.testing.assert_allclose(out.numpy(), res.alpha * 10.0 * center)


def test_inf_and_nan_trials_are_rejected():
    x = wp.zeros(1, dtype=wp.float64)
    d = wp.array([1.0], dtype=wp.float64)
    calls = []

    def energy(y):
        t = float(y.numpy()[0])
        calls.append(t)
        if t > 0.7:
            return math.inf
        if t > 0.6:
            return math.nan
        return (t - 1.0) ** 2

    res = armijo(energy, x, d, 1.0, -2.0)
    assert res.accepted
    assert res.alpha <= 0.6 and res.tries == len(calls) >= 3
    assert math.isfinite(res.f_new)


def test_step_bound_caps_first_trial():
    center = np.array([[4.0, 0.0, 0.0]])
    x = wp.zeros(1, dtype=wp.vec3d)
    d = wp.array(center, dtype=wp.vec3d)
    seen = []

    def bound(xx, dd):
        seen.append((xx, dd))
        return 0.25

    f = _quadratic(center)
    res = armijo(f, x, d, f(x), -16.0, step_bound_fn=bound)
    assert res.accepted and res.alpha == 0.25 and res.tries == 1
    assert seen[0][0] is x and seen[0][1] is d
    res = armijo(f, x, d, f(x), -16.0, step_bound_fn=lambda *_: 0.0)
    assert not res.accepted and res.alpha == 0.0 and res.tries == 0


def test_no_step_flag_when_never_decreasing():
    x = wp.zeros(2, dtype=wp.vec3d)
    d = wp.ones(2, dtype=wp.vec3d)
    out = wp.empty_like(x)
    res = armijo(lambda y: math.inf, x, d, 1.0, -1.0, max_tries=5, out=out)
    assert res == (0.0, 1.0, 5, False)
    np.testing.assert_array_equal(out.numpy(), x.numpy())
    res = armijo(lambda y: 0.0, x, d, 1.0, +1.0)  # ascent direction: no trial at all
    assert not res.accepted and res.tries == 0


def test_validation():
    x = wp.zeros(2, dtype=wp.vec3d)
    with pytest.raises(ValueError, match=r"direction: expected shape \(2,\), got \(3,\)"):
        armijo(lambda y: 0.0, x, wp.zeros(3, dtype=wp.vec3d), 1.0, -1.0)
    with pytest.raises(TypeError, match="direction: expected dtype vec3d, got vec3f"):
        armijo(lambda y: 0.0, x, wp.zeros(2, dtype=wp.vec3f), 1.0, -1.0)
    with pytest.raises(ValueError, match="shrink"):
        armijo(lambda y: 0.0, x, x, 1.0, -1.0, shrink=1.5, out=wp.empty_like(x))
    with pytest.raises(ValueError, match="distinct from x"):
        armijo(lambda y: 0.0, x, wp.zeros_like(x), 1.0, -1.0, out=x)

"""The loops' decisions (:mod:`warp_meshad._src.solve.policy`): each stop reason, the descent test, Armijo's rule,
the energy-change test and the first step, checked once on known cases; the device functions decide as the NumPy
rules on the same float64 inputs (NaN, inf and the boundaries included). The loops are checked against each other in
tests/test_device_loop.py, tests/test_first_order_loop.py and tests/test_problem_batch.py."""

import math

import numpy as np
import pytest
import warp as wp

from warp_meshad._src.solve import policy
from warp_meshad._src.solve.policy import device

pytestmark = pytest.mark.device

NAN, INF = math.nan, math.inf


def test_codes_name_every_reason_once():
    assert policy.RUNNING == 0 and policy.NO_FALLBACK == 0
    assert sorted(policy.REASONS) == list(range(1, len(policy.REASONS) + 1))
    assert len(set(policy.REASONS.values())) == len(policy.REASONS)
    assert set(policy.CONVERGED) <= set(policy.REASONS.values())
    for code, name in policy.REASONS.items():
        assert policy.reason_code(name) == code
    for code, name in policy.FALLBACKS.items():
        assert policy.fallback_code(name) == code
    with pytest.raises(KeyError):
        policy.reason_code("callback")


def test_point_status_takes_the_first_reason_that_applies():
    energy = np.array([1.0, INF, NAN, 1.0, 1.0, 1.0, 1.0, 1.0])
    gnorm = np.array([0.5, 0.0, 0.0, NAN, INF, 1e-7, 1e-6, 0.5])
    iteration = np.array([3, 3, 3, 3, 3, 5, 3, 5])
    got = policy.point_status(energy, gnorm, iteration, max_iterations=5, gradient_tolerance=1e-6)
    expected = [policy.RUNNING, policy.NON_FINITE_ENERGY, policy.NON_FINITE_ENERGY, policy.NON_FINITE_GRADIENT,
                policy.NON_FINITE_GRADIENT, policy.GRADIENT_NORM, policy.GRADIENT_NORM, policy.MAX_ITERATIONS]
    np.testing.assert_array_equal(got, expected)
    # without the energy test the non-finite energies fall through to the gradient tests
    np.testing.assert_array_equal(policy.point_status(None, gnorm[:3], 3, 5, 1e-6),
                                  [policy.RUNNING, policy.GRADIENT_NORM, policy.GRADIENT_NORM])
    assert int(policy.point_status(2.0, 1.0, 0, 0, 1e-6)) == policy.MAX_ITERATIONS  # max_iterations = 0


def test_gradient_norm_is_nan_for_negative_or_nan_squares():
    np.testing.assert_array_equal(policy.gradient_norm([4.0, 0.0, INF]), [2.0, 0.0, INF])
    assert np.isnan(policy.gradient_norm([-1.0, NAN])).all()


def test_descent_test_and_fallback_slope():
    dd = np.array([-1.0, 0.0, 1.0, NAN, -INF, -1e-300])
    np.testing.assert_array_equal(policy.direction_fallback(dd), [0, 1, 1, 1, 1, 0])
    np.testing.assert_array_equal(policy.direction_fallback(dd, solve_failed=True), [policy.LINEAR_SOLVE_FAILED] * 6)
    assert float(policy.fallback_slope(3.0)) == -9.0


def test_newton_decrement_stops_strictly_below_the_tolerance():
    np.testing.assert_array_equal(policy.newton_decrement([-4.0, 4.0]), [2.0, 2.0])
    np.testing.assert_array_equal(policy.decrement_converged([1e-7, 1e-6, 1e-5], 1e-6), [True, False, False])


def test_armijo_rule_rejects_insufficient_decrease_and_invalid_states():
    f0, dd, c = 1.0, -2.0, 0.25
    # accepted when f <= f0 + c alpha dd = 1 - 0.5 alpha
    f = np.array([0.5, 0.5000001, 0.75, INF, NAN, -INF])
    alpha = np.array([1.0, 1.0, 0.5, 1.0, 1.0, 1.0])
    np.testing.assert_array_equal(policy.armijo_accepts(f, f0, alpha, dd, c), [True, False, True, False, False, False])
    np.testing.assert_array_equal(policy.line_search_possible([1.0, INF, 1.0, 1.0, 1.0], [-1.0, -1.0, 0.0, NAN, 1.0]),
                                  [True, False, False, False, False])


def test_energy_change_is_relative_above_one():
    f_old = np.array([1000.0, 1000.0, 0.1, 0.1])
    f_new = np.array([999.9995, 999.99, 0.1 - 5e-7, 0.1 - 2e-6])
    np.testing.assert_array_equal(policy.energy_change_converged(f_old, f_new, 1e-6), [True, False, True, False])


def test_first_trial_step_is_capped_by_a_positive_bound():
    assert float(policy.first_trial_step(1.0)) == 1.0
    np.testing.assert_array_equal(policy.first_trial_step(1.0, [0.5, 2.0, 0.0, -1.0, NAN]), [0.5, 1.0, 0.0, 0.0, 0.0])


@wp.kernel(enable_backward=False)
def _decide(values: wp.array2d(dtype=wp.float64), out: wp.array2d(dtype=wp.int32)):
    # one thread per case: every device decision on one row of inputs
    i = wp.tid()
    f = values[i, 0]
    g = values[i, 1]
    dd = values[i, 2]
    alpha = values[i, 3]
    f0 = values[i, 4]
    out[i, 0] = device.point_status(f, 1, g, int(values[i, 5]), 5, wp.float64(1e-6))
    out[i, 1] = device.point_status(f, 0, g, int(values[i, 5]), 5, wp.float64(1e-6))
    out[i, 2] = device.direction_fallback(dd, 0)
    out[i, 3] = wp.where(device.decrement_converged(device.newton_decrement(dd), wp.float64(1e-6)), 1, 0)
    out[i, 4] = wp.where(device.armijo_accepts(f, f0, alpha, dd, wp.float64(1e-4)), 1, 0)
    out[i, 5] = wp.where(device.energy_change_converged(f0, f, wp.float64(1e-6)), 1, 0)
    out[i, 6] = wp.where(device.gradient_norm(g) == device.gradient_norm(g), 1, 0)  # 0 for NaN


def test_device_functions_decide_as_the_rules(device):
    rng = np.random.default_rng(7)
    special = [0.0, -0.0, 1.0, -1.0, 1e-6, 1e-7, INF, -INF, NAN, 1e300]
    rows = []
    for _ in range(400):
        rows.append([rng.choice(special) if rng.random() < 0.3 else rng.normal() for _ in range(5)]
                    + [float(rng.integers(0, 7))])
    rows.append([0.999999, 1e-6, -2e-6, 1.0, 1.0, 5.0])  # boundaries: gnorm == tolerance, decrement == tolerance
    values = np.array(rows, dtype=np.float64)
    out = wp.zeros((len(rows), 7), dtype=wp.int32, device=device)
    wp.launch(_decide, dim=len(rows), inputs=[wp.array(values, dtype=wp.float64, device=device), out], device=device)
    got = out.numpy()
    f, g, dd, alpha, f0, it = values.T
    it = it.astype(int)
    np.testing.assert_array_equal(got[:, 0], policy.point_status(f, g, it, 5, 1e-6))
    np.testing.assert_array_equal(got[:, 1], policy.point_status(None, g, it, 5, 1e-6))
    np.testing.assert_array_equal(got[:, 2], policy.direction_fallback(dd))
    np.testing.assert_array_equal(got[:, 3], policy.decrement_converged(policy.newton_decrement(dd), 1e-6))
    np.testing.assert_array_equal(got[:, 4], policy.armijo_accepts(f, f0, alpha, dd, 1e-4))
    np.testing.assert_array_equal(got[:, 5], policy.energy_change_converged(f0, f, 1e-6))
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(got[:, 6], ~np.isnan(policy.gradient_norm(g)))

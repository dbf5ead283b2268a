"""The device loop (``NewtonSolver(device_loop=...)``) against the host loop: same iterates to round-off (energies per
iteration, gradient norms, decrements, steps, tries, fallbacks, the final x, iteration count and stop reason), with
Armijo backtracking through +inf trial energies, continued line searches, pins, the iteration cap's gradient-only
evaluation, steepest-descent fallbacks and a failing linear solve; at most one host read per iteration (counted
around :func:`~warp_meshad._src.solve.device_loop.read_record`), none with ``poll=False`` but the final one; the
refusals. The gpu-marked test replays the iteration as CUDA graphs (``capture=True``) against the host loop."""

import os
import sys
from typing import Any

import numpy as np
import pytest
import warp as wp

from warp_meshad._src.problem.problem import Problem
from warp_meshad._src.solve import device_loop
from warp_meshad._src.solve.options import DeviceLoop
from warp_meshad._src.solve.linear import ScipySolver
from warp_meshad._src.solve.linear.base import _residual_norm
from warp_meshad._src.solve.solvers import NewtonHooks, NewtonSolver
from warp_meshad.kernels import ad

sys.path.insert(0, os.path.dirname(__file__))
from test_solvers import _FailingSolver, quadratic_problem, woody_problem  # noqa: E402

wp.config.log_level = wp.LOG_WARNING

pytestmark = pytest.mark.device

_LISTS = ("energies", "gradient_norms", "newton_decrements", "step_sizes")
_EXACT = ("iterations", "reason", "converged", "line_search_tries", "linear_iterations", "linear_converged",
          "steepest_descent_fallbacks", "fallback_reasons", "linear_solves_capped", "linear_solver")


def assert_same_solve(host, dev, rtol=1e-12):
    for name in _EXACT:
        assert getattr(dev, name) == getattr(host, name), (name, getattr(host, name), getattr(dev, name))
    for name in _LISTS:
        np.testing.assert_allclose(getattr(dev, name), getattr(host, name), rtol=rtol, atol=0.0, err_msg=name)
    np.testing.assert_allclose(dev.x.numpy(), host.x.numpy(), rtol=rtol, atol=1e-12)


@pytest.fixture
def reads(monkeypatch):
    """The number of device-loop host reads (calls of read_record)."""
    count = [0]
    original = device_loop.read_record

    def counted(arr):
        count[0] += 1
        return original(arr)

    monkeypatch.setattr(device_loop, "read_record", counted)
    return count


# ----------------------------------------------------------------------------------------------------------------------
# A barrier problem: Newton overshoots into +inf and backtracks
# ----------------------------------------------------------------------------------------------------------------------


@wp.func
def pseudo_huber_with_wall(e: int, x: Any):
    """sqrt(1 + (x - 1)^2), +inf left of x = -1: Newton's step from x = 3 is -10 (its curvature is too small)."""
    y = x - wp.float64(1.0)
    f = ad.sqrt(wp.float64(1.0) + y * y)
    return ad.where(ad.value(x) > wp.float64(-1.0), f, wp.float64(wp.inf))


def barrier_problem(device):
    problem = Problem(4, 1, wp.float64, device)
    problem.add_term(np.arange(4)[:, None], pseudo_huber_with_wall)
    x0 = wp.array([3.0, 2.9, 3.1, 2.8], dtype=wp.float64, device=device)
    return problem, x0


def trial_energies(problem, monkeypatch):
    seen = []
    original = problem.eval

    def recorded(x):
        seen.append(original(x))
        return seen[-1]

    monkeypatch.setattr(problem, "eval", recorded)
    return seen


@pytest.mark.parametrize("tolerances", [(1e-10, 0.0), (1e-10, 1e-3), (0.0, 0.0)],
                         ids=["decrement_or_gradient", "energy_change", "max_iterations"])
def test_backtracking_through_inf_same_as_host(device, monkeypatch, tolerances):
    tolerance, energy_tolerance = tolerances
    problem, x0 = barrier_problem(device)
    seen = trial_energies(problem, monkeypatch)
    kwargs = dict(max_iterations=12, tolerance=tolerance, energy_tolerance=energy_tolerance)
    host = NewtonSolver(problem, linear_solver="scipy", projection=None).solve(x0, **kwargs)
    assert np.isinf(seen).any() and max(host.line_search_tries) >= 5  # the first step backtracks through +inf
    evaluations = len(seen)
    dev = NewtonSolver(problem, linear_solver="scipy", projection=None, device_loop=True).solve(x0, **kwargs)
    assert_same_solve(host, dev)
    assert len(seen) == evaluations  # the device loop's trial energies stay on the device
    assert set(dev.time_ms) >= {"derivatives", "linear_solve", "line_search", "total"}


def test_at_most_one_read_per_iteration(device, reads):
    problem, x0 = barrier_problem(device)
    result = NewtonSolver(problem, linear_solver="scipy", projection=None, device_loop=True).solve(
        x0, max_iterations=12, tolerance=1e-10)
    assert result.line_search_tries[0] >= 5  # a backtracking step, within one slot's 8 trials
    # one read per evaluated point (the start and each step) and one for the history at the end
    assert result.iterations >= 3 and reads[0] == result.iterations + 2, (reads[0], result.iterations)


def test_line_search_continued_over_slots_same_as_host(device, reads):
    problem, x0 = barrier_problem(device)
    kwargs = dict(max_iterations=12, tolerance=1e-10)
    host = NewtonSolver(problem, linear_solver="scipy", projection=None).solve(x0, **kwargs)
    dev = NewtonSolver(problem, linear_solver="scipy", projection=None,
                       device_loop=DeviceLoop(trials=2)).solve(x0, **kwargs)
    assert_same_solve(host, dev)
    extra = sum((tries - 1) // 2 for tries in host.line_search_tries)  # slots that only go on with a line search
    assert extra >= 2 and reads[0] == host.iterations + 2 + extra


def test_no_read_before_the_end_with_poll_false(device, reads):
    problem, x0 = barrier_problem(device)
    kwargs = dict(max_iterations=6, tolerance=0.0, energy_tolerance=0.0)
    host = NewtonSolver(problem, linear_solver="scipy", projection=None).solve(x0, **kwargs)
    dev = NewtonSolver(problem, linear_solver="scipy", projection=None,
                       device_loop=DeviceLoop(poll=False)).solve(x0, **kwargs)
    assert_same_solve(host, dev)
    assert reads[0] == 1
    # converged before the cap: the slots queued after the stop change nothing
    host = NewtonSolver(problem, linear_solver="scipy", projection=None).solve(x0, max_iterations=20)
    dev = NewtonSolver(problem, linear_solver="scipy", projection=None,
                       device_loop=DeviceLoop(poll=False)).solve(x0, max_iterations=20)
    assert host.converged and host.iterations < 20
    assert_same_solve(host, dev)


# ----------------------------------------------------------------------------------------------------------------------
# Parametrization (projected Newton, pins, the cap's gradient-only evaluation), fallbacks
# ----------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def woody(request):
    return woody_problem(os.environ.get("WARP_MESHAD_TEST_DEVICE", "cpu"))


@pytest.mark.parametrize("max_iterations", [4, 30])
def test_projected_newton_on_woody_same_as_host(woody, max_iterations):
    problem, F, uv, area = woody
    x0 = wp.array(uv, dtype=wp.vec2d, device=problem.device)
    kwargs = dict(max_iterations=max_iterations, tolerance=1e-6)
    solvers = [NewtonSolver(problem, linear_solver="qdldl", fixed=[0, 7], device_loop=loop) for loop in (False, True)]
    host, dev = (solver.solve(x0, **kwargs) for solver in solvers)
    assert host.reason == ("max_iterations" if max_iterations == 4 else "newton_decrement")
    # on CUDA the atomic assembly sums in a varying order: the two loops' iterates then agree to round-off carried
    # through the iterations (measured on an H200: 1e-8 relative in x after 30 iterations), not bit for bit
    assert_same_solve(host, dev, rtol=1e-7 if problem.device.is_cuda else 1e-10)
    np.testing.assert_array_equal(dev.x.numpy()[[0, 7]], uv[[0, 7]])


def test_fallbacks_same_as_host(device):
    problem, K, rhs, x0 = quadratic_problem(seed=7, device=device, stiffness=-5.0)  # H negative definite: d ascends
    kwargs = dict(max_iterations=2)
    host, dev = (NewtonSolver(problem, linear_solver="scipy", projection=None, device_loop=loop).solve(
        x0, **kwargs) for loop in (False, True))
    assert host.fallback_reasons == {"not_descent_direction": 2}
    assert_same_solve(host, dev)
    problem, K, rhs, x0 = quadratic_problem(seed=8, device=device)
    kwargs = dict(max_iterations=3, tolerance=0.0, energy_tolerance=0.0)
    host, dev = (NewtonSolver(problem, linear_solver=_FailingSolver(), projection=None, device_loop=loop).solve(
        x0, **kwargs) for loop in (False, True))
    assert host.fallback_reasons == {"linear_solve_failed": 3}
    assert_same_solve(host, dev)


class _CholeskyLike(ScipySolver):
    """Defers its residual check as cuDSS does and, like Cholesky on a Hessian that stopped being positive definite,
    gives a finite wrong direction (half the solution) from its ``bad_from``-th solve on, until a rejection makes it
    switch (``switches``: as cuDSS's ``spd_or_general`` goes to LU). Its host-side :meth:`solve` checks and redoes
    as cuDSS's does."""

    name = "cholesky_like"
    defers_checks = True

    def __init__(self, bad_from=3, switches=True):
        super().__init__()
        self.bad_from, self.switches, self.solves, self.switched = bad_from, switches, 0, False

    @property
    def direction_rtol(self):
        return 0.0 if self.switched else 1e-6

    def direction_rejected(self):
        if self.switches and not self.switched:
            self.switched = True
            return True
        return False

    def solve(self, A, b, x):
        info = super().solve(A, b, x)
        self.solves += 1
        if not self.switched and self.solves >= self.bad_from:
            x.assign(0.5 * x.numpy())
        residual = _residual_norm(A, b, x, wp.empty_like(b))
        if self._deferred is not None:
            self._deferred.fill_(residual * residual)
        elif residual > self.direction_rtol * np.linalg.norm(b.numpy()) and self.direction_rejected():
            return self.solve(A, b, x)
        return info


def test_inaccurate_solve_is_rejected_and_redone_same_as_host(woody, reads):
    """A deferred solve whose residual exceeds the back-end's ``direction_rtol`` leaves its point without a direction;
    the host's next read lets the back-end switch and the next slot solves again: the host loop's iterates (which
    redo the solve in the same iteration), one extra read. Without a switch (or with ``poll=False``, no read) the
    point steps along ``-g`` and says so."""
    problem, F, uv, area = woody
    x0 = wp.array(uv, dtype=wp.vec2d, device=problem.device)
    kwargs = dict(max_iterations=30, tolerance=1e-6)
    host = NewtonSolver(problem, linear_solver=_CholeskyLike(), fixed=[0, 7]).solve(x0, **kwargs)
    backend = _CholeskyLike()
    reads[0] = 0
    dev = NewtonSolver(problem, linear_solver=backend, fixed=[0, 7], device_loop=True).solve(x0, **kwargs)
    assert backend.switched and dev.reason == "newton_decrement" and dev.iterations > 3
    assert_same_solve(host, dev, rtol=1e-7 if problem.device.is_cuda else 1e-10)
    extra = sum((tries - 1) // DeviceLoop().trials for tries in host.line_search_tries)  # continued line searches
    # a read before each slot (a step each, the slot that stops on the decrement, the rejected one), the read that
    # sees the stop and the history's
    assert reads[0] == (dev.iterations + 1 + 1 + extra) + 1 + 1, (reads[0], dev.iterations, extra)
    if problem.device.is_cuda:  # the captured loop (the solve between two graphs): the switch drops the graphs
        backend = _CholeskyLike()
        solver = NewtonSolver(problem, linear_solver=backend, fixed=[0, 7], device_loop=DeviceLoop(capture=True))
        captured = solver.solve(x0, **kwargs)
        assert backend.switched
        assert_same_solve(host, captured, rtol=1e-7)
    # the back-end cannot switch: a second rejection at the point steps along -g
    stuck = NewtonSolver(problem, linear_solver=_CholeskyLike(switches=False), fixed=[0, 7], device_loop=True).solve(
        x0, max_iterations=4, tolerance=0.0)
    assert stuck.fallback_reasons == {"linear_solve_inaccurate": 2}, stuck.fallback_reasons
    assert stuck.energies[-1] < stuck.energies[2] and stuck.iterations == 4
    # poll=False: no read to switch on, every inaccurate solve steps along -g at once
    backend = _CholeskyLike()
    blind = NewtonSolver(problem, linear_solver=backend, fixed=[0, 7], device_loop=DeviceLoop(poll=False)).solve(
        x0, max_iterations=6, tolerance=0.0)
    assert not backend.switched and backend.solves >= 3
    assert blind.fallback_reasons == {"linear_solve_inaccurate": blind.steepest_descent_fallbacks}
    assert blind.steepest_descent_fallbacks >= 1 and np.all(np.diff(blind.energies) < 0.0)


def test_callback_and_refusals(device):
    problem, x0 = barrier_problem(device)
    calls = {False: [], True: []}
    for loop in (False, True):
        result = NewtonSolver(problem, linear_solver="scipy", projection=None, device_loop=loop).solve(
            x0, callback=lambda i, x, f, loop=loop: calls[loop].append((i, f, x.numpy().copy())) or i == 2)
        assert result.reason == "callback" and result.iterations == 2
    for (i, f, x), (j, g, y) in zip(calls[False], calls[True], strict=True):
        assert i == j
        np.testing.assert_allclose(g, f, rtol=1e-12)
        np.testing.assert_allclose(y, x, rtol=1e-12)
    with pytest.raises(ValueError, match=r"NewtonSolver: incompatible options: device_loop with hooks.stop: .*; "
                                         r"device_loop with step_bound_fn: "):
        NewtonSolver(problem, linear_solver="scipy", device_loop=True, hooks=NewtonHooks(stop=lambda x, d: None),
                     step_bound_fn=lambda x, d: 1.0)
    if problem.device.is_cuda:
        with pytest.raises(ValueError, match=r"DeviceLoop\(capture=True\) with hooks.before_derivatives: "):
            NewtonSolver(problem, linear_solver="scipy", device_loop=DeviceLoop(capture=True),
                         hooks=NewtonHooks(before_derivatives=lambda x: None))
    else:
        with pytest.raises(ValueError, match=r"DeviceLoop\(capture=True\) with a problem on cpu: CUDA graphs need a "
                                             r"CUDA device"):
            NewtonSolver(problem, linear_solver="scipy", device_loop=DeviceLoop(capture=True))
    with pytest.raises(ValueError, match=r"DeviceLoop\(trials=...\): expected an int >= 1, got 0"):
        DeviceLoop(trials=0)
    with pytest.raises(TypeError, match="device_loop: expected a bool or a DeviceLoop, got str"):
        NewtonSolver(problem, linear_solver="scipy", device_loop="yes")
    with pytest.raises(ValueError, match=r"DeviceLoop\(poll=False\) with callback: "):
        NewtonSolver(problem, linear_solver="scipy", device_loop=DeviceLoop(poll=False)).solve(
            x0, callback=lambda i, x, f: None)


# ----------------------------------------------------------------------------------------------------------------------
# GPU: the iteration replayed as CUDA graphs
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("linear_solver", ["cudss", "cg"])
def test_captured_iteration_same_as_host_on_cuda(linear_solver):
    problem, F, uv, area = woody_problem("cuda:0")
    x0 = wp.array(uv, dtype=wp.vec2d, device="cuda:0")
    kwargs = dict(max_iterations=30, tolerance=1e-6)
    # two pins: without them the minimizer is defined up to a rigid motion of the layout, along which x may drift
    host = NewtonSolver(problem, linear_solver=linear_solver, fixed=[0, 7]).solve(x0, **kwargs)
    for loop in (True, DeviceLoop(capture=True), DeviceLoop(capture=True, poll=False),
                 DeviceLoop(capture=True, capture_solve=False)):
        solver = NewtonSolver(problem, linear_solver=linear_solver, fixed=[0, 7], device_loop=loop)
        dev = solver.solve(x0, **kwargs)
        if linear_solver == "cudss" and loop is not True:  # cuDSS's direct calls are captured in the slot's graph
            runner = solver._device_loop
            assert runner.solve_capture_error is None, runner.solve_capture_error
            whole = [key for key in runner._graphs if key[-1] == "whole"]
            assert len(whole) == (1 if loop.capture_solve else 0)
        # GPU atomics sum in a varying order: the same iterates to round-off, not bit for bit
        assert dev.reason == host.reason and abs(dev.iterations - host.iterations) <= 1
        np.testing.assert_allclose(dev.energies[-1], host.energies[-1], rtol=1e-9)
        np.testing.assert_allclose(dev.x.numpy(), host.x.numpy(), rtol=1e-6, atol=1e-8)


@pytest.mark.gpu
def test_captured_second_run_replays_from_its_first_slot_same_as_host(monkeypatch):
    """A time-stepping user calls ``solve`` again on the same solver: the second run replays the first run's graphs
    from its first slot (its only capture: the derivatives at its start point) and still takes the host loop's
    iterates, from other starts too; the third run captures nothing."""
    problem, F, uv, area = woody_problem("cuda:0")
    kwargs = dict(max_iterations=30, tolerance=1e-6)
    starts = [uv, uv + 0.01 * np.sin(7.0 * uv[:, ::-1]), uv - 0.01 * np.cos(5.0 * uv)]
    solver = NewtonSolver(problem, linear_solver="cudss", fixed=[0, 7], device_loop=DeviceLoop(capture=True))
    captures = []
    original = wp.ScopedCapture.__enter__

    def counted(self):
        captures.append(1)
        return original(self)

    monkeypatch.setattr(wp.ScopedCapture, "__enter__", counted)
    for k, start in enumerate(starts):
        x0 = wp.array(start, dtype=wp.vec2d, device="cuda:0")
        dev = solver.solve(x0, **kwargs)
        # run 1: the whole slot, the cuDSS solve included; run 2: the start's derivatives; run 3: nothing new
        assert len(captures) == min(k + 1, 2), (k, len(captures))
        host = NewtonSolver(problem, linear_solver="cudss", fixed=[0, 7]).solve(x0, **kwargs)
        assert dev.reason == host.reason and abs(dev.iterations - host.iterations) <= 1
        np.testing.assert_allclose(dev.energies[-1], host.energies[-1], rtol=1e-9)
        np.testing.assert_allclose(dev.x.numpy(), host.x.numpy(), rtol=1e-6, atol=1e-8)


@pytest.mark.gpu
@pytest.mark.parametrize("conditional", [True, False], ids=["while_node", "trials_per_slot"])
def test_captured_line_search_backtracks_same_as_host(conditional, reads):
    """The captured slot's line search as a while node of the graph (``DeviceLoop(conditional=True)``, the default)
    or as ``trials`` per slot: backtracking through +inf energies gives the host loop's iterates and tries. The while
    node finishes each line search in its slot; only the first slot (uncaptured, ``trials`` = 2) hands its line
    search on (once), while ``trials`` per slot hands on every line search that needs more, as often as it needs."""
    problem, x0 = barrier_problem("cuda:0")
    kwargs = dict(max_iterations=12, tolerance=1e-10)
    host = NewtonSolver(problem, linear_solver="scipy", projection=None).solve(x0, **kwargs)
    solver = NewtonSolver(problem, linear_solver="scipy", projection=None,
                          device_loop=DeviceLoop(capture=True, trials=2, conditional=conditional))
    reads[0] = 0
    dev = solver.solve(x0, **kwargs)
    runner = solver._device_loop
    assert runner.conditional is conditional and runner.conditional_error is None, runner.conditional_error
    assert_same_solve(host, dev, rtol=1e-10)
    tries = host.line_search_tries
    assert tries[0] >= 5, tries  # the first line search needs three slots of 2 trials, or one while node after one
    handed_on = [(t - 1) // 2 for t in tries]
    extra = min(handed_on[0], 1) if conditional else sum(handed_on)
    assert reads[0] == host.iterations + 2 + extra, (reads[0], host.iterations, tries)

"""The first-order device loop (``LBFGSSolver`` / ``GradientDescentSolver`` with ``device_loop=...``) against the host
loop: the same iterates (energies, gradient norms, steps, tries, fallbacks, the final x, iteration count and stop
reason), bit for bit on the CPU and to round-off on a GPU; through +inf trial energies and line searches continued
over slots, with pins, skipped curvature pairs (a nonconvex energy), scalar and float32 variables, each stop reason;
the host reads (one per slot with ``poll=True``; with capture and ``poll=False`` none before the end); the refusals.
The gpu-marked tests replay the iteration, and the whole solve, as CUDA graphs."""

import os
import sys
from typing import Any

import numpy as np
import pytest
import warp as wp

import warp_meshad as wm
from warp_meshad._src.solve import device_loop, first_order_loop
from warp_meshad._src.solve.options import DeviceLoop
from warp_meshad.kernels import ad

sys.path.insert(0, os.path.dirname(__file__))
from test_device_loop import barrier_problem  # noqa: E402
from test_solvers import woody_problem  # noqa: E402

pytestmark = pytest.mark.device

_SOLVERS = {
    "lbfgs": (wm.LBFGSSolver, {"history": 4, "initial_step": 1e-2}),
    "gradient_descent": (wm.GradientDescentSolver, {"step": 1e-2}),
}
_EXACT = ("iterations", "reason", "converged", "line_search_tries", "steepest_descent_fallbacks", "fallback_reasons",
          "linear_solver", "newton_decrements", "linear_iterations")
_LISTS = ("energies", "gradient_norms", "step_sizes")


def assert_same_solve(host, dev, on_cpu: bool, rtol: float = 1e-6, atol: float = 1e-10, list_atol: float = 0.0):
    """Bit for bit on the CPU; on a GPU the same decisions and values to ``rtol`` (float atomics add the element
    gradients in a varying order, and on woody's stiff energy the iterates of two host-loop runs part as fast), the
    per-iteration lists also to ``list_atol`` times their largest magnitude (a late gradient norm far below the first
    carries the rounding of the first: float32)."""
    for name in _EXACT:
        assert getattr(dev, name) == getattr(host, name), (name, getattr(host, name), getattr(dev, name))
    for name in _LISTS:
        if on_cpu:
            assert getattr(dev, name) == getattr(host, name), name
        else:
            want = np.asarray(getattr(host, name), dtype=np.float64)
            scale = float(np.max(np.abs(want[np.isfinite(want)]), initial=0.0))
            np.testing.assert_allclose(getattr(dev, name), want, rtol=rtol, atol=list_atol * scale, err_msg=name)
    if on_cpu:
        np.testing.assert_array_equal(dev.x.numpy(), host.x.numpy())
    else:
        np.testing.assert_allclose(dev.x.numpy(), host.x.numpy(), rtol=rtol, atol=atol)


@pytest.fixture
def reads(monkeypatch):
    """The number of host reads of the first-order loop (calls of read_record)."""
    count = [0]
    original = device_loop.read_record

    def counted(arr):
        count[0] += 1
        return original(arr)

    monkeypatch.setattr(first_order_loop, "read_record", counted)
    monkeypatch.setattr(device_loop, "read_record", counted)  # the per-slot read (DeviceLoopBase._poll)
    return count


@pytest.fixture(scope="module")
def woody():
    return woody_problem(os.environ.get("WARP_MESHAD_TEST_DEVICE", "cpu"))


# ----------------------------------------------------------------------------------------------------------------------
# A nonconvex scalar energy: negative curvature at the start, so early curvature pairs are skipped
# ----------------------------------------------------------------------------------------------------------------------


@wp.func
def double_well(e: int, x: Any):
    """(x^2 - 1)^2: concave for |x| < 1/sqrt(3)."""
    u = x * x - wp.float64(1.0)
    return u * u


def double_well_problem(device):
    problem = wm.Problem(6, 1, wp.float64, device)
    problem.add_term(np.arange(6)[:, None], double_well)
    x0 = wp.array([0.05, -0.1, 0.2, 0.3, -0.25, 0.15], dtype=wp.float64, device=device)
    return problem, x0


@wp.func
def spring32(e: int, xa: Any, xb: Any):
    """float32 springs of rest length 0.1."""
    l = ad.length(xa - xb)
    return 0.5 * (l - 0.1) * (l - 0.1)


# ----------------------------------------------------------------------------------------------------------------------
# Same iterates as the host loop
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(_SOLVERS))
@pytest.mark.parametrize("options", [True, DeviceLoop(trials=1), DeviceLoop(poll=False)],
                         ids=["poll", "one_trial_per_slot", "device_stop"])
def test_woody_same_as_host(woody, name, options):
    problem, faces, uv, _ = woody
    cls, kwargs = _SOLVERS[name]
    x0 = wp.array(uv, dtype=wp.vec2d, device=problem.device)
    solve = dict(max_iterations=12, tolerance=1e-9)
    host = cls(problem, **kwargs).solve(x0, **solve)
    dev = cls(problem, device_loop=options, **kwargs).solve(x0, **solve)
    assert host.iterations == 12 and max(host.line_search_tries) >= 2  # some backtracking
    assert_same_solve(host, dev, problem.device.is_cpu)
    assert dev.linear_solver is None and dev.newton_decrements == []


@pytest.mark.parametrize("fused", [True, False], ids=["one_block", "launches_per_pair"])
def test_two_loop_forms_same_as_host(woody, fused, monkeypatch):
    problem, faces, uv, _ = woody
    monkeypatch.setattr(first_order_loop.FirstOrderLoopRunner, "fused_two_loop_max_scalars", 1 << 30 if fused else 0)
    x0 = wp.array(uv, dtype=wp.vec2d, device=problem.device)
    solve = dict(max_iterations=12, tolerance=1e-9)
    host = wm.LBFGSSolver(problem, history=4, initial_step=1e-2).solve(x0, **solve)
    solver = wm.LBFGSSolver(problem, history=4, initial_step=1e-2, device_loop=True)
    assert solver._device_loop._fused == fused
    assert_same_solve(host, solver.solve(x0, **solve), problem.device.is_cpu)


@pytest.mark.cpu
def test_one_block_two_loop_with_many_lanes_on_cpu_fibers(monkeypatch):
    """The one-block recursion's lanes (each its own strided variables, the dots as tile sums) checked on the CPU with
    Warp's CPU blocks: 8 lanes sum in another order, so to round-off."""
    problem, x0 = double_well_problem("cpu")
    solve = dict(max_iterations=30, tolerance=1e-12)
    host = wm.LBFGSSolver(problem, history=3, initial_step=0.1).solve(x0, **solve)
    monkeypatch.setattr(wp.config, "enable_cpu_blocks", True)
    solver = wm.LBFGSSolver(problem, history=3, initial_step=0.1, device_loop=True)
    solver._device_loop._fused_block_dim = 8
    assert_same_solve(host, solver.solve(x0, **solve), on_cpu=False, rtol=1e-10)


@pytest.mark.parametrize("name", sorted(_SOLVERS))
def test_backtracking_through_inf_with_pins_same_as_host(device, name):
    problem, x0 = barrier_problem(device)
    cls, _ = _SOLVERS[name]
    kwargs = {"history": 3} if name == "lbfgs" else {"step": 8.0}
    solve = dict(max_iterations=15, tolerance=1e-10)
    host = cls(problem, fixed=[1], **kwargs).solve(x0, **solve)
    dev = cls(problem, fixed=[1], device_loop=DeviceLoop(trials=2), **kwargs).solve(x0, **solve)
    assert_same_solve(host, dev, problem.device.is_cpu)
    assert max(host.line_search_tries) > 2  # a line search went on in a second slot
    assert dev.x.numpy()[1] == x0.numpy()[1]  # the pin did not move


def test_skipped_curvature_pairs_on_scalar_variables_same_as_host(device, monkeypatch):
    problem, x0 = double_well_problem(device)
    skipped = []
    original = wm.LBFGSSolver._derivatives

    def counted(self, x):  # how many pairs the host loop keeps after each step
        out = original(self, x)
        skipped.append(len(self._pairs))
        return out

    solve = dict(max_iterations=40, tolerance=1e-12)
    with monkeypatch.context() as m:
        m.setattr(wm.LBFGSSolver, "_derivatives", counted)
        host = wm.LBFGSSolver(problem, history=3, initial_step=0.1).solve(x0, **solve)
    assert skipped[1] == 0  # the first pair crossed negative curvature (s . y < 0) and was skipped
    dev = wm.LBFGSSolver(problem, history=3, initial_step=0.1, device_loop=True).solve(x0, **solve)
    assert_same_solve(host, dev, problem.device.is_cpu)
    assert host.converged and np.allclose(np.abs(dev.x.numpy()), 1.0, atol=1e-5)


def test_float32_variables_same_as_host(device):
    mesh = wm.TriMesh.grid(5, 5)
    problem = wm.Problem(mesh.vertex_count, 3, wp.float32, device)
    problem.add_term(mesh.edges, spring32)
    rng = np.random.default_rng(3)
    x0 = wp.array(mesh.vertices + 0.02 * rng.standard_normal(mesh.vertices.shape), dtype=wp.vec3f, device=device)
    solve = dict(max_iterations=20, tolerance=1e-7)
    for cls, kwargs in _SOLVERS.values():
        host = cls(problem, fixed=[0], **kwargs).solve(x0, **solve)
        dev = cls(problem, fixed=[0], device_loop=True, **kwargs).solve(x0, **solve)
        # float32: x to 1e-6 of ~1; a gradient norm to 1e-5 of the first (the sum's rounding in float32)
        assert_same_solve(host, dev, problem.device.is_cpu, rtol=1e-4, atol=1e-6, list_atol=1e-5)


@pytest.mark.parametrize("case", ["gradient_norm", "energy_change", "max_iterations_zero", "line_search_failed",
                                  "non_finite_energy"])
def test_stop_reasons_same_as_host(device, case):
    problem, x0 = double_well_problem(device)
    solve = dict(max_iterations=50, tolerance=1e-6, energy_tolerance=0.0)
    kwargs = {"history": 3, "initial_step": 0.1}
    if case == "energy_change":
        solve["energy_tolerance"] = 1e-3
    elif case == "max_iterations_zero":
        solve["max_iterations"] = 0
    elif case == "line_search_failed":
        kwargs["line_search"] = wm.LineSearch(tries=1)
        kwargs["initial_step"] = 50.0
    elif case == "non_finite_energy":
        problem, x0 = barrier_problem(device)
        x0 = wp.array([-3.0, 2.9, 3.1, 2.8], dtype=wp.float64, device=device)  # +inf at the start
    host = wm.LBFGSSolver(problem, **kwargs).solve(x0, check_finite=False, **solve)
    assert host.reason == ("max_iterations" if case == "max_iterations_zero" else case)
    dev = wm.LBFGSSolver(problem, device_loop=True, **kwargs).solve(x0, check_finite=False, **solve)
    assert_same_solve(host, dev, problem.device.is_cpu)


def test_reads_per_slot_and_callback(device, reads):
    problem, x0 = double_well_problem(device)
    seen = []
    result = wm.LBFGSSolver(problem, history=3, initial_step=0.1, device_loop=True).solve(
        x0, max_iterations=30, tolerance=1e-12, callback=lambda it, x, f: seen.append((it, f)) or it == 4)
    assert result.reason == "callback" and result.iterations == 4
    assert [it for it, _ in seen] == [1, 2, 3, 4]
    np.testing.assert_allclose([f for _, f in seen], result.energies[1:5], rtol=0, atol=0)
    assert reads[0] == 4 + 1 + 1  # the start, one per slot, the record at the end


def test_refusals(device):
    problem, x0 = double_well_problem(device)
    with pytest.raises(ValueError, match="step_bound_fn"):
        wm.LBFGSSolver(problem, step_bound_fn=lambda x, d: 1.0, device_loop=True)
    with pytest.raises(ValueError, match="callback"):
        wm.GradientDescentSolver(problem, device_loop=DeviceLoop(poll=False)).solve(x0, callback=lambda *a: None)
    if not problem.device.is_cuda:
        with pytest.raises(ValueError, match="CUDA"):
            wm.LBFGSSolver(problem, device_loop=DeviceLoop(capture=True))
    with pytest.raises(TypeError, match="DeviceLoop"):
        wm.LBFGSSolver(problem, device_loop="capture")


# ----------------------------------------------------------------------------------------------------------------------
# CUDA graphs
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("poll", [True, False], ids=["graph_per_slot", "one_graph_per_solve"])
@pytest.mark.parametrize("name", sorted(_SOLVERS))
def test_captured_same_as_host_on_cuda(name, poll, reads):
    problem, faces, uv, _ = woody_problem("cuda:0")
    cls, kwargs = _SOLVERS[name]
    x0 = wp.array(uv, dtype=wp.vec2d, device="cuda:0")
    solve = dict(max_iterations=12, tolerance=1e-9)
    host = cls(problem, **kwargs).solve(x0, **solve)
    solver = cls(problem, device_loop=DeviceLoop(capture=True, poll=poll), **kwargs)
    first = solver.solve(x0, **solve)  # loads the kernels (its first slot uncaptured), captures
    assert_same_solve(host, first, on_cpu=False)
    reads[0] = 0
    second = solver.solve(x0, **solve)  # replays the graphs from its first slot on
    assert_same_solve(host, second, on_cpu=False)
    runner = solver._device_loop
    if poll:
        assert reads[0] == second.iterations + 2
    else:
        assert runner.captured_solve_error is None, runner.captured_solve_error
        assert reads[0] == 1  # the record, once, at the end

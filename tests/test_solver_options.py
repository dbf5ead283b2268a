"""warp_meshad._src.solve.options: the grouped solver options (LineSearch, Projection, DeviceLoop), the solvers'
keyword-only signatures, and check_compatible (one test per refused pair, each message naming both options)."""

import dataclasses
import inspect
import math
import os
import sys
from typing import Any

import numpy as np
import pytest
import warp as wp

import warp_meshad as wm
from warp_meshad._src.solve import options
from warp_meshad._src.solve.linear import ScipySolver
from warp_meshad._src.solve.options import DeviceLoop, LineSearch, Projection, check_compatible

sys.path.insert(0, os.path.dirname(__file__))
from test_device_loop import barrier_problem  # noqa: E402
from test_solvers import quadratic_problem  # noqa: E402

_SOLVERS = (wm.NewtonSolver, wm.GaussNewtonSolver, wm.NewtonCGSolver, wm.LBFGSSolver, wm.GradientDescentSolver)


@wp.func
def _double_well(e: int, x: Any):
    """(x^2 - 1)^2 per variable: second derivative 12 x^2 - 4 (negative for |x| < 1/sqrt(3))."""
    u = x * x - wp.float64(1.0)
    return u * u


def _double_well_problem(x):
    problem = wm.Problem(len(x), 1, wp.float64, "cpu")
    problem.add_term(np.arange(len(x))[:, None], _double_well)
    return problem, wp.array(x, dtype=wp.float64, device="cpu")


# ----------------------------------------------------------------------------------------------------------------------
# The option objects
# ----------------------------------------------------------------------------------------------------------------------


def test_options_are_public_and_frozen():
    for name in ("LineSearch", "Projection", "DeviceLoop"):
        assert getattr(wm, name) is getattr(options, name) and name in wm.__all__
    assert LineSearch() == LineSearch(shrink=0.8, tries=64, c=1e-4)  # TinyAD's settings
    assert Projection() == Projection(mode="clamp", eps=1e-9)
    with pytest.raises(dataclasses.FrozenInstanceError):
        LineSearch().shrink = 0.5


@pytest.mark.parametrize("kwargs, error, message", [
    ({"shrink": 1.0}, ValueError, r"LineSearch\(shrink=...\): expected a value in \(0, 1\), got 1.0"),
    ({"shrink": 0.0}, ValueError, r"LineSearch\(shrink=...\): expected a value in \(0, 1\), got 0.0"),
    ({"c": 1.5}, ValueError, r"LineSearch\(c=...\): expected a value in \(0, 1\), got 1.5"),
    ({"tries": 0}, ValueError, r"LineSearch\(tries=...\): expected >= 1, got 0"),
    ({"tries": 2.5}, TypeError, r"LineSearch\(tries=...\): expected an int >= 1, got 2.5"),
    ({"shrink": "0.5"}, TypeError, r"LineSearch\(shrink=...\): expected a float in \(0, 1\), got '0.5'"),
    ({"c": True}, TypeError, r"LineSearch\(c=...\): expected a float in \(0, 1\), got True"),
], ids=["shrink_1", "shrink_0", "c", "tries_0", "tries_float", "shrink_str", "c_bool"])
def test_line_search_checks_its_values(kwargs, error, message):
    with pytest.raises(error, match=message):
        LineSearch(**kwargs)


def test_line_search_keeps_numbers_as_python_floats_and_ints():
    ls = LineSearch(shrink=np.float32(0.5), tries=np.int64(7), c=np.float64(1e-3))
    assert type(ls.shrink) is float and type(ls.tries) is int and type(ls.c) is float
    assert (ls.shrink, ls.tries, ls.c) == (0.5, 7, 1e-3)


@pytest.mark.parametrize("kwargs, message", [
    ({"mode": "flip"}, r"Projection\(mode=...\): expected one of \('clamp', 'abs'\), got 'flip'"),
    ({"eps": -1e-9}, r"Projection\(eps=...\): expected a finite number >= 0, got -1e-09"),
    ({"eps": math.nan}, r"Projection\(eps=...\): expected a finite number >= 0, got nan"),
    ({"eps": "1e-9"}, r"Projection\(eps=...\): expected a finite number >= 0, got '1e-9'"),
], ids=["mode", "negative_eps", "nan_eps", "str_eps"])
def test_projection_checks_its_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Projection(**kwargs)


def test_device_loop_checks_its_values():
    with pytest.raises(ValueError, match=r"DeviceLoop\(trials=...\): expected an int >= 1, got 0"):
        DeviceLoop(trials=0)
    with pytest.raises(TypeError, match=r"DeviceLoop\(poll=...\): expected a bool, got 'no'"):
        DeviceLoop(poll="no")
    assert options.device_loop_options(True) == DeviceLoop() and options.device_loop_options(False) is None
    with pytest.raises(TypeError, match="device_loop: expected a bool or a DeviceLoop, got dict"):
        options.device_loop_options({"capture": True})


# ----------------------------------------------------------------------------------------------------------------------
# The solvers take them, keyword-only
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [*_SOLVERS, wm.BatchNewtonSolver], ids=lambda c: c.__name__)
def test_every_argument_after_the_problem_is_keyword_only(cls):
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]  # past self
    assert params[0].name in ("problem", "batch") and params[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert [p.name for p in params[1:] if p.kind is not inspect.Parameter.KEYWORD_ONLY] == []
    names = {p.name for p in params}
    assert "line_search" in names
    assert not names & {"shrink", "max_line_search_tries", "armijo_c", "project_hessian", "projection_eps"}
    problem, _, _, _ = quadratic_problem()
    first = wm.ProblemBatch([problem]) if cls is wm.BatchNewtonSolver else problem
    with pytest.raises(TypeError, match="positional argument"):
        cls(first, "scipy")


def _armijo_reference(x0, d, energy, slope, ls):
    """(alpha, tries) of Armijo backtracking from alpha = 1, in float64 NumPy."""
    f0, alpha = energy(x0), 1.0
    for tries in range(1, ls.tries + 1):
        f = energy(x0 + alpha * d)
        if math.isfinite(f) and f <= f0 + ls.c * alpha * slope:
            return alpha, tries
        alpha *= ls.shrink
    return 0.0, ls.tries


@pytest.mark.parametrize("loop", [False, DeviceLoop(trials=2)], ids=["host_loop", "device_loop"])
@pytest.mark.parametrize("ls", [LineSearch(), LineSearch(shrink=0.5, tries=3, c=0.9), LineSearch(shrink=0.3, c=0.4),
                                LineSearch(shrink=0.5, tries=2)], ids=["default", "tries_3", "shrink_c", "fails"])
def test_newton_line_search_follows_its_settings(loop, ls):
    """sqrt(1 + (x - 1)^2) with a wall at x = -1: the first Newton step overshoots into +inf, and the trials that
    follow are those of a NumPy Armijo loop with the same settings."""
    problem, x0 = barrier_problem("cpu")
    x = x0.numpy()
    y = x - 1.0
    d = -(y / np.sqrt(1 + y * y)) * (1 + y * y) ** 1.5  # -f'/f'' per variable (the Hessian is diagonal)

    def energy(z):
        return float(np.sum(np.sqrt(1 + (z - 1) ** 2))) if np.all(z > -1) else math.inf

    slope = float(np.dot(y / np.sqrt(1 + y * y), d))
    alpha, tries = _armijo_reference(x, d, energy, slope, ls)
    result = wm.NewtonSolver(problem, linear_solver="scipy", projection=None, line_search=ls,
                             device_loop=loop).solve(x0, max_iterations=1)
    assert result.line_search_tries[0] == tries and (alpha > 0.0) == (result.reason != "line_search_failed")
    np.testing.assert_allclose(result.step_sizes[0], alpha, rtol=1e-15)
    assert tries >= 2  # the default settings backtrack too


@pytest.mark.parametrize("cls", [wm.LBFGSSolver, wm.GradientDescentSolver, wm.NewtonCGSolver],
                         ids=lambda c: c.__name__)
def test_first_order_and_matrix_free_solvers_stop_after_line_search_tries(cls):
    """A first step along -g of length 50 lands in +inf; LineSearch(tries=...) bounds the trials."""
    problem, x0 = barrier_problem("cpu")
    kwargs = {wm.LBFGSSolver: {"initial_step": 50.0}, wm.GradientDescentSolver: {"step": 50.0}}.get(cls, {})
    for tries in (1, 3):
        result = cls(problem, line_search=LineSearch(shrink=0.9, tries=tries), **kwargs).solve(x0, max_iterations=1)
        assert result.line_search_tries == [tries]
    with pytest.raises(TypeError, match=rf"{cls.__name__}\(line_search=...\): expected a LineSearch, got dict"):
        cls(problem, line_search={"tries": 3})


@pytest.mark.parametrize("projection, expected", [
    (None, lambda h: h),
    (Projection(mode="clamp", eps=0.5), lambda h: np.maximum(h, 0.5)),
    (Projection(mode="abs", eps=0.5), lambda h: np.maximum(np.abs(h), 0.5)),
    (Projection(mode="abs", eps=4.0), lambda h: np.maximum(np.abs(h), 4.0)),
], ids=["exact", "clamp", "abs", "abs_large_eps"])
def test_newton_projects_each_element_hessian_as_its_projection_says(projection, expected):
    """One variable per element: each element Hessian is the scalar 12 x^2 - 4, so the assembled diagonal is its
    projection, in closed form."""
    x = np.array([0.1, 0.9, -0.3, 1.2])
    problem, x0 = _double_well_problem(x)
    solver = wm.NewtonSolver(problem, linear_solver="scipy", projection=projection)
    assert solver.projection == projection
    _, _, H = solver.system(x0)
    np.testing.assert_allclose(wm.to_scipy(H).diagonal(), expected(12 * x * x - 4), rtol=1e-13)


def test_device_loop_projects_as_the_host_loop():
    """The device loop's Hessian reads the same Projection: its iterates are the host loop's (CPU: bit for bit), and
    another mode gives other iterates."""
    problem, x0 = _double_well_problem(np.array([0.1, 0.9, -0.3, 1.2, 0.4]))
    runs = {}
    for mode in ("clamp", "abs"):
        for loop in (False, True):
            runs[mode, loop] = wm.NewtonSolver(problem, linear_solver="scipy", device_loop=loop,
                                               projection=Projection(mode=mode, eps=0.1)).solve(x0, max_iterations=6)
    for mode in ("clamp", "abs"):
        host, dev = runs[mode, False], runs[mode, True]
        assert host.energies == dev.energies and host.step_sizes == dev.step_sizes
        np.testing.assert_array_equal(dev.x.numpy(), host.x.numpy())
    assert runs["clamp", False].energies[1] != runs["abs", False].energies[1]
    with pytest.raises(TypeError, match=r"NewtonSolver\(projection=...\): expected a Projection or None, got 'abs'"):
        wm.NewtonSolver(problem, projection="abs")


@pytest.mark.parametrize("case", ["line_search", "projection"])
def test_batch_solver_takes_the_options_as_the_single_solver(case):
    """BatchNewtonSolver's own line search reads LineSearch, its Newton systems Projection: each mesh takes the steps
    of the single-mesh solve with the same options (backtracking past the wall of the barrier; the double well's
    concave start, where the two projection modes take different steps)."""
    if case == "line_search":
        made = [barrier_problem("cpu") for _ in range(2)]
        kw = {"projection": None, "line_search": LineSearch(shrink=0.5, tries=9, c=0.3)}
        other = dict(kw, line_search=LineSearch())
    else:
        made = [_double_well_problem(np.array(x)) for x in ([0.1, 0.3, -0.2], [0.4, -0.45, 0.05])]
        kw = {"projection": Projection(mode="abs", eps=0.1), "line_search": LineSearch(c=0.4)}
        other = dict(kw, projection=Projection(mode="clamp", eps=0.1))
    problems, starts = [p for p, _ in made], [x for _, x in made]
    batch = wm.ProblemBatch(problems)
    solver = wm.BatchNewtonSolver(batch, linear_solver="scipy", **kw)
    assert solver.line_search == kw["line_search"] and solver.projection == kw["projection"]
    results = solver.solve(batch.join(starts), max_iterations=10).results
    for problem, x0, result in zip(problems, starts, results, strict=True):
        single = wm.NewtonSolver(problem, linear_solver="scipy", **kw).solve(x0, max_iterations=10)
        assert result.line_search_tries == single.line_search_tries and result.reason == single.reason
        np.testing.assert_allclose(result.step_sizes, single.step_sizes, rtol=1e-12)
        np.testing.assert_allclose(result.energies, single.energies, rtol=1e-12)
        # the options matter: the defaults (line search) or the other mode (projection) take other steps
        default = wm.NewtonSolver(problem, linear_solver="scipy", **other).solve(x0, max_iterations=10)
        assert default.energies[1] != single.energies[1]


# ----------------------------------------------------------------------------------------------------------------------
# check_compatible: one test per refused pair
# ----------------------------------------------------------------------------------------------------------------------


def _hook(*args):
    return None


def test_device_loop_with_hooks_stop_is_refused():
    problem, _, _, _ = quadratic_problem()
    with pytest.raises(ValueError, match=r"^NewtonSolver: incompatible options: device_loop with hooks.stop: "
                                         r"hooks.stop is host code inside the iteration.*\(expected one of the two, "
                                         r"got both\)$"):
        wm.NewtonSolver(problem, device_loop=True, hooks=wm.NewtonHooks(stop=_hook))
    wm.NewtonSolver(problem, hooks=wm.NewtonHooks(stop=_hook))  # the host loop takes it


def test_device_loop_with_hooks_line_search_energy_is_refused():
    problem, _, _, _ = quadratic_problem()
    with pytest.raises(ValueError, match=r"NewtonSolver: incompatible options: device_loop with "
                                         r"hooks.line_search_energy: "):
        wm.NewtonSolver(problem, device_loop=DeviceLoop(trials=2), hooks=wm.NewtonHooks(line_search_energy=_hook))


@pytest.mark.parametrize("cls", [wm.NewtonSolver, wm.LBFGSSolver, wm.GradientDescentSolver],
                         ids=lambda c: c.__name__)
def test_device_loop_with_step_bound_fn_is_refused(cls):
    problem, _, _, _ = quadratic_problem()
    with pytest.raises(ValueError, match=rf"^{cls.__name__}: incompatible options: device_loop with step_bound_fn: "):
        cls(problem, device_loop=True, step_bound_fn=_hook)
    cls(problem, step_bound_fn=_hook)


def test_captured_device_loop_with_hooks_before_derivatives_is_refused():
    problem, _, _, _ = quadratic_problem()
    with pytest.raises(ValueError, match=r"DeviceLoop\(capture=True\) with hooks.before_derivatives: host code cannot "
                                         r"be replayed in a CUDA graph"):
        wm.NewtonSolver(problem, device_loop=DeviceLoop(capture=True),
                        hooks=wm.NewtonHooks(before_derivatives=_hook))
    wm.NewtonSolver(problem, device_loop=True, hooks=wm.NewtonHooks(before_derivatives=_hook))  # uncaptured: run


@pytest.mark.parametrize("cls", [wm.NewtonSolver, wm.LBFGSSolver, wm.GradientDescentSolver],
                         ids=lambda c: c.__name__)
def test_captured_device_loop_on_a_cpu_problem_is_refused(cls):
    problem, _, _, _ = quadratic_problem(device="cpu")
    with pytest.raises(ValueError, match=rf"^{cls.__name__}: incompatible options: DeviceLoop\(capture=True\) with a "
                                         r"problem on cpu: CUDA graphs need a CUDA device"):
        cls(problem, device_loop=DeviceLoop(capture=True))


def test_keep_start_factors_with_an_unpolled_device_loop_is_refused():
    problem, _, _, _ = quadratic_problem()
    with pytest.raises(ValueError, match=r"NewtonSolver: incompatible options: DeviceLoop\(poll=False\) with "
                                         r"keep_start_factors=True: "):
        wm.NewtonSolver(problem, linear_solver="scipy", keep_start_factors=True, device_loop=DeviceLoop(poll=False))
    wm.NewtonSolver(problem, linear_solver="scipy", keep_start_factors=True, device_loop=DeviceLoop(poll=True))


@pytest.mark.parametrize("cls", [wm.NewtonSolver, wm.LBFGSSolver, wm.GradientDescentSolver],
                         ids=lambda c: c.__name__)
def test_callback_with_an_unpolled_device_loop_is_refused(cls):
    problem, _, _, x0 = quadratic_problem()
    solver = cls(problem, device_loop=DeviceLoop(poll=False))
    with pytest.raises(ValueError, match=rf"^{cls.__name__}: incompatible options: DeviceLoop\(poll=False\) with "
                                         r"callback: the callback runs on the host after every iteration"):
        solver.solve(x0, callback=_hook)
    seen = []
    result = cls(problem, device_loop=True).solve(x0, max_iterations=3, callback=lambda i, x, f: seen.append(i))
    assert result.iterations >= 1 and seen == list(range(1, result.iterations + 1))  # polled: called every step


@pytest.mark.parametrize("cls", [wm.NewtonSolver, wm.GaussNewtonSolver, wm.BatchNewtonSolver],
                         ids=lambda c: c.__name__)
def test_a_linear_solver_instance_with_linear_solver_options_is_refused(cls):
    problem, _, _, _ = quadratic_problem()
    first = wm.ProblemBatch([problem]) if cls is wm.BatchNewtonSolver else problem
    with pytest.raises(ValueError, match=rf"^{cls.__name__}: incompatible options: linear_solver=ScipySolver\(...\) "
                                         r"with linear_solver_options=\{'matrix_type': 'general'\}: "):
        cls(first, linear_solver=ScipySolver(), linear_solver_options={"matrix_type": "general"})
    assert cls(first, linear_solver=ScipySolver(), linear_solver_options={}).linear_solver.name == "scipy"


def test_every_refused_pair_is_named_in_one_message():
    problem, _, _, _ = quadratic_problem(device="cpu")
    with pytest.raises(ValueError) as info:
        wm.NewtonSolver(problem, device_loop=DeviceLoop(capture=True, poll=False), keep_start_factors=True,
                        step_bound_fn=_hook, hooks=wm.NewtonHooks(stop=_hook, before_derivatives=_hook))
    pairs = [part.split(":")[0] for part in str(info.value).split(": incompatible options: ")[1].split("; ")]
    assert pairs == ["device_loop with hooks.stop", "device_loop with step_bound_fn",
                     "DeviceLoop(capture=True) with hooks.before_derivatives",
                     "DeviceLoop(capture=True) with a problem on cpu",
                     "DeviceLoop(poll=False) with keep_start_factors=True"]
    check_compatible("NewtonSolver")  # nothing given: nothing refused

"""Nonlinear minimizers over a :class:`warp_meshad.Problem`: host-side drivers over device arrays.

- :class:`NewtonSolver`: Newton / projected Newton (per-element PSD projection, TinyAD style) with an assembled
  Hessian and any linear back-end of :mod:`warp_meshad._src.solve.linear`.
- :class:`NewtonCGSolver`: matrix-free truncated Newton: CG on ``problem.hessian_vector_product``, stopped at
  negative curvature, with an Eisenstat-Walker forcing term.
- :class:`GaussNewtonSolver`: Gauss-Newton for residual terms (``problem.eval_gauss_newton`` assembles
  ``sum_j J_j^T J_j`` per element into the Hessian pattern), optional Levenberg damping.
- :class:`LBFGSSolver`: limited-memory BFGS (two-loop recursion, history ``m``).
- :class:`GradientDescentSolver`: steepest descent.

All run one loop (``_Driver.solve``): derivatives, direction, Armijo backtracking (an energy of +inf or NaN rejects a
trial). They pin ``fixed`` variables (their gradient rows are zeroed and the Newton system gets symmetric Dirichlet
rows), and stop on the first of: gradient norm <= tolerance, Newton decrement ``0.5 |d . g|`` < tolerance (Newton-type
solvers, as TinyAD), relative energy change <= ``energy_tolerance``, ``max_iterations``, a failed line search, or
non-finite derivatives. :class:`NewtonHooks` plug problem-specific steps into that loop (contact pairs refreshed before
the derivatives, a trial energy over swept pairs, an extra stop test: the shells app), and ``step_bound_fn`` caps the
step (CCD). The grouped options (:class:`~warp_meshad.LineSearch`, :class:`~warp_meshad.Projection`,
:class:`~warp_meshad.DeviceLoop`) and the refusal of options that cannot work together live in
:mod:`~warp_meshad._src.solve.options`.

Where a direction cannot be used (it is not a descent direction, the linear solve failed, Newton-CG met negative
curvature before any step) the iteration steps along ``-g`` instead, as TinyAD does. Such steepest-descent fallbacks
and linear solves stopped at their iteration cap are counted in the :class:`SolveResult`, never hidden.

The problem's returned gradient/Hessian/product buffers are overwritten by its next evaluation, so every driver copies
what it keeps into its own preallocated arrays.
"""


import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import warp as wp

from warp_meshad._src.solve import policy
from warp_meshad._src.solve.constraints import apply_dirichlet, fixed_indices, fixed_mask_from_indices, zero_fixed_rows
from warp_meshad._src.solve.device_loop import DeviceLoopRunner
from warp_meshad._src.solve.first_order_loop import FirstOrderLoopRunner
from warp_meshad._src.solve.line_search import armijo
from warp_meshad._src.solve.linear import LinearSolveError, LinearSolver, make_linear_solver
from warp_meshad._src.solve.options import (
    DeviceLoop,
    LineSearch,
    Projection,
    check_compatible,
    check_line_search,
    check_projection,
    device_loop_options,
)
from warp_meshad._src.solve.vector_ops import (
    add_to_diagonal,
    axpy_into,
    check_finite_variables,
    dot,
    lincomb_into,
    mark_if_different,
    norm,
    scale_into,
)

__all__ = [
    "GaussNewtonSolver",
    "GradientDescentSolver",
    "LBFGSSolver",
    "NewtonCGSolver",
    "NewtonHooks",
    "NewtonSolver",
    "SolveResult",
    "check_hessian_shift",
    "solve_tolerances",
]


@dataclass
class SolveResult:
    """Outcome of a ``solve`` call.

    Attributes:
        x: the final point, a new wp.array [variable_count] of the problem's variable dtype (the input is untouched).
        iterations: number of accepted or attempted steps (derivative evaluations that led to a step attempt).
        energies: energy at the start and after every iteration (length ``iterations + 1``).
        gradient_norms: ``||g||_2`` of the free variables at each evaluated point.
        newton_decrements: ``0.5 |d . g|`` per iteration (Newton-type solvers; empty for L-BFGS / GD).
        converged: True when a convergence test (gradient, decrement, energy change) stopped the solve.
        reason: why it stopped: ``"gradient_norm"``, ``"newton_decrement"``, ``"energy_change"``, ``"max_iterations"``,
            ``"line_search_failed"``, ``"non_finite_energy"``, ``"non_finite_gradient"``, ``"callback"``, or the reason
            returned by a :attr:`NewtonHooks.stop` hook.
        time_ms: milliseconds per phase: ``derivatives``, ``linear_solve``, ``line_search``, ``total``, and
            ``before_derivatives`` when that hook is set (:class:`NewtonHooks`).
        step_sizes: accepted line-search step per iteration.
        line_search_tries: energy evaluations of the line search per iteration.
        linear_iterations: iterations reported by the linear solver per iteration (CG iterations; 1 for direct; 0
            for a solve that failed).
        linear_solver: name of the linear back-end used, or None.
        steepest_descent_fallbacks: iterations that stepped along ``-g`` because the solver's own direction could
            not be used (Newton-type solvers and L-BFGS; 0 for gradient descent, whose direction is ``-g``).
        fallback_reasons: those fallbacks counted by cause: ``"not_descent_direction"`` (``d . g >= 0`` or not
            finite: an indefinite Hessian without projection, a bad L-BFGS pair), ``"linear_solve_failed"`` (the
            back-end raised :class:`~warp_meshad._src.solve.linear.LinearSolveError`: singular or non-finite matrix; or
            Newton-CG's Hessian-vector product was not finite), ``"negative_curvature"`` (Newton-CG's first CG
            direction had ``p . H p <= 0``), ``"linear_solve_inaccurate"`` (device loop only: a deferred solve's
            residual exceeded the back-end's ``direction_rtol`` at a point whose solve was already redone, or with
            ``DeviceLoop(poll=False)``).
        linear_converged: per iteration of a Newton-type solver, whether its linear solve met its tolerance (False
            for an iterative solve stopped at its iteration cap, and for a failed solve).
        linear_solves_capped: linear solves (CG: the back-end's or Newton-CG's inner CG) that stopped at their
            iteration cap above their tolerance; their inexact direction is still used when it descends.
        cudss_skipped_reason: the linear back-end's ``cudss_skipped_reason``: why ``linear_solver="auto"`` did not
            pick cuDSS (None when it did, or when the back-end was named).
    """

    x: wp.array
    iterations: int = 0
    energies: list = field(default_factory=list)
    gradient_norms: list = field(default_factory=list)
    newton_decrements: list = field(default_factory=list)
    converged: bool = False
    reason: str = ""
    time_ms: dict = field(default_factory=lambda: {"derivatives": 0.0, "linear_solve": 0.0, "line_search": 0.0})
    step_sizes: list = field(default_factory=list)
    line_search_tries: list = field(default_factory=list)
    linear_iterations: list = field(default_factory=list)
    linear_solver: str | None = None
    steepest_descent_fallbacks: int = 0
    fallback_reasons: dict = field(default_factory=dict)
    linear_converged: list = field(default_factory=list)
    linear_solves_capped: int = 0
    cudss_skipped_reason: str | None = None

    def record_fallback(self, why: str) -> None:
        """Count one steepest-descent fallback and its cause (a ``fallback_reasons`` key)."""
        self.steepest_descent_fallbacks += 1
        self.fallback_reasons[why] = self.fallback_reasons.get(why, 0) + 1

    def record_linear_solve(self, iterations: int, converged: bool, failed: bool = False) -> None:
        """Record one linear solve of an iteration (``failed``: it raised; a solve that did not converge and did
        not fail stopped at its iteration cap)."""
        self.linear_iterations.append(int(iterations))
        self.linear_converged.append(bool(converged) and not failed)
        if not converged and not failed:
            self.linear_solves_capped += 1


def solve_tolerances(max_iterations, tolerance: float, gradient_tolerance: float | None,
                     energy_tolerance: float) -> float:
    """Check ``solve``'s limits (every solver's and the batch solver's) and return the gradient-norm tolerance.

    Raises:
        ValueError: ``max_iterations`` < 0, or a negative (or NaN) tolerance.
    """
    if int(max_iterations) < 0:
        raise ValueError(f"max_iterations: expected >= 0, got {max_iterations}")
    if not tolerance >= 0.0 or not energy_tolerance >= 0.0:
        raise ValueError(f"tolerance, energy_tolerance: expected >= 0, got {tolerance}, {energy_tolerance}")
    return float(tolerance if gradient_tolerance is None else gradient_tolerance)


def _scalar_type(problem):
    vt = problem.variable_type
    return getattr(problem, "dtype", None) or getattr(vt, "_wp_scalar_type_", vt)


@dataclass
class NewtonHooks:
    """Problem-specific steps plugged into the driver's loop (contact, CCD, an app's own stop test); all optional.

    The driver's loop (every solver's), with the hooks where they run::

        before_derivatives(x)                 # e.g. find the contact pairs at x
        f, g (, H) = derivatives at x
        d = direction (linear solve)
        stop(x, d) -> reason or None          # only for the solver's own direction, not a -g fallback
        energy_fn = line_search_energy(x, d)  # once per line search, before the step bound
        alpha = Armijo on energy_fn from min(1, step_bound_fn(x, d))

    The step bound (continuous collision detection) is the solvers' ``step_bound_fn`` argument.

    Attributes:
        before_derivatives: ``(x) -> None``, called at every point before its derivatives are evaluated (also before
            the gradient-only evaluation at ``max_iterations``). Its time is
            ``SolveResult.time_ms["before_derivatives"]``.
        line_search_energy: ``(x, d) -> energy_fn`` with ``energy_fn(y) -> float``, called once per line search with
            the point and the direction; the line search evaluates ``energy_fn`` at its trial points ``y = x + alpha d``
            (default ``problem.eval``). Its time counts in ``time_ms["line_search"]``.
        stop: ``(x, d) -> str | None``, called after the solver computed its direction ``d`` at ``x`` (not when it
            falls back to ``-g``); a returned string stops the solve as converged with that ``reason``, before the
            descent test and the Newton decrement. Its time counts in ``time_ms["total"]`` only.
    """

    before_derivatives: Callable[[wp.array], None] | None = None
    line_search_energy: Callable[[wp.array, wp.array], Callable[[wp.array], float]] | None = None
    stop: Callable[[wp.array, wp.array], str | None] | None = None


# ----------------------------------------------------------------------------------------------------------------------
# Base driver
# ----------------------------------------------------------------------------------------------------------------------


class _Driver:
    """Shared state: problem, pins, line search settings, buffers, stopping tests."""

    uses_newton_decrement = False
    _device_loop: DeviceLoopRunner | None = None

    def __init__(
        self,
        problem,
        *,
        fixed=None,
        line_search: LineSearch = LineSearch(),
        step_bound_fn: Callable[[wp.array, wp.array], float] | None = None,
        hooks: NewtonHooks | None = None,
    ):
        for attr in ("variable_count", "variable_type", "device", "eval", "eval_with_gradient"):
            if not hasattr(problem, attr):
                raise TypeError(f"problem: expected a warp_meshad Problem (missing {attr!r}), got {type(problem).__name__}")
        self.problem = problem
        self.line_search = check_line_search(line_search, f"{type(self).__name__}(line_search=...)")
        self.step_bound_fn = step_bound_fn
        if hooks is not None and not isinstance(hooks, NewtonHooks):
            raise TypeError(f"hooks: expected a NewtonHooks or None, got {type(hooks).__name__}")
        self.hooks = hooks if hooks is not None else NewtonHooks()
        n = problem.variable_count
        self.fixed_indices = fixed_indices(fixed)
        self.fixed_mask = (
            None if self.fixed_indices is None
            else fixed_mask_from_indices(self.fixed_indices, n, problem.device, what=f"{type(self).__name__}(fixed=...)")
        )
        self._buffers = None

    def _checked_options(self, device_loop=False, **settings) -> DeviceLoop | None:
        """The options of ``device_loop=...`` (None: the host loop), once
        :func:`~warp_meshad._src.solve.options.check_compatible` accepts them with the hooks, the step bound and
        ``settings`` (the subclass's own options). Every constructor calls it."""
        options = device_loop_options(device_loop)
        check_compatible(type(self).__name__, device=self.problem.device, device_loop=options, hooks=self.hooks,
                         step_bound_fn=self.step_bound_fn, **settings)
        return options

    # -- buffers ----------------------------------------------------------------------------------------------------

    def _alloc(self, *names: str) -> None:
        p = self.problem
        if self._buffers is None:
            self._buffers = {}
        for name in names:
            if name not in self._buffers:
                self._buffers[name] = wp.zeros(p.variable_count, dtype=p.variable_type, device=p.device)

    def _buf(self, name: str) -> wp.array:
        return self._buffers[name]

    def check_x(self, x) -> None:
        """Raise TypeError / ValueError unless ``x`` is a wp.array [variable_count] of the problem's variable dtype
        on its device (what ``solve`` takes)."""
        p = self.problem
        if not isinstance(x, wp.array):
            raise TypeError(f"x: expected a wp.array, got {type(x).__name__}")
        if x.shape != (p.variable_count,):
            raise ValueError(f"x: expected shape ({p.variable_count},), got {x.shape}")
        if not wp.types.types_equal(x.dtype, p.variable_type):
            raise TypeError(f"x: expected dtype {wp.types.type_repr(p.variable_type)}, got {wp.types.type_repr(x.dtype)}")
        if x.device != p.device:
            raise ValueError(f"x: expected device {p.device}, got {x.device}")

    def _now(self) -> float:
        """``time.perf_counter()`` once the device's queued work is done, so a CUDA phase timer counts its kernels."""
        wp.synchronize_device(self.problem.device)
        return time.perf_counter()

    def pinned_gradient(self, g_problem: wp.array, out: wp.array) -> wp.array:
        """Copy the problem's gradient into ``out`` (the problem's buffer is overwritten by its next evaluation) and
        zero the rows of the pinned variables (``fixed_mask``); returns ``out``. One step of every loop."""
        wp.copy(out, g_problem)
        if self.fixed_mask is not None:
            zero_fixed_rows(out, self.fixed_mask)
        return out

    def _keep_gradient(self, g_problem: wp.array) -> wp.array:
        return self.pinned_gradient(g_problem, self._buf("g"))

    # -- the loop ---------------------------------------------------------------------------------------------------

    def solve(
        self,
        x: wp.array,
        max_iterations: int = 100,
        tolerance: float = 1e-6,
        gradient_tolerance: float | None = None,
        energy_tolerance: float = 1e-12,
        callback: Callable[[int, wp.array, float], Any] | None = None,
        check_finite: bool = True,
    ) -> SolveResult:
        """Minimize the problem's energy from ``x``.

        Args:
            x: start point, wp.array [variable_count] of the problem's variable dtype on its device (not modified).
            max_iterations: iteration cap (>= 0).
            tolerance: Newton-decrement tolerance (Newton-type solvers: stop when ``0.5 |d . g| < tolerance``), and
                the gradient-norm tolerance when ``gradient_tolerance`` is None.
            gradient_tolerance: stop when ``||g||_2 <= gradient_tolerance`` (free variables only).
            energy_tolerance: stop when ``|f_old - f_new| <= energy_tolerance * max(1, |f_old|)`` after a step.
            callback: optional ``callback(iteration, x, f)`` called after every accepted step; returning True stops
                the solve (reason ``"callback"``).
            check_finite: refuse a start point holding NaN or inf (one reduction on the device, a host read of one
                number; the message names the first bad variable). The evaluations themselves do not check: NaN in
                x gives NaN energies, gradients and Hessian blocks.

        Returns:
            :class:`SolveResult`.
        """
        self.check_x(x)
        if check_finite:
            check_finite_variables(x, f"{type(self).__name__}.solve(x=...)")
        gtol = solve_tolerances(max_iterations, tolerance, gradient_tolerance, energy_tolerance)
        if self._device_loop is not None:
            check_compatible(type(self).__name__, device_loop=self._device_loop.options, callback=callback)
            backend = getattr(self, "linear_solver", None)
            result = SolveResult(x=x, linear_solver=getattr(backend, "name", None),
                                 cudss_skipped_reason=getattr(backend, "cudss_skipped_reason", None))
            return self._device_loop.run(x, max_iterations, tolerance, gtol, energy_tolerance, callback, result)
        t_start = self._now()
        self._alloc("x", "trial", "g", "d")
        xk = self._buf("x")
        wp.copy(xk, x)
        result = SolveResult(x=xk)
        backend = getattr(self, "linear_solver", None)
        result.linear_solver = getattr(backend, "name", None)
        result.cudss_skipped_reason = getattr(backend, "cudss_skipped_reason", None)
        times = result.time_ms
        hooks = self.hooks
        if hooks.before_derivatives is not None:
            times["before_derivatives"] = 0.0
        self._start(xk)

        f = None
        for it in range(int(max_iterations) + 1):
            if hooks.before_derivatives is not None:
                t0 = self._now()
                hooks.before_derivatives(xk)
                times["before_derivatives"] += (self._now() - t0) * 1000.0
            t0 = self._now()
            try:
                if it == int(max_iterations) and it > 0:
                    # past the cap only the gradient norm is reported: no Hessian for a step never taken
                    f_eval, g = _Driver._derivatives(self, xk)
                else:
                    f_eval, g = self._derivatives(xk)
            except _StopSolve as stop:
                times["derivatives"] += (self._now() - t0) * 1000.0
                result.reason = stop.reason
                if f is None:
                    result.energies.append(float(stop.energy) if stop.energy is not None else float("nan"))
                break
            times["derivatives"] += (self._now() - t0) * 1000.0
            if f is None:
                f = f_eval
                result.energies.append(f)
            if not math.isfinite(f):
                result.reason = policy.REASONS[policy.NON_FINITE_ENERGY]
                break
            gnorm = float(policy.gradient_norm(dot(g, g)))
            result.gradient_norms.append(gnorm)
            status = int(policy.point_status(None, gnorm, it, max_iterations, gtol))
            if status != policy.RUNNING:
                result.reason = policy.REASONS[status]
                result.converged = result.reason in policy.CONVERGED
                break

            t0 = self._now()
            try:
                fallback = self._direction(xk, g, result)
            except LinearSolveError:
                fallback = "linear_solve_failed"
            times["linear_solve"] += (self._now() - t0) * 1000.0
            d = self._buf("d")
            if fallback is None and hooks.stop is not None:
                reason = hooks.stop(xk, d)
                if reason:
                    result.converged, result.reason = True, str(reason)
                    break
            if fallback is None:
                dd = dot(g, d)
                code = int(policy.direction_fallback(dd))  # indefinite Hessian, bad curvature pair, NaN solution
                fallback = policy.FALLBACKS[code] if code != policy.NO_FALLBACK else None
            if fallback is not None:
                # the direction cannot be used: steepest descent this iteration, counted in the result
                scale_into(d, -1.0, g)
                dd = float(policy.fallback_slope(gnorm))
                result.record_fallback(fallback)
                self._on_fallback()
            if self.uses_newton_decrement:
                decrement = float(policy.newton_decrement(dd))
                result.newton_decrements.append(decrement)
                if policy.decrement_converged(decrement, tolerance):
                    result.converged, result.reason = True, policy.REASONS[policy.NEWTON_DECREMENT]
                    break

            t0 = self._now()
            energy_fn = self.problem.eval if hooks.line_search_energy is None else hooks.line_search_energy(xk, d)
            ls = armijo(
                energy_fn,
                xk,
                d,
                f,
                dd,
                shrink=self.line_search.shrink,
                max_tries=self.line_search.tries,
                c=self.line_search.c,
                max_step=self.first_step,
                step_bound_fn=self.step_bound_fn,
                out=self._buf("trial"),
            )
            times["line_search"] += (self._now() - t0) * 1000.0
            result.iterations += 1
            result.line_search_tries.append(ls.tries)
            result.step_sizes.append(ls.alpha)
            if not ls.accepted:
                result.reason = policy.REASONS[policy.LINE_SEARCH_FAILED]
                break
            # accept: swap x and trial buffers
            self._buffers["x"], self._buffers["trial"] = self._buffers["trial"], self._buffers["x"]
            x_old, xk = xk, self._buffers["x"]
            f_old, f = f, ls.f_new
            result.energies.append(f)
            self._accepted(x_old, xk, ls.alpha)
            if callback is not None and callback(result.iterations, xk, f):
                result.reason = "callback"
                break
            if policy.energy_change_converged(f_old, f, energy_tolerance):
                result.converged, result.reason = True, policy.REASONS[policy.ENERGY_CHANGE]
                break

        result.x = wp.clone(xk)
        times["total"] = (self._now() - t_start) * 1000.0
        return result

    # -- hooks ------------------------------------------------------------------------------------------------------

    def _start(self, x: wp.array) -> None:
        pass

    def _derivatives(self, x: wp.array):
        """Evaluate what the direction needs; return (f, g) with g our own copy, pins zeroed."""
        f, g = self.problem.eval_with_gradient(x)
        return f, self._keep_gradient(g)

    def _direction(self, x: wp.array, g: wp.array, result: SolveResult) -> str | None:
        """Write the search direction into the ``"d"`` buffer; return None, or why ``-g`` must be used instead (a
        ``fallback_reasons`` key). May raise LinearSolveError (counted as ``"linear_solve_failed"``)."""
        raise NotImplementedError

    def _accepted(self, x_old: wp.array, x_new: wp.array, alpha: float) -> None:
        pass

    def _on_fallback(self) -> None:
        pass

    @property
    def first_step(self) -> float:
        """The line search's first trial step (1; gradient descent: its ``step``)."""
        return 1.0


class _StopSolve(Exception):
    def __init__(self, reason: str, energy=None):
        super().__init__(reason)
        self.reason = reason
        self.energy = energy


def check_hessian_shift(hessian_shift, name: str = "hessian_shift") -> float:
    """``hessian_shift`` as a float; ValueError unless it is a finite number >= 0."""
    try:
        value = float(hessian_shift)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a finite number >= 0, got {hessian_shift!r}") from None
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"{name}: expected a finite number >= 0, got {hessian_shift!r}")
    return value


# ----------------------------------------------------------------------------------------------------------------------
# Newton with an assembled Hessian
# ----------------------------------------------------------------------------------------------------------------------


class NewtonSolver(_Driver):
    """Newton / projected Newton with Armijo backtracking.

    Each iteration assembles ``H`` (per-element PSD projection unless ``projection`` is None), pins ``fixed`` variables
    symmetrically, solves ``H d = -g`` with the linear back-end and backtracks along ``d``. A direction that is not a
    descent direction (possible without projection), or a failed linear solve, is replaced by ``-g`` and counted in
    ``SolveResult.steepest_descent_fallbacks``; CG solves stopped at their cap count in ``linear_solves_capped``.

    Args:
        problem: a :class:`warp_meshad.Problem`.
        linear_solver: back-end name (one of ``LINEAR_SOLVER_NAMES``: ``"auto"``, ``"qdldl"``, ``"scipy"``,
            ``"cg"``, ``"cupy"``, ``"cudss"``; see :func:`~warp_meshad.make_linear_solver`) or a
            :class:`~warp_meshad.LinearSolver` instance.
        projection: a :class:`~warp_meshad.Projection` (``mode``, ``eps``): every element Hessian projected to PSD
            before assembly (projected Newton; default ``Projection()``: clamped at 1e-9), or None for the exact
            Hessian (Newton).
        fixed: indices of variables that never move (sequence, numpy or wp.array of ints), or None.
        linear_solver_options: keyword options for :func:`~warp_meshad._src.solve.linear.make_linear_solver`.
            With a back-end named ``"auto"`` or ``"cudss"``, a ``projection``, pinned variables (``fixed``) or a
            ``hessian_shift`` > 0, and no ``matrix_type`` given, cuDSS gets ``matrix_type="spd_or_general"``:
            Cholesky, which halves the factorization of such SPD systems, with LU taking over if one fails.
            cuDSS's ``deterministic`` mode is not asked for on its own (see
            :class:`~warp_meshad._src.solve.linear.CudssSolver`).
        step_bound_fn: optional ``(x, d) -> float`` capping the line-search step (CCD).
        line_search: the Armijo settings, a :class:`~warp_meshad.LineSearch` (TinyAD's defaults: shrink 0.8, 64
            tries, c = 1e-4).
        hooks: optional :class:`NewtonHooks` (contact pairs refreshed before the derivatives, the line search's trial
            energy, an extra stop test).
        device_loop: False (default: the host loop), True, or a :class:`~warp_meshad.DeviceLoop`
            (``trials``, ``poll``, ``capture``, ``capture_solve``, ``conditional``): energy, gradient norm, Newton
            decrement, Armijo test, step acceptance and stop tests run in small kernels on the problem's device,
            with at most one small host read per iteration (none with ``poll=False``), CUDA-event phase timers and,
            with ``capture=True`` on a GPU, the iteration replayed as CUDA graphs (see
            :mod:`warp_meshad._src.solve.device_loop`). Same iterates as the host loop to round-off. Refused with
            ``hooks.stop``, ``hooks.line_search_energy`` or ``step_bound_fn`` (host code inside the iteration), and
            the other pairs :func:`~warp_meshad._src.solve.options.check_compatible` lists. The default stays the
            host loop, which takes every hook; the apps ask for the captured loop on a GPU (``device_loop: auto``).
            With cuDSS captured in the slot's graph, on the H200 elastic/bunny's 40 steps took 0.41-0.49 s against
            0.84 s in the host loop, cuDSS being most of an iteration (benchmarks/history/2026-12-03_apps_solve_time.md,
            the direction check).
        hessian_shift: ``sigma >= 0`` added to every diagonal coefficient of the (projected) Hessian before the
            solve, on the device: the direction solves ``(H + sigma I) d = -g`` (a fixed Levenberg-Marquardt term).
            An energy that does not see rigid motions has a projected Hessian that is singular along them up to the
            projection's clamp (``Projection.eps`` per element); a shift well above round-off and well below the
            Hessian's other eigenvalues makes it definite, so cuDSS can factor it by Cholesky (see
            ``linear_solver_options``), and it bounds a direction's component along a mode that is nearly singular
            near the minimum. The gradient is orthogonal to exact gauge modes, so the minimum does not move;
            directions change by about ``sigma / lambda`` elsewhere. 0 (the default): no shift.
        keep_start_factors: a solve that starts at the point of this solver's last factorization (the same values,
            compared on the device) solves its first Newton system with the linear back-end's kept factors
            (:meth:`~warp_meshad.LinearSolver.resolve`; back-ends with ``keeps_factors``) instead of factorizing
            again. A solve ends by factorizing at its last point for the stop test, and a time step starts where the
            previous one ended, so every step after the first saves a factorization. Only right when the Hessian at
            a point is the same in both solves: what changes between the calls (an inertia term's target, gravity)
            must not enter the Hessian. The captured device loop replays that slot from a graph of its own (captured
            once), else it runs uncaptured; refused with ``DeviceLoop(poll=False)`` (the kept factors are chosen
            from a host read before the first slot). Default False.
    """

    uses_newton_decrement = True

    def __init__(
        self,
        problem,
        *,
        linear_solver: str | LinearSolver = "auto",
        projection: Projection | None = Projection(),
        fixed=None,
        linear_solver_options: dict | None = None,
        step_bound_fn=None,
        line_search: LineSearch = LineSearch(),
        hooks: NewtonHooks | None = None,
        device_loop: bool | DeviceLoop = False,
        hessian_shift: float = 0.0,
        keep_start_factors: bool = False,
    ):
        super().__init__(problem, fixed=fixed, line_search=line_search, step_bound_fn=step_bound_fn, hooks=hooks)
        self.projection = check_projection(projection, f"{type(self).__name__}(projection=...)")
        self.hessian_shift = check_hessian_shift(hessian_shift)
        self.keep_start_factors = bool(keep_start_factors)
        options = self._checked_options(device_loop, keep_start_factors=self.keep_start_factors,
                                        linear_solver=linear_solver, linear_solver_options=linear_solver_options)
        self.kept_solves = 0  # first directions solved with kept factors (keep_start_factors)
        self._factored_at = None  # the point of the last factorization (keep_start_factors, host loop)
        self._same = None  # its comparison flag
        # as given: what a BatchNewtonSolver built like this one (BatchNewtonSolver.like) asks for
        self.linear_solver_request = linear_solver if isinstance(linear_solver, str) else linear_solver.name
        self.linear_solver_options = dict(linear_solver_options or {})
        linear_options = dict(linear_solver_options or {})
        cudss_by_name = isinstance(linear_solver, str) and linear_solver in ("auto", "cudss")
        if cudss_by_name and self.projection is not None and (self.fixed_indices is not None
                                                               or self.hessian_shift > 0.0):
            # pinned or shifted + projected: SPD (Cholesky, LU if it fails)
            linear_options.setdefault("matrix_type", "spd_or_general")
        self.linear_solver = make_linear_solver(linear_solver, device=problem.device, dtype=_scalar_type(problem),
                                                **linear_options)
        self._H = None
        self._device_loop = None if options is None else DeviceLoopRunner(self, options)

    def system(self, x):
        """Energy, gradient and the Hessian this solver's direction solves with at ``x``: projected per element
        unless ``projection`` is None, plus ``hessian_shift`` on the diagonal (Gauss-Newton: ``J^T J``). Returns
        ``(f, g, H)`` as :meth:`~warp_meshad.Problem.eval_with_hessian` does (the problem's buffers; pins not applied).
        One step of the host and batch loops."""
        return self._hessian(x)

    def solve_direction(self, H, g: wp.array, out: wp.array, kept: bool = False):
        """The Newton direction into ``out``: ``H d = -g`` with the pinned variables' rows and columns made
        Dirichlet rows (``fixed_mask``; ``g`` already zero there), by the linear back-end (``kept``: with the factors
        it kept, :meth:`~warp_meshad.LinearSolver.resolve`). ``H`` is modified by the pins. Returns the back-end's
        :class:`~warp_meshad.LinearSolveInfo`; raises :class:`~warp_meshad.LinearSolveError` where the solve
        failed. One step of the host and batch loops."""
        rhs = self._buf_rhs()
        scale_into(rhs, -1.0, g)
        if self.fixed_mask is not None:
            apply_dirichlet(H, rhs, self.fixed_mask)
        out.zero_()
        return (self.linear_solver.resolve if kept else self.linear_solver.solve)(H, rhs, out)

    def _hessian(self, x):
        if self.projection is not None:
            f, g, H = self.problem.eval_with_hessian_proj(x, mode=self.projection.mode, eps=self.projection.eps)
        else:
            f, g, H = self.problem.eval_with_hessian(x)
        if self.hessian_shift > 0.0:
            add_to_diagonal(H, self.hessian_shift)
        return f, g, H

    def _derivatives(self, x):
        f, g, H = self._hessian(x)
        g = self._keep_gradient(g)
        if not math.isfinite(f):
            raise _StopSolve("non_finite_energy", f)
        self._H = H
        return f, g

    @property
    def keeps_start_factors(self) -> bool:
        """``keep_start_factors`` where the linear back-end keeps factors to solve with (``keeps_factors``)."""
        return self.keep_start_factors and self.linear_solver.keeps_factors

    def _at_factored_point(self, x) -> bool:
        """keep_start_factors: whether ``x`` is the point of the last factorization (one host read)."""
        if self._factored_at is None:
            return False
        if self._same is None:
            self._same = wp.zeros(1, dtype=wp.float64, device=x.device)
        self._same.fill_(1.0)
        mark_if_different(x, self._factored_at, self._same)
        return float(self._same.numpy()[0]) == 1.0

    def _direction(self, x, g, result):
        keeping = self.keeps_start_factors
        # the solve's first direction (no linear solve recorded in this solve's result yet) from the kept factors
        kept = keeping and not result.linear_iterations and self._at_factored_point(x)
        try:
            info = self.solve_direction(self._H, g, self._buf("d"), kept=kept)
        except LinearSolveError:
            self._factored_at = None
            result.record_linear_solve(0, False, failed=True)
            return "linear_solve_failed"
        if kept:
            self.kept_solves += 1
        elif keeping:
            if self._factored_at is None or self._factored_at.shape != x.shape:
                self._factored_at = wp.empty_like(x)
            wp.copy(self._factored_at, x)
        result.record_linear_solve(info.iterations, info.converged)
        return None

    def _buf_rhs(self):
        self._alloc("rhs")
        return self._buf("rhs")


class GaussNewtonSolver(NewtonSolver):
    """Gauss-Newton for least-squares objectives built with ``add_residual_term``.

    Uses ``problem.eval_gauss_newton(x) -> (f, g, H)``, where residual terms contribute ``weight/2 |r|^2`` to ``f`` and
    ``weight J^T J`` (assembled per element into the Hessian pattern) to ``H``; scalar terms contribute their exact
    Hessian. ``damping > 0`` adds ``damping * I`` (Levenberg) to keep ``H`` definite when ``J`` is rank deficient.

    Args:
        problem: a :class:`warp_meshad.Problem` providing ``eval_gauss_newton``.
        linear_solver, fixed, linear_solver_options, step_bound_fn, line_search: as :class:`NewtonSolver`.
        damping: Levenberg damping added to the diagonal (>= 0).
    """

    def __init__(
        self,
        problem,
        *,
        linear_solver: str | LinearSolver = "auto",
        fixed=None,
        damping: float = 0.0,
        linear_solver_options: dict | None = None,
        step_bound_fn=None,
        line_search: LineSearch = LineSearch(),
    ):
        if not hasattr(problem, "eval_gauss_newton"):
            raise TypeError("GaussNewtonSolver: the problem has no eval_gauss_newton(x) (needs residual-term support)")
        if not damping >= 0.0:
            raise ValueError(f"damping: expected >= 0, got {damping}")
        super().__init__(
            problem,
            linear_solver=linear_solver,
            projection=None,
            fixed=fixed,
            linear_solver_options=linear_solver_options,
            step_bound_fn=step_bound_fn,
            line_search=line_search,
        )
        self.damping = float(damping)

    def _hessian(self, x):
        f, g, H = self.problem.eval_gauss_newton(x)
        if self.damping > 0.0:
            add_to_diagonal(H, self.damping)
        return f, g, H


# ----------------------------------------------------------------------------------------------------------------------
# Matrix-free truncated Newton
# ----------------------------------------------------------------------------------------------------------------------


class NewtonCGSolver(_Driver):
    """Matrix-free truncated Newton: CG on ``problem.hessian_vector_product``, nothing assembled.

    The inner CG stops at relative residual ``min(forcing, sqrt(||g||)) ``(Eisenstat-Walker forcing), at
    ``cg_maxiter`` (counted in ``SolveResult.linear_solves_capped``), or at the first direction of non-positive
    curvature (then it returns the last iterate, or ``-g`` on the first iteration: counted as a
    ``"negative_curvature"`` steepest-descent fallback). Pinned variables are projected out of every CG vector.

    Args:
        problem: a :class:`warp_meshad.Problem`.
        fixed: indices of pinned variables, or None.
        cg_maxiter: inner CG iteration cap (>= 1; None: ``min(scalar unknowns, 1000)``).
        forcing: cap of the relative residual tolerance of the inner CG (0.5).
        step_bound_fn, line_search: as :class:`NewtonSolver`.
    """

    uses_newton_decrement = True

    def __init__(
        self,
        problem,
        *,
        fixed=None,
        cg_maxiter: int | None = None,
        forcing: float = 0.5,
        step_bound_fn=None,
        line_search: LineSearch = LineSearch(),
    ):
        super().__init__(problem, fixed=fixed, line_search=line_search, step_bound_fn=step_bound_fn)
        self._checked_options()
        if not hasattr(problem, "hessian_vector_product"):
            raise TypeError("NewtonCGSolver: the problem has no hessian_vector_product(x, v)")
        if not 0.0 < forcing < 1.0:
            raise ValueError(f"forcing: expected a value in (0, 1), got {forcing}")
        if cg_maxiter is not None and int(cg_maxiter) < 1:
            raise ValueError(f"cg_maxiter: expected an int >= 1 or None, got {cg_maxiter}")
        scalars = problem.variable_count * max(1, getattr(problem, "variable_dim", 1))
        self.cg_maxiter = int(cg_maxiter) if cg_maxiter is not None else min(scalars, 1000)
        self.forcing = float(forcing)

    def _hvp(self, x, v, out):
        hv = self.problem.hessian_vector_product(x, v)
        wp.copy(out, hv)
        if self.fixed_mask is not None:
            zero_fixed_rows(out, self.fixed_mask)
        return out

    def _direction(self, x, g, result):
        self._alloc("cg_r", "cg_p", "cg_hp")
        d, r, p, hp = self._buf("d"), self._buf("cg_r"), self._buf("cg_p"), self._buf("cg_hp")
        d.zero_()
        scale_into(r, -1.0, g)  # r = -g - H d with d = 0
        wp.copy(p, r)
        rr = dot(r, r)
        gnorm = math.sqrt(rr)
        tol = min(self.forcing, math.sqrt(gnorm)) * gnorm
        iterations, stopped = 0, False  # stopped: at the tolerance or at non-positive curvature (not at the cap)
        for iterations in range(1, self.cg_maxiter + 1):
            self._hvp(x, p, hp)
            curvature = dot(p, hp)
            if not math.isfinite(curvature):
                result.record_linear_solve(iterations, False, failed=True)
                return "linear_solve_failed"
            if curvature <= 0.0:
                result.record_linear_solve(iterations, True)
                return "negative_curvature" if iterations == 1 else None
            alpha = rr / curvature
            axpy_into(d, d, alpha, p)
            axpy_into(r, r, -alpha, hp)
            rr_new = dot(r, r)
            if math.sqrt(rr_new) <= tol:
                stopped = True
                break
            lincomb_into(p, 1.0, r, rr_new / rr, p)
            rr = rr_new
        result.record_linear_solve(iterations, stopped)
        return None


# ----------------------------------------------------------------------------------------------------------------------
# Quasi-Newton and first order
# ----------------------------------------------------------------------------------------------------------------------


class LBFGSSolver(_Driver):
    """Limited-memory BFGS with Armijo backtracking.

    Curvature pairs ``(s, y)`` with ``s . y <= 1e-12 |s| |y|`` are skipped; the initial inverse Hessian is
    ``(s . y / y . y) I`` from the newest pair (the first step is scaled to ``initial_step / ||g||``).

    Args:
        problem: a :class:`warp_meshad.Problem`.
        history: number of stored pairs ``m`` (>= 1).
        fixed: indices of pinned variables, or None.
        initial_step: length of the very first step along ``-g`` (before any curvature information).
        step_bound_fn, line_search: as :class:`NewtonSolver`.
        device_loop: False (default: the host loop), True, or a :class:`~warp_meshad.DeviceLoop`: the iteration
            (two-loop recursion over a ring of pairs on the device, Armijo trials, every stop test) queued on the
            problem's device with at most one small host read per iteration, none with ``poll=False`` and
            ``capture=True`` (the whole solve one CUDA graph); see :mod:`~warp_meshad._src.solve.first_order_loop`.
            Same iterates as the host loop (CPU: bit for bit).
    """

    def __init__(
        self,
        problem,
        *,
        history: int = 10,
        fixed=None,
        initial_step: float = 1.0,
        step_bound_fn=None,
        line_search: LineSearch = LineSearch(),
        device_loop: bool | DeviceLoop = False,
    ):
        super().__init__(problem, fixed=fixed, line_search=line_search, step_bound_fn=step_bound_fn)
        if int(history) < 1:
            raise ValueError(f"history: expected >= 1, got {history}")
        if not initial_step > 0.0:
            raise ValueError(f"initial_step: expected > 0, got {initial_step}")
        self.history = int(history)
        self.initial_step = float(initial_step)
        options = self._checked_options(device_loop)
        self._device_loop = None if options is None else FirstOrderLoopRunner(self, options, self.history,
                                                                              self.initial_step)

    def _start(self, x):
        p = self.problem
        if getattr(self, "_s", None) is None:
            self._s = [wp.zeros(p.variable_count, dtype=p.variable_type, device=p.device) for _ in range(self.history)]
            self._y = [wp.zeros(p.variable_count, dtype=p.variable_type, device=p.device) for _ in range(self.history)]
        self._pairs = []  # list of (slot, rho) oldest first
        self._next_slot = 0
        self._g_prev = None
        self._alloc("g_prev")

    def _derivatives(self, x):
        f, g = super()._derivatives(x)
        if self._g_prev is not None:
            # new curvature pair from the step just accepted: s = x_new - x_old (stored in _accepted), y = g - g_prev
            slot = self._pending_slot
            y = self._y[slot]
            lincomb_into(y, 1.0, g, -1.0, self._g_prev)
            s = self._s[slot]
            sy = dot(s, y)
            if math.isfinite(sy) and sy > 1e-12 * norm(s) * norm(y):
                self._pairs = [pr for pr in self._pairs if pr[0] != slot]
                self._pairs.append((slot, 1.0 / sy, sy / dot(y, y)))
                if len(self._pairs) > self.history:
                    self._pairs.pop(0)
                self._next_slot = (slot + 1) % self.history
        return f, g

    def _direction(self, x, g, result):
        d = self._buf("d")
        wp.copy(self._buf("g_prev"), g)
        self._g_prev = self._buf("g_prev")
        if not self._pairs:
            scale_into(d, -self.initial_step / max(norm(g), 1e-300), g)
            return None
        # two-loop recursion on q = -g, result in d
        scale_into(d, -1.0, g)
        alphas = []
        for slot, rho, _ in reversed(self._pairs):
            a = rho * dot(self._s[slot], d)
            alphas.append(a)
            axpy_into(d, d, -a, self._y[slot])
        gamma = self._pairs[-1][2]
        scale_into(d, gamma, d)
        for (slot, rho, _), a in zip(self._pairs, reversed(alphas)):
            b = rho * dot(self._y[slot], d)
            axpy_into(d, d, a - b, self._s[slot])
        return None

    def _accepted(self, x_old, x_new, alpha):
        slot = self._next_slot
        self._pairs = [pr for pr in self._pairs if pr[0] != slot]  # its s is about to be overwritten
        lincomb_into(self._s[slot], 1.0, x_new, -1.0, x_old)
        self._pending_slot = slot

    def _on_fallback(self):
        self._pairs = []


class GradientDescentSolver(_Driver):
    """Steepest descent ``d = -g`` with Armijo backtracking from ``step``.

    Args:
        problem: a :class:`warp_meshad.Problem`.
        step: first trial step length along ``-g`` (the line search shrinks it).
        fixed: indices of pinned variables, or None.
        step_bound_fn, line_search: as :class:`NewtonSolver`.
        device_loop: as :class:`LBFGSSolver` (the direction is ``-g``).
    """

    def __init__(
        self,
        problem,
        *,
        step: float = 1.0,
        fixed=None,
        step_bound_fn=None,
        line_search: LineSearch = LineSearch(),
        device_loop: bool | DeviceLoop = False,
    ):
        super().__init__(problem, fixed=fixed, line_search=line_search, step_bound_fn=step_bound_fn)
        if not step > 0.0:
            raise ValueError(f"step: expected > 0, got {step}")
        self.step = float(step)
        options = self._checked_options(device_loop)
        self._device_loop = None if options is None else FirstOrderLoopRunner(self, options, 0)

    def _direction(self, x, g, result):
        scale_into(self._buf("d"), -1.0, g)
        return None

    @property
    def first_step(self) -> float:
        """The line search's first trial step: ``step``."""
        return self.step

"""Kernels of the device-side Newton loop (:mod:`warp_meshad._src.solve.device_loop`): stop tests, direction check,
Armijo trials and step acceptance, all reading and writing one float64 ``state`` array and a ``history`` table.

Every scalar decision is taken in float64 in one thread, with the host loop's formulas in the host loop's order
(:meth:`warp_meshad._src.solve.solvers._Driver.solve` and :func:`~warp_meshad._src.solve.line_search.armijo`), so
both loops take the same decisions on the same numbers. A kernel does nothing once ``state[STATUS]`` holds a stop
reason, so launches queued after a stop leave the state as it was.
"""

from typing import Any

import warp as wp

from warp_meshad._src.solve.policy import codes
from warp_meshad._src.solve.policy import device as policy
from warp_meshad._src.solve.policy.device import (  # noqa: F401 (the loops read them from here)
    ENERGY_CHANGE,
    GRADIENT_NORM,
    LINE_SEARCH_FAILED,
    LINEAR_SOLVE_FAILED,
    LINEAR_SOLVE_INACCURATE,
    MAX_ITERATIONS,
    NEWTON_DECREMENT,
    NON_FINITE_ENERGY,
    NON_FINITE_GRADIENT,
)

# state slots (float64 array of STATE_SIZE)
STATUS = wp.constant(0)  # 0 running, else a stop code (REASONS)
IT = wp.constant(1)  # index of the current point x_it (accepted steps so far)
F = wp.constant(2)  # energy at x_it
GNORM = wp.constant(3)  # ||g|| at x_it (free variables)
DD = wp.constant(4)  # g . d of the direction used
PHASE = wp.constant(5)  # 0: x_it needs a direction; 1: its line search is under way
FRESH = wp.constant(6)  # 1 when this slot computed a new direction
FALLBACK = wp.constant(7)  # 0 none, else a FALLBACKS code
ALPHA = wp.constant(8)  # the next (or accepted) trial step
TRIES = wp.constant(9)  # energy evaluations of the line search so far
ACCEPTED = wp.constant(10)  # 1 once a trial passed
F_NEW = wp.constant(11)  # energy of the accepted trial
ITERATIONS = wp.constant(12)  # line searches finished (SolveResult.iterations)
SLOT = wp.constant(13)  # slots launched (1-based index of the current one)
REJECTED = wp.constant(14)  # linear solves whose direction was rejected for its residual and redone (the host reacts)
REDO_AT = wp.constant(15)  # 1 + the point whose solve was last redone (one redo per point)
SAME_START = wp.constant(16)  # 1 when the run starts where the kept factorization was made (keep_start_factors)
STATE_SIZE = 17

# history columns (float64 table [max_iterations + 1, HISTORY_SIZE], one row per point x_it)
H_ENERGY = wp.constant(0)
H_HAS_GNORM = wp.constant(1)
H_GNORM = wp.constant(2)
H_HAS_DIRECTION = wp.constant(3)
H_DECREMENT = wp.constant(4)
H_FALLBACK = wp.constant(5)
H_SLOT = wp.constant(6)
H_HAS_STEP = wp.constant(7)
H_ALPHA = wp.constant(8)
H_TRIES = wp.constant(9)
HISTORY_SIZE = 10

# stop codes written to state[STATUS] and fallback codes: the policy's (:mod:`~warp_meshad._src.solve.policy.device`)
REASONS = codes.REASONS
CONVERGED = codes.CONVERGED
FALLBACKS = codes.FALLBACKS


@wp.func
def _stop(state: wp.array(dtype=wp.float64), code: int):
    state[STATUS] = wp.float64(code)


@wp.kernel(enable_backward=False, module="unique")
def check_point(
    energy: wp.array(dtype=Any),
    gg: wp.array(dtype=Any),
    hessian_eval: int,
    gradient_tolerance: wp.float64,
    max_iterations: int,
    state: wp.array(dtype=wp.float64),
    history: wp.array2d(dtype=wp.float64),
):
    # one thread: the tests at a new point x_it (energy, gradient norm, iteration cap), as the host loop's top
    if state[STATUS] != wp.float64(0.0) or state[PHASE] != wp.float64(0.0):
        return
    it = int(state[IT])
    f = wp.float64(energy[0])
    if it == 0:
        state[F] = f
        history[0, H_ENERGY] = f
    gnorm = policy.gradient_norm(wp.float64(gg[0]))
    status = policy.point_status(f, hessian_eval, gnorm, it, max_iterations, gradient_tolerance)
    if status == NON_FINITE_ENERGY:
        _stop(state, status)
        return
    state[GNORM] = gnorm
    history[it, H_HAS_GNORM] = wp.float64(1.0)
    history[it, H_GNORM] = gnorm
    if status != 0:
        _stop(state, status)


@wp.kernel(enable_backward=False, module="unique")
def check_direction(
    gd: wp.array(dtype=Any),
    residual_sq: wp.array(dtype=Any),
    solve_failed: wp.array(dtype=wp.int32),
    check_residual: int,
    residual_rtol: wp.float64,
    redo: int,
    tolerance: wp.float64,
    max_step: wp.float64,
    state: wp.array(dtype=wp.float64),
    history: wp.array2d(dtype=wp.float64),
):
    # one thread: descent test, steepest-descent fallback, Newton decrement, start of the line search
    state[SLOT] = state[SLOT] + wp.float64(1.0)
    state[FRESH] = wp.float64(0.0)
    if state[STATUS] != wp.float64(0.0) or state[PHASE] != wp.float64(0.0):
        return
    it = int(state[IT])
    history[it, H_SLOT] = state[SLOT]
    dd = wp.float64(gd[0])
    fallback = int(0)
    if solve_failed[0] != 0:
        fallback = LINEAR_SOLVE_FAILED
    elif check_residual != 0 and not wp.isfinite(wp.float64(residual_sq[0])):
        fallback = LINEAR_SOLVE_FAILED
    elif check_residual != 0 and residual_rtol > wp.float64(0.0) and wp.float64(residual_sq[0]) > (
        residual_rtol * residual_rtol * state[GNORM] * state[GNORM]
    ):
        # ||b - A d|| > rtol ||b|| (b = -g on the free variables): e.g. Cholesky on a matrix that is not positive
        # definite gives a finite wrong answer. Once per point, leave the point without a direction: the host sees
        # REJECTED grow at its next read, lets the back-end react (cuDSS: LU from now on) and the next slot solves again
        if redo != 0 and state[REDO_AT] != wp.float64(it + 1):
            state[REDO_AT] = wp.float64(it + 1)
            state[REJECTED] = state[REJECTED] + wp.float64(1.0)
            return
        fallback = LINEAR_SOLVE_INACCURATE
    else:
        fallback = policy.direction_fallback(dd, 0)
    if fallback != 0:
        dd = policy.fallback_slope(state[GNORM])
    state[FALLBACK] = wp.float64(fallback)
    history[it, H_HAS_DIRECTION] = wp.float64(1.0)
    history[it, H_FALLBACK] = wp.float64(fallback)
    decrement = policy.newton_decrement(dd)
    history[it, H_DECREMENT] = decrement
    if policy.decrement_converged(decrement, tolerance):
        _stop(state, NEWTON_DECREMENT)
        return
    state[DD] = dd
    state[FRESH] = wp.float64(1.0)
    state[PHASE] = wp.float64(1.0)
    state[ALPHA] = max_step
    state[TRIES] = wp.float64(0.0)
    state[ACCEPTED] = wp.float64(0.0)


@wp.kernel(enable_backward=False, module="unique")
def use_direction(
    solved: wp.array(dtype=Any), g: wp.array(dtype=Any), minus_one: Any, state: wp.array(dtype=wp.float64),
    d: wp.array(dtype=Any),
):
    # one thread per variable: d = the linear solve's direction, or -g on a fallback (only in a slot with a new one)
    i = wp.tid()
    if state[FRESH] == wp.float64(0.0):
        return
    if state[FALLBACK] != wp.float64(0.0):
        d[i] = minus_one * g[i]
    else:
        d[i] = solved[i]


@wp.kernel(enable_backward=False, module="unique")
def trial_point(
    x: wp.array(dtype=Any), d: wp.array(dtype=Any), alpha: wp.array(dtype=Any), max_tries: int,
    state: wp.array(dtype=wp.float64), out: wp.array(dtype=Any),
):
    # one thread per variable: out = x + alpha d for the next trial (nothing once accepted, stopped or out of tries)
    i = wp.tid()
    if not _trial_open(state, max_tries):
        return
    out[i] = x[i] + alpha[0] * d[i]


@wp.func
def _trial_open(state: wp.array(dtype=wp.float64), max_tries: int):
    return (state[STATUS] == wp.float64(0.0) and state[PHASE] == wp.float64(1.0)
            and state[ACCEPTED] == wp.float64(0.0) and int(state[TRIES]) < max_tries)


@wp.kernel(enable_backward=False, module="unique")
def search_open(max_tries: int, state: wp.array(dtype=wp.float64), flag: wp.array(dtype=wp.int32)):
    # one thread: 1 while the line search wants another trial (the condition of the captured loop's while node)
    flag[0] = wp.where(_trial_open(state, max_tries), 1, 0)


@wp.kernel(enable_backward=False, module="unique")
def trial_step(max_tries: int, state: wp.array(dtype=wp.float64), alpha: wp.array(dtype=Any)):
    # one thread: the step of the next trial in the variables' scalar type (as the host's axpy_into casts it)
    if _trial_open(state, max_tries):
        alpha[0] = alpha.dtype(state[ALPHA])


@wp.kernel(enable_backward=False, module="unique")
def armijo_test(
    energy: wp.array(dtype=Any), c: wp.float64, shrink: wp.float64, max_tries: int,
    state: wp.array(dtype=wp.float64),
):
    # one thread: accept the trial when its energy is finite and f <= f0 + c alpha (g . d); else shrink alpha
    if not _trial_open(state, max_tries):
        return
    state[TRIES] = state[TRIES] + wp.float64(1.0)
    f = wp.float64(energy[0])
    alpha = state[ALPHA]
    if policy.armijo_accepts(f, state[F], alpha, state[DD], c):
        state[ACCEPTED] = wp.float64(1.0)
        state[F_NEW] = f
    else:
        state[ALPHA] = alpha * shrink


@wp.kernel(enable_backward=False, module="unique")
def take_step(
    d: wp.array(dtype=Any), alpha: wp.array(dtype=Any), state: wp.array(dtype=wp.float64), x: wp.array(dtype=Any)
):
    # one thread per variable: x += alpha d with the accepted step (the accepted trial point, bit for bit)
    i = wp.tid()
    if state[STATUS] == wp.float64(0.0) and state[PHASE] == wp.float64(1.0) and state[ACCEPTED] != wp.float64(0.0):
        x[i] = x[i] + alpha[0] * d[i]


@wp.kernel(enable_backward=False, module="unique")
def finish_line_search(
    energy_tolerance: wp.float64, max_tries: int, state: wp.array(dtype=wp.float64),
    history: wp.array2d(dtype=wp.float64),
):
    # one thread: book the accepted step and test the energy change, or fail the line search when out of tries;
    # with tries left and none accepted the line search goes on in the next slot
    if state[STATUS] != wp.float64(0.0) or state[PHASE] != wp.float64(1.0):
        return
    it = int(state[IT])
    if state[ACCEPTED] != wp.float64(0.0):
        history[it, H_HAS_STEP] = wp.float64(1.0)
        history[it, H_ALPHA] = state[ALPHA]
        history[it, H_TRIES] = state[TRIES]
        state[ITERATIONS] = state[ITERATIONS] + wp.float64(1.0)
        f_old = state[F]
        f = state[F_NEW]
        state[F] = f
        history[it + 1, H_ENERGY] = f
        state[IT] = wp.float64(it + 1)
        state[PHASE] = wp.float64(0.0)
        if policy.energy_change_converged(f_old, f, energy_tolerance):
            _stop(state, ENERGY_CHANGE)
    elif int(state[TRIES]) >= max_tries:
        history[it, H_HAS_STEP] = wp.float64(1.0)
        history[it, H_ALPHA] = wp.float64(0.0)
        history[it, H_TRIES] = state[TRIES]
        state[ITERATIONS] = state[ITERATIONS] + wp.float64(1.0)
        _stop(state, LINE_SEARCH_FAILED)


@wp.kernel(enable_backward=False, module="unique")
def start_may_keep_factors(solve_failed: wp.array(dtype=wp.int32), state: wp.array(dtype=wp.float64)):
    """Before the comparison of the start point with the factored one: 1 unless the last solve failed."""
    state[SAME_START] = wp.where(solve_failed[0] == 0, wp.float64(1.0), wp.float64(0.0))

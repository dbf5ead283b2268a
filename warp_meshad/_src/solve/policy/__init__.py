"""policy: the decisions every minimization loop takes, stated once.

A minimization loop (the host loop of :mod:`~warp_meshad._src.solve.solvers`, the device loops of
:mod:`~warp_meshad._src.solve.device_loop` and :mod:`~warp_meshad._src.solve.first_order_loop`, the batch loop of
:mod:`~warp_meshad._src.solve.batch_solver`) repeats: tests at a new point, a direction, its descent test, the Newton
decrement, Armijo backtracking, the energy-change test. What those tests decide lives here:

- ``codes``: the stop reasons and steepest-descent fallback causes, as the integer codes the device loops write and
  the names :class:`~warp_meshad.SolveResult` reports.
- ``rules``: each decision as a NumPy function over arrays of one value per problem (a single solve is the batch of
  one), float64, in the order of operations every loop uses.
- ``device``: the same decisions as ``@wp.func`` for the device loops' one-thread kernels, with the same formulas in
  the same order, so host and device take the same decisions on the same numbers.

tests/test_policy.py checks each rule and that the device functions decide as the NumPy ones on the same inputs.
"""

from warp_meshad._src.solve.policy.codes import (
    CONVERGED,
    ENERGY_CHANGE,
    FALLBACKS,
    GRADIENT_NORM,
    LINE_SEARCH_FAILED,
    LINEAR_SOLVE_FAILED,
    LINEAR_SOLVE_INACCURATE,
    MAX_ITERATIONS,
    NEWTON_DECREMENT,
    NO_FALLBACK,
    NON_FINITE_ENERGY,
    NON_FINITE_GRADIENT,
    NOT_DESCENT_DIRECTION,
    REASONS,
    RUNNING,
    fallback_code,
    reason_code,
)
from warp_meshad._src.solve.policy.rules import (
    armijo_accepts,
    decrement_converged,
    direction_fallback,
    energy_change_converged,
    fallback_slope,
    first_trial_step,
    gradient_norm,
    line_search_possible,
    newton_decrement,
    point_status,
)

__all__ = [
    "CONVERGED",
    "ENERGY_CHANGE",
    "FALLBACKS",
    "GRADIENT_NORM",
    "LINEAR_SOLVE_FAILED",
    "LINEAR_SOLVE_INACCURATE",
    "LINE_SEARCH_FAILED",
    "MAX_ITERATIONS",
    "NEWTON_DECREMENT",
    "NON_FINITE_ENERGY",
    "NON_FINITE_GRADIENT",
    "NOT_DESCENT_DIRECTION",
    "NO_FALLBACK",
    "REASONS",
    "RUNNING",
    "armijo_accepts",
    "decrement_converged",
    "direction_fallback",
    "energy_change_converged",
    "fallback_code",
    "fallback_slope",
    "first_trial_step",
    "gradient_norm",
    "line_search_possible",
    "newton_decrement",
    "point_status",
    "reason_code",
]

"""Stop reasons and steepest-descent fallback causes: integer codes (what the device loops write into their float64
state) and the names :class:`~warp_meshad.SolveResult` reports (``reason``, ``fallback_reasons``).

Code 0 means "running" (a stop code) or "no fallback" (a fallback code). A hook's own stop reason (``NewtonHooks.stop``)
and ``"callback"`` are host-side reasons with no code.
"""

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
    "fallback_code",
    "reason_code",
]

RUNNING = 0
GRADIENT_NORM = 1
NEWTON_DECREMENT = 2
ENERGY_CHANGE = 3
MAX_ITERATIONS = 4
LINE_SEARCH_FAILED = 5
NON_FINITE_ENERGY = 6
NON_FINITE_GRADIENT = 7

REASONS = {
    GRADIENT_NORM: "gradient_norm",
    NEWTON_DECREMENT: "newton_decrement",
    ENERGY_CHANGE: "energy_change",
    MAX_ITERATIONS: "max_iterations",
    LINE_SEARCH_FAILED: "line_search_failed",
    NON_FINITE_ENERGY: "non_finite_energy",
    NON_FINITE_GRADIENT: "non_finite_gradient",
}
"""Stop code -> ``SolveResult.reason``."""

CONVERGED = ("gradient_norm", "newton_decrement", "energy_change")
"""The reasons that count as ``SolveResult.converged`` (a hook's own stop reason counts too)."""

NO_FALLBACK = 0
NOT_DESCENT_DIRECTION = 1
LINEAR_SOLVE_FAILED = 2
LINEAR_SOLVE_INACCURATE = 3

FALLBACKS = {
    NOT_DESCENT_DIRECTION: "not_descent_direction",
    LINEAR_SOLVE_FAILED: "linear_solve_failed",
    LINEAR_SOLVE_INACCURATE: "linear_solve_inaccurate",
}
"""Fallback code -> key of ``SolveResult.fallback_reasons``. Newton-CG's ``"negative_curvature"`` is host-only."""

_REASON_CODES = {name: code for code, name in REASONS.items()}
_FALLBACK_CODES = {name: code for code, name in FALLBACKS.items()}


def reason_code(reason: str) -> int:
    """The stop code of a reason name (KeyError for host-only reasons such as ``"callback"``)."""
    return _REASON_CODES[reason]


def fallback_code(reason: str) -> int:
    """The fallback code of a ``fallback_reasons`` key (KeyError for host-only ones)."""
    return _FALLBACK_CODES[reason]

"""The loops' decisions as ``@wp.func`` (float64) for the device loops' one-thread kernels: the formulas of
:mod:`~warp_meshad._src.solve.policy.rules`, in the same order of operations.

Codes are the ints of :mod:`~warp_meshad._src.solve.policy.codes`, here as ``wp.constant`` of the same names.
"""

import warp as wp

from warp_meshad._src.solve.policy import codes

__all__ = [
    "ENERGY_CHANGE",
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
    "RUNNING",
    "armijo_accepts",
    "decrement_converged",
    "direction_fallback",
    "energy_change_converged",
    "fallback_slope",
    "gradient_norm",
    "newton_decrement",
    "point_status",
]

# every code as a Warp constant (the device loops' kernels compare and write these)
RUNNING = wp.constant(codes.RUNNING)
GRADIENT_NORM = wp.constant(codes.GRADIENT_NORM)
NEWTON_DECREMENT = wp.constant(codes.NEWTON_DECREMENT)
ENERGY_CHANGE = wp.constant(codes.ENERGY_CHANGE)
MAX_ITERATIONS = wp.constant(codes.MAX_ITERATIONS)
LINE_SEARCH_FAILED = wp.constant(codes.LINE_SEARCH_FAILED)
NON_FINITE_ENERGY = wp.constant(codes.NON_FINITE_ENERGY)
NON_FINITE_GRADIENT = wp.constant(codes.NON_FINITE_GRADIENT)
NO_FALLBACK = wp.constant(codes.NO_FALLBACK)
NOT_DESCENT_DIRECTION = wp.constant(codes.NOT_DESCENT_DIRECTION)
LINEAR_SOLVE_FAILED = wp.constant(codes.LINEAR_SOLVE_FAILED)
LINEAR_SOLVE_INACCURATE = wp.constant(codes.LINEAR_SOLVE_INACCURATE)


@wp.func
def gradient_norm(gg: wp.float64):
    """sqrt(g . g), NaN where g . g is NaN or negative."""
    gnorm = wp.float64(wp.nan)
    if gg >= wp.float64(0.0):
        gnorm = wp.sqrt(gg)
    return gnorm


@wp.func
def point_status(energy: wp.float64, check_energy: int, gnorm: wp.float64, iteration: int, max_iterations: int,
                 gradient_tolerance: wp.float64):
    """Stop code at a new point (rules.point_status; the energy is tested where ``check_energy`` != 0)."""
    if check_energy != 0 and not wp.isfinite(energy):
        return NON_FINITE_ENERGY
    if not wp.isfinite(gnorm):
        return NON_FINITE_GRADIENT
    if gnorm <= gradient_tolerance:
        return GRADIENT_NORM
    if iteration == max_iterations:
        return MAX_ITERATIONS
    return RUNNING


@wp.func
def direction_fallback(dd: wp.float64, solve_failed: int):
    """Why a direction cannot be used (rules.direction_fallback)."""
    if solve_failed != 0:
        return LINEAR_SOLVE_FAILED
    if not wp.isfinite(dd) or dd >= wp.float64(0.0):
        return NOT_DESCENT_DIRECTION
    return NO_FALLBACK


@wp.func
def fallback_slope(gnorm: wp.float64):
    """g . d of d = -g."""
    return -gnorm * gnorm


@wp.func
def newton_decrement(dd: wp.float64):
    """0.5 |g . d|."""
    return wp.float64(0.5) * wp.abs(dd)


@wp.func
def decrement_converged(decrement: wp.float64, tolerance: wp.float64):
    """decrement < tolerance."""
    return decrement < tolerance


@wp.func
def armijo_accepts(f: wp.float64, f0: wp.float64, alpha: wp.float64, dd: wp.float64, c: wp.float64):
    """Finite f and f <= f0 + c alpha (g . d)."""
    return wp.isfinite(f) and f <= f0 + c * alpha * dd


@wp.func
def energy_change_converged(f_old: wp.float64, f_new: wp.float64, energy_tolerance: wp.float64):
    """|f_old - f_new| <= energy_tolerance max(1, |f_old|)."""
    return wp.abs(f_old - f_new) <= energy_tolerance * wp.max(wp.float64(1.0), wp.abs(f_old))

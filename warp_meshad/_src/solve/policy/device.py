"""The loops' decisions as ``@wp.func`` (float64) for the device loops' one-thread kernels: the formulas of
:mod:`~warp_meshad._src.solve.policy.rules`, in the same order of operations.

Codes are the ints of :mod:`~warp_meshad._src.solve.policy.codes` (as ``wp.constant``).
"""

import warp as wp

from warp_meshad._src.solve.policy import codes

__all__ = [
    "armijo_accepts",
    "decrement_converged",
    "direction_fallback",
    "energy_change_converged",
    "fallback_slope",
    "gradient_norm",
    "newton_decrement",
    "point_status",
]

_RUNNING = wp.constant(codes.RUNNING)
_GRADIENT_NORM = wp.constant(codes.GRADIENT_NORM)
_MAX_ITERATIONS = wp.constant(codes.MAX_ITERATIONS)
_NON_FINITE_ENERGY = wp.constant(codes.NON_FINITE_ENERGY)
_NON_FINITE_GRADIENT = wp.constant(codes.NON_FINITE_GRADIENT)
_NO_FALLBACK = wp.constant(codes.NO_FALLBACK)
_NOT_DESCENT_DIRECTION = wp.constant(codes.NOT_DESCENT_DIRECTION)
_LINEAR_SOLVE_FAILED = wp.constant(codes.LINEAR_SOLVE_FAILED)


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
        return _NON_FINITE_ENERGY
    if not wp.isfinite(gnorm):
        return _NON_FINITE_GRADIENT
    if gnorm <= gradient_tolerance:
        return _GRADIENT_NORM
    if iteration == max_iterations:
        return _MAX_ITERATIONS
    return _RUNNING


@wp.func
def direction_fallback(dd: wp.float64, solve_failed: int):
    """Why a direction cannot be used (rules.direction_fallback)."""
    if solve_failed != 0:
        return _LINEAR_SOLVE_FAILED
    if not wp.isfinite(dd) or dd >= wp.float64(0.0):
        return _NOT_DESCENT_DIRECTION
    return _NO_FALLBACK


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

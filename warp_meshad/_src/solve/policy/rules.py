"""The loops' decisions as NumPy functions over arrays of one value per problem (float64; a single solve passes
scalars or arrays of length one, the batch loop one value per mesh).

Every function is elementwise and returns a NumPy array (a 0-d array for scalar inputs). The formulas and their order
of operations are the ones :mod:`~warp_meshad._src.solve.policy.device` states for the device loops, so a loop on the
host and one on the device decide alike on the same float64 numbers.
"""

from __future__ import annotations

import numpy as np

from warp_meshad._src.solve.policy.codes import (
    GRADIENT_NORM,
    LINEAR_SOLVE_FAILED,
    MAX_ITERATIONS,
    NO_FALLBACK,
    NON_FINITE_ENERGY,
    NON_FINITE_GRADIENT,
    NOT_DESCENT_DIRECTION,
    RUNNING,
)

__all__ = [
    "armijo_accepts",
    "decrement_converged",
    "direction_fallback",
    "energy_change_converged",
    "fallback_slope",
    "first_trial_step",
    "gradient_norm",
    "line_search_possible",
    "newton_decrement",
    "point_status",
]


def _f64(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def gradient_norm(gg) -> np.ndarray:
    """``sqrt(g . g)``, NaN where ``g . g`` is NaN or negative (``gg``: the squared norms)."""
    gg = _f64(gg)
    ok = gg >= 0.0
    return np.where(ok, np.sqrt(np.where(ok, gg, 0.0)), np.nan)


def point_status(energy, gnorm, iteration, max_iterations: int, gradient_tolerance: float) -> np.ndarray:
    """The stop code at a new point ``x_iteration`` (``RUNNING`` to go on), the first that applies of:
    ``NON_FINITE_ENERGY`` (``energy`` not finite; pass None where the loop does not test it),
    ``NON_FINITE_GRADIENT``, ``GRADIENT_NORM`` (``gnorm <= gradient_tolerance``), ``MAX_ITERATIONS``
    (``iteration == max_iterations``: past the cap only the gradient norm is reported)."""
    gnorm = _f64(gnorm)
    status = np.where(np.asarray(iteration) == int(max_iterations), MAX_ITERATIONS, RUNNING)
    status = np.where(gnorm <= float(gradient_tolerance), GRADIENT_NORM, status)
    status = np.where(np.isfinite(gnorm), status, NON_FINITE_GRADIENT)
    if energy is not None:
        status = np.where(np.isfinite(_f64(energy)), status, NON_FINITE_ENERGY)
    return status


def direction_fallback(directional_derivative, solve_failed=False) -> np.ndarray:
    """Why a direction ``d`` cannot be used (``NO_FALLBACK`` when it can): ``LINEAR_SOLVE_FAILED`` when its solve
    failed, else ``NOT_DESCENT_DIRECTION`` when ``g . d`` is not finite or ``>= 0``. The loop then steps along ``-g``."""
    dd = _f64(directional_derivative)
    code = np.where(np.isfinite(dd) & (dd < 0.0), NO_FALLBACK, NOT_DESCENT_DIRECTION)
    return np.where(np.asarray(solve_failed, dtype=bool), LINEAR_SOLVE_FAILED, code)


def fallback_slope(gnorm) -> np.ndarray:
    """``g . d`` of the fallback direction ``d = -g``: ``-|g|^2`` from the gradient norm."""
    gnorm = _f64(gnorm)
    with np.errstate(over="ignore"):
        return -gnorm * gnorm


def newton_decrement(directional_derivative) -> np.ndarray:
    """The Newton decrement ``0.5 |g . d|`` (TinyAD's stop measure)."""
    return 0.5 * np.abs(_f64(directional_derivative))


def decrement_converged(decrement, tolerance: float) -> np.ndarray:
    """Newton-type solvers stop when the decrement is below ``tolerance`` (strictly)."""
    return _f64(decrement) < float(tolerance)


def line_search_possible(f0, directional_derivative) -> np.ndarray:
    """Armijo backtracking starts only from a finite energy along a descent direction (finite ``g . d < 0``)."""
    f0, dd = _f64(f0), _f64(directional_derivative)
    return np.isfinite(f0) & np.isfinite(dd) & (dd < 0.0)


def first_trial_step(max_step, bound=None) -> np.ndarray:
    """The first trial step: ``max_step``, capped by a step bound (CCD) when given; 0 where the bound is not
    ``> 0`` (NaN included): no step is possible."""
    alpha = _f64(max_step)
    if bound is None:
        return alpha
    bound = _f64(bound)
    return np.where(bound > 0.0, np.minimum(alpha, bound), 0.0)


def armijo_accepts(f_trial, f0, alpha, directional_derivative, c: float) -> np.ndarray:
    """Armijo's sufficient decrease ``f(x + alpha d) <= f0 + c alpha (g . d)``; a trial energy of +inf or NaN (an
    invalid state) is rejected."""
    f = _f64(f_trial)
    with np.errstate(invalid="ignore", over="ignore"):  # inf * 0 and the like: NaN, which rejects
        return np.isfinite(f) & (f <= _f64(f0) + float(c) * _f64(alpha) * _f64(directional_derivative))


def energy_change_converged(f_old, f_new, energy_tolerance: float) -> np.ndarray:
    """The relative energy change test after a step: ``|f_old - f_new| <= energy_tolerance max(1, |f_old|)``."""
    f_old, f_new = _f64(f_old), _f64(f_new)
    with np.errstate(invalid="ignore", over="ignore"):
        return np.abs(f_old - f_new) <= float(energy_tolerance) * np.maximum(1.0, np.abs(f_old))

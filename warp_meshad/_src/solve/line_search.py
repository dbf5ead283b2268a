"""Armijo backtracking line search on Warp arrays (TinyAD defaults: shrink 0.8, 64 tries, c = 1e-4).

A trial point ``x + alpha d`` is written by :func:`~warp_meshad._src.solve.vector_ops.axpy_into` into a preallocated
buffer; its energy is accepted when ``f(x + alpha d) <= f0 + c alpha (g . d)``. A trial energy that is +inf or NaN (an
inverted element, a penetration) is rejected like any other failed trial and the step shrinks. An optional
``step_bound_fn(x, d)`` caps the first step (continuous collision detection plugs in there).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import warp as wp

from warp_meshad._src.solve import policy
from warp_meshad._src.solve.vector_ops import axpy_into

__all__ = ["LineSearchResult", "armijo", "check_armijo_settings"]


class LineSearchResult(NamedTuple):
    """Outcome of :func:`armijo`.

    Attributes:
        alpha: accepted step length; 0.0 when no step was accepted.
        f_new: energy at the accepted point (``f0`` when no step was accepted).
        tries: number of energy evaluations made.
        accepted: whether a step satisfied the Armijo condition.
    """

    alpha: float
    f_new: float
    tries: int
    accepted: bool


def _check_pair(x, direction, out) -> None:
    if not isinstance(x, wp.array) or x.ndim != 1:
        raise TypeError(f"x: expected a 1-d wp.array, got {type(x).__name__} of shape {getattr(x, 'shape', None)}")
    for name, arr in (("direction", direction), ("out", out)):
        if arr is None:
            continue
        if not isinstance(arr, wp.array):
            raise TypeError(f"{name}: expected a wp.array, got {type(arr).__name__}")
        if arr.shape != x.shape:
            raise ValueError(f"{name}: expected shape {x.shape}, got {arr.shape}")
        if not wp.types.types_equal(arr.dtype, x.dtype):
            raise TypeError(f"{name}: expected dtype {wp.types.type_repr(x.dtype)}, got {wp.types.type_repr(arr.dtype)}")
        if arr.device != x.device:
            raise ValueError(f"{name}: expected device {x.device}, got {arr.device}")


def check_armijo_settings(shrink: float, c: float, max_tries: int,
                          names: tuple[str, str, str] = ("shrink", "c", "max_tries")) -> None:
    """Check the Armijo settings (``armijo``'s, and the batch solver's own line search's).

    Args:
        names: how the messages name the three settings (the caller's arguments).

    Raises:
        ValueError: ``shrink`` or ``c`` outside (0, 1), ``max_tries`` < 1.
    """
    if not 0.0 < shrink < 1.0:
        raise ValueError(f"{names[0]}: expected a value in (0, 1), got {shrink}")
    if not 0.0 < c < 1.0:
        raise ValueError(f"{names[1]}: expected a value in (0, 1), got {c}")
    if int(max_tries) < 1:
        raise ValueError(f"{names[2]}: expected >= 1, got {max_tries}")


def armijo(
    energy_fn: Callable[[wp.array], float],
    x: wp.array,
    direction: wp.array,
    f0: float,
    directional_derivative: float,
    *,
    shrink: float = 0.8,
    max_tries: int = 64,
    c: float = 1e-4,
    max_step: float = 1.0,
    step_bound_fn: Callable[[wp.array, wp.array], float] | None = None,
    out: wp.array | None = None,
) -> LineSearchResult:
    """Backtrack from ``alpha = min(max_step, step_bound_fn(x, d))`` until the Armijo condition holds.

    Args:
        energy_fn: ``f(y) -> float`` for a trial point ``y`` (the ``out`` buffer); may return +inf or NaN for an
            invalid state, which rejects the trial.
        x: current point, shape ``[n]``, dtype a float scalar or ``vec{k}{f|d}``; not modified.
        direction: search direction ``d``, same shape/dtype/device as ``x``.
        f0: energy at ``x`` (finite).
        directional_derivative: ``g . d`` at ``x``; must be negative for a descent direction.
        shrink: factor in (0, 1) applied to ``alpha`` after a rejected trial.
        max_tries: maximum number of energy evaluations (>= 1).
        c: sufficient-decrease constant in (0, 1).
        max_step: first trial step (> 0).
        step_bound_fn: optional ``(x, d) -> float`` upper bound on the step (e.g. the CCD time of impact); a bound
            <= 0 means no step is possible.
        out: preallocated buffer for the trial point (same shape/dtype/device as ``x``); allocated if None. On return
            it holds ``x + alpha d`` (a copy of ``x`` when no step was accepted). Must not be ``x``.

    Returns:
        :class:`LineSearchResult` ``(alpha, f_new, tries, accepted)``; ``alpha == 0`` and ``accepted == False`` when no
        step was accepted (not a descent direction, bound <= 0, or ``max_tries`` rejections).
    """
    _check_pair(x, direction, out)
    check_armijo_settings(shrink, c, max_tries)
    if not max_step > 0.0:
        raise ValueError(f"max_step: expected > 0, got {max_step}")
    f0 = float(f0)
    dd = float(directional_derivative)
    if out is None:
        out = wp.empty_like(x)
    elif out is x:
        raise ValueError("out: expected a buffer distinct from x (trial points must not overwrite x)")

    def _reject() -> LineSearchResult:
        wp.copy(out, x)
        return LineSearchResult(0.0, f0, tries, False)

    tries = 0
    if not policy.line_search_possible(f0, dd):
        return _reject()

    bound = None if step_bound_fn is None else float(step_bound_fn(x, direction))
    alpha = float(policy.first_trial_step(float(max_step), bound))
    if not alpha > 0.0:  # a step bound <= 0 (or NaN): no step is possible
        return _reject()

    while tries < int(max_tries):
        axpy_into(out, x, alpha, direction)
        f = float(energy_fn(out))
        tries += 1
        if policy.armijo_accepts(f, f0, alpha, dd, c):
            return LineSearchResult(alpha, f, tries, True)
        alpha *= shrink
    return _reject()

"""Local math for energies, overloaded for plain values and for dual numbers.

Inside an energy added to a :class:`warp_meshad.Problem`, ``ad.f`` resolves to the overload set of
the dual type being evaluated (value only, gradient, or gradient + Hessian), so one energy runs
unchanged in every mode. Outside of a problem (in any Warp kernel) the functions here work on
plain floats, vectors and matrices, generic over float32 and float64.

Functions: ``length, length_sq, normalize, dot, cross, outer, sqrt, exp, log, sin, cos, tan, asin,
acos, atan, atan2, sinh, cosh, tanh, pow, abs, sq, min, max, where, select, det, inverse,
transpose, trace, frobenius_sq, matmul``, constructors ``vec2, vec3, vec4, mat22, mat22_cols,
mat22_rows, mat33_cols, mat33_rows``, and ``value`` (the plain value of a dual or plain input).

``where(cond, a, b)`` is ``a`` when ``cond`` holds (as ``wp.where``); ``select(cond, a, b)`` is ``b``
when ``cond`` holds (as ``wp.select``).

:func:`duals` returns the generated module of one dual type for direct use in hand-written
kernels (``seed``, ``const``, ``value``, ``gradient``, ``hessian`` and every operator).
"""

from __future__ import annotations

from ._dualgen import load as _load

__all__ = [
    "abs", "acos", "asin", "atan", "atan2", "cos", "cosh", "cross", "det", "dot", "duals", "exp",
    "frobenius_sq", "inverse", "length", "length_sq", "log", "mat22", "mat22_cols", "mat22_rows",
    "mat33_cols", "mat33_rows", "matmul", "max", "min", "normalize", "outer", "pow", "select", "sin",
    "sinh", "sq", "sqrt", "tan", "tanh", "trace", "transpose", "value", "vec2", "vec3", "vec4", "where",
]

_plain = _load(0, None, "plain")


def duals(k: int, dtype=None, hessian: bool = True):
    """The generated dual-number module for local size ``k``.

    Args:
        k: number of scalar variables differentiated together (1..64).
        dtype: ``wp.float32`` or ``wp.float64`` (default ``wp.float64``).
        hessian: gradient + Hessian duals when True, gradient-only duals when False.

    Returns:
        A module with the struct ``Dual`` (fields ``v``, ``g``, and ``h`` with a Hessian), ``DVec2/3/4``,
        ``DMat22/33``, ``seed(x, offset)``, ``const(x)``, ``value``, ``gradient``, ``hessian``, the
        operators ``add, sub, mul, div`` and every function of this module.
    """
    import warp as wp

    return _load(k, wp.float64 if dtype is None else dtype, "hess" if hessian else "grad")


globals().update({_name: getattr(_plain, _name) for _name in __all__ if _name != "duals"})

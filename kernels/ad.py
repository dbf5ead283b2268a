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
kernels (``seed``, ``const``, ``value``, ``gradient``, ``hessian`` and every operator); the
:mod:`warp_meshad.kernels` docstring shows such a kernel.
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
    """The generated dual-number module for local size ``k``, for use in hand-written kernels.

    A dual scalar carries a value and its derivatives with respect to ``k`` variables: the gradient (``vecK``) and,
    when ``hessian`` is True, the symmetric k x k Hessian (stored as its packed upper triangle ``h``; read it with
    ``hessian``). Bind the module's ``add, sub, mul, div`` in the globals of the file that defines your kernel so
    ``+ - * /`` work on duals there (see :mod:`warp_meshad.kernels` for a whole example).

    Args:
        k: number of scalar variables differentiated together (1..64): the sum of the sizes of the seeded inputs.
        dtype: ``wp.float32`` or ``wp.float64`` (default ``wp.float64``).
        hessian: gradient + Hessian duals when True, gradient-only duals (cheaper: no k (k + 1) / 2 entries) when
            False.

    Returns:
        The module (the same object for the same arguments). Its names:

        - ``Dual`` (fields ``v``, ``g`` and, with a Hessian, ``h``), ``DVec2/3/4`` (fields ``x, y, z, w``),
          ``DMat22/33`` (fields ``m00, m01, ...``); ``S`` the scalar type, ``vecK`` / ``matK`` the gradient and
          Hessian types, ``K = k``;
        - ``seed(x, offset)``: a scalar, ``vecN`` or ``matNN`` (row-major) of plain values as a dual whose
          components are the variables ``offset, offset + 1, ...``;
        - ``const(x)``: the same with zero derivatives; ``value(a)``: the plain value of a dual (scalar, vector or
          matrix); ``gradient(a)``: ``a.g``, a ``vecK``; ``hessian(a)``: the ``matK`` (Hessian duals only);
        - the operators ``add, sub, mul, div`` (duals with duals, plain scalars and int or float literals) and every
          function of this module, overloaded for duals and plain values.

    Raises:
        ValueError: ``k`` outside 1..64 or a dtype other than float32 / float64, naming what came.
    """
    import warp as wp

    module = _load(k, wp.float64 if dtype is None else dtype, "hess" if hessian else "grad")
    for name, doc in _DUAL_DOCS.items():  # Warp's Function keeps a docstring in doc and __doc__ (not hashed)
        f = getattr(module, name, None)
        if f is not None and not f.doc:
            f.doc = f.__doc__ = doc
    return module


# what help() / __doc__ shows for the generated functions a hand-written kernel calls
_DUAL_DOCS = {
    "seed": (
        "seed(x, offset) -> Dual | DVecN | DMatNN: the plain scalar, vecN (N = 2, 3, 4) or matNN (N = 2, 3) x as a "
        "dual whose components are the independent variables offset, offset + 1, ... (matrices row-major), each "
        "with gradient one at its own slot, zero elsewhere, and a zero Hessian. Seed each input of an element at "
        "its own offset; the offsets of all inputs cover 0 .. K - 1."
    ),
    "const": "const(x) -> Dual | DVecN | DMatNN: the plain scalar, vector or matrix x as a dual with zero derivatives.",
    "value": "value(a): the plain value of a dual scalar, vector or matrix (a plain input is returned as it is).",
    "gradient": "gradient(a: Dual) -> vecK: the derivatives of a with respect to the K seeded variables.",
    "hessian": "hessian(a: Dual) -> matK: the symmetric K x K second derivatives of a (Hessian duals only).",
}


globals().update({_name: getattr(_plain, _name) for _name in __all__ if _name != "duals"})

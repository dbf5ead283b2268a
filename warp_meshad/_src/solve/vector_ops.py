"""Vector operations of the solvers on Warp block vectors, and the one matrix update they need.

A block vector is a ``wp.array`` of shape ``[n]`` whose dtype is a float scalar or ``vec{k}{f|d}`` (a problem's
variables, gradients, directions). Results written into ``out`` use one Warp launch on the arrays' device; ``out``
may alias an input. :func:`dot` and :func:`norm` return host floats (they synchronize). :func:`add_to_diagonal` adds
``value * I`` to the stored diagonal blocks of a :class:`warp.sparse.BsrMatrix` (Levenberg damping).

Every solver, the line search and the benchmarks use these; none keeps a private copy.
"""

import math
from typing import Any

import numpy as np
import warp as wp
import warp.sparse as wps

__all__ = [
    "add_to_diagonal",
    "axpy_into",
    "check_finite_variables",
    "dot",
    "lincomb_into",
    "mark_if_different",
    "norm",
    "scalar_view",
    "scale_into",
]


@wp.kernel(enable_backward=False, module="unique")
def _axpy_into(x: wp.array(dtype=Any), d: wp.array(dtype=Any), alpha: Any, out: wp.array(dtype=Any)):
    # one thread per variable: out = x + alpha * d
    i = wp.tid()
    out[i] = x[i] + alpha * d[i]


@wp.kernel(enable_backward=False, module="unique")
def _scaled_copy(a: wp.array(dtype=Any), s: Any, out: wp.array(dtype=Any)):
    # one thread per variable: out = s * a
    i = wp.tid()
    out[i] = s * a[i]


@wp.kernel(enable_backward=False, module="unique")
def _lincomb(a: wp.array(dtype=Any), sa: Any, b: wp.array(dtype=Any), sb: Any, out: wp.array(dtype=Any)):
    # one thread per variable: out = sa * a + sb * b
    i = wp.tid()
    out[i] = sa * a[i] + sb * b[i]


def _scalar_of(arr: wp.array):
    return getattr(arr.dtype, "_wp_scalar_type_", arr.dtype)


def axpy_into(out: wp.array, x: wp.array, alpha: float, d: wp.array) -> wp.array:
    """Write ``out = x + alpha * d`` (``out`` may alias ``x``).

    Args:
        out: destination, shape ``[n]``, same dtype/device as ``x``.
        x: shape ``[n]``, dtype a float scalar or ``vec{k}{f|d}``.
        alpha: step length.
        d: direction, same shape/dtype/device as ``x``.

    Returns:
        ``out``.
    """
    wp.launch(_axpy_into, dim=x.shape[0], inputs=[x, d, _scalar_of(x)(alpha), out], device=x.device)
    return out


def scale_into(out: wp.array, s: float, a: wp.array) -> wp.array:
    """Write ``out = s * a`` (``out`` may alias ``a``).

    Args:
        out: destination, same shape/dtype/device as ``a``.
        s: scale factor.
        a: shape ``[n]``, dtype a float scalar or ``vec{k}{f|d}``.

    Returns:
        ``out``.
    """
    wp.launch(_scaled_copy, dim=a.shape[0], inputs=[a, _scalar_of(a)(s), out], device=a.device)
    return out


def lincomb_into(out: wp.array, sa: float, a: wp.array, sb: float, b: wp.array) -> wp.array:
    """Write ``out = sa * a + sb * b`` (``out`` may alias ``a`` or ``b``).

    Args:
        out: destination, same shape/dtype/device as ``a``.
        sa, sb: coefficients.
        a, b: shape ``[n]``, same dtype (a float scalar or ``vec{k}{f|d}``) and device.

    Returns:
        ``out``.
    """
    scalar = _scalar_of(a)
    wp.launch(_lincomb, dim=a.shape[0], inputs=[a, scalar(sa), b, scalar(sb), out], device=a.device)
    return out


def dot(a: wp.array, b: wp.array) -> float:
    """``sum_i a[i] . b[i]`` over all scalar components, as a host float.

    Args:
        a, b: shape ``[n]``, same dtype (a float scalar or ``vec{k}{f|d}``) and device.
    """
    return float(wp.utils.array_inner(a, b))


def norm(a: wp.array) -> float:
    """Euclidean norm of all scalar components of ``a`` (NaN when ``a . a`` is NaN or negative), as a host float.

    Args:
        a: shape ``[n]``, dtype a float scalar or ``vec{k}{f|d}``.
    """
    v = dot(a, a)
    return math.sqrt(v) if v >= 0.0 else float("nan")


_diag_kernels: dict = {}


def _diag_add_kernel(block_type):
    if block_type in _diag_kernels:
        return _diag_kernels[block_type]
    scalar = getattr(block_type, "_wp_scalar_type_", block_type)
    if scalar == block_type:

        def _add_to_diagonal(offsets: wp.array(dtype=int), columns: wp.array(dtype=int), nrow: int, value: scalar,
                             values: wp.array(dtype=block_type)):
            # one thread per block row: adds value to its diagonal entry when stored
            r = wp.tid()
            for k in range(offsets[r], offsets[r + 1]):
                if columns[k] == r:
                    values[k] = values[k] + value

    else:
        bs = block_type._shape_[0]

        def _add_to_diagonal(offsets: wp.array(dtype=int), columns: wp.array(dtype=int), nrow: int, value: scalar,
                             values: wp.array(dtype=block_type)):
            # one thread per block row: adds value * I to its diagonal block when stored
            r = wp.tid()
            for k in range(offsets[r], offsets[r + 1]):
                if columns[k] == r:
                    values[k] = values[k] + wp.identity(n=bs, dtype=scalar) * value

    kernel = wp.kernel(_add_to_diagonal, enable_backward=False, module="unique")
    _diag_kernels[block_type] = kernel
    return kernel


def add_to_diagonal(A: wps.BsrMatrix, value: float) -> None:
    """Add ``value`` (``value * I`` for square blocks) to every stored diagonal block of ``A``, in place.

    Args:
        A: square BSR matrix of ``k x k`` (or scalar) blocks, float32/float64; rows without a stored diagonal block
            are left as they are.
        value: the amount added to each diagonal coefficient.
    """
    wp.launch(
        _diag_add_kernel(A.values.dtype),
        dim=A.nrow,
        inputs=[A.offsets, A.columns, A.nrow, A.scalar_type(value), A.values],
        device=A.device,
    )


def check_finite_variables(x: wp.array, what: str) -> None:
    """Raise ``ValueError`` when ``x`` holds NaN or inf, naming ``what`` and the first bad variable.

    One reduction on the device (``x . x`` is finite exactly when every entry is, short of overflow past the dtype's
    largest number) and a host read of its result; the host copy of ``x`` is made only to word the error.
    """
    if math.isfinite(dot(x, x)):
        return
    values = x.numpy().reshape(x.shape[0], -1)
    bad = np.flatnonzero(~np.isfinite(values).all(axis=1))
    if bad.size == 0:  # finite but too large to square in this dtype
        raise ValueError(f"{what}: values too large for {x.dtype.__name__} (their squares overflow): max |x| = "
                         f"{np.abs(values).max():.3g}")
    raise ValueError(
        f"{what}: expected finite values, got NaN or inf at {bad.size} variable{'s' if bad.size > 1 else ''}, first "
        f"x[{int(bad[0])}] = {values[bad[0]].tolist() if values.shape[1] > 1 else float(values[bad[0], 0])}"
    )


@wp.kernel(enable_backward=False, module="unique")
def _mark_if_different(a: wp.array(dtype=Any), b: wp.array(dtype=Any), flag: wp.array(dtype=wp.float64), slot: int):
    i = wp.tid()
    if a[i] != b[i]:  # NaN differs from everything, itself included
        flag[slot] = wp.float64(0.0)


def scalar_view(a: wp.array) -> wp.array:
    """The scalar components of a contiguous block vector ``a`` (shape ``[n]``, dtype a float scalar or
    ``vec{k}{f|d}``) as a flat array of its scalar type that shares ``a``'s memory (shape ``[n * k]``)."""
    scalar = _scalar_of(a)
    if scalar == a.dtype:
        return a
    if not a.is_contiguous:
        raise ValueError(f"scalar_view: expected a contiguous array, got strides {a.strides}")
    return wp.array(ptr=a.ptr, dtype=scalar, shape=(a.shape[0] * a.dtype._length_,), device=a.device, copy=False)


def mark_if_different(a: wp.array, b: wp.array, flag: wp.array, slot: int = 0) -> None:
    """Queue ``flag[slot] = 0`` (float64) where ``a`` and ``b`` differ in any scalar component (NaN counts as
    different); ``flag[slot]`` is left as it was when they are equal bit for bit (up to the sign of zero).

    Args:
        a, b: block vectors of the same shape, dtype and device, as :func:`scalar_view` takes them.
        flag: float64 device array holding index ``slot``.
    """
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"mark_if_different: expected arrays of one shape and dtype, got {a.shape} {a.dtype} and "
                         f"{b.shape} {b.dtype}")
    fa, fb = scalar_view(a), scalar_view(b)
    wp.launch(_mark_if_different, dim=fa.shape[0], inputs=[fa, fb, flag, int(slot)], device=a.device)

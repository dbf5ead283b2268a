"""Conversions of assembled matrices to SciPy and CuPy."""

from __future__ import annotations

import numpy as np
import warp as wp

__all__ = ["to_scipy", "to_cupy"]


def _block_shape(A) -> tuple[int, int]:
    shape = getattr(A.values.dtype, "_shape_", None)
    return (1, 1) if shape is None else (int(shape[0]), int(shape[1]))


def to_scipy(A):
    """Copy a ``warp.sparse.BsrMatrix`` to a ``scipy.sparse.csr_matrix`` (float dtype of A).

    Args:
        A: BSR matrix with ``nrow x ncol`` blocks of ``r x c`` (scalar blocks allowed), any device.

    Returns:
        ``scipy.sparse.csr_matrix`` of shape ``(nrow * r, ncol * c)``.
    """
    import scipy.sparse as sp

    if not hasattr(A, "offsets") or not hasattr(A, "values"):
        raise TypeError(f"to_scipy expects a warp.sparse.BsrMatrix, got {type(A).__name__}")
    r, c = _block_shape(A)
    nnz = int(A.nnz_sync())  # the host-side nnz may be an upper bound (a rebuilt interaction pattern)
    offsets = A.offsets.numpy()[: A.nrow + 1]
    columns = A.columns.numpy()[:nnz]
    values = A.values.numpy()[:nnz].reshape(nnz, r, c)
    shape = (A.nrow * r, A.ncol * c)
    if (r, c) == (1, 1):
        return sp.csr_matrix((values.reshape(nnz), columns, offsets), shape=shape)
    return sp.bsr_matrix((values, columns, offsets), shape=shape).tocsr()


def to_cupy(A):
    """Convert a ``warp.sparse.BsrMatrix`` on a CUDA device to ``cupyx.scipy.sparse.csr_matrix``.

    The scalar CSR is expanded on the device (``warp.sparse.bsr_copy`` to 1 x 1 blocks) and handed
    to CuPy without a host copy.

    Raises:
        ImportError: when CuPy is not installed.
        ValueError: when A is not on a CUDA device.
    """
    try:
        import cupy as cp
        import cupyx.scipy.sparse as csp
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError('to_cupy needs CuPy: pip install "warp-meshad[cudss]" (CuPy for CUDA 13: cupy-cuda13x)') from exc
    if not A.values.device.is_cuda:
        raise ValueError(f"to_cupy needs a matrix on a CUDA device, got one on {A.values.device}")
    import warp.sparse as wps

    r, c = _block_shape(A)
    S = A if (r, c) == (1, 1) else wps.bsr_copy(A, block_shape=(1, 1))
    nnz = int(S.nnz)
    with cp.cuda.Device(A.values.device.ordinal):
        data = cp.asarray(S.values)[:nnz].copy()
        indices = cp.asarray(S.columns)[:nnz].copy()
        indptr = cp.asarray(S.offsets)[: S.nrow + 1].copy()
        return csp.csr_matrix((data, indices, indptr), shape=(S.nrow, S.ncol))

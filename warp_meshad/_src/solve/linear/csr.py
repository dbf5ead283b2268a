"""The scalar CSR copy of a BSR matrix, as the factorizing back-ends (SciPy, QDLDL, CuPy, cuDSS) take it.

Three Warp kernels write the CSR pattern (``indptr``, ``indices``) and values of a compact
:class:`warp.sparse.BsrMatrix` at closed-form positions, and :class:`_CsrBuffers` keeps them in preallocated buffers
on the matrix's device: the pattern written once per sparsity pattern, the values refilled in place (same address,
which the CuPy and cuDSS views rely on). :func:`block_row_of` (the block row of a stored block) is shared with the
Dirichlet kernels of :mod:`warp_meshad._src.solve.constraints`.

Not here: when a pattern counts as new (``_pattern_key`` in ``base.py``) and any solving (the back-ends).
"""

from __future__ import annotations

from typing import Any

import warp as wp
import warp.sparse as wps

from warp_meshad._src.solve.linear.base import _block_dim

__all__ = ["block_row_of"]

# ----------------------------------------------------------------------------------------------------------------------
# Private kernels: BSR -> scalar CSR with a closed-form position for every coefficient (no search, no map array).
# Scalar row (r, i) of block row r starts at bs*bs*offsets[r] + i*bs*len(r); block t of the row puts its (i, j)
# coefficient at that start + t*bs + j.
# ----------------------------------------------------------------------------------------------------------------------


@wp.func
def block_row_of(offsets: wp.array(dtype=int), nrow: int, k: int):
    # block row r of the stored block k of a BSR matrix: binary search for offsets[r] <= k < offsets[r + 1]
    # (shared with the Dirichlet kernels of constraints.py, which also run one thread per stored block)
    lo = int(0)
    hi = nrow
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if offsets[mid] <= k:
            lo = mid
        else:
            hi = mid
    return lo


@wp.kernel(enable_backward=False)
def _csr_indptr_from_bsr(offsets: wp.array(dtype=int), bs: int, nrow: int, indptr: wp.array(dtype=int)):
    # one thread per block row: writes the start of its bs scalar rows (and the end for the last row)
    r = wp.tid()
    beg = offsets[r]
    length = offsets[r + 1] - beg
    for i in range(bs):
        indptr[r * bs + i] = bs * bs * beg + i * bs * length
    if r == nrow - 1:
        indptr[nrow * bs] = bs * bs * offsets[nrow]


@wp.kernel(enable_backward=False)
def _csr_indices_from_bsr(
    offsets: wp.array(dtype=int),
    columns: wp.array(dtype=int),
    bs: int,
    nrow: int,
    indices: wp.array(dtype=int),
):
    # one thread per stored block: writes the scalar column index of its bs*bs coefficients
    k = wp.tid()
    if k >= offsets[nrow]:
        return
    r = block_row_of(offsets, nrow, k)
    beg = offsets[r]
    length = offsets[r + 1] - beg
    base = bs * bs * beg + (k - beg) * bs
    c = columns[k]
    for i in range(bs):
        for j in range(bs):
            indices[base + i * bs * length + j] = c * bs + j


@wp.kernel(enable_backward=False)
def _csr_values_from_bsr(
    offsets: wp.array(dtype=int),
    nrow: int,
    block_values: wp.array3d(dtype=Any),
    data: wp.array(dtype=Any),
):
    # one thread per stored block: scatters its bs*bs coefficients into scalar CSR order
    k = wp.tid()
    if k >= offsets[nrow]:
        return
    bs = block_values.shape[1]
    r = block_row_of(offsets, nrow, k)
    beg = offsets[r]
    length = offsets[r + 1] - beg
    base = bs * bs * beg + (k - beg) * bs
    for i in range(bs):
        for j in range(bs):
            data[base + i * bs * length + j] = block_values[k, i, j]


class _CsrBuffers:
    """Scalar CSR copy of a BSR matrix in preallocated Warp buffers on the matrix's device.

    The pattern (``indptr``, ``indices``) is written once per sparsity pattern; :meth:`update_values` refills ``data``
    in place (same address), which is what cuDSS and CuPy views rely on.
    """

    def __init__(self, A: wps.BsrMatrix):
        device = A.device
        self.block_dim = bs = _block_dim(A)
        self.nrow = A.nrow
        self.size = A.nrow * bs
        self.block_nnz = A.nnz_sync() if A.nrow > 0 else 0
        self.nnz = self.block_nnz * bs * bs
        self.indptr = wp.empty(self.size + 1, dtype=wp.int32, device=device)
        self.indices = wp.empty(max(self.nnz, 1), dtype=wp.int32, device=device)
        self.data = wp.zeros(max(self.nnz, 1), dtype=A.scalar_type, device=device)
        if A.nrow > 0:
            wp.launch(_csr_indptr_from_bsr, dim=A.nrow, inputs=[A.offsets, bs, A.nrow, self.indptr], device=device)
        else:
            self.indptr.zero_()
        if self.block_nnz > 0:
            wp.launch(
                _csr_indices_from_bsr,
                dim=self.block_nnz,
                inputs=[A.offsets, A.columns, bs, A.nrow, self.indices],
                device=device,
            )

    def update_values(self, A: wps.BsrMatrix) -> None:
        if self.block_nnz > 0:
            wp.launch(
                _csr_values_from_bsr,
                dim=self.block_nnz,
                inputs=[A.offsets, A.nrow, A.scalar_values, self.data],
                device=A.device,
            )

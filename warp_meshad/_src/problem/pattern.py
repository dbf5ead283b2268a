"""Sparsity patterns known from the topology alone.

The Hessian pattern is the union, over all terms, of every ordered pair of variables that share an
element, plus the diagonal. It is built once on the host with sorted integer keys
(``row * n + col``); every element's target block slot is looked up here, once, so evaluation
never searches a row.
"""

from __future__ import annotations

import numpy as np

__all__ = ["HessianPattern", "JacobianPattern", "build_hessian_pattern", "build_jacobian_pattern"]


class HessianPattern:
    """CSR structure of a symmetric block pattern and the block slots of every term.

    Attributes:
        offsets: (n + 1,) int32 row offsets.
        columns: (nnz,) int32 block columns, sorted within each row.
        slots: per term, (m, valence * valence) int32: the block index of pair (a, b) of element
            e at ``slots[e, a * valence + b]``.
    """

    def __init__(self, offsets, columns, slots):
        self.offsets = offsets
        self.columns = columns
        self.slots = slots

    @property
    def nnz(self) -> int:
        return int(self.columns.shape[0])


def build_hessian_pattern(variable_count: int, element_arrays: list[np.ndarray]) -> HessianPattern:
    """Build the block pattern of ``sum_j S_j^T H_j S_j`` plus the diagonal.

    Args:
        variable_count: number of block rows and columns n.
        element_arrays: per term, an int array (m, valence) of variable indices in [0, n).

    Returns:
        The pattern with per-term slots.
    """
    n = np.int64(variable_count)
    keys = [np.arange(n, dtype=np.int64) * (n + 1)]
    term_keys = []
    for el in element_arrays:
        el = el.astype(np.int64, copy=False)
        v = el.shape[1]
        rows = np.repeat(el, v, axis=1)  # (m, v*v): a-major
        cols = np.tile(el, (1, v))
        k = rows * n + cols
        term_keys.append(k)
        keys.append(k.ravel())
    allkeys = np.unique(np.concatenate(keys))
    rows = allkeys // n
    columns = (allkeys - rows * n).astype(np.int32)
    counts = np.bincount(rows, minlength=int(n))
    offsets = np.zeros(int(n) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    slots = [np.searchsorted(allkeys, k).astype(np.int32) for k in term_keys]
    return HessianPattern(offsets, columns, slots)


class JacobianPattern:
    """CSR structure of a Jacobian with one scalar residual per block row.

    Attributes:
        row_count: total number of scalar residuals.
        offsets: (row_count + 1,) int32.
        columns: (nnz,) int32 sorted within rows.
        row_starts: per term, first residual row of the term.
        slots: per term, (m, residual_dim * valence) int32: the block of residual c of element e
            with respect to its variable a at ``slots[e, c * valence + a]``.
    """

    def __init__(self, row_count, offsets, columns, row_starts, slots):
        self.row_count = row_count
        self.offsets = offsets
        self.columns = columns
        self.row_starts = row_starts
        self.slots = slots

    @property
    def nnz(self) -> int:
        return int(self.columns.shape[0])


def build_jacobian_pattern(variable_count: int, terms: list[tuple[np.ndarray, int]]) -> JacobianPattern:
    """Build the Jacobian pattern for residual terms.

    Args:
        variable_count: number of block columns.
        terms: per term, (elements (m, valence), residual_dim).
    """
    n = np.int64(variable_count)
    keys, term_keys, starts = [], [], []
    row = 0
    for el, rdim in terms:
        el = el.astype(np.int64, copy=False)
        m, v = el.shape
        starts.append(row)
        rows = row + np.arange(m, dtype=np.int64)[:, None] * rdim + np.arange(rdim, dtype=np.int64)[None, :]
        k = (rows[:, :, None] * n + el[:, None, :]).reshape(m, rdim * v)
        term_keys.append(k)
        keys.append(k.ravel())
        row += m * rdim
    allkeys = np.unique(np.concatenate(keys)) if keys else np.zeros(0, dtype=np.int64)
    rows = allkeys // n
    columns = (allkeys - rows * n).astype(np.int32)
    counts = np.bincount(rows, minlength=row)
    offsets = np.zeros(row + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    slots = [np.searchsorted(allkeys, k).astype(np.int32) for k in term_keys]
    return JacobianPattern(row, offsets, columns, starts, slots)

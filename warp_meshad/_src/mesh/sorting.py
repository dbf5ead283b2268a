"""Runs of equal keys after a sort: how TriMesh groups half-edges into edges and TetMesh groups tet faces."""

from __future__ import annotations

import numpy as np

__all__ = ["sorted_groups"]


def sorted_groups(sorted_keys: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Runs of equal keys after a sort: ``sorted_keys`` (1D, or 2D rows compared whole) is ``keys[order]``.

    Returns:
        ``(starts, counts, group)``: where each run starts in the sorted order and how long it is, and the run
        (0, 1, ... in sorted order) of each unsorted key, all int64.
    """
    is_start = np.empty(sorted_keys.shape[0], dtype=bool)
    is_start[0] = True
    if sorted_keys.ndim == 1:
        np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=is_start[1:])
    else:
        np.any(sorted_keys[1:] != sorted_keys[:-1], axis=1, out=is_start[1:])
    starts = np.flatnonzero(is_start)
    counts = np.diff(np.append(starts, is_start.size))
    group = np.empty(order.size, dtype=np.int64)
    group[order] = np.cumsum(is_start) - 1
    return starts, counts, group

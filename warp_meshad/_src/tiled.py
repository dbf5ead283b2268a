"""Patch plan of the tiled Hessian assembly.

The block rows of the Hessian are cut into patches of consecutive rows whose blocks fit a
shared-memory tile (at most ``cap`` blocks). A patch's blocks are one contiguous range of the BSR
values (rows are stored in order), so a thread block can accumulate them in shared memory and
write them out with coalesced stores. Every element is listed in each patch that owns one of its
rows; the kernels (``kernelgen.kernel_source(..., tiled=True)``) keep only the blocks of owned rows.

How many elements a patch shares with others depends on how the variables are numbered: a
spatially coherent order (:func:`warp_meshad.locality_order`) keeps patches compact, so fewer
elements are evaluated twice.
"""

from __future__ import annotations

import numpy as np
import warp as wp

__all__ = ["TilePlan", "build_tile_plan", "tile_capacity", "TILE_BLOCK_DIM"]

TILE_BLOCK_DIM = 256
_SHARED_BYTES = 36 * 1024  # shared memory per thread block used by the tile


def tile_capacity(block_type) -> int:
    """Blocks per patch tile for one block type (``_SHARED_BYTES`` of shared memory)."""
    return max(16, _SHARED_BYTES // wp.types.type_size_in_bytes(block_type))


class TilePlan:
    """Patches of a Hessian pattern and, per term, the elements each patch evaluates.

    Attributes:
        cap: blocks per tile.
        patch_count: number of patches (thread blocks per launch).
        block_start: (patch_count + 1,) int32 device array: first BSR block of each patch.
        entries / entry_start: per term, device arrays: the element indices of patch p are
            ``entries[entry_start[p]:entry_start[p + 1]]``.
        evaluations: per term, number of element evaluations (elements times patches touched).
    """

    def __init__(self, cap, block_start, entries, entry_start, evaluations, device):
        self.cap = cap
        self.patch_count = int(block_start.shape[0] - 1)
        self.block_start = wp.array(block_start, dtype=wp.int32, device=device)
        self.entries = [wp.array(e, dtype=wp.int32, device=device) for e in entries]
        self.entry_start = [wp.array(s, dtype=wp.int32, device=device) for s in entry_start]
        self.evaluations = evaluations


def _row_patches(offsets: np.ndarray, cap: int) -> np.ndarray | None:
    """Greedy cut of rows into runs of at most ``cap`` blocks; None when one row alone is larger."""
    counts = np.diff(offsets)
    if counts.size == 0 or counts.max() > cap:
        return None
    bounds = [0]
    n = counts.size
    # cut where the running block count passes a multiple of the capacity: vectorized greedy
    while bounds[-1] < n:
        start = bounds[-1]
        limit = offsets[start] + cap
        end = int(np.searchsorted(offsets, limit, side="right")) - 1  # last row boundary <= limit
        bounds.append(min(max(end, start + 1), n))
    return np.asarray(bounds, dtype=np.int64)


def build_tile_plan(offsets: np.ndarray, element_arrays: list[np.ndarray], block_type, device) -> TilePlan | None:
    """Plan the tiled assembly of a pattern.

    Args:
        offsets: (n + 1,) row offsets of the BSR pattern.
        element_arrays: per term, (m, valence) int variable indices.
        block_type: the Hessian's block dtype (sets the tile capacity).
        device: where the plan's arrays live.

    Returns:
        The plan, or None when a single row has more blocks than a tile holds.
    """
    cap = tile_capacity(block_type)
    offsets = np.asarray(offsets, dtype=np.int64)
    bounds = _row_patches(offsets, cap)
    if bounds is None:
        return None
    n = offsets.size - 1
    patch_of = np.repeat(np.arange(bounds.size - 1, dtype=np.int64), np.diff(bounds))
    entries, starts, evals = [], [], []
    for el in element_arrays:
        m, v = el.shape
        pe = np.sort(patch_of[el.astype(np.int64, copy=False)], axis=1) if m else np.zeros((0, v), np.int64)
        keep = np.ones_like(pe, dtype=bool)
        keep[:, 1:] = pe[:, 1:] != pe[:, :-1]
        patches = pe[keep]
        elems = np.broadcast_to(np.arange(m, dtype=np.int64)[:, None], pe.shape)[keep]
        order = np.lexsort((elems, patches))
        entries.append(elems[order].astype(np.int32))
        counts = np.bincount(patches, minlength=bounds.size - 1)
        st = np.zeros(bounds.size, dtype=np.int32)
        np.cumsum(counts, out=st[1:])
        starts.append(st)
        evals.append(int(patches.size))
    block_start = offsets[bounds].astype(np.int32)
    assert block_start[-1] == offsets[n]
    return TilePlan(cap, block_start, entries, starts, evals, device)

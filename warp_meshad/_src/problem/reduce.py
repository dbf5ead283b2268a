"""Fixed-order sums for the deterministic evaluation mode.

Elements write their contributions to buffers (no float atomics); these kernels then add each
target's contributions in one fixed order, so results are bitwise identical run to run.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import warp as wp

__all__ = ["ContributionLists", "contribution_lists", "gather_sum", "ordered_total", "partial_count"]

_BLOCK = 256
_MAX_BLOCKS = 1024


@wp.kernel(enable_backward=False)
def _gather_sum(
    offsets: wp.array(dtype=wp.int32),
    items: wp.array(dtype=wp.int32),
    src: wp.array(dtype=Any),
    dst: wp.array(dtype=Any),
):
    # one thread per target: its contributions, in the precomputed order
    i = wp.tid()
    s = offsets[i]
    t = offsets[i + 1]
    if s < t:
        acc = src[items[s]]
        for j in range(s + 1, t):
            acc = acc + src[items[j]]
        dst[i] = acc


@wp.kernel(enable_backward=False)
def _block_sum(src: wp.array(dtype=Any), count: int, partial: wp.array(dtype=Any)):
    # one block per partial sum: each thread strides over the input (coalesced), then a tile tree sum
    b, lane = wp.tid()
    bd = wp.block_dim()
    stride = partial.shape[0] * bd
    i = b * bd + lane
    acc = src.dtype(0.0)
    while i < count:
        acc += src[i]
        i += stride
    s = wp.tile_sum(wp.tile(acc))
    wp.tile_store(partial, s, offset=b)


class ContributionLists:
    """CSR lists: target i sums ``src[items[offsets[i]:offsets[i + 1]]]``."""

    def __init__(self, offsets, items):
        self.offsets = offsets
        self.items = items


def contribution_lists(targets: np.ndarray, target_count: int, device) -> ContributionLists:
    """Group contribution indices by target, in increasing contribution index.

    Args:
        targets: (c,) int array: the target of contribution j.
        target_count: number of targets.
    """
    order = np.argsort(targets, kind="stable").astype(np.int32)
    counts = np.bincount(targets, minlength=target_count)
    offsets = np.zeros(target_count + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return ContributionLists(wp.array(offsets, dtype=wp.int32, device=device), wp.array(order, dtype=wp.int32, device=device))


def gather_sum(lists: ContributionLists, src, dst, device):
    """dst[i] = ordered sum of src over target i's contributions (dst must be zeroed for empty ones)."""
    wp.launch(_gather_sum, dim=dst.shape[0], inputs=[lists.offsets, lists.items, src, dst], device=device)


def partial_count(count: int, device) -> int:
    """Number of partial sums :func:`ordered_total` uses for ``count`` entries."""
    if not wp.get_device(device).is_cuda:
        return 1
    return max(1, min(_MAX_BLOCKS, (count + _BLOCK - 1) // _BLOCK))


def ordered_total(src, count: int, partial, out, device):
    """out[0] = sum of src[:count], in an order fixed by ``partial``'s length (deterministic).

    Args:
        partial: scratch array of :func:`partial_count` entries, src's dtype.
    """
    device = wp.get_device(device)
    block = _BLOCK if device.is_cuda else 1  # CPU blocks run lane 0 only (see WARP_NOTES)
    wp.launch_tiled(_block_sum, dim=[partial.shape[0]], inputs=[src, count, partial], block_dim=block, device=device)
    wp.launch_tiled(_block_sum, dim=[1], inputs=[partial, partial.shape[0], out], block_dim=block, device=device)

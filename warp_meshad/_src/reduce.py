"""Fixed-order sums for the deterministic evaluation mode.

Elements write their contributions to buffers (no float atomics); these kernels then add each
target's contributions in one fixed order, so results are bitwise identical run to run.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import warp as wp

__all__ = ["ContributionLists", "contribution_lists", "gather_sum", "ordered_total"]

_CHUNK = 256


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
def _chunk_sum(src: wp.array(dtype=Any), count: int, chunk: int, partial: wp.array(dtype=Any)):
    # one thread per chunk of consecutive entries, summed left to right
    c = wp.tid()
    s = c * chunk
    t = wp.min(s + chunk, count)
    acc = src[s]
    for j in range(s + 1, t):
        acc = acc + src[j]
    partial[c] = acc


@wp.kernel(enable_backward=False)
def _serial_sum(partial: wp.array(dtype=Any), count: int, out: wp.array(dtype=Any)):
    # a single thread adds the chunk sums in order
    acc = partial[0]
    for j in range(1, count):
        acc = acc + partial[j]
    out[0] = acc


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


def ordered_total(src, count: int, partial, out, device):
    """out[0] = sum of src[:count] in a fixed order (chunks of 256, then the chunk sums)."""
    chunks = (count + _CHUNK - 1) // _CHUNK
    wp.launch(_chunk_sum, dim=chunks, inputs=[src, count, _CHUNK, partial], device=device)
    wp.launch(_serial_sum, dim=1, inputs=[partial, chunks, out], device=device)

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

__all__ = ["TilePlan", "build_tile_plan", "det_tile_capacity", "min_blocks", "tile_capacity", "TILE_BLOCK_DIM"]

TILE_BLOCK_DIM = 256
_SHARED_BYTES = 36 * 1024  # shared memory per thread block used by the tile
TILE_STORE = "number"  # write-out of d x d blocks: a thread per number ("number") or per block ("block")
TILE_MIN_BLOCKS = 4  # > 0: thread blocks per SM asked of the CUDA compiler (caps registers), see min_blocks()
# (the knobs above are swept by benchmarks/tile_sweep.py; the defaults are its fastest measured setting: H200,
# mass-spring 1000x1000, float32: 0.436 ms with 4 blocks per SM, 0.520 ms without, 0.646 ms storing by block)
_MIN_BLOCKS_MAX_HESSIAN_BYTES = 36 * 4  # see min_blocks()


def tile_capacity(block_type) -> int:
    """Blocks per patch tile for one block type (``_SHARED_BYTES`` of shared memory)."""
    return max(16, _SHARED_BYTES // wp.types.type_size_in_bytes(block_type))


def det_tile_capacity(block_type, var_type, blocks_per_row: float) -> tuple[int, int]:
    """(blocks, rows) per patch of the deterministic variant, which sums the patch's gradient in a
    second shared tile of one entry per row.

    The ``_SHARED_BYTES`` are split between the two tiles for rows of ``blocks_per_row`` blocks (the
    pattern's mean): a patch is cut when either tile is full. (Sizing the gradient tile like the
    block tile, one entry per block, left room for 768 instead of 977 3x3 float32 blocks per patch,
    33% more patches for mass-spring.)
    """
    bb = wp.types.type_size_in_bytes(block_type)
    vb = wp.types.type_size_in_bytes(var_type)
    rows = max(1, int(_SHARED_BYTES // (bb * max(float(blocks_per_row), 1.0) + vb)))
    return max(16, (_SHARED_BYTES - vb * rows) // bb), rows


def min_blocks(k: int, scalar_type, projected: bool = False) -> int:
    """Thread blocks per SM asked of the compiler for a tiled kernel of an element with ``k`` variables.

    :data:`TILE_MIN_BLOCKS` where an element's dual Hessian (``k * k`` numbers) fits in 36 registers
    (float32 and k <= 6, as mass-spring, measured): there the cap (64 registers for 4 blocks of 256
    threads) costs a few spilled bytes (44 per thread for mass-spring) and raises occupancy from 3 to
    4 blocks per SM. Larger elements would spill most of their Hessian under that cap, and so would a
    ``projected`` kernel (the eigen-decomposition: 126 registers, 780 bytes spilled under the cap for
    mass-spring): they get no cap (0).
    """
    if projected or k * k * wp.types.type_size_in_bytes(scalar_type) > _MIN_BLOCKS_MAX_HESSIAN_BYTES:
        return 0
    return int(TILE_MIN_BLOCKS)


class TilePlan:
    """Patches of a Hessian pattern and, per term, the elements each patch evaluates.

    Attributes:
        cap: blocks per tile.
        row_cap: rows per patch (the gradient tile of the deterministic variant), 0 otherwise.
        patch_count: number of patches (thread blocks per launch).
        block_start: (patch_count + 1,) int32 device array: first BSR block of each patch.
        entries / entry_start: per term, device arrays: the element indices of patch p are
            ``entries[entry_start[p]:entry_start[p + 1]]``.
        evaluations: per term, number of element evaluations (elements times patches touched).
    """

    def __init__(self, cap, block_start, entries, entry_start, evaluations, device, row_start=None, rounds=None,
                 row_cap=0):  # fmt: skip
        self.cap = cap
        self.row_cap = row_cap
        self.patch_count = int(block_start.shape[0] - 1)
        self.block_start = wp.array(block_start, dtype=wp.int32, device=device)
        self.entries = [wp.array(e, dtype=wp.int32, device=device) for e in entries]
        self.entry_start = [wp.array(s, dtype=wp.int32, device=device) for s in entry_start]
        self.evaluations = evaluations
        self.deterministic = rounds is not None
        if self.deterministic:
            self.row_start = wp.array(row_start, dtype=wp.int32, device=device)
            self.round_start = [wp.array(r, dtype=wp.int32, device=device) for r, _ in rounds]
            self.patch_round_start = [wp.array(pr, dtype=wp.int32, device=device) for _, pr in rounds]
            self.round_count = [int(r.shape[0] - 1) for r, _ in rounds]


def _row_patches(offsets: np.ndarray, cap: int, row_cap: int = 0) -> np.ndarray | None:
    """Greedy cut of rows into runs of at most ``cap`` blocks (and ``row_cap`` rows, where > 0); None when
    one row alone is larger."""
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
        if row_cap > 0:
            end = min(end, start + row_cap)
        bounds.append(min(max(end, start + 1), n))
    return np.asarray(bounds, dtype=np.int64)


def _rank_layers(q_idx: np.ndarray, group: np.ndarray, q_count: int, key: np.ndarray | None) -> np.ndarray:
    """Each entry's largest rank within its groups, members ranked by ``key`` (per entry), then entry."""
    layer = np.zeros(q_count, dtype=np.int64)
    order = np.lexsort((q_idx, group) if key is None else (q_idx, key[q_idx], group))
    g_sorted = group[order]
    first = np.r_[True, g_sorted[1:] != g_sorted[:-1]]
    run_start = np.maximum.accumulate(np.where(first, np.arange(g_sorted.size), 0))
    np.maximum.at(layer, q_idx[order], np.arange(g_sorted.size) - run_start)
    return layer


def _separate(q_idx: np.ndarray, group: np.ndarray, layer: np.ndarray) -> np.ndarray:
    """Bump entries to later layers until no two entries of one layer share a group."""
    layer = layer.copy()
    for _ in range(10000):
        lay = layer[q_idx]
        order = np.lexsort((q_idx, lay, group))
        g, l, q = group[order], lay[order], q_idx[order]
        clash = np.r_[False, (g[1:] == g[:-1]) & (l[1:] == l[:-1])]
        if not clash.any():
            return layer
        layer[np.unique(q[clash])] += 1
    raise RuntimeError("tiled assembly: could not separate the element rounds")  # pragma: no cover


def _patch_rounds(patches: np.ndarray, layer: np.ndarray, patch_count: int, block_dim: int) -> np.ndarray:
    """Rounds each patch takes: per layer, its entries in runs of at most ``block_dim``."""
    width = int(layer.max()) + 1 if layer.size else 1
    counts = np.bincount(patches * width + layer, minlength=patch_count * width).reshape(patch_count, width)
    return ((counts + block_dim - 1) // block_dim).sum(axis=1)


def _layers(
    entries: np.ndarray,
    patches: np.ndarray,
    slots: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    elements: np.ndarray,
    block_dim: int,
) -> np.ndarray:
    """Layer of each entry such that entries of one patch and one layer never add to the same tile entry
    in the same call (the same pair position ``a, b`` and the same block slot; the gradient of variable
    ``a`` goes with the diagonal slot ``a, a``).

    This colours a conflict graph. Three starts are separated (:func:`_separate`) and each patch keeps
    the one that takes it the fewest rounds (groups never span patches): ranks in element order; ranks
    in the order of the elements' shapes (their variables relative to the first); and, where there are
    few shapes, the shape itself. Two elements of one shape that share a variable at the same position
    are the same element, so on a structured mesh the shapes colour the graph with as many layers as a
    variable has elements at one position (mass-spring grid: 3, where ranks in element order take 4).
    """
    q_count = entries.shape[0]
    if q_count == 0:
        return np.zeros(0, dtype=np.int64)
    s = slots[entries].astype(np.int64)  # (q, v*v) global block slots
    owned = (s >= lo[patches][:, None]) & (s < hi[patches][:, None])
    q_idx, pos = np.nonzero(owned)
    group = pos.astype(np.int64) * (int(s.max()) + 1) + s[q_idx, pos]
    el = np.asarray(elements, dtype=np.int64)
    shape_id = np.zeros(el.shape[0], dtype=np.int64)
    if el.shape[1] > 1:
        _, inv = np.unique(el[:, 1:] - el[:, :1], axis=0, return_inverse=True)
        shape_id = inv.reshape(-1).astype(np.int64)
    shape = shape_id[entries]
    starts = [_rank_layers(q_idx, group, q_count, None), _rank_layers(q_idx, group, q_count, shape)]
    if shape_id.size and shape_id.max() < 64:
        starts.append(shape)
    patch_count = int(patches.max()) + 1
    best = best_rounds = None
    for start in starts:
        layer = _separate(q_idx, group, start)
        rounds = _patch_rounds(patches, layer, patch_count, block_dim)
        if best is None:
            best, best_rounds = layer, rounds
        else:
            better = rounds < best_rounds
            best = np.where(better[patches], layer, best)
            best_rounds = np.minimum(rounds, best_rounds)
    return best


def build_tile_plan(
    offsets: np.ndarray,
    element_arrays: list[np.ndarray],
    block_type,
    device,
    slot_arrays: list[np.ndarray] | None = None,
    var_type=None,
    block_dim: int | None = None,
) -> TilePlan | None:
    """Plan the tiled assembly of a pattern.

    Args:
        offsets: (n + 1,) row offsets of the BSR pattern.
        element_arrays: per term, (m, valence) int variable indices.
        block_type: the Hessian's block dtype (sets the tile capacity).
        device: where the plan's arrays live.
        slot_arrays: per term, (m, valence * valence) block slots: given, the plan is for the
            deterministic variant: each patch's elements are ordered into rounds of at most
            ``block_dim`` in which no two add to the same tile entry (so plain adds in a fixed order
            replace atomics), and gradients are summed in shared memory too (``var_type``; a patch
            then also has at most ``row_cap`` rows, see :func:`det_tile_capacity`).
        block_dim: threads per block (round size); default :data:`TILE_BLOCK_DIM`.

    Returns:
        The plan, or None when a single row has more blocks than a tile holds.
    """
    deterministic = slot_arrays is not None
    block_dim = block_dim or TILE_BLOCK_DIM
    offsets = np.asarray(offsets, dtype=np.int64)
    row_cap = 0
    if deterministic:
        cap, row_cap = det_tile_capacity(block_type, var_type, offsets[-1] / max(offsets.size - 1, 1))
    else:
        cap = tile_capacity(block_type)
    bounds = _row_patches(offsets, cap, row_cap)
    if bounds is None:
        return None
    terms = _plan_terms(offsets, bounds, element_arrays, slot_arrays, block_dim)
    if deterministic and terms["density"] > 0:
        # a layer larger than a round takes a second, nearly empty one: where the densest layer outgrows
        # block_dim, patches of fewer rows may take fewer rounds in all (mass-spring grid, 3x3 float32:
        # 3 rounds per patch of 128 rows instead of 5 per patch of 139); keep whichever plan has fewer
        fewer = int(block_dim / terms["density"])
        if 0 < fewer < row_cap:
            bounds2 = _row_patches(offsets, cap, fewer)
            terms2 = _plan_terms(offsets, bounds2, element_arrays, slot_arrays, block_dim)
            if terms2["round_total"] < terms["round_total"]:
                bounds, terms, row_cap = bounds2, terms2, fewer
    n = offsets.size - 1
    block_start = offsets[bounds].astype(np.int32)
    assert block_start[-1] == offsets[n]
    return TilePlan(
        cap, block_start, terms["entries"], terms["starts"], terms["evals"], device, bounds.astype(np.int32),
        terms["rounds"] if deterministic else None, row_cap,
    )  # fmt: skip


def _plan_terms(offsets, bounds, element_arrays, slot_arrays, block_dim) -> dict:
    """Per term, the elements of each patch (and, deterministic, their rounds) for patches ``bounds``.

    Returns a dict with the lists ``entries``, ``starts``, ``evals``, ``rounds`` (see :class:`TilePlan`),
    ``round_total`` (rounds of all patches and terms) and ``density`` (one layer's elements per row of its
    patch: the 90th percentile over patches of each patch's densest layer, the largest over terms; 0
    without rounds).
    """
    deterministic = slot_arrays is not None
    patch_count = bounds.size - 1
    rows = np.diff(bounds)
    patch_of = np.repeat(np.arange(patch_count, dtype=np.int64), rows)
    out = dict(entries=[], starts=[], evals=[], rounds=[], round_total=0, density=0.0)
    lo, hi = offsets[bounds[:-1]], offsets[bounds[1:]]
    for t, el in enumerate(element_arrays):
        m, v = el.shape
        pe = np.sort(patch_of[el.astype(np.int64, copy=False)], axis=1) if m else np.zeros((0, v), np.int64)
        keep = np.ones_like(pe, dtype=bool)
        keep[:, 1:] = pe[:, 1:] != pe[:, :-1]
        patches = pe[keep]
        elems = np.broadcast_to(np.arange(m, dtype=np.int64)[:, None], pe.shape)[keep]
        if deterministic:
            layer = _layers(elems, patches, slot_arrays[t], lo, hi, el, block_dim)
            order = np.lexsort((elems, layer, patches))
            patches, layer, elems = patches[order], layer[order], elems[order]
            # rounds: runs of one (patch, layer), cut every block_dim entries
            run = np.r_[True, (patches[1:] != patches[:-1]) | (layer[1:] != layer[:-1])] if elems.size else np.zeros(0, bool)
            run_start = np.maximum.accumulate(np.where(run, np.arange(elems.size), 0)) if elems.size else run
            cut = run | ((np.arange(elems.size) - run_start) % block_dim == 0)
            r_start = np.r_[np.flatnonzero(cut), elems.size].astype(np.int32)
            r_patch = patches[r_start[:-1]]
            pr = np.zeros(bounds.size, dtype=np.int32)
            np.cumsum(np.bincount(r_patch, minlength=patch_count), out=pr[1:])
            out["rounds"].append((r_start, pr))
            out["round_total"] += int(r_start.size - 1)
            if elems.size:
                run_len = np.diff(np.r_[np.flatnonzero(run), elems.size])
                dense = np.zeros(patch_count)
                np.maximum.at(dense, patches[run], run_len / rows[patches[run]])
                out["density"] = max(out["density"], float(np.percentile(dense, 90)))
        else:
            order = np.lexsort((elems, patches))
            patches, elems = patches[order], elems[order]
        out["entries"].append(elems.astype(np.int32))
        counts = np.bincount(patches, minlength=patch_count)
        st = np.zeros(bounds.size, dtype=np.int32)
        np.cumsum(counts, out=st[1:])
        out["starts"].append(st)
        out["evals"].append(int(patches.size))
    return out

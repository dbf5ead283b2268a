"""The numpy build of the tiled assembly's patch lists and rounds: the reference the device build
(``warp_meshad._src.problem.tiled``) is checked against (same patches, same listed elements; rounds as few).

This is the host algorithm the device build replaced (it took 15.9 s at 1000x1000 mass-spring); see the
comment above ``_rows_to_patches`` in ``warp_meshad/_src/problem/tiled.py`` for what the rounds must satisfy.
"""

from __future__ import annotations

import numpy as np

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


def plan_terms(offsets, bounds, element_arrays, slot_arrays, block_dim) -> dict:
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

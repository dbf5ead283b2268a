"""Patch plan of the tiled Hessian assembly, and its knobs (:class:`TileConfig`).

The block rows of the Hessian are cut into patches of consecutive rows whose blocks fit a
shared-memory tile (at most ``cap`` blocks). A patch's blocks are one contiguous range of the BSR
values (rows are stored in order), so a thread block can accumulate them in shared memory and
write them out with coalesced stores. Every element is listed in each patch that owns one of its
rows; the kernels (``codegen.kernel_source.kernel_source(..., tiled=True)``) keep only the blocks of owned rows.

How many elements a patch shares with others depends on how the variables are numbered: a
spatially coherent order (:func:`warp_meshad.locality_order`) keeps patches compact, so fewer
elements are evaluated twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import warp as wp

__all__ = ["TileConfig", "TilePlan", "build_tile_plan", "det_tile_capacity", "min_blocks", "tile_capacity"]

_MIN_BLOCKS_MAX_HESSIAN_BYTES = 36 * 4  # see min_blocks()


@dataclass(frozen=True)
class TileConfig:
    """The knobs of the tiled Hessian assembly (a Problem's ``tile_config``; part of its kernels' cache key).

    The defaults are the fastest setting ``benchmarks/tile_sweep.py`` measured (H200, mass-spring 1000x1000,
    float32: 0.436 ms with 4 blocks per SM, 0.520 ms without, 0.646 ms storing by block).

    Attributes:
        block_dim: threads per block (and elements per round of the round-ordered variant).
        shared_bytes: shared memory per thread block used by the tile.
        store: write-out of d x d blocks: a thread per number (``"number"``) or per block (``"block"``).
        min_blocks: > 0: thread blocks per SM asked of the CUDA compiler (caps registers), see :func:`min_blocks`.
    """

    block_dim: int = 256
    shared_bytes: int = 36 * 1024
    store: str = "number"
    min_blocks: int = 4

    def __post_init__(self):
        if self.store not in ("number", "block"):
            raise ValueError(f"TileConfig(store=...) must be 'number' or 'block', got {self.store!r}")
        for name in ("block_dim", "shared_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"TileConfig({name}=...) must be a positive int, got {value!r}")
        if not isinstance(self.min_blocks, int) or self.min_blocks < 0:
            raise ValueError(f"TileConfig(min_blocks=...) must be an int >= 0, got {self.min_blocks!r}")


def tile_capacity(block_type, config: TileConfig = TileConfig()) -> int:
    """Blocks per patch tile for one block type (``config.shared_bytes`` of shared memory)."""
    return max(16, config.shared_bytes // wp.types.type_size_in_bytes(block_type))


def det_tile_capacity(block_type, var_type, blocks_per_row: float, config: TileConfig = TileConfig()) -> tuple[int, int]:
    """(blocks, rows) per patch of the deterministic variant, which sums the patch's gradient in a
    second shared tile of one entry per row.

    The ``config.shared_bytes`` are split between the two tiles for rows of ``blocks_per_row`` blocks (the
    pattern's mean): a patch is cut when either tile is full. (Sizing the gradient tile like the
    block tile, one entry per block, left room for 768 instead of 977 3x3 float32 blocks per patch,
    33% more patches for mass-spring.)
    """
    shared = config.shared_bytes
    bb = wp.types.type_size_in_bytes(block_type)
    vb = wp.types.type_size_in_bytes(var_type)
    rows = max(1, int(shared // (bb * max(float(blocks_per_row), 1.0) + vb)))
    return max(16, (shared - vb * rows) // bb), rows


def min_blocks(k: int, scalar_type, projected: bool = False, config: TileConfig = TileConfig()) -> int:
    """Thread blocks per SM asked of the compiler for a tiled kernel of an element with ``k`` variables.

    ``config.min_blocks`` where an element's dual Hessian (``k * k`` numbers) fits in 36 registers
    (float32 and k <= 6, as mass-spring, measured): there the cap (64 registers for 4 blocks of 256
    threads) costs a few spilled bytes (44 per thread for mass-spring) and raises occupancy from 3 to
    4 blocks per SM. Larger elements would spill most of their Hessian under that cap, and so would a
    ``projected`` kernel (the eigen-decomposition: 126 registers, 780 bytes spilled under the cap for
    mass-spring): they get no cap (0).
    """
    if projected or k * k * wp.types.type_size_in_bytes(scalar_type) > _MIN_BLOCKS_MAX_HESSIAN_BYTES:
        return 0
    return int(config.min_blocks)


class TilePlan:
    """Patches of a Hessian pattern and, per term, the elements each patch evaluates (device arrays).

    Attributes:
        cap: blocks per tile.
        row_cap: rows per patch (the gradient tile of the deterministic variant), 0 otherwise.
        patch_count: number of patches (thread blocks per launch).
        block_start: (patch_count + 1,) int32: first BSR block of each patch.
        row_start: (patch_count + 1,) int32: first block row of each patch.
        entries / entry_start: per term, int32 arrays: the element indices of patch p are
            ``entries[entry_start[p]:entry_start[p + 1]]`` (in increasing order; with rounds, ordered by round).
        evaluations: per term, number of element evaluations (elements times patches touched).
        deterministic: whether the plan has rounds (then also ``round_start``, ``patch_round_start`` and
            ``round_count`` per term: round r lists ``entries[round_start[r]:round_start[r + 1]]``, patch p takes
            rounds ``patch_round_start[p]`` to ``patch_round_start[p + 1]``).
    """

    def __init__(self, cap, row_cap, block_start, row_start, entries, entry_start, evaluations, rounds=None):
        self.cap = cap
        self.row_cap = row_cap
        self.patch_count = int(block_start.shape[0] - 1)
        self.block_start = block_start
        self.row_start = row_start
        self.entries = entries
        self.entry_start = entry_start
        self.evaluations = evaluations
        self.deterministic = rounds is not None
        if self.deterministic:
            self.round_start = [r for r, _ in rounds]
            self.patch_round_start = [pr for _, pr in rounds]
            self.round_count = [int(r.shape[0] - 1) for r, _ in rounds]


@wp.kernel(enable_backward=False)
def _patch_ends(offsets: wp.array(dtype=wp.int64), cap: wp.int64, row_cap: int, ends: wp.array(dtype=wp.int32)):
    # where a patch that starts at row r ends: the last row boundary within cap blocks (and row_cap rows), >= r + 1
    r = wp.tid()
    n = offsets.shape[0] - 1
    limit = offsets[r] + cap
    lo = r + 1
    hi = n
    if row_cap > 0:
        hi = wp.min(hi, r + row_cap)
    while lo < hi:  # the largest e in [r + 1, hi] with offsets[e] <= limit (at least r + 1)
        mid = (lo + hi + 1) // 2
        if offsets[mid] <= limit:
            lo = mid
        else:
            hi = mid - 1
    ends[r] = lo


def _row_patches(offsets: np.ndarray, offsets_d: wp.array, cap: int, row_cap: int = 0) -> np.ndarray | None:
    """Greedy cut of rows into runs of at most ``cap`` blocks (and ``row_cap`` rows, where > 0); None when
    one row alone is larger.

    Every row's end, were a patch to start there, is found at once on the device of ``offsets_d`` (the int64
    ``offsets`` there; a binary search per row); the host then follows the chain of ends from row 0 (plain lookups:
    ~2 ms for 8k patches, where a search per patch on the host took 25 ms at 1000x1000 mass-spring).
    """
    counts = np.diff(offsets)
    if counts.size == 0 or counts.max() > cap:
        return None
    n = counts.size
    ends_d = wp.empty(n, dtype=wp.int32, device=offsets_d.device)
    wp.launch(_patch_ends, dim=n, inputs=[offsets_d, wp.int64(cap), int(row_cap), ends_d], device=offsets_d.device)
    ends = ends_d.numpy()
    bounds = [0]
    b = 0
    while b < n:
        b = ends.item(b)
        bounds.append(b)
    return np.asarray(bounds, dtype=np.int64)


# ------------------------------------------------------------------------------------------------
# The plan is built on the plan's device (a GPU for the problems that use it): sorts, scans and one
# thread per element position, so that setting up millions of elements takes milliseconds, not the
# seconds to minutes of a host build (15.9 s at 1000x1000 mass-spring on the H200's host, 70 s at
# 2000x2000). The same kernels run on the CPU.
#
# Rounds (deterministic variant). Two elements of one patch may not be summed in the same round when
# they add to the same tile entry in the same call. The kernels add pair position by pair position, and
# block (a, b) of an element is owned by the patch of row ``el[a]``; so two elements clash exactly when
# they hold the same owned variable u at the same position a (the same (a, a) diagonal block; the
# gradient of u goes with it). Each (position, variable) is a *group*: the rounds colour the entries so
# that the members of a group get distinct layers. Three starts are separated and each patch keeps the
# one that takes it the fewest rounds (groups never span patches): ranks in element order; ranks in the
# order of the elements' shapes (their variables relative to the first); and, where there are few
# shapes, the shape itself. Two elements of one shape that share a variable at the same position are the
# same element, so on a structured mesh the shapes colour the graph with as many layers as a variable
# has elements at one position (mass-spring grid: 3, where ranks in element order take 4). Every step is
# a function of the previous step's arrays only (atomic max and integer counts commute), so the plan,
# and with it the deterministic summation order, is the same on every run.
# ------------------------------------------------------------------------------------------------

_SEPARATE_MAX_SWEEPS = 10000


@wp.kernel(enable_backward=False)
def _rows_to_patches(bounds: wp.array(dtype=wp.int32), patch_of: wp.array(dtype=wp.int32)):
    p = wp.tid()
    for r in range(bounds[p], bounds[p + 1]):
        patch_of[r] = p


@wp.kernel(enable_backward=False)
def _first_in_patch(el: wp.array2d(dtype=wp.int32), patch_of: wp.array(dtype=wp.int32), flags: wp.array(dtype=wp.int32)):
    # 1 where position a is the element's first position in its patch: an element is listed once per patch
    e, a = wp.tid()
    p = patch_of[el[e, a]]
    first = int(1)
    for b in range(a):
        if patch_of[el[e, b]] == p:
            first = 0
    flags[e * el.shape[1] + a] = first


@wp.kernel(enable_backward=False)
def _entry_keys(
    el: wp.array2d(dtype=wp.int32),
    patch_of: wp.array(dtype=wp.int32),
    flags: wp.array(dtype=wp.int32),
    place: wp.array(dtype=wp.int32),
    m: wp.int64,
    keys: wp.array(dtype=wp.int64),
    values: wp.array(dtype=wp.int32),
):
    e, a = wp.tid()
    i = e * el.shape[1] + a
    if flags[i] != 0:
        j = place[i] - 1  # inclusive scan of the flags
        keys[j] = wp.int64(patch_of[el[e, a]]) * m + wp.int64(e)
        values[j] = e


@wp.kernel(enable_backward=False)
def _count_cells(keys: wp.array(dtype=wp.int64), m: wp.int64, layer: wp.array(dtype=wp.int32), layered: int,
                 width: int, counts: wp.array(dtype=wp.int32)):  # fmt: skip
    # entries per (patch, layer) cell; the patch is the key's high part (without layers: width 1)
    q = wp.tid()
    p = wp.int32(keys[q] // m)
    lay = int(0)
    if layered != 0:
        lay = layer[q]
    wp.atomic_add(counts, p * width + lay, 1)


@wp.kernel(enable_backward=False)
def _group_keys(
    el: wp.array2d(dtype=wp.int32),
    patch_of: wp.array(dtype=wp.int32),
    keys: wp.array(dtype=wp.int64),
    entry_count: int,
    m: wp.int64,
    n: wp.int64,
    entry_of: wp.array(dtype=wp.int32),
    gkeys: wp.array(dtype=wp.int64),
    gvalues: wp.array(dtype=wp.int32),
):
    # the entry that owns position a of element e (binary search of its key), and the position's group
    e, a = wp.tid()
    v = el.shape[1]
    i = e * v + a
    u = el[e, a]
    target = wp.int64(patch_of[u]) * m + wp.int64(e)
    lo = int(0)
    hi = entry_count
    while lo < hi:
        mid = (lo + hi) // 2
        if keys[mid] < target:
            lo = mid + 1
        else:
            hi = mid
    entry_of[i] = lo
    gkeys[i] = wp.int64(a) * n + wp.int64(u)
    gvalues[i] = i


@wp.kernel(enable_backward=False)
def _run_starts(flags: wp.array(dtype=wp.int32), run: wp.array(dtype=wp.int32), starts: wp.array(dtype=wp.int32)):
    i = wp.tid()
    if flags[i] != 0:
        starts[run[i] - 1] = i


@wp.kernel(enable_backward=False)
def _shape_keys(el: wp.array2d(dtype=wp.int32), keys: wp.array(dtype=wp.int64), values: wp.array(dtype=wp.int32)):
    # a 62-bit hash of the element's variables relative to its first (a collision costs rounds, not correctness)
    e = wp.tid()
    h = wp.uint64(1469598103934665603)
    for a in range(1, el.shape[1]):
        d = wp.uint64(wp.int64(el[e, a] - el[e, 0]) + wp.int64(4294967296))
        h = (h ^ d) * wp.uint64(1099511628211)
        h = h ^ (h >> wp.uint64(29))
    keys[e] = wp.int64(h >> wp.uint64(2))
    values[e] = e


@wp.kernel(enable_backward=False)
def _scatter_ids(values: wp.array(dtype=wp.int32), run: wp.array(dtype=wp.int32), ids: wp.array(dtype=wp.int32)):
    i = wp.tid()
    ids[values[i]] = run[i] - 1


@wp.kernel(enable_backward=False)
def _rank_in_groups(
    gvalues: wp.array(dtype=wp.int32),
    run: wp.array(dtype=wp.int32),
    gstart: wp.array(dtype=wp.int32),
    entry_of: wp.array(dtype=wp.int32),
    shape: wp.array(dtype=wp.int32),
    by_shape: int,
    v: int,
    layer: wp.array(dtype=wp.int32),
):
    # an entry's start layer: its largest rank within its groups, members ranked by (shape, entry) or entry
    i = wp.tid()
    g = run[i] - 1
    q = entry_of[gvalues[i]]
    s = int(0)
    if by_shape != 0:
        s = shape[gvalues[i] // v]
    rank = int(0)
    for j in range(gstart[g], gstart[g + 1]):
        qj = entry_of[gvalues[j]]
        sj = int(0)
        if by_shape != 0:
            sj = shape[gvalues[j] // v]
        if sj < s or (sj == s and qj < q):
            rank += 1
    wp.atomic_max(layer, q, rank)


@wp.kernel(enable_backward=False)
def _shape_layer(values: wp.array(dtype=wp.int32), shape: wp.array(dtype=wp.int32), layer: wp.array(dtype=wp.int32)):
    q = wp.tid()
    layer[q] = shape[values[q]]


@wp.kernel(enable_backward=False)
def _find_clashes(
    gvalues: wp.array(dtype=wp.int32),
    run: wp.array(dtype=wp.int32),
    gstart: wp.array(dtype=wp.int32),
    entry_of: wp.array(dtype=wp.int32),
    layer: wp.array(dtype=wp.int32),
    bump: wp.array(dtype=wp.int32),
):
    # every member of a group but the first entry of each layer moves on (reads layers, writes bumps only)
    i = wp.tid()
    g = run[i] - 1
    q = entry_of[gvalues[i]]
    lay = layer[q]
    for j in range(gstart[g], gstart[g + 1]):
        qj = entry_of[gvalues[j]]
        if qj < q and layer[qj] == lay:
            bump[q] = 1


@wp.kernel(enable_backward=False)
def _apply_bumps(layer: wp.array(dtype=wp.int32), bump: wp.array(dtype=wp.int32), moved: wp.array(dtype=wp.int32)):
    q = wp.tid()
    if bump[q] != 0:
        layer[q] = layer[q] + 1
        bump[q] = 0
        moved[0] = 1


@wp.kernel(enable_backward=False)
def _max_of(a: wp.array(dtype=wp.int32), out: wp.array(dtype=wp.int32)):
    wp.atomic_max(out, 0, a[wp.tid()])


@wp.kernel(enable_backward=False)
def _rounds_per_patch(counts: wp.array(dtype=wp.int32), width: int, block_dim: int, rounds: wp.array(dtype=wp.int32)):
    p = wp.tid()
    r = int(0)
    for lay in range(width):
        r += (counts[p * width + lay] + block_dim - 1) // block_dim
    rounds[p] = r


@wp.kernel(enable_backward=False)
def _keep_fewer_entries(keys: wp.array(dtype=wp.int64), m: wp.int64, rounds: wp.array(dtype=wp.int32),
                        best_rounds: wp.array(dtype=wp.int32), layer: wp.array(dtype=wp.int32),
                        best: wp.array(dtype=wp.int32)):  # fmt: skip
    q = wp.tid()
    p = wp.int32(keys[q] // m)
    if rounds[p] < best_rounds[p]:
        best[q] = layer[q]


@wp.kernel(enable_backward=False)
def _keep_fewer_patches(rounds: wp.array(dtype=wp.int32), best_rounds: wp.array(dtype=wp.int32)):
    p = wp.tid()
    best_rounds[p] = wp.min(rounds[p], best_rounds[p])


@wp.kernel(enable_backward=False)
def _round_keys(keys: wp.array(dtype=wp.int64), values: wp.array(dtype=wp.int32), m: wp.int64,
                layer: wp.array(dtype=wp.int32), width: wp.int64, out_keys: wp.array(dtype=wp.int64),
                out_values: wp.array(dtype=wp.int32)):  # fmt: skip
    q = wp.tid()
    p = keys[q] // m
    out_keys[q] = (p * width + wp.int64(layer[q])) * m + wp.int64(values[q])
    out_values[q] = values[q]


@wp.kernel(enable_backward=False)
def _cut_rounds(counts: wp.array(dtype=wp.int32), cell_start: wp.array(dtype=wp.int32),
                round_base: wp.array(dtype=wp.int32), block_dim: int, round_start: wp.array(dtype=wp.int32)):  # fmt: skip
    # a (patch, layer) cell's entries in runs of at most block_dim
    c = wp.tid()
    count = counts[c]
    for j in range((count + block_dim - 1) // block_dim):
        round_start[round_base[c] + j] = cell_start[c] + j * block_dim


@wp.kernel(enable_backward=False)
def _patch_first_round(round_base: wp.array(dtype=wp.int32), width: int, patch_round_start: wp.array(dtype=wp.int32)):
    p = wp.tid()
    patch_round_start[p] = round_base[p * width]


def _scan(a: wp.array, inclusive: bool) -> wp.array:
    out = wp.empty_like(a)
    if a.shape[0]:
        wp.utils.array_scan(a, out, inclusive=inclusive)
    return out


def _last(a: wp.array) -> int:
    return int(a[a.shape[0] - 1 : a.shape[0]].numpy()[0]) if a.shape[0] else 0


def _sort(keys: wp.array, values: wp.array, count: int, end_value: int) -> None:
    if count > 1:
        wp.utils.radix_sort_pairs(keys, values, count, end_bit=max(1, int(end_value).bit_length()))


def _runs(keys: wp.array, count: int, device):
    """Run structure of ``count`` sorted int64 keys: (each key's run, 1-based (an inclusive scan of the run starts);
    the runs' first keys, then ``count``; the number of runs)."""
    from warp_meshad._src.problem.pattern_device import _first_of_run

    flags = wp.empty(count, dtype=wp.int32, device=device)
    wp.launch(_first_of_run, dim=count, inputs=[keys, flags], device=device)
    run = _scan(flags, inclusive=True)
    runs = _last(run)
    starts = wp.empty(runs + 1, dtype=wp.int32, device=device)
    wp.launch(_run_starts, dim=count, inputs=[flags, run, starts], device=device)
    starts[runs : runs + 1].fill_(count)
    return run, starts, runs


class _TermEntries:
    """One term's elements listed per patch, on the device: sorted (patch, element) keys and the elements."""

    def __init__(self, el: wp.array, patch_of: wp.array, patch_count: int, device):
        m, v = el.shape
        self.m, self.v = int(m), int(v)
        self.m64 = wp.int64(max(self.m, 1))
        flags = wp.empty(self.m * self.v, dtype=wp.int32, device=device)
        if self.m:
            wp.launch(_first_in_patch, dim=(m, v), inputs=[el, patch_of, flags], device=device)
        place = _scan(flags, inclusive=True)
        self.count = _last(place)
        self.keys = wp.empty(2 * self.count, dtype=wp.int64, device=device)
        self.values = wp.empty(2 * self.count, dtype=wp.int32, device=device)
        if self.m:
            wp.launch(_entry_keys, dim=(m, v), inputs=[el, patch_of, flags, place, self.m64, self.keys, self.values],
                      device=device)  # fmt: skip
        _sort(self.keys, self.values, self.count, patch_count * max(self.m, 1))
        self.keys, self.values = self.keys[: self.count], self.values[: self.count]

    def cell_counts(self, patch_count: int, layer=None, width: int = 1):
        counts = wp.zeros(patch_count * width + 1, dtype=wp.int32, device=self.keys.device)
        if self.count:
            wp.launch(_count_cells, dim=self.count, inputs=[self.keys, self.m64, layer, 0 if layer is None else 1, width, counts],
                      device=self.keys.device)  # fmt: skip
        return counts


def _separate(groups, layer: wp.array, device) -> None:
    """Bump entries to later layers until no two entries of one layer share a group."""
    gvalues, run, gstart, entry_of = groups
    bump = wp.zeros_like(layer)
    moved = wp.zeros(1, dtype=wp.int32, device=device)
    for _ in range(_SEPARATE_MAX_SWEEPS):
        wp.launch(_find_clashes, dim=gvalues.shape[0], inputs=[gvalues, run, gstart, entry_of, layer, bump], device=device)
        moved.zero_()
        wp.launch(_apply_bumps, dim=layer.shape[0], inputs=[layer, bump, moved], device=device)
        if not int(moved.numpy()[0]):
            return
    raise RuntimeError("tiled assembly: could not separate the element rounds")  # pragma: no cover


def _width(layer: wp.array, device) -> int:
    top = wp.zeros(1, dtype=wp.int32, device=device)
    if layer.shape[0]:
        wp.launch(_max_of, dim=layer.shape[0], inputs=[layer, top], device=device)
    return int(top.numpy()[0]) + 1


def _rounds_of(te: _TermEntries, layer, patch_count: int, block_dim: int, device):
    width = _width(layer, device)
    counts = te.cell_counts(patch_count, layer, width)
    rounds = wp.empty(patch_count, dtype=wp.int32, device=device)
    wp.launch(_rounds_per_patch, dim=patch_count, inputs=[counts, width, block_dim, rounds], device=device)
    return rounds


def _term_rounds(te: _TermEntries, el: wp.array, patch_of: wp.array, n: int, patch_count: int, rows: np.ndarray,
                 block_dim: int, device):  # fmt: skip
    """Order one term's entries into rounds (see the comment above). Returns (entries, entry_start,
    round_start, patch_round_start, rounds in all, density)."""
    m, v, count = te.m, te.v, te.count
    if count == 0:
        zeros = wp.zeros(patch_count + 1, dtype=wp.int32, device=device)
        return te.values, zeros, wp.zeros(1, dtype=wp.int32, device=device), zeros, 0, 0.0
    mv = m * v
    entry_of = wp.empty(mv, dtype=wp.int32, device=device)
    gkeys = wp.empty(2 * mv, dtype=wp.int64, device=device)
    gvalues = wp.empty(2 * mv, dtype=wp.int32, device=device)
    wp.launch(_group_keys, dim=(m, v), inputs=[el, patch_of, te.keys, count, te.m64, wp.int64(n), entry_of, gkeys, gvalues],
              device=device)  # fmt: skip
    _sort(gkeys, gvalues, mv, v * n)
    gkeys, gvalues = gkeys[:mv], gvalues[:mv]
    run, gstart, _ = _runs(gkeys, mv, device)
    groups = (gvalues, run, gstart, entry_of)

    shape = wp.zeros(m, dtype=wp.int32, device=device)
    shape_count = 1
    if v > 1:
        skeys = wp.empty(2 * m, dtype=wp.int64, device=device)
        svalues = wp.empty(2 * m, dtype=wp.int32, device=device)
        wp.launch(_shape_keys, dim=m, inputs=[el, skeys, svalues], device=device)
        _sort(skeys, svalues, m, 1 << 62)
        srun, _, shape_count = _runs(skeys[:m], m, device)
        wp.launch(_scatter_ids, dim=m, inputs=[svalues[:m], srun, shape], device=device)

    best = best_rounds = None
    for start in ("rank", "rank_by_shape", "shape"):
        layer = wp.zeros(count, dtype=wp.int32, device=device)
        if start == "shape":
            if shape_count > 64:
                continue
            wp.launch(_shape_layer, dim=count, inputs=[te.values, shape, layer], device=device)
        else:
            by = 1 if start == "rank_by_shape" else 0
            wp.launch(_rank_in_groups, dim=mv, inputs=[gvalues, run, gstart, entry_of, shape, by, v, layer], device=device)
        _separate(groups, layer, device)
        rounds = _rounds_of(te, layer, patch_count, block_dim, device)
        if best is None:
            best, best_rounds = layer, rounds
        else:  # each patch keeps the start that takes it the fewest rounds (the earlier one on a tie)
            wp.launch(_keep_fewer_entries, dim=count, inputs=[te.keys, te.m64, rounds, best_rounds, layer, best],
                      device=device)  # fmt: skip
            wp.launch(_keep_fewer_patches, dim=patch_count, inputs=[rounds, best_rounds], device=device)

    width = _width(best, device)
    rkeys = wp.empty(2 * count, dtype=wp.int64, device=device)
    rvalues = wp.empty(2 * count, dtype=wp.int32, device=device)
    wp.launch(_round_keys, dim=count, inputs=[te.keys, te.values, te.m64, best, wp.int64(width), rkeys, rvalues],
              device=device)  # fmt: skip
    _sort(rkeys, rvalues, count, patch_count * width * max(m, 1))
    entries = rvalues[:count]

    cells = patch_count * width
    counts = te.cell_counts(patch_count, best, width)  # (cells + 1,), the last cell empty
    cell_start = _scan(counts, inclusive=False)
    counts_np = counts.numpy()
    per_cell = wp.array((counts_np + block_dim - 1) // block_dim, dtype=wp.int32, device=device)
    round_base = _scan(per_cell, inclusive=False)
    total_rounds = _last(round_base)
    round_start = wp.empty(total_rounds + 1, dtype=wp.int32, device=device)
    wp.launch(_cut_rounds, dim=cells, inputs=[counts, cell_start, round_base, block_dim, round_start], device=device)
    round_start[total_rounds : total_rounds + 1].fill_(count)
    patch_round_start = wp.empty(patch_count + 1, dtype=wp.int32, device=device)
    wp.launch(_patch_first_round, dim=patch_count + 1, inputs=[round_base, width, patch_round_start], device=device)

    per_patch = counts_np[:cells].reshape(patch_count, width)
    entry_start = np.zeros(patch_count + 1, dtype=np.int32)
    np.cumsum(per_patch.sum(axis=1), out=entry_start[1:])
    # one layer's entries per row of its patch (the densest layer of each patch, 90th percentile over patches)
    density = float(np.percentile(per_patch.max(axis=1) / rows, 90))
    return entries, wp.array(entry_start, dtype=wp.int32, device=device), round_start, patch_round_start, total_rounds, density


def _plan_terms(bounds, element_arrays, n: int, rounds: bool, block_dim: int, device) -> dict:
    """Per term, the elements of each patch (and with ``rounds``, their rounds) for patches ``bounds``.

    Returns a dict with the lists ``entries``, ``starts``, ``evals``, ``rounds`` (see :class:`TilePlan`),
    ``round_total`` (rounds of all patches and terms) and ``density`` (one layer's elements per row of its
    patch: the 90th percentile over patches of each patch's densest layer, the largest over terms; 0
    without rounds).
    """
    patch_count = bounds.size - 1
    rows = np.diff(bounds)
    bounds_d = wp.array(bounds.astype(np.int32), dtype=wp.int32, device=device)
    patch_of = wp.empty(n, dtype=wp.int32, device=device)
    wp.launch(_rows_to_patches, dim=patch_count, inputs=[bounds_d, patch_of], device=device)
    out = dict(entries=[], starts=[], evals=[], rounds=[], round_total=0, density=0.0, bounds=bounds_d)
    for el in element_arrays:
        te = _TermEntries(el, patch_of, patch_count, device)
        if rounds:
            entries, starts, rstart, prstart, total, density = _term_rounds(
                te, el, patch_of, n, patch_count, rows, block_dim, device
            )
            out["rounds"].append((rstart, prstart))
            out["round_total"] += total
            out["density"] = max(out["density"], density)
        else:
            entries = te.values
            starts = _scan(te.cell_counts(patch_count), inclusive=False)
        out["entries"].append(entries)
        out["starts"].append(starts)
        out["evals"].append(te.count)
    return out


def build_tile_plan(
    offsets: np.ndarray,
    element_arrays: list,
    block_type,
    device,
    rounds: bool = False,
    var_type=None,
    config: TileConfig = TileConfig(),
) -> TilePlan | None:
    """Plan the tiled assembly of a pattern, on ``device``.

    Args:
        offsets: (n + 1,) row offsets of the BSR pattern (host array).
        element_arrays: per term, (m, valence) int32 variable indices: ``wp.array2d`` on ``device`` (or numpy).
        block_type: the Hessian's block dtype (sets the tile capacity).
        device: where the plan is computed and its arrays live.
        rounds: plan for the deterministic variant: each patch's elements are ordered into rounds of at most
            ``config.block_dim`` in which no two add to the same tile entry (so plain adds in a fixed order replace
            atomics), and gradients are summed in shared memory too (``var_type``; a patch then also has at
            most ``row_cap`` rows, see :func:`det_tile_capacity`).
        var_type: the variable dtype (with ``rounds``).
        config: the tile knobs (the tile's size from ``shared_bytes``, the round size ``block_dim``).

    Returns:
        The plan, or None when a single row has more blocks than a tile holds.
    """
    device = wp.get_device(device)
    block_dim = config.block_dim
    offsets = np.asarray(offsets, dtype=np.int64)
    n = offsets.size - 1
    els = [e if isinstance(e, wp.array) and e.device == device
           else wp.array(np.ascontiguousarray(e.numpy() if isinstance(e, wp.array) else e, dtype=np.int32),
                         dtype=wp.int32, device=device)
           for e in element_arrays]  # fmt: skip
    row_cap = 0
    if rounds:
        if var_type is None:
            raise ValueError("build_tile_plan(rounds=True) needs var_type (the variable dtype)")
        cap, row_cap = det_tile_capacity(block_type, var_type, offsets[-1] / max(n, 1), config)
    else:
        cap = tile_capacity(block_type, config)
    offsets_d = wp.array(offsets, dtype=wp.int64, device=device)
    bounds = _row_patches(offsets, offsets_d, cap, row_cap)
    if bounds is None:
        return None
    terms = _plan_terms(bounds, els, n, rounds, block_dim, device)
    if rounds and terms["density"] > 0:
        # a layer larger than a round takes a second, nearly empty one: where the densest layer outgrows
        # block_dim, patches of fewer rows may take fewer rounds in all (mass-spring grid, 3x3 float32:
        # 3 rounds per patch of 128 rows instead of 5 per patch of 139); keep whichever plan has fewer
        fewer = int(block_dim / terms["density"])
        if 0 < fewer < row_cap:
            bounds2 = _row_patches(offsets, offsets_d, cap, fewer)
            terms2 = _plan_terms(bounds2, els, n, rounds, block_dim, device)
            if terms2["round_total"] < terms["round_total"]:
                bounds, terms, row_cap = bounds2, terms2, fewer
    block_start = wp.array(offsets[bounds].astype(np.int32), dtype=wp.int32, device=device)
    return TilePlan(
        cap, row_cap, block_start, terms["bounds"], terms["entries"], terms["starts"], terms["evals"],
        terms["rounds"] if rounds else None,
    )  # fmt: skip

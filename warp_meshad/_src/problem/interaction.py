"""Interaction terms on the device: elements that change at run time (contact pairs, ...).

The Hessian pattern of the other ("static") terms is built once on the host
(:func:`~warp_meshad._src.problem.pattern.build_hessian_pattern`) and kept on the device. When the elements
of an interaction term change, the next Hessian evaluation merges their blocks into it on the
device, with no host round trip:

1. every interaction element writes its ``valence**2`` keys ``row * n + col`` (and the place of
   its slot) into one buffer, which is radix-sorted;
2. one thread per sorted key marks where each row's keys start and counts, per row, the distinct
   keys that are not in the static pattern (binary search in the static row);
3. an exclusive prefix sum of (static blocks + new blocks) per row gives the merged row offsets;
4. one thread per row merges the static columns with the row's sorted keys (both sorted), writing
   the merged columns, the static-slot -> merged-slot remap, and the slot of every interaction key;
5. the static terms' slots are gathered through the remap.

The merged pattern is exactly the one a rebuild from scratch gives (sorted unique columns per row).
It is built into the back one of two matrices, which then becomes the front one, so the matrix
returned by the previous evaluation keeps its pattern. Buffers are sized from the element counts,
which the host knows, and grow (doubling) before anything is launched: no element is dropped.

The block count ``nnz`` of a rebuilt matrix lives on the device; the matrix's host-side ``nnz``
holds an upper bound (static blocks + interaction keys) until the next point where the host waits
for the device anyway (the energy read of ``eval*``), which makes it exact. ``nnz_sync()`` is
always exact.

Elements given as a ``wp.array`` of int32 on the problem's device are copied on the device and
range-checked there: an out-of-range index is replaced by 0 in the copy (so no kernel reads out of
bounds) and flagged; the flag is read back without waiting, and at the latest by the energy read of
the next ``eval*``, which raises a ``ValueError`` naming ``set_interaction_elements`` and the first
bad element. Every evaluation raises until valid elements are set.
"""

from __future__ import annotations

import numpy as np
import warp as wp
import warp.sparse as wps

from warp_meshad._src.codegen.warp_compat import set_matrix_pattern_version
# pair_keys lives with the pattern build that also launches it: a problem without interaction terms compiles
# the pattern's module only, never this one
from warp_meshad._src.problem.pattern_device import pair_keys
from warp_meshad._src.problem.variables import check_elements

__all__ = ["InteractionElements", "InteractionPattern", "check_interaction", "set_interaction_elements"]

_INT64_MAX = np.iinfo(np.int64).max
_LOW32 = 4294967296
_SHIFT32 = wp.constant(wp.int64(_LOW32))  # packs (flat index, bad index) into one int64


# ---------------------------------------------------------------------------------------------
# kernels (one module: a handful of generic kernels, shared by every problem)
# ---------------------------------------------------------------------------------------------


@wp.kernel(enable_backward=False)
def _copy_checked(
    src: wp.array2d(dtype=wp.int32), n: int, dst: wp.array2d(dtype=wp.int32), bad: wp.array(dtype=wp.int64)
):
    # copy elements, replacing indices outside [0, n) by 0; bad[0] = min over bad entries of
    # (flat index << 32 | index as uint32), bad[1] = their number
    e, a = wp.tid()
    i = src[e, a]
    ok = i >= 0 and i < n
    if not ok:
        flat = wp.int64(e) * wp.int64(src.shape[1]) + wp.int64(a)
        wp.atomic_min(bad, 0, flat * _SHIFT32 + wp.int64(wp.uint32(i)))
        wp.atomic_add(bad, 1, wp.int64(1))
    dst[e, a] = wp.where(ok, i, 0)


@wp.func
def _in_row(columns: wp.array(dtype=wp.int32), lo: int, hi: int, c: int):
    # binary search of c in the sorted columns[lo:hi]
    while lo < hi:
        mid = (lo + hi) // 2
        m = columns[mid]
        if m == c:
            return True
        if m < c:
            lo = mid + 1
        else:
            hi = mid
    return False


@wp.kernel(enable_backward=False)
def _count_new(
    keys: wp.array(dtype=wp.int64),
    n: wp.int64,
    base_offsets: wp.array(dtype=wp.int32),
    base_columns: wp.array(dtype=wp.int32),
    counts: wp.array(dtype=wp.int32),
    row_start: wp.array(dtype=wp.int32),
):
    # over sorted keys: first key of each row, and per row the distinct keys absent from the base
    i = wp.tid()
    key = keys[i]
    r = int(key // n)
    prev = keys[wp.max(i - 1, 0)]
    if i == 0 or prev // n != key // n:
        row_start[r] = i
    if i == 0 or prev != key:
        c = int(key - wp.int64(r) * n)
        if not _in_row(base_columns, base_offsets[r], base_offsets[r + 1], c):
            wp.atomic_add(counts, r, 1)


@wp.kernel(enable_backward=False)
def _merge_rows(
    base_offsets: wp.array(dtype=wp.int32),
    base_columns: wp.array(dtype=wp.int32),
    keys: wp.array(dtype=wp.int64),
    places: wp.array(dtype=wp.int32),
    key_count: int,
    n: wp.int64,
    row_start: wp.array(dtype=wp.int32),
    offsets: wp.array(dtype=wp.int32),
    columns: wp.array(dtype=wp.int32),
    remap: wp.array(dtype=wp.int32),
    slots: wp.array(dtype=wp.int32),
):
    # one row: merge the base columns with the row's sorted keys (duplicates share one block)
    r = wp.tid()
    b = base_offsets[r]
    be = base_offsets[r + 1]
    out = offsets[r]
    i = row_start[r]
    if i >= 0:
        rn = wp.int64(r) * n
        last = int(-1)
        last_slot = int(-1)
        while i < key_count:
            key = keys[i]
            if key - rn >= n:
                break
            c = int(key - rn)
            if c != last:
                while b < be and base_columns[b] < c:
                    columns[out] = base_columns[b]
                    remap[b] = out
                    b += 1
                    out += 1
                if b < be and base_columns[b] == c:
                    remap[b] = out
                    b += 1
                columns[out] = c
                last = c
                last_slot = out
                out += 1
            slots[places[i]] = last_slot
            i += 1
    while b < be:
        columns[out] = base_columns[b]
        remap[b] = out
        b += 1
        out += 1


@wp.kernel(enable_backward=False)
def _remap_slots(base: wp.array2d(dtype=wp.int32), remap: wp.array(dtype=wp.int32), out: wp.array2d(dtype=wp.int32)):
    e, j = wp.tid()
    out[e, j] = remap[base[e, j]]


# ---------------------------------------------------------------------------------------------
# elements of one interaction term
# ---------------------------------------------------------------------------------------------


def _capturing(device) -> bool:
    return device.is_cuda and device.is_capturing


class InteractionElements:
    """Device buffer of one interaction term's elements: count, capacity, version, range check.

    Attributes:
        buffer: (capacity, valence) int32 device array; the first ``count`` rows are the elements.
        count: number of elements set last.
        capacity: rows of ``buffer`` (grows by doubling, never shrinks).
        version: bumped by every :meth:`set`; the pattern is rebuilt when it changed.
    """

    def __init__(self, device, valence: int, capacity: int):
        self.device = device
        self.valence = valence
        self.capacity = capacity
        self.buffer = wp.zeros((capacity, valence), dtype=wp.int32, device=device)
        self.count = 0
        self.version = 0
        self.error = None
        self._n = 0
        self._bad = wp.zeros(2, dtype=wp.int64, device=device)
        self._bad_init = wp.array(np.array([_INT64_MAX, 0], dtype=np.int64), dtype=wp.int64, device=device)
        self._bad_host = wp.zeros(2, dtype=wp.int64, device="cpu", pinned=device.is_cuda)
        self._event = wp.Event(device) if device.is_cuda else None
        self._pending = False

    def _reserve(self, k: int) -> bool:
        if k <= self.capacity:
            return False
        self.capacity = max(2 * self.capacity, k)
        self.buffer = wp.zeros((self.capacity, self.valence), dtype=wp.int32, device=self.device)
        return True

    def set(self, elements, variable_count: int) -> bool:
        """Copy ``elements`` (indices in [0, variable_count)) in (see :func:`set_interaction_elements`); returns
        whether the buffer grew."""
        what = "set_interaction_elements"
        v = self.valence
        dev = self.device
        on_device = (
            isinstance(elements, wp.array) and elements.device == dev and elements.dtype == wp.int32 and elements.ndim == 2
        )
        if on_device:
            if elements.shape[1] != v and elements.size != 0:
                raise ValueError(f"{what}(elements=...) must have shape (k, {v}), got {tuple(elements.shape)}")
            k = int(elements.shape[0]) if elements.size else 0
            grew = self._reserve(k)
            self.count = k
            self.version += 1
            self.error = None
            self._pending = False
            if k:
                self._n = variable_count
                wp.copy(self._bad, self._bad_init)
                wp.launch(_copy_checked, dim=(k, v), inputs=[elements, self._n, self.buffer, self._bad], device=dev)
                if not _capturing(dev):
                    wp.copy(self._bad_host, self._bad)
                    if self._event is not None:
                        wp.get_stream(dev).record_event(self._event)
                    self._pending = True
            return grew
        # host data (or a wp.array of another dtype / device): checked on the host, uploaded once
        if isinstance(elements, wp.array):
            elements = elements.numpy()
        arr = np.asarray(elements)
        if arr.size == 0:
            arr = np.zeros((0, v), dtype=np.int32)
        if arr.ndim != 2 or arr.shape[1] != v:
            raise ValueError(f"{what}(elements=...) must have shape (k, {v}), got {arr.shape}")
        if arr.shape[0]:
            arr = check_elements(arr, variable_count, what)
        k = int(arr.shape[0])
        grew = self._reserve(k)
        self.count = k
        self.version += 1
        self.error = None
        self._pending = False
        if k:
            wp.copy(self.buffer, wp.array(arr, dtype=wp.int32, device=dev), count=arr.size)
        return grew

    def poll(self, synced: bool) -> None:
        """Read the range check once it is available (``synced``: the host has waited for the device).

        Raises:
            ValueError: while the elements set last hold an index out of range.
        """
        if self._pending and (synced or self._event is None or self._event.is_complete):
            self._pending = False
            packed, count = (int(a) for a in self._bad_host.numpy())
            if count:
                flat, low = divmod(packed, _LOW32)
                value = low - _LOW32 if low >= _LOW32 // 2 else low
                e, a = divmod(flat, self.valence)
                self.error = (
                    f"set_interaction_elements(elements=...) has {count} indices out of range [0, {self._n}): "
                    f"first elements[{e}, {a}] = {value}"
                )
        if self.error is not None:
            raise ValueError(self.error)


def set_interaction_elements(term, elements, variable_count: int) -> bool:
    """Replace the elements of interaction term ``term`` (a :class:`~warp_meshad._src.problem.terms.Term`).

    A ``wp.array`` of int32 on the term's device is copied and checked on the device (no host
    copy); anything else is checked on the host and uploaded once.

    Returns:
        Whether the term's capacity grew (the element buffers' layout, sized from it, must then be rebuilt).
    """
    ie = term.interaction
    grew = ie.set(elements, variable_count)
    if grew:
        term.capacity = ie.capacity
    term.elements = ie.buffer
    ie.poll(False)  # a device check that is already back (always on the CPU) raises here
    return grew


def check_interaction(terms, pattern, synced: bool) -> None:
    """Raise for bad interaction elements; make a rebuilt Hessian's ``nnz`` exact once it is known.

    Args:
        terms: the problem's terms.
        pattern: the problem's Hessian pattern (None before it is built).
        synced: the host has just waited for the device (the energy read of an ``eval*``).
    """
    for t in terms:
        if t.dynamic:
            t.interaction.poll(synced)
    if isinstance(pattern, InteractionPattern):
        pattern.settle(synced)


# ---------------------------------------------------------------------------------------------
# the merged pattern
# ---------------------------------------------------------------------------------------------


def _grow(size: int, need: int) -> int:
    return max(need, 2 * size) if need > size else size


class InteractionPattern:
    """The Hessian pattern of a problem with interaction terms (see :class:`~warp_meshad._src.problem.storage.Storage`).

    Built once from the static terms' host pattern ``base``; :meth:`update` merges the interaction
    blocks on the device when elements changed and returns the front matrix.

    Attributes:
        base: the static terms' :class:`~warp_meshad._src.problem.pattern.HessianPattern` (host arrays).
        matrix: the front ``warp.sparse.BsrMatrix`` (the one the last evaluation used).
        rebuilds: number of device rebuilds so far.
    """

    def __init__(self, terms, base, variable_count: int, block_type, device):
        self.base = base
        self.block_type = block_type
        dev = self.device = device
        n = self.n = variable_count
        self.static = [t for t in terms if not t.dynamic]
        self.dynamic = [t for t in terms if t.dynamic]
        self.base_nnz = base.nnz
        self.base_offsets = wp.array(base.offsets, dtype=wp.int32, device=dev)
        self.base_columns = wp.array(base.columns, dtype=wp.int32, device=dev)
        counts = np.zeros(n + 1, dtype=np.int32)
        counts[:n] = np.diff(base.offsets)
        self.base_counts = wp.array(counts, dtype=wp.int32, device=dev)
        for t in self.static:  # built from the host pattern by the caller
            t.base_slots = t.slots
            t.slots = wp.empty_like(t.base_slots)
        self.counts = wp.zeros(n + 1, dtype=wp.int32, device=dev)
        self.row_start = wp.zeros(n, dtype=wp.int32, device=dev)
        self.remap = wp.zeros(max(self.base_nnz, 1), dtype=wp.int32, device=dev)
        self.keys = wp.zeros(0, dtype=wp.int64, device=dev)
        self.places = wp.zeros(0, dtype=wp.int32, device=dev)
        self.slots = None
        self._slot_caps = None
        self.end_bit = max(1, (n * n - 1).bit_length())
        self.matrices = [None, None]
        self.front = 1
        self.built = None
        self.rebuilds = 0
        self._nnz_host = wp.zeros(1, dtype=wp.int32, device="cpu", pinned=dev.is_cuda)
        self._nnz_event = wp.Event(dev) if dev.is_cuda else None
        self._nnz_target = None

    # pattern-like read-outs (host copies, for inspection)
    @property
    def matrix(self):
        return self.matrices[self.front]

    @property
    def nnz(self) -> int:
        return int(self.matrix.nnz_sync())

    @property
    def offsets(self) -> np.ndarray:
        return self.matrix.offsets.numpy()[: self.n + 1].copy()

    @property
    def columns(self) -> np.ndarray:
        return self.matrix.columns.numpy()[: self.nnz].copy()

    def _matrix(self, capacity: int):
        """The back matrix with room for ``capacity`` blocks."""
        i = 1 - self.front
        A = self.matrices[i]
        if A is None:
            A = wps.bsr_zeros(self.n, self.n, self.block_type, device=self.device)
            A.offsets = wp.zeros(self.n + 1, dtype=wp.int32, device=self.device)
            A.columns = wp.zeros(0, dtype=wp.int32, device=self.device)
            A.values = wp.zeros(0, dtype=self.block_type, device=self.device)
            self.matrices[i] = A
        size = A.columns.shape[0]
        if capacity > size:
            size = _grow(size, capacity)
            A.columns = wp.zeros(size, dtype=wp.int32, device=self.device)
            A.values = wp.zeros(size, dtype=self.block_type, device=self.device)
        return A

    def _reserve(self, key_count: int):
        dev = self.device
        if self.keys.shape[0] < 2 * key_count:  # radix sort scratch: twice the count
            size = _grow(self.keys.shape[0], 2 * key_count)
            self.keys = wp.zeros(size, dtype=wp.int64, device=dev)
            self.places = wp.zeros(size, dtype=wp.int32, device=dev)
        caps = tuple(t.capacity for t in self.dynamic)
        if caps != self._slot_caps:  # one slot buffer; each term's slots are a view of it
            sizes = [t.capacity * t.spec.valence**2 for t in self.dynamic]
            self.slots = wp.zeros(max(sum(sizes), 1), dtype=wp.int32, device=dev)
            start = 0
            for t, s in zip(self.dynamic, sizes):
                vv = t.spec.valence**2
                t.slot_base = start
                t.slots = self.slots[start : start + s].reshape((t.capacity, vv))
                start += s
            self._slot_caps = caps

    def update(self):
        """Merge the interaction blocks if elements changed since the last build; the front matrix."""
        versions = tuple(t.interaction.version for t in self.dynamic)
        if versions == self.built:
            return self.matrix
        dev, n = self.device, self.n
        n64 = wp.int64(n)
        key_count = sum(t.count * t.spec.valence**2 for t in self.dynamic)
        self._reserve(key_count)
        upper = self.base_nnz + key_count
        A = self._matrix(upper)
        kb = 0
        for t in self.dynamic:
            vv = t.spec.valence**2
            if t.count:
                wp.launch(
                    pair_keys, dim=(t.count, vv), inputs=[t.elements, n64, kb, t.slot_base, self.keys, self.places],
                    device=dev,
                )  # fmt: skip
            kb += t.count * vv
        wp.utils.radix_sort_pairs(self.keys, self.places, key_count, end_bit=self.end_bit)
        wp.copy(self.counts, self.base_counts)
        self.row_start.fill_(-1)
        if key_count:
            wp.launch(
                _count_new, dim=key_count,
                inputs=[self.keys, n64, self.base_offsets, self.base_columns, self.counts, self.row_start], device=dev,
            )  # fmt: skip
        wp.utils.array_scan(self.counts, A.offsets, inclusive=False)
        wp.launch(
            _merge_rows, dim=n,
            inputs=[self.base_offsets, self.base_columns, self.keys, self.places, key_count, n64, self.row_start,
                    A.offsets, A.columns, self.remap, self.slots],
            device=dev,
        )  # fmt: skip
        for t in self.static:
            wp.launch(_remap_slots, dim=t.base_slots.shape, inputs=[t.base_slots, self.remap, t.slots], device=dev)
        A.notify_nnz_changed(nnz=upper)  # exact once read back (see settle)
        self.rebuilds += 1
        set_matrix_pattern_version(A, self.rebuilds)  # linear solvers re-analyse on change
        self._nnz_target = None
        if not _capturing(dev):
            wp.copy(self._nnz_host, A.offsets, src_offset=n, count=1)
            if self._nnz_event is not None:
                wp.get_stream(dev).record_event(self._nnz_event)
            self._nnz_target = A
        self.front = 1 - self.front
        self.built = versions
        self.settle(False)
        return A

    def settle(self, synced: bool) -> None:
        """Set the rebuilt matrix's host-side nnz to the exact block count once it has arrived."""
        A = self._nnz_target
        if A is not None and (synced or self._nnz_event is None or self._nnz_event.is_complete):
            self._nnz_target = None
            A.notify_nnz_changed(nnz=int(self._nnz_host.numpy()[0]))

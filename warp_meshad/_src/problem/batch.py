"""Many meshes' problems as segments of one :class:`~warp_meshad.Problem`: one launch per term for all of them.

A :class:`ProblemBatch` is built from B problems that have the same terms (the same energies, in the same order, with
the same weights; the meshes and their per-element data may differ in size). Mesh b's variables become the segment
``[offsets[b], offsets[b + 1])`` of one variable array, each term's elements are concatenated (mesh b's indices shifted
by ``offsets[b]``), and the per-element arrays of each term's data struct are concatenated in the same order. The merged
problem's Hessian is block diagonal by construction (no element spans two meshes), so one factorization solves all B
Newton systems at once; its element energies are summed per mesh by one segmented reduction
(:meth:`ProblemBatch.eval_per_mesh`). :class:`~warp_meshad.BatchNewtonSolver` runs Newton with per-mesh decrements,
line searches and stops on it.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import warp as wp

from warp_meshad._src.codegen.warp_compat import struct_fields, struct_type
from warp_meshad._src.plural import plural

__all__ = ["ProblemBatch", "segment_dot", "segment_sums"]

_BLOCK = 256


@wp.kernel(enable_backward=False, module="unique")
def _segment_sums(src: wp.array(dtype=Any), starts: wp.array2d(dtype=wp.int32), ends: wp.array2d(dtype=wp.int32),
                  out: wp.array(dtype=Any)):  # fmt: skip
    # one block per segment: its threads stride over the segment's ranges (coalesced), then a tile tree sum
    b, lane = wp.tid()
    bd = wp.block_dim()
    acc = src.dtype(0.0)
    for r in range(starts.shape[1]):
        i = starts[b, r] + lane
        end = ends[b, r]
        while i < end:
            acc += src[i]
            i += bd
    s = wp.tile_sum(wp.tile(acc))
    wp.tile_store(out, s, offset=b)


@wp.kernel(enable_backward=False, module="unique")
def _segment_dot(a: wp.array(dtype=Any), c: wp.array(dtype=Any), offsets: wp.array(dtype=wp.int32),
                 out: wp.array(dtype=Any)):  # fmt: skip
    # one block per segment: sum of a[i] * c[i] over the segment's scalars
    b, lane = wp.tid()
    bd = wp.block_dim()
    acc = a.dtype(0.0)
    i = offsets[b] + lane
    end = offsets[b + 1]
    while i < end:
        acc += a[i] * c[i]
        i += bd
    s = wp.tile_sum(wp.tile(acc))
    wp.tile_store(out, s, offset=b)


def _block(device) -> int:
    return _BLOCK if wp.get_device(device).is_cuda else 1  # CPU tile blocks run lane 0 only (WARP_NOTES)


def segment_sums(src: wp.array, starts: wp.array, ends: wp.array, out: wp.array) -> wp.array:
    """``out[b] = sum of src over the ranges [starts[b, r], ends[b, r])`` (a fixed order: deterministic).

    Args:
        src: shape [N], a float scalar dtype.
        starts, ends: int32 wp.array2d of shape [B, R] (empty ranges allowed).
        out: shape [B], src's dtype, on src's device.
    """
    wp.launch_tiled(_segment_sums, dim=[out.shape[0]], inputs=[src, starts, ends, out], block_dim=_block(src.device),
                    device=src.device)  # fmt: skip
    return out


def _flat(a: wp.array) -> wp.array:
    """A float-scalar view of a block vector (``vec{k}`` entries as k scalars each)."""
    return a.view(a.dtype._wp_scalar_type_).flatten() if wp.types.type_is_vector(a.dtype) else a


def segment_dot(a: wp.array, c: wp.array, scalar_offsets: wp.array, out: wp.array) -> wp.array:
    """``out[b] = sum_i a[i] . c[i]`` over segment b of two block vectors (all scalar components).

    Args:
        a, c: shape [n], the same float scalar or ``vec{k}`` dtype and device.
        scalar_offsets: int32 [B + 1]: segment b is the scalars ``[scalar_offsets[b], scalar_offsets[b + 1])``
            (variable offsets times the variable's length).
        out: shape [B] of the scalar dtype.
    """
    wp.launch_tiled(_segment_dot, dim=[out.shape[0]], inputs=[_flat(a), _flat(c), scalar_offsets, out],
                    block_dim=_block(a.device), device=a.device)  # fmt: skip
    return out


def _merge_data(datas: list, counts: list[int], label: str, device):
    """One struct instance of the datas' type: per-element array fields concatenated, other fields equal in all."""
    first = datas[0]
    stype = struct_type(first)
    for b, d in enumerate(datas):
        if d is None or struct_type(d) is not stype:
            got = "None" if d is None else type(d).__name__
            raise ValueError(f"ProblemBatch: term '{label}': mesh {b}'s data is {got}, expected an instance of the "
                             f"same @wp.struct as mesh 0's")  # fmt: skip
    merged = stype()
    for name, _ in struct_fields(stype):
        values = [getattr(d, name) for d in datas]
        if isinstance(values[0], wp.array):
            for b, (v, m) in enumerate(zip(values, counts)):
                if not isinstance(v, wp.array) or v.ndim < 1 or v.shape[0] != m:
                    shape = getattr(v, "shape", None)
                    raise ValueError(
                        f"ProblemBatch: term '{label}': data field {name!r} of mesh {b} has shape {shape}; only "
                        f"per-element arrays (first dimension = the term's {plural(m, 'element')}) can be batched")
            host = np.concatenate([v.numpy() for v in values], axis=0)
            setattr(merged, name, wp.array(host, dtype=values[0].dtype, device=device))
        else:
            first = values[0]
            for b, v in enumerate(values[1:], start=1):
                same = v is None if first is None else v is not None and np.array_equal(np.asarray(v), np.asarray(first))
                if not same:
                    raise ValueError(f"ProblemBatch: term '{label}': data field {name!r} differs between mesh 0 "
                                     f"({values[0]!r}) and mesh {b} ({v!r}); a shared field must be equal in every "
                                     f"mesh (make it a per-element array to vary it)")  # fmt: skip
            setattr(merged, name, values[0])
    return merged


def _term_kind(term) -> str:
    if term.dynamic:
        return "interaction"
    if term.residual:
        return "residual"
    return "deformation" if term.rest_inverse is not None else "scalar"


class ProblemBatch:
    """B problems with the same terms as segments of one :class:`~warp_meshad.Problem`.

    Build each mesh's problem as usual (``Problem`` + ``add_term`` / ``add_deformation_term`` /
    ``add_residual_term``; nothing is launched or compiled by that beyond the probes), then batch them: their terms
    must match one to one (same kind, energy function, weight, valence, data struct type, shared data fields and
    analytic projection); element counts and per-element arrays may differ. Interaction terms and parameters are not
    batched (their element sets change at run time / their derivatives are per problem).

    Args:
        problems: the B >= 1 problems, all of the same ``variable_dim``, ``dtype`` and device.
        assembly: the merged problem's Hessian assembly (``"auto"``, ``"atomic"``, ``"tiled"``); default: problem 0's.
        deterministic: default: problem 0's.

    Attributes:
        problem: the merged :class:`~warp_meshad.Problem` (variables: the B segments in order).
        problems: the B problems it was made from (left as they were).
        size: B.
        offsets: int64 numpy [B + 1]: mesh b's variables are ``offsets[b]:offsets[b + 1]`` of the merged ones.
        variable_counts: int64 numpy [B].
        element_offsets: per term, int64 numpy [B + 1]: mesh b's elements of that term in the merged term.
        mesh_of_variable: int32 device array [n]: the mesh of every merged variable.
    """

    def __init__(self, problems: Sequence, assembly: str | None = None, deterministic: bool | None = None):
        from warp_meshad._src.problem.problem import Problem

        problems = list(problems)
        if not problems:
            raise ValueError("ProblemBatch(problems=...): expected at least one Problem, got none")
        for b, p in enumerate(problems):
            if not isinstance(p, Problem):
                raise TypeError(f"ProblemBatch(problems=...): item {b} is a {type(p).__name__}, expected a Problem")
        p0 = problems[0]
        for b, p in enumerate(problems):
            for attr in ("variable_dim", "dtype", "device"):
                if getattr(p, attr) != getattr(p0, attr):
                    raise ValueError(f"ProblemBatch: problem {b} has {attr} {getattr(p, attr)}, problem 0 has "
                                     f"{getattr(p0, attr)}; all must be equal")  # fmt: skip
            if len(p.terms) != len(p0.terms):
                raise ValueError(f"ProblemBatch: problem {b} has {plural(len(p.terms), 'term')}, problem 0 has "
                                 f"{len(p0.terms)}; the problems must have the same terms")  # fmt: skip
            if not p.terms:
                raise ValueError(f"ProblemBatch: problem {b} has no terms")
        self.problems = problems
        self.size = len(problems)
        self.device = p0.device
        self.dtype = p0.dtype
        self.variable_counts = np.array([p.variable_count for p in problems], dtype=np.int64)
        self.offsets = np.zeros(self.size + 1, dtype=np.int64)
        np.cumsum(self.variable_counts, out=self.offsets[1:])
        merged = Problem(int(self.offsets[-1]), p0.variable_dim, p0.dtype, p0.device,
                         deterministic=p0.deterministic if deterministic is None else deterministic,
                         assembly=p0.assembly if assembly is None else assembly, tile_config=p0.tile_config)
        merged._assembler.element_energies = True  # every evaluation leaves the element energies summed per mesh
        self.element_offsets = []
        for k in range(len(p0.terms)):
            self._add_merged(merged, k, [p.terms[k] for p in problems])
        self.problem = merged
        mesh_of = np.repeat(np.arange(self.size, dtype=np.int32), self.variable_counts)
        self.mesh_of_variable = wp.array(mesh_of, dtype=wp.int32, device=self.device)
        vlen = p0.variable_dim
        self._scalar_offsets = wp.array((self.offsets * vlen).astype(np.int32), dtype=wp.int32, device=self.device)
        self._energy_ranges = None
        self._per_mesh = wp.zeros(self.size, dtype=self.dtype, device=self.device)
        self._options = {"assembly": merged.assembly, "deterministic": merged.deterministic}

    def subset(self, meshes: Sequence[int]) -> "ProblemBatch":
        """A new batch of some of this batch's meshes (their problems, in the given order; same assembly)."""
        meshes = [int(b) for b in meshes]
        bad = [b for b in meshes if not 0 <= b < self.size]
        if bad or not meshes:
            raise ValueError(f"ProblemBatch.subset: expected mesh indices in [0, {self.size}), got {meshes}")
        return ProblemBatch([self.problems[b] for b in meshes], **self._options)

    def _add_merged(self, merged, k: int, terms: list) -> None:
        t0 = terms[0]
        label = t0.label
        kind = _term_kind(t0)
        if kind == "interaction":
            raise ValueError(f"ProblemBatch: term {k} ('{label}') is an interaction term; they cannot be batched yet")
        if t0.params:
            raise ValueError(f"ProblemBatch: term {k} ('{label}') has parameters; they cannot be batched yet")
        for b, t in enumerate(terms[1:], start=1):
            what = None
            if _term_kind(t) != kind:
                what = f"is a {_term_kind(t)} term, mesh 0's a {kind} term"
            elif t.energy is not t0.energy:
                what = f"has energy {t.info.name}, mesh 0's {t0.info.name}"
            elif t.weight != t0.weight:
                what = f"has weight {t.weight}, mesh 0's {t0.weight}"
            elif t.spec.valence != t0.spec.valence:
                what = f"has valence {t.spec.valence}, mesh 0's {t0.spec.valence}"
            elif (t.data is None) != (t0.data is None):
                what = "has data" if t.data is not None else "has no data"
            elif t.projection is not t0.projection:
                what = "has another analytic projection than mesh 0's"
            if what:
                raise ValueError(f"ProblemBatch: term {k} ('{label}') of mesh {b} {what}; the problems must have the "
                                 f"same terms in the same order")  # fmt: skip
        counts = [t.count for t in terms]
        eoff = np.zeros(len(terms) + 1, dtype=np.int64)
        np.cumsum(counts, out=eoff[1:])
        self.element_offsets.append(eoff)
        elements = np.concatenate([t.elements_np + np.int32(self.offsets[b]) for b, t in enumerate(terms)], axis=0)
        data = None if t0.data is None else _merge_data([t.data for t in terms], counts, label, self.device)
        if kind == "deformation":
            rest = np.concatenate([t.rest_inverse.numpy() for t in terms], axis=0)
            merged.add_deformation_term(elements, t0.energy, rest, data, weight=t0.weight, name=label,
                                        projection=t0.projection)  # fmt: skip
        elif kind == "residual":
            merged.add_residual_term(elements, t0.energy, data, weight=t0.weight, name=label)
        else:
            merged.add_term(elements, t0.energy, data, weight=t0.weight, name=label)

    # -- variables ---------------------------------------------------------------------------------------------------

    @property
    def variable_count(self) -> int:
        """Variables of all meshes together."""
        return int(self.offsets[-1])

    def join(self, xs: Sequence) -> wp.array:
        """The merged variable array of B per-mesh arrays.

        Args:
            xs: B arrays (``wp.array`` or numpy-like, mesh b's of shape [variable_counts[b]] or
                [variable_counts[b], variable_dim]).

        Returns:
            wp.array [variable_count] of the merged problem's variable type on its device.
        """
        xs = list(xs)
        if len(xs) != self.size:
            raise ValueError(f"ProblemBatch.join: expected {self.size} arrays (one per mesh), got {len(xs)}")
        vt = self.problem.variable_type
        parts = []
        for b, x in enumerate(xs):
            arr = np.asarray(x.numpy() if isinstance(x, wp.array) else x, dtype=np.float64)
            n = int(self.variable_counts[b])
            arr = arr.reshape(n, -1) if arr.size == n * self.problem.variable_dim else arr
            if arr.shape[0] != n or arr.size != n * self.problem.variable_dim:
                raise ValueError(f"ProblemBatch.join: mesh {b}'s array has shape {arr.shape}, expected "
                                 f"({n}, {self.problem.variable_dim}) or ({n},)")  # fmt: skip
            parts.append(arr.reshape(n, self.problem.variable_dim))
        host = np.concatenate(parts, axis=0)
        if self.problem.variable_dim == 1:
            host = host[:, 0]
        return wp.array(host, dtype=vt, device=self.device)

    def segment(self, x: wp.array, b: int) -> wp.array:
        """Mesh b's part of a merged array (a view, no copy)."""
        if not 0 <= b < self.size:
            raise IndexError(f"ProblemBatch.segment: mesh index {b} out of range [0, {self.size})")
        return x[int(self.offsets[b]):int(self.offsets[b + 1])]

    def split(self, x: wp.array) -> list[np.ndarray]:
        """The B meshes' parts of a merged array, as numpy copies (one device read)."""
        host = x.numpy()
        return [host[int(self.offsets[b]):int(self.offsets[b + 1])].copy() for b in range(self.size)]

    def join_indices(self, per_mesh: Sequence) -> np.ndarray:
        """Merged indices of per-mesh variable indices (e.g. each mesh's ``fixed=``): ``None`` entries are skipped.

        Raises:
            ValueError: an index outside its mesh's range (naming the mesh and the index).
        """
        per_mesh = list(per_mesh)
        if len(per_mesh) != self.size:
            raise ValueError(f"ProblemBatch.join_indices: expected {self.size} index lists (None for none), got "
                             f"{len(per_mesh)}")  # fmt: skip
        out = []
        for b, idx in enumerate(per_mesh):
            if idx is None:
                continue
            arr = np.asarray(idx.numpy() if isinstance(idx, wp.array) else idx, dtype=np.int64).reshape(-1)
            n = int(self.variable_counts[b])
            bad = arr[(arr < 0) | (arr >= n)]
            if bad.size:
                raise ValueError(f"ProblemBatch.join_indices: mesh {b} has {plural(n, 'variable')}, got index "
                                 f"{int(bad[0])}")  # fmt: skip
            out.append(arr + self.offsets[b])
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    # -- per-mesh reductions -----------------------------------------------------------------------------------------

    def _ranges(self):
        """Per mesh, its element ranges in the merged problem's element-energy buffer (one per term)."""
        layout = self.problem._storage.ensure_layout(self.problem.terms)
        if self._energy_ranges is None or self._energy_ranges[0] is not layout:
            T = len(self.problem.terms)
            starts = np.zeros((self.size, T), dtype=np.int32)
            ends = np.zeros((self.size, T), dtype=np.int32)
            for k, eoff in enumerate(self.element_offsets):
                base = int(layout.offsets[k][0])
                starts[:, k] = base + eoff[:-1]
                ends[:, k] = base + eoff[1:]
            self._energy_ranges = (layout, wp.array(starts, dtype=wp.int32, device=self.device),
                                   wp.array(ends, dtype=wp.int32, device=self.device))  # fmt: skip
        return self._energy_ranges

    def energies_into(self, out: wp.array) -> wp.array:
        """Per-mesh energies of the merged problem's last evaluation, summed on the device into ``out`` [B]."""
        layout, starts, ends = self._ranges()
        return segment_sums(layout.energy, starts, ends, out)

    def eval_per_mesh(self, x: wp.array) -> np.ndarray:
        """Per-mesh energies at the merged point ``x``: float64 numpy [B] (+inf for a mesh with an invalid element)."""
        self.problem.assemble_energy(x)
        return self.energies_into(self._per_mesh).numpy().astype(np.float64)

    def dot_per_mesh(self, a: wp.array, c: wp.array, out: wp.array | None = None) -> wp.array:
        """Per-mesh ``a . c`` of two merged block vectors, into ``out`` [B] (allocated if None), on the device."""
        if out is None:
            out = wp.zeros(self.size, dtype=self.dtype, device=self.device)
        return segment_dot(a, c, self._scalar_offsets, out)

    def __repr__(self) -> str:
        return (f"ProblemBatch({plural(self.size, 'mesh', 'meshes')}, {plural(self.variable_count, 'variable')}, "
                f"{plural(len(self.problem.terms), 'term')}, {self.device})")

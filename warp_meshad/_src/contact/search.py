"""Contact on the device: candidate pairs, CCD step bounds, mollifier thresholds, intersection checks.

Host-side drivers over device arrays, built on :mod:`warp_meshad.kernels.contact`:

* :func:`find_contact_pairs`: point-triangle pairs ``[p, a, b, c]`` and edge-edge pairs
  ``[a0, a1, b0, b1]`` closer than a distance (the IPC barrier's d_hat), or, given a displacement,
  whose swept boxes come closer than it (the broad phase of CCD). Incident pairs (the vertex is a
  corner of the face; the edges share a vertex) are excluded, so one call covers self-contact and
  contact between objects stored in one vertex array. Broad phase: ``wp.Bvh`` trees over face and
  edge boxes (float32, rounded outward), one thread per query vertex / edge, ``bvh_query_aabb``;
  narrow phase (static case): the exact squared distance. Two passes (count, prefix sum, fill)
  give every pair, grouped by query vertex / edge in ascending order, with no capacity to guess.
* :func:`max_step`: the largest fraction t in [0, t_max] of a step dx such that no pair collides
  on [0, t] (additive CCD per pair, minimum over pairs).
* :func:`plane_max_step`: the same bound for vertices against a plane (ground, box walls), exact.
* :func:`edge_edge_mollifier_thresholds`: eps_x of the edge-edge barrier per pair, from rest positions.
* :func:`intersecting_face_pairs`: every pair of faces sharing no vertex that intersect (exact
  triangle-triangle test after a BVH broad phase): an acceptance check for intersection-free runs.

The :class:`ContactSearch` object keeps the topology and trees on the device across calls (refit,
no re-allocation when sizes do not change); the functions build a temporary one.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import warp as wp

from warp_meshad.kernels.contact.ccd import edge_edge_ccd, point_triangle_ccd
from warp_meshad.kernels.contact.distance import (
    edge_edge_distance_sq,
    edge_edge_mollifier_threshold,
    point_triangle_distance_sq,
)
from warp_meshad.kernels.contact.intersection import triangles_intersect

__all__ = [
    "ContactPairs",
    "ContactSearch",
    "edge_edge_mollifier_thresholds",
    "find_contact_pairs",
    "intersecting_face_pairs",
    "max_step",
    "plane_max_step",
]

DEFAULT_CCD_RESCALING = 0.9
DEFAULT_CCD_MAX_ITERATIONS = 100_000


class ContactPairs(NamedTuple):
    """Candidate contact pairs (device arrays, int32).

    Attributes:
        point_triangle: rows ``[p, a, b, c]`` (vertex p, face (a, b, c) not containing p), shape (m_pt, 4).
        edge_edge: rows ``[a0, a1, b0, b1]`` (two edges sharing no vertex, first edge index lower), shape (m_ee, 4).
    """

    point_triangle: wp.array
    edge_edge: wp.array


# ------------------------------------------------------------------------------------ kernels


@wp.func
def _lo32(v: wp.vec3d):
    """float32 lower corner at or below the float64 point v."""
    f = wp.vec3(wp.float32(v[0]), wp.float32(v[1]), wp.float32(v[2]))
    return f - (wp.vec3(wp.abs(f[0]), wp.abs(f[1]), wp.abs(f[2])) * wp.float32(4.0e-7) + wp.vec3(wp.float32(1.0e-30)))


@wp.func
def _hi32(v: wp.vec3d):
    """float32 upper corner at or above the float64 point v."""
    f = wp.vec3(wp.float32(v[0]), wp.float32(v[1]), wp.float32(v[2]))
    return f + (wp.vec3(wp.abs(f[0]), wp.abs(f[1]), wp.abs(f[2])) * wp.float32(4.0e-7) + wp.vec3(wp.float32(1.0e-30)))


@wp.func
def _end(x: wp.array(dtype=wp.vec3d), dx: wp.array(dtype=wp.vec3d), swept: int, i: int):
    """Position of vertex i at the end of the step (x itself when not swept)."""
    if swept != 0:
        return x[i] + dx[i]
    return x[i]


@wp.kernel(enable_backward=False)
def _face_boxes(
    x: wp.array(dtype=wp.vec3d),
    dx: wp.array(dtype=wp.vec3d),
    swept: int,
    faces: wp.array2d(dtype=wp.int32),
    lowers: wp.array(dtype=wp.vec3),
    uppers: wp.array(dtype=wp.vec3),
):
    """One thread per face: its (swept) bounding box."""
    f = wp.tid()
    lo = x[faces[f, 0]]
    hi = lo
    for k in range(3):
        i = faces[f, k]
        a = x[i]
        b = _end(x, dx, swept, i)
        lo = wp.min(lo, wp.min(a, b))
        hi = wp.max(hi, wp.max(a, b))
    lowers[f] = _lo32(lo)
    uppers[f] = _hi32(hi)


@wp.kernel(enable_backward=False)
def _edge_boxes(
    x: wp.array(dtype=wp.vec3d),
    dx: wp.array(dtype=wp.vec3d),
    swept: int,
    edges: wp.array2d(dtype=wp.int32),
    lowers: wp.array(dtype=wp.vec3),
    uppers: wp.array(dtype=wp.vec3),
):
    """One thread per edge: its (swept) bounding box."""
    e = wp.tid()
    lo = x[edges[e, 0]]
    hi = lo
    for k in range(2):
        i = edges[e, k]
        a = x[i]
        b = _end(x, dx, swept, i)
        lo = wp.min(lo, wp.min(a, b))
        hi = wp.max(hi, wp.max(a, b))
    lowers[e] = _lo32(lo)
    uppers[e] = _hi32(hi)


@wp.kernel(enable_backward=False)
def _point_triangle_candidates(
    bvh: wp.uint64,
    x: wp.array(dtype=wp.vec3d),
    dx: wp.array(dtype=wp.vec3d),
    swept: int,
    faces: wp.array2d(dtype=wp.int32),
    distance: wp.float64,
    write: int,
    offsets: wp.array(dtype=wp.int32),
    counts: wp.array(dtype=wp.int32),
    out: wp.array2d(dtype=wp.int32),
):
    """One thread per vertex: count (write = 0) or store (write = 1) its candidate faces."""
    v = wp.tid()
    a = x[v]
    b = _end(x, dx, swept, v)
    pad = wp.vec3d(distance, distance, distance)
    lo = _lo32(wp.min(a, b) - pad)
    hi = _hi32(wp.max(a, b) + pad)
    dist_sq = distance * distance
    query = wp.bvh_query_aabb(bvh, lo, hi)
    f = int(0)
    n = int(0)
    base = int(0)
    if write != 0:
        base = offsets[v]
    while wp.bvh_query_next(query, f):
        i0 = faces[f, 0]
        i1 = faces[f, 1]
        i2 = faces[f, 2]
        if v == i0 or v == i1 or v == i2:
            continue
        if swept == 0:
            if point_triangle_distance_sq(a, x[i0], x[i1], x[i2]) >= dist_sq:
                continue
        if write != 0:
            out[base + n, 0] = v
            out[base + n, 1] = i0
            out[base + n, 2] = i1
            out[base + n, 3] = i2
        n += 1
    if write == 0:
        counts[v] = n


@wp.kernel(enable_backward=False)
def _edge_edge_candidates(
    bvh: wp.uint64,
    x: wp.array(dtype=wp.vec3d),
    dx: wp.array(dtype=wp.vec3d),
    swept: int,
    edges: wp.array2d(dtype=wp.int32),
    distance: wp.float64,
    write: int,
    offsets: wp.array(dtype=wp.int32),
    counts: wp.array(dtype=wp.int32),
    out: wp.array2d(dtype=wp.int32),
):
    """One thread per edge: count (write = 0) or store (write = 1) its candidate edges of higher index."""
    e = wp.tid()
    j0 = edges[e, 0]
    j1 = edges[e, 1]
    a0 = x[j0]
    a1 = x[j1]
    pad = wp.vec3d(distance, distance, distance)
    lo = wp.min(wp.min(a0, a1), wp.min(_end(x, dx, swept, j0), _end(x, dx, swept, j1))) - pad
    hi = wp.max(wp.max(a0, a1), wp.max(_end(x, dx, swept, j0), _end(x, dx, swept, j1))) + pad
    dist_sq = distance * distance
    query = wp.bvh_query_aabb(bvh, _lo32(lo), _hi32(hi))
    g = int(0)
    n = int(0)
    base = int(0)
    if write != 0:
        base = offsets[e]
    while wp.bvh_query_next(query, g):
        if g <= e:
            continue
        k0 = edges[g, 0]
        k1 = edges[g, 1]
        if j0 == k0 or j0 == k1 or j1 == k0 or j1 == k1:
            continue
        if swept == 0:
            if edge_edge_distance_sq(a0, a1, x[k0], x[k1]) >= dist_sq:
                continue
        if write != 0:
            out[base + n, 0] = j0
            out[base + n, 1] = j1
            out[base + n, 2] = k0
            out[base + n, 3] = k1
        n += 1
    if write == 0:
        counts[e] = n


@wp.kernel(enable_backward=False)
def _pair_step(
    x: wp.array(dtype=wp.vec3d),
    dx: wp.array(dtype=wp.vec3d),
    pairs: wp.array2d(dtype=wp.int32),
    edge_edge: int,
    min_distance: wp.float64,
    t_max: wp.float64,
    rescaling: wp.float64,
    max_iterations: int,
    toi: wp.array(dtype=wp.float64),
    t_min: wp.array(dtype=wp.float64),
):
    """One thread per pair (point-triangle ``p, a, b, c``, or with ``edge_edge`` edges ``a0, a1`` and
    ``b0, b1``): its ACCD time of impact, and the running minimum."""
    k = wp.tid()
    i0 = pairs[k, 0]
    i1 = pairs[k, 1]
    i2 = pairs[k, 2]
    i3 = pairs[k, 3]
    t = t_max
    if edge_edge != 0:
        t = edge_edge_ccd(
            x[i0], x[i1], x[i2], x[i3], dx[i0], dx[i1], dx[i2], dx[i3], min_distance, t_max, rescaling, max_iterations
        )
    else:
        t = point_triangle_ccd(
            x[i0], x[i1], x[i2], x[i3], dx[i0], dx[i1], dx[i2], dx[i3], min_distance, t_max, rescaling, max_iterations
        )
    toi[k] = t
    wp.atomic_min(t_min, 0, t)


@wp.kernel(enable_backward=False)
def _plane_step(
    x: wp.array(dtype=wp.vec3d),
    dx: wp.array(dtype=wp.vec3d),
    origin: wp.vec3d,
    normal: wp.vec3d,
    min_distance: wp.float64,
    t_max: wp.float64,
    rescaling: wp.float64,
    t_min: wp.array(dtype=wp.float64),
):
    """One thread per vertex: the step fraction at which it would cover ``rescaling`` of its gap to the plane."""
    i = wp.tid()
    gap = wp.dot(x[i] - origin, normal) - min_distance
    speed = wp.dot(dx[i], normal)
    t = t_max
    if gap <= wp.float64(0.0):
        t = wp.float64(0.0)
    elif speed < wp.float64(0.0):
        t = wp.min(t_max, rescaling * gap / (-speed))
    wp.atomic_min(t_min, 0, t)


@wp.kernel(enable_backward=False)
def _mollifier_thresholds(
    rest: wp.array(dtype=wp.vec3d), pairs: wp.array2d(dtype=wp.int32), out: wp.array(dtype=wp.float64)
):
    """One thread per edge-edge pair: eps_x = 1e-3 |a1 - a0|^2 |b1 - b0|^2 at rest."""
    k = wp.tid()
    out[k] = edge_edge_mollifier_threshold(rest[pairs[k, 0]], rest[pairs[k, 1]], rest[pairs[k, 2]], rest[pairs[k, 3]])


@wp.kernel(enable_backward=False)
def _face_intersections(
    bvh: wp.uint64,
    x: wp.array(dtype=wp.vec3d),
    faces: wp.array2d(dtype=wp.int32),
    lowers: wp.array(dtype=wp.vec3),
    uppers: wp.array(dtype=wp.vec3),
    write: int,
    offsets: wp.array(dtype=wp.int32),
    counts: wp.array(dtype=wp.int32),
    out: wp.array2d(dtype=wp.int32),
):
    """One thread per face: count (write = 0) or store (write = 1) the faces of higher index it intersects."""
    f = wp.tid()
    i0 = faces[f, 0]
    i1 = faces[f, 1]
    i2 = faces[f, 2]
    query = wp.bvh_query_aabb(bvh, lowers[f], uppers[f])
    g = int(0)
    n = int(0)
    base = int(0)
    if write != 0:
        base = offsets[f]
    while wp.bvh_query_next(query, g):
        if g <= f:
            continue
        j0 = faces[g, 0]
        j1 = faces[g, 1]
        j2 = faces[g, 2]
        if i0 == j0 or i0 == j1 or i0 == j2 or i1 == j0 or i1 == j1 or i1 == j2 or i2 == j0 or i2 == j1 or i2 == j2:
            continue
        if not triangles_intersect(x[i0], x[i1], x[i2], x[j0], x[j1], x[j2]):
            continue
        if write != 0:
            out[base + n, 0] = f
            out[base + n, 1] = g
        n += 1
    if write == 0:
        counts[f] = n


# ------------------------------------------------------------------------------------ host side


def _as_positions(x, what: str, device, count: int | None = None) -> wp.array:
    """x as a wp.array of vec3d on ``device`` (no copy when it already is one)."""
    if isinstance(x, wp.array):
        if x.dtype != wp.vec3d:
            raise TypeError(f"{what} must have dtype wp.vec3d, got {wp.types.type_repr(x.dtype)}")
        arr = x if x.device == device else x.to(device)
    else:
        a = np.asarray(x, dtype=np.float64)
        if a.ndim != 2 or a.shape[1] != 3:
            raise ValueError(f"{what} must have shape (n, 3), got {a.shape}")
        arr = wp.array(a, dtype=wp.vec3d, device=device)
    if count is not None and arr.shape[0] != count:
        raise ValueError(f"{what} has {arr.shape[0]} rows, expected {count}")
    return arr


def _as_index_rows(a, width: int, what: str, device, vertex_count: int | None = None) -> wp.array:
    if isinstance(a, wp.array):
        if a.ndim == 2 and a.dtype == wp.int32 and a.shape[1] == width:
            return a if a.device == device else a.to(device)
        a = a.numpy()
    arr = np.asarray(a)
    if arr.size == 0:
        arr = arr.reshape(0, width)
    if arr.ndim != 2 or arr.shape[1] != width or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{what} must be an integer array of shape (m, {width}), got {arr.dtype} {arr.shape}")
    if vertex_count is not None and arr.size and (arr.min() < 0 or arr.max() >= vertex_count):
        raise ValueError(f"{what} has indices out of range [0, {vertex_count}): min {arr.min()}, max {arr.max()}")
    return wp.array(np.ascontiguousarray(arr, dtype=np.int32), dtype=wp.int32, device=device)


def _edges_of(faces: np.ndarray) -> np.ndarray:
    e = np.concatenate([faces[:, [0, 1]], faces[:, [1, 2]], faces[:, [2, 0]]])
    e = np.sort(e, axis=1)
    return np.unique(e, axis=0)


class _Tree:
    """A BVH over m boxes whose storage is reused while m does not change."""

    def __init__(self, count: int, device):
        self.count = count
        self.lowers = wp.zeros(count, dtype=wp.vec3, device=device)
        self.uppers = wp.zeros(count, dtype=wp.vec3, device=device)
        self.bvh = None

    def update(self):
        if self.bvh is None:
            self.bvh = wp.Bvh(self.lowers, self.uppers)
        else:
            self.bvh.refit()  # topology of the tree kept; boxes refreshed (rebuild() when motion is large)


class ContactSearch:
    """Contact queries over one triangle mesh (all objects of a scene in one vertex array).

    Args:
        faces: triangles, int array (face_count, 3) (numpy or wp.array2d).
        edges: int array (edge_count, 2); default: the unique edges of ``faces``.
        vertex_count: number of vertices (default: max index + 1).
        device: Warp device of the queries (default: Warp's default device).
        rebuild_every: rebuild the trees from scratch every this many updates (refit in between;
            refitting keeps queries exact but slows them as the motion scrambles the boxes).
    """

    def __init__(self, faces, edges=None, vertex_count: int | None = None, device=None, rebuild_every: int = 8):
        self.device = wp.get_device(device)
        f = faces.numpy() if isinstance(faces, wp.array) else np.asarray(faces)
        if f.ndim != 2 or f.shape[1] != 3 or not np.issubdtype(f.dtype, np.integer) or f.shape[0] == 0:
            raise ValueError(
                f"ContactSearch(faces=...) must be a non-empty integer array (m, 3), got {f.dtype} {f.shape}"
            )
        self.vertex_count = int(f.max()) + 1 if vertex_count is None else int(vertex_count)
        if f.min() < 0 or f.max() >= self.vertex_count:
            raise ValueError(f"ContactSearch(faces=...) has indices out of range [0, {self.vertex_count})")
        e = _edges_of(f) if edges is None else (edges.numpy() if isinstance(edges, wp.array) else np.asarray(edges))
        self.faces = _as_index_rows(f, 3, "ContactSearch(faces=...)", self.device, self.vertex_count)
        self.edges = _as_index_rows(e, 2, "ContactSearch(edges=...)", self.device, self.vertex_count)
        self.face_count = self.faces.shape[0]
        self.edge_count = self.edges.shape[0]
        self.rebuild_every = max(1, int(rebuild_every))
        self._face_tree = _Tree(self.face_count, self.device)
        self._edge_tree = _Tree(self.edge_count, self.device) if self.edge_count else None
        self._updates = 0
        self._vcounts = wp.zeros(self.vertex_count, dtype=wp.int32, device=self.device)
        self._voffsets = wp.zeros(self.vertex_count, dtype=wp.int32, device=self.device)
        self._ecounts = wp.zeros(max(self.edge_count, 1), dtype=wp.int32, device=self.device)
        self._eoffsets = wp.zeros(max(self.edge_count, 1), dtype=wp.int32, device=self.device)
        self._fcounts = wp.zeros(self.face_count, dtype=wp.int32, device=self.device)
        self._foffsets = wp.zeros(self.face_count, dtype=wp.int32, device=self.device)
        self._empty2 = wp.zeros((1, 4), dtype=wp.int32, device=self.device)

    # -------------------------------------------------------------------------------- trees

    def _trees(self, x, dx, swept):
        """Boxes of faces and edges at x (swept over dx when ``swept``), then refit or rebuild the trees."""
        rebuild = self._updates % self.rebuild_every == 0
        self._updates += 1
        trees = ((self._face_tree, _face_boxes, self.faces), (self._edge_tree, _edge_boxes, self.edges))
        for tree, kernel, rows in trees:
            if tree is None:
                continue
            wp.launch(kernel, tree.count, inputs=[x, dx, swept, rows, tree.lowers, tree.uppers], device=self.device)
            if rebuild:
                tree.bvh = None
            tree.update()

    def _two_pass(self, kernel, dim, fixed, counts, offsets, width):
        """Count, prefix-sum, allocate, fill: returns a (total, width) int32 device array."""
        wp.launch(kernel, dim, inputs=[*fixed, 0, offsets, counts, self._empty2], device=self.device)
        wp.utils.array_scan(counts, offsets, inclusive=False)
        total = int(offsets[dim - 1 : dim].numpy()[0] + counts[dim - 1 : dim].numpy()[0])
        out = wp.zeros((total, width), dtype=wp.int32, device=self.device)
        if total:
            wp.launch(kernel, dim, inputs=[*fixed, 1, offsets, counts, out], device=self.device)
        return out

    # -------------------------------------------------------------------------------- queries

    def find_pairs(self, x, distance: float, dx=None) -> ContactPairs:
        """Point-triangle and edge-edge pairs within ``distance`` (see :func:`find_contact_pairs`)."""
        distance = float(distance)
        if not np.isfinite(distance) or distance < 0:
            raise ValueError(f"find_pairs(distance=...) must be finite and >= 0, got {distance}")
        x = _as_positions(x, "x", self.device, self.vertex_count)
        swept = 0 if dx is None else 1
        d = x if dx is None else _as_positions(dx, "dx", self.device, self.vertex_count)
        self._trees(x, d, swept)
        dist = wp.float64(distance)
        pt = self._two_pass(
            _point_triangle_candidates, self.vertex_count,
            [self._face_tree.bvh.id, x, d, swept, self.faces, dist], self._vcounts, self._voffsets, 4,
        )
        if self._edge_tree is None:
            ee = wp.zeros((0, 4), dtype=wp.int32, device=self.device)
        else:
            ee = self._two_pass(
                _edge_edge_candidates, self.edge_count,
                [self._edge_tree.bvh.id, x, d, swept, self.edges, dist], self._ecounts, self._eoffsets, 4,
            )
        return ContactPairs(pt, ee)

    def max_step(
        self,
        x,
        dx,
        *,
        min_distance: float = 0.0,
        t_max: float = 1.0,
        rescaling: float = DEFAULT_CCD_RESCALING,
        max_iterations: int = DEFAULT_CCD_MAX_ITERATIONS,
    ) -> float:
        """Largest collision-free fraction of the step ``dx`` from ``x`` (swept broad phase + ACCD)."""
        pairs = self.find_pairs(x, min_distance, dx=dx)
        return max_step(x, dx, pairs.point_triangle, pairs.edge_edge, min_distance=min_distance, t_max=t_max,
                        rescaling=rescaling, max_iterations=max_iterations, device=self.device)

    def intersecting_face_pairs(self, x) -> np.ndarray:
        """Pairs of faces sharing no vertex that intersect (see :func:`intersecting_face_pairs`)."""
        x = _as_positions(x, "x", self.device, self.vertex_count)
        self._trees(x, x, 0)
        tree = self._face_tree
        out = self._two_pass(
            _face_intersections, self.face_count, [tree.bvh.id, x, self.faces, tree.lowers, tree.uppers],
            self._fcounts, self._foffsets, 2,
        )
        return out.numpy().reshape(-1, 2)


# ------------------------------------------------------------------------------------ functions


def find_contact_pairs(x, faces, distance: float, *, edges=None, dx=None, device=None) -> ContactPairs:
    """Point-triangle and edge-edge contact candidates of a triangle mesh.

    Args:
        x: vertex positions [m], shape (vertex_count, 3) NumPy or wp.array of wp.vec3d.
        faces: triangles, int array (face_count, 3).
        distance: d [m]: static case (``dx`` None): pairs whose exact distance is < d (the IPC
            barrier's active set for d = d_hat); swept case: pairs whose boxes swept over the step
            ``dx`` come closer than d (a superset of the pairs CCD must check).
        edges: int array (edge_count, 2); default: the unique edges of ``faces``.
        dx: step [m], shape as x, or None.
        device: Warp device (default: x's device when x is a wp.array, else Warp's default).

    Returns:
        :class:`ContactPairs` of int32 device arrays with rows ``[p, a, b, c]`` and ``[a0, a1, b0, b1]``;
        a vertex never pairs with a face containing it, nor an edge with an edge sharing a vertex.
    """
    if device is None and isinstance(x, wp.array):
        device = x.device
    n = x.shape[0]
    return ContactSearch(faces, edges, vertex_count=n, device=device).find_pairs(x, distance, dx=dx)


def max_step(
    x,
    dx,
    point_triangle=None,
    edge_edge=None,
    *,
    min_distance: float = 0.0,
    t_max: float = 1.0,
    rescaling: float = DEFAULT_CCD_RESCALING,
    max_iterations: int = DEFAULT_CCD_MAX_ITERATIONS,
    device=None,
) -> float:
    """Largest t in [0, t_max] such that no given pair collides while x moves to x + t dx.

    Additive CCD (Li et al. 2021) per pair, minimum over all pairs; each pair's t keeps its distance
    above ``min_distance`` along [0, t] with the margin of ``rescaling`` (see
    :mod:`warp_meshad.kernels.contact.ccd`).

    Args:
        x: positions [m], shape (n, 3) NumPy or wp.array of wp.vec3d.
        dx: step [m], same shape.
        point_triangle: rows ``[p, a, b, c]``, int (m, 3+1) array, or None.
        edge_edge: rows ``[a0, a1, b0, b1]``, int (m, 4) array, or None. Pairs must cover every pair
            that can meet during the step, e.g. ``find_contact_pairs(x, faces, min_distance, dx=dx)``.
        min_distance: xi [m] >= 0, the distance to keep (0 for IPC: the barrier keeps it positive).
        t_max: upper bound of the result (1 for a full Newton step).
        rescaling: s in (0, 1): each ACCD step moves at most s of the remaining gap (0.9 in the paper).
        max_iterations: cap of ACCD iterations per pair (the result stays safe when reached).
        device: Warp device (default: x's device when x is a wp.array, else Warp's default).

    Returns:
        t (float): 0 when a pair starts at distance <= min_distance; t_max when no pair collides.
    """
    if not 0.0 < rescaling < 1.0:
        raise ValueError(f"max_step(rescaling=...) must be in (0, 1), got {rescaling}")
    if not (np.isfinite(t_max) and t_max >= 0.0):
        raise ValueError(f"max_step(t_max=...) must be finite and >= 0, got {t_max}")
    if not (np.isfinite(min_distance) and min_distance >= 0.0):
        raise ValueError(f"max_step(min_distance=...) must be finite and >= 0, got {min_distance}")
    if device is None and isinstance(x, wp.array):
        device = x.device
    device = wp.get_device(device)
    x = _as_positions(x, "x", device)
    n = x.shape[0]
    dx = _as_positions(dx, "dx", device, n)
    t_min = wp.array([t_max], dtype=wp.float64, device=device)
    args = [wp.float64(min_distance), wp.float64(t_max), wp.float64(rescaling), int(max_iterations)]
    for pairs, edge_edge, what in ((point_triangle, 0, "point_triangle"), (edge_edge, 1, "edge_edge")):
        if pairs is None:
            continue
        rows = _as_index_rows(pairs, 4, f"max_step({what}=...)", device, None)
        m = rows.shape[0]
        if m == 0:
            continue
        toi = wp.empty(m, dtype=wp.float64, device=device)
        wp.launch(_pair_step, m, inputs=[x, dx, rows, edge_edge, *args, toi, t_min], device=device)
    return float(t_min.numpy()[0])


def plane_max_step(
    x,
    dx,
    origin,
    normal,
    *,
    min_distance: float = 0.0,
    t_max: float = 1.0,
    rescaling: float = DEFAULT_CCD_RESCALING,
    device=None,
) -> float:
    """Largest t in [0, t_max] keeping every vertex above a plane (ground, box wall) while x moves to x + t dx.

    Exact for a plane: a vertex at height s above it (less ``min_distance``) moving with normal speed
    v < 0 reaches it at s / -v; the bound is ``rescaling`` times that, as in :func:`max_step`.

    Args:
        x, dx: positions and step [m], shape (n, 3) NumPy or wp.array of wp.vec3d.
        origin: a point of the plane [m]; normal: its normal toward the free side (normalized here).
        min_distance, t_max, rescaling, device: as in :func:`max_step`.

    Returns:
        t (float): 0 when a vertex starts on or below the plane (less min_distance).
    """
    if not 0.0 < rescaling < 1.0:
        raise ValueError(f"plane_max_step(rescaling=...) must be in (0, 1), got {rescaling}")
    n = np.asarray(normal, dtype=np.float64).reshape(3)
    if not np.linalg.norm(n) > 0:
        raise ValueError(f"plane_max_step(normal=...) must be a nonzero 3-vector, got {normal}")
    n = n / np.linalg.norm(n)
    o = np.asarray(origin, dtype=np.float64).reshape(3)
    if device is None and isinstance(x, wp.array):
        device = x.device
    device = wp.get_device(device)
    x = _as_positions(x, "x", device)
    dx = _as_positions(dx, "dx", device, x.shape[0])
    t_min = wp.array([t_max], dtype=wp.float64, device=device)
    scalars = [wp.float64(min_distance), wp.float64(t_max), wp.float64(rescaling)]
    wp.launch(_plane_step, x.shape[0], inputs=[x, dx, wp.vec3d(*o), wp.vec3d(*n), *scalars, t_min], device=device)
    return float(t_min.numpy()[0])


def edge_edge_mollifier_thresholds(rest_positions, edge_edge, device=None) -> wp.array:
    """eps_x = 1e-3 |a1 - a0|^2 |b1 - b0|^2 [m^4] at rest, per edge-edge pair (for ``EdgeEdgeBarrierData``).

    Args:
        rest_positions: rest positions [m], shape (n, 3) NumPy or wp.array of wp.vec3d.
        edge_edge: rows ``[a0, a1, b0, b1]``, int (m, 4).
        device: Warp device (default: that of ``edge_edge`` when a wp.array, else Warp's default).

    Returns:
        wp.array of float64, shape (m,).
    """
    if device is None and isinstance(edge_edge, wp.array):
        device = edge_edge.device
    device = wp.get_device(device)
    rest = _as_positions(rest_positions, "rest_positions", device)
    rows = _as_index_rows(edge_edge, 4, "edge_edge", device, rest.shape[0])
    out = wp.zeros(rows.shape[0], dtype=wp.float64, device=device)
    if rows.shape[0]:
        wp.launch(_mollifier_thresholds, rows.shape[0], inputs=[rest, rows, out], device=device)
    return out


def intersecting_face_pairs(x, faces, device=None) -> np.ndarray:
    """Every pair of faces that share no vertex and intersect (closed triangles, float64 test).

    Args:
        x: positions [m], shape (n, 3) NumPy or wp.array of wp.vec3d.
        faces: triangles, int array (face_count, 3).
        device: Warp device (default: x's device when x is a wp.array, else Warp's default).

    Returns:
        int32 NumPy array (k, 2) of face index pairs ``f < g``; empty when the surface is free of
        intersections.
    """
    if device is None and isinstance(x, wp.array):
        device = x.device
    search = ContactSearch(faces, edges=np.zeros((0, 2), np.int32), vertex_count=x.shape[0], device=device)
    return search.intersecting_face_pairs(x)

"""Isotropic remeshing of a triangle mesh (Botsch and Kobbelt 2004) with per-vertex and per-face data carried over.

:func:`remesh_isotropic` drives the edge lengths of a mesh toward a target length ``L`` (a scalar or a per-vertex
field) by the four steps of Botsch and Kobbelt, "A remeshing approach to multiresolution modeling" (SGP 2004),
repeated ``iterations`` times:

1. split every edge longer than 4/3 L at its midpoint;
2. collapse every edge shorter than 4/5 L into one of its ends, refusing a collapse that would make an edge longer
   than 4/3 L, break the link condition (a non-manifold result), flip or degenerate a face, or move a boundary or
   feature vertex off its curve;
3. flip an edge when that brings the valences of its four vertices closer to 6 (4 on the boundary) and flips no face;
4. tangential relaxation: each vertex moves toward the area-weighted centroid of its one-ring in its tangent plane
   and is projected back to the closest point of the input surface (a vertex of a feature curve moves along the
   curve and is projected back to the input's curve).

A last round of splits (its new vertices projected to the input) leaves no edge longer than 4/3 L.

Every step keeps the mesh an oriented manifold (each edge in one or two faces, each vertex's faces one fan) without
flipped or degenerate faces: a change is made only when each face it makes has positive area, a normal turned by less
than 90 degrees from the faces it replaces, and a normal on the side of the input's normal at each of its corners (the
input's area-weighted vertex normals, interpolated where a vertex lies on the input). The result is checked at the end
(:func:`check_result`).

Operations are applied in rounds of independent sets: each candidate claims the faces (splits), the faces around both
ends (collapses) or the four vertices (flips) it changes; passes over the candidates, higher priority first (longest
splits, shortest collapses, largest valence gains, ties broken by a hash), take a maximal set with disjoint claims, so
no two operations of a round touch the same face. A step's rounds stop when a round does less than 2% of the first
round's work (what is left waits for the next iteration); the last splits run until no edge is too long. Every round is
numpy over arrays (gathers, sorts, ``bincount`` scatters); the topology is rebuilt per round by
:class:`~warp_meshad._src.mesh.trimesh.TriMesh`'s one-sort edge build.

Why the host: the remesher runs between solves, every k solver iterations, on meshes the solver hands over as arrays,
and numpy does a round at these sizes in tens of milliseconds (five iterations on one CPU core: about 0.8 s for 10k
faces, 9 s for 100k). It is the reference a GPU port would be checked against. On the GPU in Warp, the candidate tests
and the independent-set passes would be one thread per candidate (claims by ``wp.atomic_max`` on a face or vertex
array), the projection one ``wp.mesh_query_point`` per vertex on a ``wp.Mesh`` of the input, and the topology rebuild a
device radix sort of the half-edge keys; that port pays off once the mesh stays on the device between solves.
SciPy supplies the k-d tree of the closest-point queries and the connected components of the fan check; trimesh's
closest-point query needs rtree, which is not a dependency, so the exact query is here (:class:`_Closest`).

Attribute transfer: a vertex made by a split takes the mean of its edge's two ends; a vertex moved by the relaxation
(or a projected split vertex) is re-sampled by barycentric interpolation on the input triangle (or input curve
segment) it was projected to; a vertex whose position never changed keeps its input values exactly. A face takes the
values of the input face closest to its centroid, so a face whose three vertices are unmoved input vertices forming an
input face takes that face's values exactly.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers

import numpy as np

from warp_meshad._src.mesh.checks import DEGENERATE_RTOL, MeshError, check_nondegenerate, first_items
from warp_meshad._src.mesh.trimesh import TriMesh

__all__ = ["RemeshResult", "remesh_isotropic"]

SPLIT_RATIO = 4.0 / 3.0  # an edge longer than SPLIT_RATIO * L is split
COLLAPSE_RATIO = 4.0 / 5.0  # an edge shorter than COLLAPSE_RATIO * L is collapsed
BOUNDARY_MODES = ("slide", "fixed")
_MAX_ROUNDS = 32  # independent-set rounds of one step per iteration (each round applies at least one operation)
_TAIL = 0.02  # a step's rounds stop when one applies less than this fraction of the first round's operations
_KEY_SHIFT = 32  # an undirected edge (lo, hi) is the int64 key lo << 32 | hi
_LOW = (1 << _KEY_SHIFT) - 1
_SOURCE = "remesh_isotropic"
_LEVELS = 4  # priority levels per unit of length / target in the independent sets
_QUERY_COUNTS = (16, 64, 256)  # tree points per closest-point query, tried in turn until the closest is certain


@dataclasses.dataclass(frozen=True)
class RemeshResult:
    """The remeshed surface and what a solver needs to carry its state over.

    Attributes:
        vertices: positions, float64, shape (vertex_count, 3).
        faces: triangles, int32, shape (face_count, 3), oriented as the input.
        vertex_data: each input ``vertex_data`` array transferred, float64, shape (vertex_count, ...).
        face_data: each input ``face_data`` array transferred (its dtype kept), shape (face_count, ...).
        vertex_map: the input vertex each vertex is, int32, shape (vertex_count,); -1 for a vertex made by a split.
            A vertex that survived may have moved (see `moved`).
        moved: whether each vertex's position differs from its input vertex's, bool, shape (vertex_count,); True for
            every new vertex. Where it is False the vertex's data equal the input's exactly.
        face_map: the input face whose ``face_data`` each face took (the one closest to its centroid), int32,
            shape (face_count,).
        operation_counts: how many splits, collapses, flips and relaxed vertex moves were applied, by name.
    """

    vertices: np.ndarray
    faces: np.ndarray
    vertex_data: dict
    face_data: dict
    vertex_map: np.ndarray
    moved: np.ndarray
    face_map: np.ndarray
    operation_counts: dict

    def mesh(self) -> TriMesh:
        """The result as a :class:`~warp_meshad._src.mesh.trimesh.TriMesh`."""
        return TriMesh(self.vertices, self.faces, source=_SOURCE)


def remesh_isotropic(
    vertices,
    faces,
    target_length,
    *,
    iterations: int = 5,
    boundary: str = "slide",
    features=None,
    feature_angle: float | None = None,
    corner_angle: float = 45.0,
    vertex_data: dict | None = None,
    face_data: dict | None = None,
) -> RemeshResult:
    """Remeshes a triangle surface toward edges of length ``target_length`` (Botsch and Kobbelt 2004).

    Boundary and feature edges form curves that the remeshed mesh keeps: their edges are split and collapsed only
    along the curve, never flipped, and their vertices slide along the input's curve. A curve vertex where the curve
    turns by more than ``corner_angle``, where three or more curve edges meet, or where an open curve ends is a corner:
    it is neither moved nor removed.

    On return no edge is longer than 4/3 of its target, except where every split of it would make an unacceptable face
    (see the module docstring) or it is a boundary edge kept by ``boundary="fixed"``; edges shorter than 4/5 of their
    target remain where a collapse was refused or the relaxation shortened them.

    Args:
        vertices: input positions, shape (n, 3), real.
        faces: input triangles, shape (m, 3), integer, an oriented manifold (each edge in one or two faces, the faces
            around each vertex one fan), every vertex used, without zero-area faces.
        target_length: the target edge length L, in the units of ``vertices``: a positive scalar, or a positive array
            of shape (n,) giving L at each input vertex (interpolated over the surface; an edge's target is the mean
            of its ends').
        iterations: rounds of (split, collapse, flip, relax), >= 0.
        boundary: ``"slide"`` (boundary edges are remeshed along the boundary curves, whose vertices slide along the
            input's boundary) or ``"fixed"`` (boundary vertices and edges are kept exactly: not moved, split,
            collapsed or flipped).
        features: extra curves to keep: input edges as vertex pairs, integer, shape (k, 2), or None.
        feature_angle: also keep every interior edge whose dihedral angle (between the normals of its two faces)
            exceeds this many degrees, in (0, 180); None: none.
        corner_angle: in degrees, in [0, 180]: a curve vertex whose two curve edges turn by more than this is a corner.
        vertex_data: name -> per-vertex values, real, shape (n, ...): positions, velocities, rest shapes, UVs, ...;
            interpolated in float64 (integers too).
        face_data: name -> per-face values, any dtype, shape (m, ...).

    Returns:
        A :class:`RemeshResult`.

    Raises:
        MeshError: the input is not a valid oriented manifold mesh, or has zero-area faces, or a feature is not an
            edge of it.
        ValueError: a bad target length, option or data array (the message names what was expected and what came).
    """
    mesh = TriMesh(vertices, faces, source=_SOURCE + " input")
    check_manifold_fans(mesh)
    check_nondegenerate(mesh.source, mesh.vertices, faces=mesh.faces, needs="the remesher compares face normals")
    n0, m0 = mesh.vertex_count, mesh.face_count
    target = _check_target(target_length, n0)
    if isinstance(iterations, bool) or not isinstance(iterations, numbers.Integral) or iterations < 0:
        raise ValueError(f"{_SOURCE}: iterations={iterations!r}; expected an integer >= 0")
    if boundary not in BOUNDARY_MODES:
        raise ValueError(f"{_SOURCE}: boundary={boundary!r} is not an option; expected one of {BOUNDARY_MODES}")
    if feature_angle is not None and not (isinstance(feature_angle, numbers.Real) and 0 < feature_angle < 180):
        raise ValueError(f"{_SOURCE}: feature_angle={feature_angle!r}; expected None or degrees in (0, 180)")
    if not (isinstance(corner_angle, numbers.Real) and 0 <= corner_angle <= 180):
        raise ValueError(f"{_SOURCE}: corner_angle={corner_angle!r}; expected degrees in [0, 180]")
    vnames, vcols, vshapes = _check_vertex_data(vertex_data, n0)
    fdata = _check_face_data(face_data, m0)

    state = _State.from_input(mesh, target, vcols, boundary, features, feature_angle, corner_angle)
    for _ in range(iterations):
        _run_rounds(state, _split_round)
        _run_rounds(state, _collapse_round)
        _run_rounds(state, _flip_round)
        _relax(state)
    _run_rounds(state, lambda s: _split_round(s, project=True), to_the_end=True)

    exact = _unchanged_input_faces(state, mesh.faces)
    check_result(state.x, state.f, state.nref, kept=exact >= 0)
    face_map = state.surface.closest(state.x[state.f].mean(axis=1))[1]
    face_map[exact >= 0] = exact[exact >= 0]
    data, offset = {}, 0
    for name, shape in zip(vnames, vshapes):
        width = math.prod(shape)
        data[name] = np.ascontiguousarray(state.data[:, offset:offset + width]).reshape((state.x.shape[0],) + shape)
        offset += width
    return RemeshResult(
        vertices=state.x,
        faces=state.f.astype(np.int32),
        vertex_data=data,
        face_data={name: values[face_map] for name, values in fdata.items()},
        vertex_map=state.origin.astype(np.int32),
        moved=state.moved.copy(),
        face_map=face_map.astype(np.int32),
        operation_counts=dict(state.counts),
    )


# ---------------------------------------------------------------------------------------------- validation


def _check_target(target_length, n: int) -> np.ndarray:
    """The target length at each input vertex, float64 (n,); ValueError for a non-positive or non-finite one."""
    try:
        t = np.asarray(target_length, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{_SOURCE}: target_length could not be read as numbers ({exc}); expected a positive "
                         f"scalar or an array of shape ({n},)") from None
    if t.ndim == 0:
        if not (np.isfinite(t) and t > 0):
            raise ValueError(f"{_SOURCE}: target_length={float(t)!r}; expected a finite length > 0")
        return np.full(n, float(t))
    if t.shape != (n,):
        raise ValueError(f"{_SOURCE}: target_length has shape {t.shape}; expected a scalar or shape ({n},) "
                         f"(one length per input vertex)")
    bad = np.flatnonzero(~(np.isfinite(t) & (t > 0)))
    if bad.size:
        raise ValueError(f"{_SOURCE}: target_length at vertices {first_items(bad)} is not a finite length > 0 "
                         f"(vertex {bad[0]}: {t[bad[0]]!r}); expected positive finite lengths")
    return t.copy()


def _check_vertex_data(vertex_data, n: int):
    """Names, the columns (n, D) float64 of all arrays side by side, and each array's trailing shape."""
    if vertex_data is None:
        return [], np.zeros((n, 0)), []
    if not isinstance(vertex_data, dict):
        raise ValueError(f"{_SOURCE}: vertex_data is a {type(vertex_data).__name__}; expected a dict name -> array")
    names, cols, shapes = [], [], []
    for name, values in vertex_data.items():
        a = np.asarray(values)
        if a.ndim == 0 or a.shape[0] != n:
            raise ValueError(f"{_SOURCE}: vertex_data[{name!r}] has shape {a.shape}; expected ({n}, ...) "
                             f"(one row per input vertex)")
        if a.dtype == bool or not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
            raise ValueError(f"{_SOURCE}: vertex_data[{name!r}] has dtype {a.dtype}; expected real numbers "
                             f"(they are interpolated)")
        names.append(name)
        shapes.append(a.shape[1:])
        cols.append(a.reshape(n, -1).astype(np.float64))
    return names, np.concatenate(cols, axis=1) if cols else np.zeros((n, 0)), shapes


def _check_face_data(face_data, m: int) -> dict:
    if face_data is None:
        return {}
    if not isinstance(face_data, dict):
        raise ValueError(f"{_SOURCE}: face_data is a {type(face_data).__name__}; expected a dict name -> array")
    out = {}
    for name, values in face_data.items():
        a = np.asarray(values)
        if a.ndim == 0 or a.shape[0] != m:
            raise ValueError(f"{_SOURCE}: face_data[{name!r}] has shape {a.shape}; expected ({m}, ...) "
                             f"(one row per input face)")
        out[name] = a
    return out


def check_manifold_fans(mesh: TriMesh) -> None:
    """Refuses a vertex whose faces form more than one fan (a bow-tie), which `TriMesh` does not check.

    The corners of each vertex are linked across each interior edge at that vertex; a vertex is manifold when its
    corners form one connected component.

    Raises:
        MeshError: naming the first few such vertices and how many fans the first has.
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    f = mesh.faces.astype(np.int64)
    m = f.shape[0]
    ef = mesh.edge_faces.astype(np.int64)
    ev = mesh.edges[mesh.interior_edges].astype(np.int64)
    rows, cols = [], []
    for end in range(2):  # link the corners of each end of an interior edge in its two faces
        v = ev[:, end]
        k0 = np.argmax(f[ef[:, 0]] == v[:, None], axis=1)
        k1 = np.argmax(f[ef[:, 1]] == v[:, None], axis=1)
        rows.append(3 * ef[:, 0] + k0)
        cols.append(3 * ef[:, 1] + k1)
    r, c = np.concatenate(rows), np.concatenate(cols)
    graph = coo_matrix((np.ones(r.size, dtype=np.int8), (r, c)), shape=(3 * m, 3 * m))
    _, label = connected_components(graph, directed=False)
    corner_vertex = f.ravel()
    pairs = np.unique(corner_vertex.astype(np.int64) << _KEY_SHIFT | label.astype(np.int64))
    fans = np.bincount(pairs >> _KEY_SHIFT, minlength=mesh.vertex_count)
    bad = np.flatnonzero(fans > 1)
    if bad.size:
        raise MeshError(
            f"{mesh.source}: non-manifold vertices {first_items(bad)}: their faces form more than one fan (vertex "
            f"{bad[0]} joins {fans[bad[0]]} fans that share no edge); expected the faces around each vertex to form "
            f"one disk or one open fan"
        )


def check_result(x: np.ndarray, f: np.ndarray, nref: np.ndarray, kept=None) -> None:
    """Checks a remeshed mesh: manifold, no zero-area face, no face flipped against the input surface.

    A face is flipped when its normal points away from the sum of the input's normals at its corners (the input's
    area-weighted vertex normals interpolated where each corner lies on the input). Faces of the input kept as they
    were (``kept``) are not tested for that.

    Args:
        x: positions, float64 (n, 3).
        f: triangles, int (m, 3).
        nref: the input's normal at each vertex, float64 (n, 3).
        kept: bool (m,), the faces that are input faces unchanged; None: none.

    Raises:
        MeshError: naming the offending edges (as vertex pairs), vertices or faces.
    """
    source = _SOURCE + " result"
    mesh = TriMesh(x, f, source=source)  # edge-manifold, oriented, every vertex used
    check_manifold_fans(mesh)
    check_nondegenerate(source, x, faces=f)
    normal = np.cross(x[f[:, 1]] - x[f[:, 0]], x[f[:, 2]] - x[f[:, 0]])
    flipped = ~_on_input_side(normal, nref, f, each=False)
    if kept is not None:
        flipped &= ~kept
    flipped = np.flatnonzero(flipped)
    if flipped.size:
        b = flipped[0]
        side = nref[f[b]].sum(axis=0)
        raise MeshError(
            f"{source}: faces {first_items(flipped)} are flipped against the input surface (face {b} = "
            f"{f[b].tolist()} has normal {_unit(normal[b]).round(3).tolist()}, the input's normal there "
            f"{_unit(side).round(3).tolist()}); expected normals on the input's side"
        )


# ---------------------------------------------------------------------------------------------- geometry helpers


def _dot(a, b):
    return np.einsum("ij,ij->i", a, b)


def _unit(v):
    n = np.linalg.norm(v, axis=-1, keepdims=True)
    return np.divide(v, n, out=np.zeros_like(v), where=n > 0)


def _keys(a, b):
    return np.minimum(a, b).astype(np.int64) << _KEY_SHIFT | np.maximum(a, b).astype(np.int64)


def _find(sorted_keys, keys):
    """Index of each key in ``sorted_keys`` and whether it is there."""
    pos = np.searchsorted(sorted_keys, keys)
    pos = np.minimum(pos, max(sorted_keys.size - 1, 0))
    found = sorted_keys[pos] == keys if sorted_keys.size else np.zeros(keys.shape, dtype=bool)
    return pos, found


def _face_geometry(x, f):
    """(normal (unnormalised), twice area, squared longest edge) per face."""
    e1 = x[f[:, 1]] - x[f[:, 0]]
    e2 = x[f[:, 2]] - x[f[:, 0]]
    e3 = e2 - e1
    n = np.cross(e1, e2)
    return n, np.sqrt(_dot(n, n)), np.maximum(np.maximum(_dot(e1, e1), _dot(e2, e2)), _dot(e3, e3))


def _acceptable(nref: np.ndarray, x: np.ndarray, faces: np.ndarray, *old_normals: np.ndarray) -> np.ndarray:
    """Which changed faces may be made: not degenerate, with a normal on the side of the input's normal at each of its
    corners (so also on the side of their sum, which `check_result` tests), and turned by less than 90 degrees from
    each of ``old_normals`` (the faces they replace). A vertex carried across a thin part of the input to its other
    side fails the first test.

    Args:
        nref: the input's unit normal at each vertex (interpolated where the vertex lies), (n, 3).
        x: positions, (n, 3).
        faces: the new faces, int (k, 3).
        old_normals: normals (k, 3) to compare with, any length.

    Returns:
        bool (k,).
    """
    normal, twice, longest_sq = _face_geometry(x, faces)
    ok = (twice > DEGENERATE_RTOL * longest_sq) & _on_input_side(normal, nref, faces, each=True)
    for old in old_normals:
        ok &= _dot(normal, old) > 0
    return ok


def _on_input_side(normal: np.ndarray, nref: np.ndarray, faces: np.ndarray, *, each: bool) -> np.ndarray:
    """Whether face normals (k, 3) point to the side of the input's normals at their corners ``nref[faces]``: of the
    normal at each corner (``each``), or of their sum."""
    if each:
        return (_dot(normal, nref[faces[:, 0]]) > 0) & (_dot(normal, nref[faces[:, 1]]) > 0) & (
            _dot(normal, nref[faces[:, 2]]) > 0)
    return _dot(normal, nref[faces[:, 0]] + nref[faces[:, 1]] + nref[faces[:, 2]]) > 0


def _triangle_weights(d1, d2, d00, d01, d11):
    """Barycentric weights (v, w) on corners b and c of the point of triangles (a, b, c) closest to points p, from
    ``d1 = ab.ap``, ``d2 = ac.ap`` and ``d00 = ab.ab``, ``d01 = ab.ac``, ``d11 = ac.ac`` (all (k,)).

    Ericson, Real-Time Collision Detection, 5.1.5: the Voronoi region of p (a vertex, an edge or the face) decides;
    the other dot products follow from these five (``bp = ap - ab``, ``cp = ap - ac``).
    """
    d3, d4, d5, d6 = d1 - d00, d2 - d01, d1 - d01, d2 - d11  # ab.bp, ac.bp, ab.cp, ac.cp
    va, vb, vc = d3 * d6 - d5 * d4, d5 * d2 - d1 * d6, d1 * d4 - d3 * d2
    with np.errstate(divide="ignore", invalid="ignore"):
        denom = va + vb + vc
        v, w = vb / denom, vc / denom  # inside the face
        t_bc = (d4 - d3) / ((d4 - d3) + (d5 - d6))
        t_ac = d2 / (d2 - d6)
        t_ab = d1 / (d1 - d3)
    # later regions take precedence, as the early returns of Ericson's order (A, B, AB, C, AC, BC, face)
    regions = (
        ((va <= 0) & (d4 - d3 >= 0) & (d5 - d6 >= 0), 1 - t_bc, t_bc),
        ((vb <= 0) & (d2 >= 0) & (d6 <= 0), 0.0, t_ac),
        ((d6 >= 0) & (d5 <= d6), 0.0, 1.0),
        ((vc <= 0) & (d1 >= 0) & (d3 <= 0), t_ab, 0.0),
        ((d3 >= 0) & (d4 <= d3), 1.0, 0.0),
        ((d1 <= 0) & (d2 <= 0), 0.0, 0.0),
    )
    for mask, vv, ww in regions:
        v = np.where(mask, vv, v)
        w = np.where(mask, ww, w)
    return v, w


class _Closest:
    """Exact closest points on a fixed set of triangles or segments, each optionally labelled.

    A k-d tree holds points that cover every element (sub-triangle centroids or sub-segment midpoints, no point of an
    element farther than `radius` from one of its points). The elements of a query's k nearest tree points give a
    distance d; that is the closest when the k-th tree point is at least d + radius away, otherwise more tree points
    are tried (`_QUERY_COUNTS`), then all within d + radius. A label is a fourth coordinate far apart per label, so a
    query with a label only finds elements with that label.
    """

    def __init__(self, x: np.ndarray, elements: np.ndarray, labels: np.ndarray | None = None):
        from scipy.spatial import cKDTree

        self.elements = elements
        k = elements.shape[1]
        c = x[elements]  # (m, k, 3)
        self.a, self.ab = c[:, 0], c[:, 1] - c[:, 0]
        self.d00 = _dot(self.ab, self.ab)
        sides = [np.sqrt(self.d00)]
        if k == 3:
            self.ac = c[:, 2] - c[:, 0]
            self.d01, self.d11 = _dot(self.ab, self.ac), _dot(self.ac, self.ac)
            sides += [np.sqrt(self.d11), np.linalg.norm(c[:, 2] - c[:, 1], axis=1)]
            self.normals = _unit(np.cross(self.ab, self.ac))
        longest = np.max(sides, axis=0)
        spacing = max(0.5 * float(np.median(longest)), np.finfo(float).tiny)
        parts = np.clip(np.ceil(longest / spacing), 1, 64).astype(np.int64)
        points, owner = [], []
        for s in np.unique(parts):
            which = np.flatnonzero(parts == s)
            w = _cover_weights(int(s), k)  # (p, k)
            points.append(np.einsum("pk,mkd->mpd", w, c[which]).reshape(-1, 3))
            owner.append(np.repeat(which, w.shape[0]))
        # a sub-triangle's centroid is within 2/3 of its longest side of its corners; a sub-segment's midpoint within 1/2
        self.radius = float(np.max(longest / parts)) * (2.0 / 3.0 if k == 3 else 0.5) * (1 + 1e-9)
        points = np.concatenate(points)
        self.owner = np.concatenate(owner)
        self.labelled = labels is not None
        self.labels = labels
        if self.labelled:
            self.label_gap = 10.0 * (float(np.ptp(x, axis=0).max()) + 1.0)
            points = np.concatenate([points, (labels[self.owner] * self.label_gap)[:, None]], axis=1)
        self.tree = cKDTree(points)

    def _weights(self, ap, elem):
        """Weights (v, w) on the second and third corner of the closest points and squared distances."""
        ab = self.ab[elem]
        d1, d00 = _dot(ab, ap), self.d00[elem]
        pp = _dot(ap, ap)
        if self.elements.shape[1] == 2:
            v = np.clip(d1 / np.maximum(d00, np.finfo(float).tiny), 0.0, 1.0)
            return v, np.zeros_like(v), pp - 2 * v * d1 + v * v * d00
        d2, d01, d11 = _dot(self.ac[elem], ap), self.d01[elem], self.d11[elem]
        v, w = _triangle_weights(d1, d2, d00, d01, d11)
        return v, w, pp - 2 * (v * d1 + w * d2) + v * v * d00 + 2 * v * w * d01 + w * w * d11

    def closest(self, q: np.ndarray, labels: np.ndarray | None = None):
        """The closest points to ``q`` (k, 3): (points (k, 3), element index (k,), weights (k, 3) on its corners).

        ``labels`` (k,) restricts each query to the elements of its label (required when the elements are labelled).
        A segment's weights are on its corners (a, b, b), the last 0.
        """
        nq = q.shape[0]
        out = (np.full(nq, np.inf), np.zeros(nq, dtype=np.int64), np.zeros(nq), np.zeros(nq))  # distance, element, v, w
        qq = np.concatenate([q, (labels * self.label_gap)[:, None]], axis=1) if self.labelled else q
        total = self.owner.size
        pending, seen = np.arange(nq), 0
        for k in _QUERY_COUNTS:  # more tree points for the queries not settled yet
            k = min(k, total)
            if pending.size == 0 or k <= seen:
                break
            dist, idx = self.tree.query(qq[pending], k=k)
            dist, idx = dist.reshape(pending.size, k), idx.reshape(pending.size, k)
            elem = self.owner[idx[:, seen:]]  # (pending, new points)
            who = np.repeat(pending, elem.shape[1])
            v, w, d2 = self._weights(q[who] - self.a[elem.ravel()], elem.ravel())
            if self.labelled:  # a label with few tree points lets the nearest points of other labels in
                d2[self.labels[elem.ravel()] != labels[who]] = np.inf
            pick = np.argmin(d2.reshape(elem.shape), axis=1) + np.arange(pending.size) * elem.shape[1]
            self._take(q, pending, elem.ravel()[pick], v[pick], w[pick], out)
            seen = k
            if k == total:
                pending = pending[:0]
                break
            pending = pending[dist[:, -1] < out[0][pending] + self.radius]  # an element not seen may still be closer
        if pending.size:  # the last few: every tree point within reach
            near = self.tree.query_ball_point(qq[pending], out[0][pending] + self.radius)
            counts = np.fromiter((len(n) for n in near), dtype=np.int64, count=pending.size)
            elem = self.owner[np.fromiter((i for n in near for i in n), dtype=np.int64, count=int(counts.sum()))]
            who = np.repeat(pending, counts)
            v, w, d2 = self._weights(q[who] - self.a[elem], elem)
            if self.labelled:
                d2[self.labels[elem] != labels[who]] = np.inf
            order = np.lexsort((d2, who))  # per query, nearest first
            pick = order[np.r_[True, who[order][1:] != who[order][:-1]]]
            self._take(q, who[pick], elem[pick], v[pick], w[pick], out)
        _, elem, v, w = out
        return self._point(elem, v, w), elem, np.stack([1 - v - w, v, w], axis=1)

    def _point(self, elem, v, w):
        p = self.a[elem] + v[:, None] * self.ab[elem]
        return p + w[:, None] * self.ac[elem] if self.elements.shape[1] == 3 else p

    def _take(self, q, who, elem, v, w, out):
        """Keeps, for queries ``who``, the candidate ``elem`` at weights (v, w) where it is nearer than the best."""
        d = np.linalg.norm(self._point(elem, v, w) - q[who], axis=1)
        better = d < out[0][who]
        who = who[better]
        for slot, value in zip(out, (d, elem, v, w)):
            slot[who] = value[better]


def _cover_weights(s: int, k: int) -> np.ndarray:
    """Barycentric weights (p, k) of the sub-triangle centroids (k = 3) or sub-segment midpoints (k = 2) of an
    element cut ``s`` times along each side."""
    if k == 2:
        t = (np.arange(s) + 0.5) / s
        return np.stack([1 - t, t], axis=1)
    i, j = np.meshgrid(np.arange(s), np.arange(s), indexing="ij")
    up = i + j <= s - 1
    down = i + j <= s - 2
    u = np.concatenate([(i[up] + 1 / 3) / s, (i[down] + 2 / 3) / s])
    v = np.concatenate([(j[up] + 1 / 3) / s, (j[down] + 2 / 3) / s])
    return np.stack([1 - u - v, u, v], axis=1)


# ---------------------------------------------------------------------------------------------- the working mesh


FREE, CURVE, FIXED = 0, 1, 2  # vertex kinds: moves on the surface, slides along a curve, never moves nor goes


class _Topology:
    """One round's connectivity of the working mesh: TriMesh's edges plus each edge's faces and opposite corners
    (-1 where a boundary edge has no face on that side), valences, vertex -> faces and vertex -> neighbours lists."""

    def __init__(self, x, f):
        mesh = TriMesh(x, f, source=_SOURCE + " working mesh")
        self.edges = mesh.edges.astype(np.int64)
        self.keys = _keys(self.edges[:, 0], self.edges[:, 1])  # ascending: edges are sorted rows with lo < hi
        n, m, ne = x.shape[0], f.shape[0], self.edges.shape[0]
        self.face_faces = np.full((ne, 2), -1, dtype=np.int64)  # [f0, f1]: f0 runs edges[e,0] -> edges[e,1]
        self.opposite = np.full((ne, 2), -1, dtype=np.int64)  # the corner of f0 / f1 opposite the edge
        interior = mesh.interior_edges
        self.face_faces[interior] = mesh.edge_faces
        self.opposite[interior] = mesh.edge_diamonds[:, 2:]
        bnd = mesh.boundary_edges
        half = np.empty(ne, dtype=np.int64)
        half[mesh.face_edges.ravel()] = np.arange(3 * m)  # some half-edge of each edge (the only one of a boundary edge)
        h = half[bnd]
        g, k = h // 3, h % 3
        side = np.where(f[g, k] == self.edges[bnd, 0], 0, 1)
        self.face_faces[bnd, side] = g
        self.opposite[bnd, side] = f[g, (k + 2) % 3]
        self.face_count = (self.face_faces >= 0).sum(axis=1)
        self.valence = np.bincount(self.edges.ravel(), minlength=n)
        self.on_boundary = np.zeros(n, dtype=bool)
        self.on_boundary[self.edges[bnd].ravel()] = True
        self._f = f

    @functools.cached_property
    def vf_start(self) -> np.ndarray:
        """Where each vertex's faces start in `vf` (n + 1,)."""
        return np.concatenate([[0], np.cumsum(np.bincount(self._f.ravel(), minlength=self.valence.size))])

    @functools.cached_property
    def vf(self) -> np.ndarray:
        """The faces of each vertex v: ``vf[vf_start[v]:vf_start[v + 1]]``."""
        return _grouped(self._f.ravel()) // 3

    @functools.cached_property
    def vv_start(self) -> np.ndarray:
        """Where each vertex's neighbours start in `vv` (n + 1,)."""
        return np.concatenate([[0], np.cumsum(self.valence)])

    @functools.cached_property
    def vv(self) -> np.ndarray:
        """The neighbours of each vertex v: ``vv[vv_start[v]:vv_start[v + 1]]``."""
        e = self.edges
        return np.concatenate([e[:, 1], e[:, 0]])[_grouped(np.concatenate([e[:, 0], e[:, 1]]))]

    def has_edge(self, a, b):
        return _find(self.keys, _keys(a, b))[1]


def _grouped(values: np.ndarray) -> np.ndarray:
    """The stable argsort of non-negative int ``values`` (< 2**31), by one sort of packed (value, index) keys."""
    packed = np.sort(values.astype(np.int64) << _KEY_SHIFT | np.arange(values.size, dtype=np.int64))
    return packed & _LOW


def _ragged(start, items, rows):
    """(owner, item): every item of CSR rows ``rows`` (owner = position in ``rows``)."""
    s = start[rows]
    count = start[rows + 1] - s
    owner = np.repeat(np.arange(rows.size), count)
    pos = np.arange(owner.size) - np.repeat(np.cumsum(count) - count, count) + np.repeat(s, count)
    return owner, items[pos]


def _independent(priority, keys, owner, claims, claim_count):
    """A maximal set of candidates with pairwise disjoint claims, higher priorities first.

    Each pass gives every claimed item to its highest-ranked candidate still in play; the candidates that win all their
    claims are taken, and every candidate claiming an item they took leaves play. Priorities are coarse levels; within
    a level a hash of each candidate's edge key ranks, so that winners spread over the mesh (ranking by a smooth
    quantity would chain neighbours and take one per pass).

    Args:
        priority: level of each candidate (k,), higher first.
        keys: the candidate's edge key (k,), int64.
        owner: the candidate of each claim (p,).
        claims: the item of each claim (p,), in [0, claim_count).
        claim_count: the number of items.

    Returns:
        bool (k,): the candidates taken.
    """
    k = priority.size
    rank = np.empty(k, dtype=np.int64)
    rank[np.lexsort((_scramble(keys), priority))] = np.arange(k)
    taken = np.zeros(k, dtype=bool)
    used = np.zeros(claim_count, dtype=bool)
    claim_rank = rank[owner]
    while owner.size:
        winner = np.full(claim_count, -1, dtype=np.int64)
        np.maximum.at(winner, claims, claim_rank)
        lost = np.zeros(k, dtype=bool)
        lost[owner[winner[claims] != claim_rank]] = True
        win = np.zeros(k, dtype=bool)
        win[owner] = True
        win &= ~lost
        taken |= win
        used[claims[win[owner]]] = True
        out = np.zeros(k, dtype=bool)
        out[owner[used[claims]]] = True  # a winner, or a candidate that needs an item a winner took
        stay = ~out[owner]
        owner, claims, claim_rank = owner[stay], claims[stay], claim_rank[stay]
    return taken


def _scramble(keys):
    """A fixed pseudo-random permutation of int64 keys (a multiplicative hash), for tie-breaks."""
    with np.errstate(over="ignore"):
        h = keys.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    return h ^ (h >> np.uint64(29))


def _all_per(owner, ok, count):
    """Per candidate: all of its rows ``ok``."""
    bad = np.zeros(count, dtype=bool)
    bad[owner[~ok]] = True
    return ~bad


@dataclasses.dataclass
class _State:
    """The working mesh, its per-vertex bookkeeping and its constrained (curve) edges."""

    x: np.ndarray  # positions (n, 3)
    f: np.ndarray  # triangles int64 (m, 3)
    origin: np.ndarray  # input vertex of each vertex, -1 for split vertices
    moved: np.ndarray  # position differs from the input vertex's
    kind: np.ndarray  # FREE, CURVE or FIXED
    curve: np.ndarray  # curve label of CURVE vertices, -1 otherwise
    target: np.ndarray  # target length at each vertex
    data: np.ndarray  # vertex data columns (n, D)
    nref: np.ndarray  # the input's unit vertex normals interpolated where each vertex lies (n, 3)
    ckeys: np.ndarray  # sorted keys of the constrained edges
    clabel: np.ndarray  # curve label of each constrained edge; -1: a fixed edge (never split or collapsed)
    input_f: np.ndarray  # input triangles
    input_target: np.ndarray
    input_data: np.ndarray
    input_nref: np.ndarray
    surface: _Closest
    curves: _Closest | None
    counts: dict
    refused: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # see _collapse_round

    @classmethod
    def from_input(cls, mesh, target, data, boundary, features, feature_angle, corner_angle):
        x = mesh.vertices.copy()
        f = mesh.faces.astype(np.int64)
        n = x.shape[0]
        edges = mesh.edges.astype(np.int64)
        curve_edges = [mesh.boundary_edges] if boundary == "slide" else []
        if features is not None:
            curve_edges.append(_feature_edges(mesh, features))
        if feature_angle is not None:
            normals = mesh.face_normals()
            ef = mesh.edge_faces
            cos = _dot(normals[ef[:, 0]], normals[ef[:, 1]])
            curve_edges.append(mesh.interior_edges[cos < math.cos(math.radians(feature_angle))])
        curve_edges = np.unique(np.concatenate(curve_edges)) if curve_edges else np.zeros(0, dtype=np.int64)
        fixed_edges = mesh.boundary_edges if boundary == "fixed" else np.zeros(0, dtype=np.int64)
        curve_edges = np.setdiff1d(curve_edges, fixed_edges)

        kind = np.full(n, FREE, dtype=np.int8)
        ce = edges[curve_edges]
        degree = np.bincount(ce.ravel(), minlength=n)
        kind[degree > 0] = CURVE
        kind[(degree == 1) | (degree > 2)] = FIXED
        kind[edges[fixed_edges].ravel()] = FIXED
        # a curve vertex where its two curve edges turn by more than corner_angle is a corner
        cv = np.flatnonzero(kind == CURVE)
        if cv.size:
            order = np.argsort(ce.ravel(), kind="stable")
            ends = ce[order // 2, 1 - order % 2]  # the other end of each (vertex, curve edge) pair, by vertex
            start = np.concatenate([[0], np.cumsum(degree)])
            nb = ends[start[cv][:, None] + np.arange(2)]  # the two curve neighbours of each curve vertex
            u = _unit(x[cv] - x[nb[:, 0]])
            w = _unit(x[nb[:, 1]] - x[cv])
            kind[cv[_dot(u, w) < math.cos(math.radians(corner_angle))]] = FIXED
        label = _curve_labels(ce, kind)
        curve = np.full(n, -1, dtype=np.int64)
        free_ends = kind[ce] == CURVE
        curve[ce[free_ends]] = np.broadcast_to(label[:, None], ce.shape)[free_ends]

        ckeys = np.concatenate([_keys(ce[:, 0], ce[:, 1]), _keys(*edges[fixed_edges].T)])
        clabel = np.concatenate([label, np.full(fixed_edges.size, -1, dtype=np.int64)])
        order = np.argsort(ckeys)
        nref = mesh.vertex_normals()
        return cls(
            x=x, f=f, origin=np.arange(n, dtype=np.int64), moved=np.zeros(n, dtype=bool), kind=kind, curve=curve,
            target=target.copy(), data=data.copy(), nref=nref.copy(), ckeys=ckeys[order], clabel=clabel[order],
            input_f=f.copy(), input_target=target, input_data=data, input_nref=nref, surface=_Closest(x, f),
            curves=_Closest(x, ce, labels=label.astype(np.float64)) if ce.shape[0] else None,
            counts={"splits": 0, "collapses": 0, "flips": 0, "relaxed": 0},
        )

    def constrained(self, keys):
        """(is constrained, label: -1 fixed edge, -2 unconstrained) of edges given by key."""
        pos, found = _find(self.ckeys, keys)
        return found, np.where(found, self.clabel[pos] if self.clabel.size else -2, -2)

    def curve_neighbors(self) -> np.ndarray:
        """The two neighbours along its curve of each CURVE vertex (n, 2), -1 for other vertices."""
        n = self.x.shape[0]
        live = self.clabel >= 0
        lo, hi = self.ckeys[live] >> _KEY_SHIFT, self.ckeys[live] & _LOW
        ends = np.concatenate([lo, hi])
        other = np.concatenate([hi, lo])
        order = np.argsort(ends, kind="stable")
        ends, other = ends[order], other[order]
        nb = np.full((n, 2), -1, dtype=np.int64)
        first = np.r_[True, ends[1:] != ends[:-1]]
        slot = np.arange(ends.size) - np.maximum.accumulate(np.where(first, np.arange(ends.size), 0))
        keep = (slot < 2) & (self.kind[ends] == CURVE)
        nb[ends[keep], slot[keep]] = other[keep]
        return nb


def _feature_edges(mesh: TriMesh, features) -> np.ndarray:
    """Indices into ``mesh.edges`` of the ``features`` vertex pairs; MeshError naming a pair that is not an edge."""
    fe = np.asarray(features)
    n = mesh.vertex_count
    if fe.ndim != 2 or fe.shape[1] != 2 or (fe.size and not np.issubdtype(fe.dtype, np.integer)):
        raise ValueError(f"{_SOURCE}: features have shape {fe.shape} and dtype {fe.dtype}; expected integer vertex "
                         f"pairs of shape (k, 2)")
    fe = fe.astype(np.int64)
    out = np.flatnonzero(((fe < 0) | (fe >= n)).any(axis=1))
    if out.size:
        raise MeshError(f"{_SOURCE}: features {first_items(out)} use vertex indices out of range (feature {out[0]} "
                        f"= {fe[out[0]].tolist()}); expected 0 <= index < {n}")
    keys = _keys(mesh.edges[:, 0], mesh.edges[:, 1])
    pos, found = _find(keys, _keys(fe[:, 0], fe[:, 1]))
    bad = np.flatnonzero(~found)
    if bad.size:
        raise MeshError(f"{_SOURCE}: features {first_items(bad)} are not edges of the mesh (feature {bad[0]} = "
                        f"{fe[bad[0]].tolist()}); expected vertex pairs joined by an edge")
    return pos


def _curve_labels(ce: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """One label per curve: curve edges joined through CURVE vertices (corners cut curves apart), int64 (k,)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    k = ce.shape[0]
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    ends = ce.ravel()
    edge = np.repeat(np.arange(k), 2)
    keep = kind[ends] == CURVE
    order = np.argsort(ends[keep], kind="stable")
    e_sorted = edge[keep][order]  # a CURVE vertex has two curve edges: consecutive here
    graph = coo_matrix((np.ones(e_sorted.size // 2), (e_sorted[0::2], e_sorted[1::2])), shape=(k, k))
    return connected_components(graph, directed=False)[1].astype(np.int64)


# ---------------------------------------------------------------------------------------------- the four steps


def _run_rounds(state: _State, one_round, *, to_the_end: bool = False) -> None:
    """Runs rounds of one step until a round does nothing or (unless ``to_the_end``) does less than `_TAIL` of the
    first round's operations: the few left wait for the next iteration, as a sequential sweep would leave them."""
    first = None
    state.refused = state.refused[:0]
    for _ in range(_MAX_ROUNDS):
        done = one_round(state)
        first = done if first is None else first
        if done == 0 or (not to_the_end and done < _TAIL * first):
            return


def _edge_targets(state, edges):
    return 0.5 * (state.target[edges[:, 0]] + state.target[edges[:, 1]])


def _split_round(s: _State, project: bool = False) -> int:
    """Splits an independent set of the edges longer than 4/3 of their target at their midpoints (``project``: and
    projects the new vertices to the input)."""
    t = _Topology(s.x, s.f)
    e = t.edges
    length = np.linalg.norm(s.x[e[:, 1]] - s.x[e[:, 0]], axis=1)
    ratio = length / _edge_targets(s, e)
    is_c, label = s.constrained(t.keys)
    cand = np.flatnonzero((ratio > SPLIT_RATIO) & (label != -1))
    if cand.size == 0:
        return 0
    cand = cand[_split_ok(s, t, cand)]
    if cand.size == 0:
        return 0
    ff = t.face_faces[cand]
    owner = np.repeat(np.arange(cand.size), 2)
    claims = ff.ravel()
    valid = claims >= 0
    level = np.floor(ratio[cand] * _LEVELS)  # longest first, by levels
    sel = cand[_independent(level, t.keys[cand], owner[valid], claims[valid], s.f.shape[0])]

    a, b = e[sel, 0], e[sel, 1]
    n, k = s.x.shape[0], sel.size
    mid = np.arange(n, n + k)
    s.x = np.concatenate([s.x, 0.5 * (s.x[a] + s.x[b])])
    s.data = np.concatenate([s.data, 0.5 * (s.data[a] + s.data[b])])
    s.target = np.concatenate([s.target, 0.5 * (s.target[a] + s.target[b])])
    s.nref = np.concatenate([s.nref, 0.5 * (s.nref[a] + s.nref[b])])
    s.origin = np.concatenate([s.origin, np.full(k, -1, dtype=np.int64)])
    s.moved = np.concatenate([s.moved, np.ones(k, dtype=bool)])
    s.kind = np.concatenate([s.kind, np.where(is_c[sel], CURVE, FREE).astype(np.int8)])
    s.curve = np.concatenate([s.curve, np.where(is_c[sel], label[sel], -1)])
    f0, f1 = t.face_faces[sel, 0], t.face_faces[sel, 1]
    c, d = t.opposite[sel, 0], t.opposite[sel, 1]
    h0, h1 = f0 >= 0, f1 >= 0
    s.f[f0[h0]] = np.stack([a[h0], mid[h0], c[h0]], axis=1)  # (a, b, c) -> (a, m, c) + (m, b, c)
    s.f[f1[h1]] = np.stack([b[h1], mid[h1], d[h1]], axis=1)  # (b, a, d) -> (b, m, d) + (m, a, d)
    s.f = np.concatenate([s.f, np.stack([mid[h0], b[h0], c[h0]], axis=1), np.stack([mid[h1], a[h1], d[h1]], axis=1)])
    cs = is_c[sel]
    if cs.any():
        keep = ~np.isin(s.ckeys, _keys(a[cs], b[cs]))
        keys = np.concatenate([s.ckeys[keep], _keys(a[cs], mid[cs]), _keys(mid[cs], b[cs])])
        labels = np.concatenate([s.clabel[keep], label[sel][cs], label[sel][cs]])
        order = np.argsort(keys)
        s.ckeys, s.clabel = keys[order], labels[order]
    s.counts["splits"] += k
    if project:
        _move(s, mid, s.x[mid])
    return k


def _split_ok(s: _State, t: _Topology, cand: np.ndarray) -> np.ndarray:
    """Which splits of edges ``cand`` at their midpoints give acceptable faces (bool per candidate): the halves keep
    their face's plane, but the midpoint's input normal is the mean of the ends'."""
    a, b = t.edges[cand, 0], t.edges[cand, 1]
    x = np.concatenate([s.x, 0.5 * (s.x[a] + s.x[b])])
    nref = np.concatenate([s.nref, 0.5 * (s.nref[a] + s.nref[b])])
    mid = s.x.shape[0] + np.arange(cand.size)
    ok = np.ones(cand.size, dtype=bool)
    for side, (p, q) in enumerate(((a, b), (b, a))):
        face, c = t.face_faces[cand, side], t.opposite[cand, side]
        rows = np.flatnonzero(face >= 0)
        halves = np.concatenate([np.stack([p, mid, c], axis=1)[rows], np.stack([mid, q, c], axis=1)[rows]])
        good = _acceptable(nref, x, halves).reshape(2, -1).all(axis=0)
        ok[rows[~good]] = False
    return ok


def _collapse_checks(s: _State, t: _Topology, cand, keep, gone, curve_nb):
    """Which collapses of edges ``cand`` moving vertex ``gone`` onto ``keep`` are allowed (bool per candidate).

    The cheap tests run first; each later one only on the candidates still standing.
    """
    ok = np.zeros(cand.size, dtype=bool)
    is_c, label = s.constrained(t.keys[cand])
    kind = s.kind[gone]
    # who may go: a free vertex along an unconstrained edge, a curve vertex along its own curve
    live = ((kind == FREE) & ~is_c) | ((kind == CURVE) & is_c & (label == s.curve[gone]))
    # an interior edge between two boundary vertices would pinch the surface
    live &= ~((t.face_count[cand] == 2) & t.on_boundary[keep] & t.on_boundary[gone])
    # an opposite corner must keep at least 3 edges (2 faces) on the boundary, 4 inside
    for side in range(2):
        c = t.opposite[cand, side]
        cc = np.maximum(c, 0)
        live &= (c < 0) | (t.valence[cc] >= np.where(t.on_boundary[cc], 3, 4))
    rows = np.flatnonzero(live)
    cand, keep, gone = cand[rows], keep[rows], gone[rows]
    k = rows.size
    # a curve vertex's other curve neighbour must not be joined to keep by a curve edge already (the curve would close)
    live = np.ones(k, dtype=bool)
    along = np.flatnonzero(s.kind[gone] == CURVE)
    if along.size:
        nbs = curve_nb[gone[along]]
        other = np.where(nbs[:, 0] == keep[along], nbs[:, 1], nbs[:, 0])
        live[along[s.constrained(_keys(keep[along], other))[0]]] = False
    # link condition: the common neighbours of the two ends are exactly the corners opposite the edge
    oa, na = _ragged(t.vv_start, t.vv, keep)
    ob, nb = _ragged(t.vv_start, t.vv, gone)
    pairs = np.sort(np.concatenate([oa << _KEY_SHIFT | na, ob << _KEY_SHIFT | nb]))
    common = np.bincount(pairs[1:][pairs[1:] == pairs[:-1]] >> _KEY_SHIFT, minlength=k)
    live &= common == t.face_count[cand]
    sub = np.flatnonzero(live)
    # geometry of the faces around `gone` that stay: acceptable (see _acceptable), no edge longer than 4/3 L
    owner, face = _ragged(t.vf_start, t.vf, gone[sub])
    old = s.f[face]
    kk = keep[sub][owner]
    stays = ~(old == kk[:, None]).any(axis=1)
    owner, old, kk = owner[stays], old[stays], kk[stays]
    new = np.where(old == gone[sub][owner][:, None], kk[:, None], old)
    good = _acceptable(s.nref, s.x, new, _face_geometry(s.x, old)[0])
    for j in range(3):
        other = new[:, j]
        length = np.linalg.norm(s.x[other] - s.x[kk], axis=1)
        good &= (other == kk) | (length <= SPLIT_RATIO * 0.5 * (s.target[other] + s.target[kk]))
    live[sub] = _all_per(owner, good, sub.size)
    ok[rows] = live
    return ok


def _collapse_round(s: _State) -> int:
    """Collapses an independent set of the edges shorter than 4/5 of their target, each into one of its ends.

    Candidates refused in an earlier round of the step are not tested again until a face around them changes
    (``s.refused``): collapses only remove, so nothing else can make them pass.
    """
    t = _Topology(s.x, s.f)
    e = t.edges
    length = np.linalg.norm(s.x[e[:, 1]] - s.x[e[:, 0]], axis=1)
    ratio = length / _edge_targets(s, e)
    cand = np.flatnonzero(ratio < COLLAPSE_RATIO)
    cand = cand[~_find(s.refused, t.keys[cand])[1]]
    if cand.size == 0:
        return 0
    curve_nb = s.curve_neighbors()
    a, b = e[cand, 0], e[cand, 1]
    ok_ab = _collapse_checks(s, t, cand, a, b, curve_nb)  # b goes onto a
    rest = np.flatnonzero(~ok_ab)
    ok_ba = np.zeros(cand.size, dtype=bool)
    ok_ba[rest] = _collapse_checks(s, t, cand[rest], b[rest], a[rest], curve_nb)
    valid = ok_ab | ok_ba
    refused = np.union1d(s.refused, t.keys[cand[~valid]])
    if not valid.any():
        s.refused = refused
        return 0
    keep = np.where(ok_ab, a, b)[valid]
    gone = np.where(ok_ab, b, a)[valid]
    cand = cand[valid]
    oa, fa = _ragged(t.vf_start, t.vf, keep)
    ob, fb = _ragged(t.vf_start, t.vf, gone)
    level = np.floor(-ratio[cand] * _LEVELS)  # shortest first, by levels
    win = _independent(level, t.keys[cand], np.concatenate([oa, ob]), np.concatenate([fa, fb]), s.f.shape[0])
    keep, gone = keep[win], gone[win]

    n = s.x.shape[0]
    remap = np.arange(n)
    remap[gone] = keep
    changed = np.zeros(n, dtype=bool)  # the vertices of the faces that change (their stars change)
    changed[s.f[_ragged(t.vf_start, t.vf, gone)[1]].ravel()] = True
    f = remap[s.f]
    s.f = f[(f[:, 0] != f[:, 1]) & (f[:, 1] != f[:, 2]) & (f[:, 2] != f[:, 0])]
    # drop the vertices that went and renumber the rest in order (monotone: sorted keys stay sorted)
    used = np.ones(n, dtype=bool)
    used[gone] = False
    new_index = np.cumsum(used) - 1
    s.f = new_index[s.f]
    lo, hi = remap[s.ckeys >> _KEY_SHIFT], remap[s.ckeys & _LOW]
    live = lo != hi
    keys, first = np.unique(_keys(new_index[lo[live]], new_index[hi[live]]), return_index=True)
    s.ckeys, s.clabel = keys, s.clabel[live][first]
    lo, hi = refused >> _KEY_SHIFT, refused & _LOW
    still = ~(changed[lo] | changed[hi])
    s.refused = new_index[lo[still]] << _KEY_SHIFT | new_index[hi[still]]
    for name in ("x", "data", "nref", "target", "origin", "moved", "kind", "curve"):
        setattr(s, name, getattr(s, name)[used])
    s.counts["collapses"] += gone.size
    return gone.size


def _flip_round(s: _State) -> int:
    """Flips an independent set of interior edges whose flip lowers the valence deviation of their four vertices."""
    t = _Topology(s.x, s.f)
    inner = np.flatnonzero(t.face_count == 2)
    inner = inner[~s.constrained(t.keys[inner])[0]]
    a, b = t.edges[inner, 0], t.edges[inner, 1]
    c, d = t.opposite[inner, 0], t.opposite[inner, 1]
    ideal = np.where(t.on_boundary, 4, 6)
    val = t.valence

    def deviation(v, delta):
        return np.abs(val[v] + delta - ideal[v])

    before = deviation(a, 0) + deviation(b, 0) + deviation(c, 0) + deviation(d, 0)
    after = deviation(a, -1) + deviation(b, -1) + deviation(c, 1) + deviation(d, 1)
    gain = before - after
    sel = np.flatnonzero((gain > 0) & (val[a] > 3) & (val[b] > 3) & ~t.has_edge(c, d))
    if sel.size == 0:
        return 0
    a, b, c, d, gain, inner = a[sel], b[sel], c[sel], d[sel], gain[sel], inner[sel]
    f0, f1 = t.face_faces[inner, 0], t.face_faces[inner, 1]
    new0 = np.stack([a, d, c], axis=1)  # (a, b, c), (b, a, d) -> (a, d, c), (d, b, c)
    new1 = np.stack([d, b, c], axis=1)
    n_old0 = _face_geometry(s.x, s.f[f0])[0]
    n_old1 = _face_geometry(s.x, s.f[f1])[0]
    good = _acceptable(s.nref, s.x, new0, n_old0, n_old1) & _acceptable(s.nref, s.x, new1, n_old0, n_old1)
    idx = np.flatnonzero(good)
    if idx.size == 0:
        return 0
    owner = np.repeat(np.arange(idx.size), 4)
    claims = np.stack([a[idx], b[idx], c[idx], d[idx]], axis=1).ravel()
    win = idx[_independent(gain[idx], t.keys[inner[idx]], owner, claims, s.x.shape[0])]
    s.f[f0[win]] = new0[win]
    s.f[f1[win]] = new1[win]
    s.counts["flips"] += win.size
    return win.size


def _relax(s: _State) -> None:
    """Moves free vertices toward their one-ring's area-weighted centroid in their tangent plane, curve vertices
    toward the midpoint of their curve neighbours, then projects them back to the input."""
    x, f = s.x, s.f
    n = x.shape[0]
    normal = np.cross(x[f[:, 1]] - x[f[:, 0]], x[f[:, 2]] - x[f[:, 0]])  # 2 area * unit normal
    area = 0.5 * np.linalg.norm(normal, axis=1)
    centroid = x[f].mean(axis=1)
    corners = f.ravel()
    weight = np.bincount(corners, weights=np.repeat(area, 3), minlength=n)
    target = np.empty_like(x)
    vn = np.empty_like(x)
    for j in range(3):
        target[:, j] = np.bincount(corners, weights=np.repeat(area * centroid[:, j], 3), minlength=n)
        vn[:, j] = np.bincount(corners, weights=np.repeat(normal[:, j], 3), minlength=n)
    target /= weight[:, None]
    vn = _unit(vn)
    step = target - x
    step -= _dot(step, vn)[:, None] * vn
    target = x + step
    on_curve = np.flatnonzero(s.kind == CURVE)
    if on_curve.size:
        nb = s.curve_neighbors()[on_curve]
        target[on_curve] = 0.5 * (x[nb[:, 0]] + x[nb[:, 1]])
    movable = np.flatnonzero(s.kind != FIXED)
    s.counts["relaxed"] += _move(s, movable, target[movable])


def _move(s: _State, idx: np.ndarray, q: np.ndarray) -> int:
    """Moves vertices ``idx`` to the input's closest points to ``q`` (curve vertices to their curve), re-samples
    their data there, and takes back every move that makes a face unacceptable. Returns how many moved."""
    if idx.size == 0:
        return 0
    p = np.empty_like(q)
    corner = np.empty((idx.size, 3), dtype=np.int64)
    weight = np.empty((idx.size, 3))
    on_curve = s.kind[idx] == CURVE
    free = np.flatnonzero(~on_curve)
    p[free], elem, weight[free] = s.surface.closest(q[free])
    corner[free] = s.input_f[elem]
    cv = np.flatnonzero(on_curve)
    if cv.size:
        p[cv], elem, weight[cv] = s.curves.closest(q[cv], s.curve[idx[cv]].astype(np.float64))
        seg = s.curves.elements[elem]
        corner[cv] = np.stack([seg[:, 0], seg[:, 1], seg[:, 1]], axis=1)
    changed = np.any(p != s.x[idx], axis=1)
    idx, p, corner, weight = idx[changed], p[changed], corner[changed], weight[changed]
    old, old_nref = s.x, s.nref
    new, nref = old.copy(), old_nref.copy()
    new[idx] = p
    nref[idx] = np.einsum("kj,kjd->kd", weight, s.input_nref[corner])
    accepted = np.ones(s.x.shape[0], dtype=bool)
    off = np.zeros(s.x.shape[0], dtype=bool)  # vertices away from their old position
    off[idx] = True
    dirty = off.copy()
    # a face with a moved vertex that is not acceptable: put its vertices back and check the faces around them again;
    # only faces with a vertex still moved are judged (an input face may fail the tests as it is), so this ends
    while True:
        check = np.flatnonzero(dirty[s.f].any(axis=1) & off[s.f].any(axis=1))
        faces = s.f[check]
        bad = check[~_acceptable(nref, new, faces, _face_geometry(old, faces)[0])]
        if bad.size == 0:
            break
        back = s.f[bad].ravel()
        new[back] = old[back]
        nref[back] = old_nref[back]
        accepted[back] = False
        off[back] = False
        dirty[:] = False
        dirty[back] = True
    keep = accepted[idx]
    idx, corner, weight = idx[keep], corner[keep], weight[keep]
    s.x, s.nref = new, nref
    s.moved[idx] = True
    s.data[idx] = np.einsum("kj,kjd->kd", weight, s.input_data[corner])
    s.target[idx] = np.einsum("kj,kj->k", weight, s.input_target[corner])
    return idx.size


def _unchanged_input_faces(s: _State, input_faces: np.ndarray) -> np.ndarray:
    """For each face whose vertices are unmoved input vertices forming an input face (same orientation), that input
    face; -1 elsewhere."""
    out = np.full(s.f.shape[0], -1, dtype=np.int64)
    still = (s.origin >= 0) & ~s.moved
    cand = np.flatnonzero(still[s.f].all(axis=1))
    if cand.size == 0:
        return out
    src = input_faces.astype(np.int64)

    def canonical(t):  # rotate each triangle so that its smallest vertex comes first (orientation kept)
        r = np.argmin(t, axis=1)
        return np.stack([t[np.arange(t.shape[0]), (r + j) % 3] for j in range(3)], axis=1)

    rows = np.concatenate([canonical(src), canonical(s.origin[s.f[cand]])])
    _, inverse = np.unique(rows, axis=0, return_inverse=True)
    inverse = inverse.ravel()
    first = np.full(inverse.max() + 1, -1, dtype=np.int64)
    first[inverse[: src.shape[0]]] = np.arange(src.shape[0])  # input faces are distinct (an oriented manifold)
    out[cand] = first[inverse[src.shape[0]:]]
    return out

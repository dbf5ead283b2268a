"""Triangle meshes: validated host-side storage, topology stencils and rest-shape geometry.

`TriMesh` holds an oriented, edge-manifold triangle mesh as numpy arrays and derives, once, every
connectivity array the toolkit's terms use as element stencils (`faces`, `edges`, `edge_diamonds`,
`edge_faces`, `vertex_indices`) plus boundary information and rest-shape helpers (edge lengths,
areas, normals, per-face 2D rest frames ``Dm``).

Everything here is pure numpy/scipy on the host and vectorised (meshes of millions of faces);
Warp is not imported. Construction validates the input and raises `MeshError` with a message that
names the source, what is wrong, where, and what was expected.

Half-edge convention used throughout: face ``f = (a, b, c)`` owns the three oriented half-edges
``a->b, b->c, c->a`` (corner ``k`` of the face starts half-edge ``k``), so ``3 * f + k`` indexes the
half-edge leaving corner ``k`` and the vertex opposite it is corner ``(k + 2) % 3``.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import pathlib
import re
import tempfile

import numpy as np

__all__ = ["MeshError", "TriMesh"]

_SUPPORTED_EXTENSIONS = (".obj", ".off", ".ply")
_UNREFERENCED_MODES = ("error", "remove")
_SHOW = 5  # how many offending items a message lists
_PACKED_SORT_BITS = 63  # edge keys and half-edge ids packed into one int64 when they fit (else argsort)
_DEGENERATE_RTOL = 1e-12  # a face is degenerate when |(x1-x0) x (x2-x0)| <= rtol * (longest edge)^2



def new_file_mode() -> int:
    """The permissions ``open(path, "w")`` gives a new file: ``0o666`` less the process umask."""
    mask = os.umask(0o022)  # reading the umask means setting it: put it back at once
    os.umask(mask)
    return 0o666 & ~mask


class MeshError(ValueError):
    """Invalid mesh input.

    The message names the source (a file path, or ``TriMesh(...)`` for arrays), what is wrong,
    where (indices: the first few and the total count) and what was expected.
    """


def _first(items, count: int | None = None) -> str:
    """Formats the first few offending items and the total count, e.g. ``"[3, 7] (2 in total)"``."""
    total = len(items) if count is None else count
    shown = ", ".join(str(int(i)) for i in items[:_SHOW])
    more = ", ..." if total > _SHOW else ""
    return f"[{shown}{more}] ({total} in total)"


def _readonly(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _atomic_write(path: pathlib.Path, write, suffix: str = ".tmp") -> None:
    """``write(tmp_path)`` then ``os.replace`` onto ``path``; the temporary file is removed on failure.

    The temporary file lies in ``path``'s folder and ends with ``suffix`` (writers that pick the format by the
    extension need it); the file gets the permissions of an ordinary new file (``mkstemp`` alone would leave it
    ``0600``).
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, new_file_mode())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# ---------------------------------------------------------------------- shared by TriMesh and TetMesh
# (the messages name the elements with the words of an _Elements: "faces" / "triangle", "tets" / "tetrahedron")


@dataclasses.dataclass(frozen=True)
class _Elements:
    """What a mesh's elements are called in its messages, and how many vertices each has."""

    mesh: str  # the class named in hints: "TriMesh", "TetMesh"
    array: str  # the element array, also the plural in messages: "faces", "tets"
    single: str  # one element: "face", "tet"
    noun: str  # what an empty mesh lacks one of: "triangle", "tetrahedron"
    valence: int  # vertices per element: 3, 4
    shape_hint: str  # appended to a 2D array's wrong-shape message
    index_dtype: str  # how the dtype message says the indices are kept
    repeat_hint: str  # leads the parenthesis of the repeated-vertex message
    file_kind: str  # the kind of file from_file reads: "mesh", "tet mesh"


_TRIANGLES = _Elements(
    mesh="TriMesh", array="faces", single="face", noun="triangle", valence=3,
    shape_hint=" (only triangles are supported)", index_dtype="stored as int32",
    repeat_hint="degenerate index triples, ", file_kind="mesh",
)  # the words of TriMesh's messages
_VALENCE_WORDS = {3: "three", 4: "four"}


def _check_option(source: str, name: str, value, options: tuple[str, ...]) -> None:
    """Refuses a keyword argument ``name=value`` that is not one of ``options``."""
    if value not in options:
        raise MeshError(f"{source}: {name}={value!r} is not an option; expected one of {options}")


def _check_arrays(src: str, vertices, elements, kind: _Elements) -> tuple[np.ndarray, np.ndarray]:
    """Reads and validates vertex positions and element vertex indices.

    Returns:
        The vertices as float64, shape (n, 3), and the elements as int64, shape (m, kind.valence).

    Raises:
        MeshError: unreadable arrays, an empty mesh, wrong shapes or dtypes, more than int32 indices, non-finite
            coordinates, indices out of range, or a vertex repeated within an element.
    """
    name, k = kind.array, kind.valence
    try:
        v = np.asarray(vertices)
    except Exception as exc:  # ragged nested lists, ...
        raise MeshError(f"{src}: vertices could not be read as an array ({exc}); expected shape (n, 3) floats")
    try:
        e = np.asarray(elements)
    except Exception as exc:
        raise MeshError(f"{src}: {name} could not be read as an array ({exc}); expected shape (m, {k}) integers")

    if v.size == 0 or e.size == 0:
        raise MeshError(
            f"{src}: empty mesh: {v.shape[0] if v.ndim else 0} vertices (array shape {v.shape}) and "
            f"{e.shape[0] if e.ndim else 0} {name} (array shape {e.shape}); expected at least one "
            f"vertex and one {kind.noun}"
        )
    if v.ndim != 2 or v.shape[1] != 3:
        raise MeshError(f"{src}: vertices have shape {v.shape}; expected (n, 3)")
    if e.ndim != 2 or e.shape[1] != k:
        hint = kind.shape_hint if e.ndim == 2 else ""
        raise MeshError(f"{src}: {name} have shape {e.shape}; expected (m, {k}){hint}")
    if v.dtype == bool or not (np.issubdtype(v.dtype, np.floating) or np.issubdtype(v.dtype, np.integer)):
        raise MeshError(f"{src}: vertices have dtype {v.dtype}; expected a real floating-point dtype (float64)")
    if not np.issubdtype(e.dtype, np.integer):
        raise MeshError(
            f"{src}: {name} have dtype {e.dtype}; expected an integer dtype (vertex indices, {kind.index_dtype})"
        )
    n, m = v.shape[0], e.shape[0]
    if n > np.iinfo(np.int32).max or k * m > np.iinfo(np.int32).max:
        raise MeshError(f"{src}: {n} vertices, {m} {name} exceed the int32 index range")

    v = v.astype(np.float64, copy=False)
    finite = np.isfinite(v).all(axis=1)
    if not finite.all():
        bad = np.flatnonzero(~finite)
        raise MeshError(
            f"{src}: vertices {_first(bad)} have NaN or infinite coordinates "
            f"(vertex {bad[0]} = {v[bad[0]].tolist()}); expected finite coordinates"
        )

    e = e.astype(np.int64, copy=False)
    out = (e < 0) | (e >= n)
    if out.any():
        bad = np.flatnonzero(out.any(axis=1))
        b = bad[0]
        raise MeshError(
            f"{src}: {name} {_first(bad)} have vertex indices out of range "
            f"({kind.single} {b} = {e[b].tolist()} uses index {e[b][out[b]][0]}); expected 0 <= index < {n} "
            f"(the vertex count; indices are 0-based)"
        )

    repeated = np.zeros(m, dtype=bool)
    for i, j in itertools.combinations(range(k), 2):  # k (k - 1) / 2 column comparisons: faster than a row sort
        repeated |= e[:, i] == e[:, j]
    if repeated.any():
        bad = np.flatnonzero(repeated)
        b = bad[0]
        raise MeshError(
            f"{src}: {name} {_first(bad)} repeat a vertex ({kind.repeat_hint}{kind.single} {b} = {e[b].tolist()}); "
            f"expected {_VALENCE_WORDS[k]} distinct vertices per {kind.single}"
        )
    return v, e


def _referenced(src: str, v: np.ndarray, e: np.ndarray, unreferenced: str, kind: _Elements):
    """Drops (``unreferenced="remove"``) or reports the vertices that no element uses.

    Returns:
        Read-only ``(vertices float64, elements int32, vertex_map int32, removed_vertices int32)`` and the
        `MeshError` to raise for unreferenced vertices under ``unreferenced="error"`` (None when there is none). The
        caller raises it after its topology checks, so that a non-manifold mesh reports that first.
    """
    n = v.shape[0]
    used = np.zeros(n, dtype=bool)
    used[e.ravel()] = True
    removed = np.flatnonzero(~used)
    if removed.size and unreferenced == "remove":
        kept = np.flatnonzero(used)
        new_index = np.full(n, -1, dtype=np.int64)
        new_index[kept] = np.arange(kept.size)
        v = v[kept]
        e = new_index[e]
        vertex_map = kept
    else:
        vertex_map = np.arange(n)
    error = None
    if removed.size and unreferenced == "error":
        error = MeshError(
            f"{src}: {removed.size} of {n} vertices are not used by any {kind.single} "
            f"(unreferenced vertices {_first(removed)}); expected every vertex in a {kind.single}. "
            f'Pass unreferenced="remove" to drop them ({kind.mesh}(..., unreferenced="remove") or '
            f'{kind.mesh}.from_file(path, unreferenced="remove"); mesh.vertex_map then maps kept '
            f"vertices to their original indices)"
        )
    return (
        _readonly(np.ascontiguousarray(v, dtype=np.float64)),
        _readonly(np.ascontiguousarray(e, dtype=np.int32)),
        _readonly(vertex_map.astype(np.int32)),
        _readonly((removed if unreferenced == "remove" else removed[:0]).astype(np.int32)),
        error,
    )


def _sorted_groups(sorted_keys: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Runs of equal keys after a sort: ``sorted_keys`` (1D, or 2D rows compared whole) is ``keys[order]``.

    Returns:
        ``(starts, counts, group)``: where each run starts in the sorted order and how long it is, and the run
        (0, 1, ... in sorted order) of each unsorted key, all int64.
    """
    is_start = np.empty(sorted_keys.shape[0], dtype=bool)
    is_start[0] = True
    if sorted_keys.ndim == 1:
        np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=is_start[1:])
    else:
        np.any(sorted_keys[1:] != sorted_keys[:-1], axis=1, out=is_start[1:])
    starts = np.flatnonzero(is_start)
    counts = np.diff(np.append(starts, is_start.size))
    group = np.empty(order.size, dtype=np.int64)
    group[order] = np.cumsum(is_start) - 1
    return starts, counts, group


def _check_mesh_file(path, extensions: tuple[str, ...], kind: _Elements) -> tuple[pathlib.Path, str]:
    """``(path, lower-case extension)`` of an existing regular file with one of ``extensions``, else MeshError."""
    p = pathlib.Path(path)
    ext = p.suffix.lower()
    if ext not in extensions:
        raise MeshError(
            f"{p}: unsupported {kind.file_kind} file extension {p.suffix!r}; supported: {', '.join(extensions)}"
        )
    if not p.exists():
        raise MeshError(f"{p}: mesh file not found (resolved: {p.resolve()}); expected an existing {ext} file")
    if not p.is_file():
        raise MeshError(f"{p}: not a regular file; expected a {ext} {kind.file_kind} file")
    return p, ext


def _check_save_path(path, extensions: tuple[str, ...]) -> tuple[pathlib.Path, str]:
    """``(path, lower-case extension)`` of a destination with one of ``extensions``, else MeshError."""
    p = pathlib.Path(path)
    ext = p.suffix.lower()
    if ext not in extensions:
        raise MeshError(f"{p}: cannot save: unsupported extension {p.suffix!r}; supported: {', '.join(extensions)}")
    return p, ext


def _check_folder(p: pathlib.Path) -> None:
    if not p.parent.is_dir():
        raise FileNotFoundError(f"{p}: cannot save: folder {p.parent} does not exist")


class _VertexMesh:
    """The vertex side of `TriMesh` and `TetMesh`: counts, positions and bounds (``source`` and ``_vertices`` are set
    by the subclass)."""

    source: str
    _vertices: np.ndarray

    @property
    def vertex_count(self) -> int:
        """Number of vertices n."""
        return self._vertices.shape[0]

    @property
    def vertices(self) -> np.ndarray:
        """Vertex positions, float64, shape (vertex_count, 3), C-contiguous, read-only."""
        return self._vertices

    @functools.cached_property
    def vertex_indices(self) -> np.ndarray:
        """Per-vertex stencil (V): ``arange(vertex_count)``, int32, shape (vertex_count, 1)."""
        return _readonly(np.arange(self.vertex_count, dtype=np.int32).reshape(-1, 1))

    def _positions(self, x) -> np.ndarray:
        if x is None:
            return self._vertices
        if hasattr(x, "numpy") and not isinstance(x, np.ndarray):  # e.g. a wp.array of vec3d
            x = x.numpy()
        x = np.asarray(x, dtype=np.float64)
        if x.shape != (self.vertex_count, 3):
            raise MeshError(f"{self.source}: positions have shape {x.shape}; expected ({self.vertex_count}, 3)")
        return x

    def bounding_box(self, x=None) -> tuple[np.ndarray, np.ndarray]:
        """Axis-aligned bounds ``(min, max)``, each float64 of shape (3,).

        Args:
            x: positions, shape (vertex_count, 3); defaults to `vertices`.
        """
        x = self._positions(x)
        return x.min(axis=0), x.max(axis=0)


class TriMesh(_VertexMesh):
    """An oriented, edge-manifold triangle mesh with cached topology and rest-shape geometry.

    Construction validates the arrays and raises `MeshError` for: wrong shapes or dtypes, an empty
    mesh, non-finite coordinates, face indices out of range, a vertex repeated within a face,
    non-manifold edges (an undirected edge used by more than two faces, or used twice with the
    same orientation) and unreferenced vertices (unless ``unreferenced="remove"``).

    All arrays are numpy, computed once and read-only (copy them to modify).

    Args:
        vertices: vertex positions, shape (n, 3), any real dtype; stored as float64, C-contiguous.
        faces: triangles as vertex indices, shape (m, 3), integer dtype; stored as int32.
            Counter-clockwise order seen from the side the normal points to.
        unreferenced: ``"error"`` (default) refuses vertices used by no face; ``"remove"`` drops
            them, reindexes the faces and records the mapping in `vertex_map` and
            `removed_vertices`.
        source: name used in error messages (a file path); defaults to ``"TriMesh(...)"``.

    Attributes:
        source: the file path, or ``"TriMesh(...)"``; named in every error message.
        vertex_map: original index of each kept vertex, int32, shape (vertex_count,); the identity
            ``arange`` when no vertex was removed.
        removed_vertices: original indices of the vertices dropped by ``unreferenced="remove"``,
            int32, sorted; empty otherwise.

    Raises:
        MeshError: the input is not a valid mesh (see above).
    """

    def __init__(self, vertices, faces, *, unreferenced: str = "error", source=None):
        self.source = "TriMesh(...)" if source is None else str(source)
        _check_option(self.source, "unreferenced", unreferenced, _UNREFERENCED_MODES)
        v, f = _check_arrays(self.source, vertices, faces, _TRIANGLES)
        self._vertices, self._faces, self.vertex_map, self.removed_vertices, unused = _referenced(
            self.source, v, f, unreferenced, _TRIANGLES
        )
        # topology first (it does not depend on unreferenced vertices), so a non-manifold mesh
        # reports that before anything about unreferenced vertices
        self._build_edges()
        if unused is not None:
            raise unused

    # ------------------------------------------------------------------ topology

    def _build_edges(self) -> None:
        """Builds the undirected edges from the half-edges with one sort, and checks manifoldness."""
        f = self._faces
        n, m = self._vertices.shape[0], f.shape[0]
        src = f.reshape(-1).astype(np.int64)  # half-edge 3*face+k leaves corner k ...
        dst = f[:, [1, 2, 0]].reshape(-1).astype(np.int64)  # ... and enters corner k+1
        lo = np.minimum(src, dst)
        hi = np.maximum(src, dst)
        key = lo * n + hi
        h_bits = int(3 * m - 1).bit_length()
        if int(n * n - 1).bit_length() + h_bits <= _PACKED_SORT_BITS:
            # pack (key, half-edge) into one int64: np.sort is several times faster than argsort
            packed = np.sort((key << h_bits) | np.arange(3 * m, dtype=np.int64))
            order = packed & ((1 << h_bits) - 1)
            sorted_key = packed >> h_bits
            del packed
        else:
            order = np.argsort(key, kind="stable")
            sorted_key = key[order]
        starts, counts, halfedge_edge = _sorted_groups(sorted_key, order)

        edge_key = sorted_key[starts]
        edges = np.empty((starts.size, 2), dtype=np.int64)
        edges[:, 0], edges[:, 1] = np.divmod(edge_key, n)
        forward = src < dst  # half-edge runs edges[e, 0] -> edges[e, 1]
        forward_count = np.bincount(halfedge_edge, weights=forward, minlength=starts.size).astype(np.int64)

        over = np.flatnonzero(counts > 2)
        same = np.flatnonzero((counts == 2) & (forward_count != 1))
        if over.size or same.size:
            parts = []
            if over.size:
                shown = ", ".join(f"({edges[e, 0]}, {edges[e, 1]}) in {counts[e]} faces" for e in over[:_SHOW])
                more = ", ..." if over.size > _SHOW else ""
                parts.append(f"{over.size} edges are shared by more than 2 faces [{shown}{more}]")
            if same.size:
                shown = ", ".join(f"({edges[e, 0]}, {edges[e, 1]})" for e in same[:_SHOW])
                more = ", ..." if same.size > _SHOW else ""
                parts.append(
                    f"{same.size} edges are used twice with the same orientation, i.e. neighbouring faces "
                    f"are inconsistently oriented [{shown}{more}]"
                )
            raise MeshError(
                f"{self.source}: non-manifold mesh: " + "; ".join(parts) + ". Expected an oriented "
                "edge-manifold mesh (each edge in one or two faces, traversed in opposite directions by "
                "the two); repair the mesh first (e.g. split non-manifold edges, reorient faces)"
            )

        self._edges = _readonly(edges.astype(np.int32))
        self._face_edges = _readonly(halfedge_edge.reshape(m, 3).astype(np.int32))
        self._edge_face_counts = _readonly(counts.astype(np.int32))
        self._boundary_edges = _readonly(np.flatnonzero(counts == 1).astype(np.int32))
        interior = np.flatnonzero(counts == 2)
        self._interior_edges = _readonly(interior.astype(np.int32))

        # the two half-edges of each interior edge, sorted: order[starts[e]], order[starts[e] + 1]
        h_a = order[starts[interior]]
        h_b = order[starts[interior] + 1]
        a_is_forward = forward[h_a]
        h0 = np.where(a_is_forward, h_a, h_b)  # in f0: edges[e,0] -> edges[e,1]
        h1 = np.where(a_is_forward, h_b, h_a)  # in f1: the opposite orientation
        twin = np.full(3 * m, -1, dtype=np.int64)
        twin[h0] = h1
        twin[h1] = h0
        self._halfedge_twin = twin
        self._boundary_halfedges = order[starts[counts == 1]]  # aligned with boundary_edges

        corners = f.reshape(-1)
        f0, f1 = h0 // 3, h1 // 3
        edge_faces = np.empty((interior.size, 2), dtype=np.int32)
        edge_faces[:, 0] = f0
        edge_faces[:, 1] = f1
        diamonds = np.empty((interior.size, 4), dtype=np.int32)
        diamonds[:, 0] = np.take(corners, h0)  # h0 starts at edges[e, 0]
        diamonds[:, 1] = np.take(corners, h1)  # h1 starts at edges[e, 1]
        diamonds[:, 2] = np.take(corners, 3 * f0 + (h0 % 3 + 2) % 3)  # opposite corner in f0
        diamonds[:, 3] = np.take(corners, 3 * f1 + (h1 % 3 + 2) % 3)  # opposite corner in f1
        self._edge_faces = _readonly(edge_faces)
        self._edge_diamonds = _readonly(diamonds)

    # ------------------------------------------------------------------ constructors

    @classmethod
    def from_file(cls, path, *, unreferenced: str = "error") -> TriMesh:
        """Loads a triangle mesh from an OBJ, OFF or PLY file, keeping the file's vertices exactly.

        OBJ is parsed here (``v`` and ``f`` lines only; ``f a/b/c`` and negative indices are
        understood, texture and normal indices ignored, so vertices are never split at UV or normal
        seams; polygons are fan-triangulated). OFF and PLY go through trimesh with
        ``process=False, maintain_order=True``. Vertex count and order always match the file.

        Args:
            path: file path (str or os.PathLike); the extension picks the format (case-insensitive).
            unreferenced: ``"error"`` or ``"remove"``, as in `TriMesh`.

        Returns:
            The mesh, with `source` set to the path.

        Raises:
            MeshError: missing file, unsupported extension, unreadable file, or an invalid mesh.
        """
        p, ext = _check_mesh_file(path, _SUPPORTED_EXTENSIONS, _TRIANGLES)
        if ext == ".obj":
            vertices, faces = _read_obj(p)
        else:
            vertices, faces = _read_with_trimesh(p, ext)
        return cls(vertices, faces, unreferenced=unreferenced, source=str(p))

    @classmethod
    def grid(cls, nx: int, ny: int, width: float = 1.0, height: float = 1.0) -> TriMesh:
        """A regular triangulated grid in the xy-plane (z = 0) with normals along +z.

        Vertex ``i + nx * j`` lies at ``(width * i / (nx - 1), height * j / (ny - 1), 0)``; each cell
        is split into two counter-clockwise triangles along the same diagonal.

        Args:
            nx: vertices along x, >= 2.
            ny: vertices along y, >= 2.
            width: extent along x.
            height: extent along y.

        Returns:
            A mesh with ``nx * ny`` vertices and ``2 * (nx - 1) * (ny - 1)`` faces.
        """
        source = f"TriMesh.grid({nx}, {ny})"
        if int(nx) != nx or int(ny) != ny or nx < 2 or ny < 2:
            raise MeshError(f"{source}: nx={nx}, ny={ny}; expected integers >= 2")
        nx, ny = int(nx), int(ny)
        xs = np.linspace(0.0, float(width), nx)
        ys = np.linspace(0.0, float(height), ny)
        gx, gy = np.meshgrid(xs, ys)  # shape (ny, nx): row j, column i -> vertex i + nx*j
        vertices = np.stack([gx.ravel(), gy.ravel(), np.zeros(nx * ny)], axis=1)
        i, j = np.meshgrid(np.arange(nx - 1), np.arange(ny - 1))
        v00 = (i + nx * j).ravel()
        v10, v01, v11 = v00 + 1, v00 + nx, v00 + nx + 1
        faces = np.empty((2 * v00.size, 3), dtype=np.int64)
        faces[0::2] = np.stack([v00, v10, v11], axis=1)
        faces[1::2] = np.stack([v00, v11, v01], axis=1)
        return cls(vertices, faces, source=source)

    def reordered(self, order=None) -> TriMesh:
        """The same mesh with its vertices renumbered (and faces sorted by their first new vertex).

        Args:
            order: int array (vertex_count,), a permutation: new vertex k is old vertex
                ``order[k]``. Default: :func:`warp_meshad.locality_order` of the vertices (a Morton
                curve), which keeps consecutive vertices close in space.

        Returns:
            A new mesh; its ``vertex_map`` gives each new vertex's index in this mesh's original
            numbering (``self.vertex_map[order]``).

        Raises:
            MeshError: ``order`` is not a permutation of ``range(vertex_count)``.
        """
        from warp_meshad._src.mesh.locality import locality_order

        n = self.vertex_count
        order = locality_order(self._vertices) if order is None else np.asarray(order)
        if order.shape != (n,) or not np.issubdtype(order.dtype, np.integer) or not np.array_equal(
            np.sort(order), np.arange(n)
        ):
            raise MeshError(
                f"{self.source}: reordered(order=...) must be a permutation of range({n}) (int array of shape ({n},)), "
                f"got {order.dtype} array of shape {order.shape}"
            )
        new_index = np.empty(n, dtype=np.int64)
        new_index[order] = np.arange(n)
        f = new_index[self._faces]
        f = f[np.argsort(f.min(axis=1), kind="stable")]
        mesh = TriMesh(self._vertices[order], f, source=self.source)
        mesh.vertex_map = _readonly(self.vertex_map[order].astype(np.int32))
        return mesh

    # ------------------------------------------------------------------ output

    def save(self, path, uv=None) -> None:
        """Writes the mesh to an OBJ, OFF or PLY file, atomically (temp file + ``os.replace``).

        Coordinates are written exactly: ``%.17g`` text for OBJ/OFF, float64 binary PLY (trimesh's
        PLY exporter would round them to float32, so all three writers live here).

        Args:
            path: destination; the extension picks the format.
            uv: optional texture coordinates, shape (vertex_count, 2), float; OBJ only. Written as
                ``vt`` lines with faces ``f a/a b/b c/c``.

        Raises:
            MeshError: unsupported extension, or uv with a wrong shape or a non-OBJ format.
            FileNotFoundError: the destination folder does not exist.
        """
        p, ext = _check_save_path(path, _SUPPORTED_EXTENSIONS)
        if uv is not None:
            uv = np.asarray(uv, dtype=np.float64)
            if uv.shape != (self.vertex_count, 2):
                raise MeshError(f"{p}: cannot save: uv has shape {uv.shape}; expected ({self.vertex_count}, 2)")
            if ext != ".obj":
                raise MeshError(f"{p}: cannot save: uv is only written to .obj files, got {ext}")
        _check_folder(p)

        def write(tmp):
            with open(tmp, "wb") as out:
                _WRITERS[ext](out, self._vertices, self._faces, uv)

        _atomic_write(p, write)

    # ------------------------------------------------------------------ counts and arrays

    @property
    def face_count(self) -> int:
        """Number of triangles m."""
        return self._faces.shape[0]

    @property
    def edge_count(self) -> int:
        """Number of undirected edges E."""
        return self._edges.shape[0]

    @property
    def faces(self) -> np.ndarray:
        """Triangles (FV stencil), int32, shape (face_count, 3), counter-clockwise."""
        return self._faces

    @property
    def edges(self) -> np.ndarray:
        """Unique undirected edges (EV stencil), int32, shape (edge_count, 2).

        ``edges[:, 0] < edges[:, 1]``; rows sorted lexicographically.
        """
        return self._edges

    @property
    def face_edges(self) -> np.ndarray:
        """Index into `edges` of each face's edges (f0,f1), (f1,f2), (f2,f0); int32, shape (face_count, 3)."""
        return self._face_edges

    @property
    def edge_face_counts(self) -> np.ndarray:
        """Number of faces using each edge (1 boundary, 2 interior), int32, shape (edge_count,)."""
        return self._edge_face_counts

    @property
    def boundary_edges(self) -> np.ndarray:
        """Indices into `edges` of edges used by one face, int32, shape (B,), ascending."""
        return self._boundary_edges

    @property
    def interior_edges(self) -> np.ndarray:
        """Indices into `edges` of edges used by two faces, int32, shape (I,), ascending."""
        return self._interior_edges

    @property
    def edge_faces(self) -> np.ndarray:
        """The two faces of each interior edge (EF stencil), int32, shape (I, 2), rows as `interior_edges`.

        ``[f0, f1]``: f0 traverses the edge ``edges[e, 0] -> edges[e, 1]``, f1 the opposite way.
        """
        return self._edge_faces

    @property
    def edge_diamonds(self) -> np.ndarray:
        """Diamond stencil of each interior edge, int32, shape (I, 4), rows as `interior_edges`.

        ``[v0, v1, a, b]``: ``v0, v1 = edges[e]``, ``a`` the vertex of ``edge_faces[i, 0]`` opposite
        the edge, ``b`` the vertex of ``edge_faces[i, 1]`` opposite the edge. So the faces are
        ``(v0, v1, a)`` and ``(v1, v0, b)`` up to rotation.
        """
        return self._edge_diamonds

    @functools.cached_property
    def boundary_vertices(self) -> np.ndarray:
        """Vertices on the boundary, int32, shape (number of boundary vertices,), sorted."""
        return _readonly(np.unique(self._edges[self._boundary_edges]).astype(np.int32))

    @functools.cached_property
    def boundary_loops(self) -> list[np.ndarray]:
        """Boundary loops as ordered vertex arrays (int32), longest first.

        Each loop follows the boundary orientation of its faces (vertex k -> k+1 is a half-edge of
        a face) and starts at its smallest vertex index. At a vertex where the boundary touches
        itself the loops are split by walking around that vertex's fan of faces.
        """
        bh = self._boundary_halfedges  # boundary half-edges, h = 3*face + corner
        if bh.size == 0:
            return []
        f = self._faces
        twin = self._halfedge_twin
        # For each boundary half-edge a->v, find the boundary half-edge leaving v that follows it:
        # rotate around v through the fan (next half-edge in the face, then its twin, ...).
        nxt = 3 * (bh // 3) + (bh % 3 + 1) % 3  # v -> c in the same face
        active = twin[nxt] >= 0
        for _ in range(self.face_count + 1):
            if not active.any():
                break
            t = twin[nxt[active]]  # c -> v in the neighbouring face
            nxt[active] = 3 * (t // 3) + (t % 3 + 1) % 3  # v -> d there
            active[active] = twin[nxt[active]] >= 0
        rank = np.full(3 * self.face_count, -1, dtype=np.int64)
        rank[bh] = np.arange(bh.size)
        successor = rank[nxt]  # permutation of boundary half-edges
        start_vertex = f.reshape(-1)[bh]

        loops = []
        seen = np.zeros(bh.size, dtype=bool)
        successor_list = successor.tolist()
        for s in range(bh.size):
            if seen[s]:
                continue
            cycle = [s]
            k = successor_list[s]
            while k != s:
                cycle.append(k)
                k = successor_list[k]
            cycle = np.asarray(cycle)
            seen[cycle] = True
            loop = start_vertex[cycle]
            loop = np.roll(loop, -int(np.argmin(loop)))
            loops.append(_readonly(loop.astype(np.int32)))
        loops.sort(key=lambda lp: (-lp.size, int(lp[0])))
        return loops

    @property
    def is_closed(self) -> bool:
        """True when no edge is a boundary edge."""
        return self._boundary_edges.size == 0

    @property
    def euler_characteristic(self) -> int:
        """V - E + F (2 for a sphere, 1 for a disk)."""
        return self.vertex_count - self.edge_count + self.face_count

    # ------------------------------------------------------------------ geometry

    def _face_edge_vectors(self, x) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x = self._positions(x)
        f = self._faces
        x0 = np.take(x, f[:, 0], axis=0)  # np.take gathers rows ~3x faster than x[idx]
        return x0, np.take(x, f[:, 1], axis=0) - x0, np.take(x, f[:, 2], axis=0) - x0

    def edge_lengths(self, x=None) -> np.ndarray:
        """Length of each edge, float64, shape (edge_count,).

        Args:
            x: positions, shape (vertex_count, 3); defaults to `vertices`.
        """
        x = self._positions(x)
        return _norm(np.take(x, self._edges[:, 1], axis=0) - np.take(x, self._edges[:, 0], axis=0))

    def face_areas(self, x=None) -> np.ndarray:
        """Area of each face, float64, shape (face_count,).

        Args:
            x: positions, shape (vertex_count, 3); defaults to `vertices`.
        """
        _, e1, e2 = self._face_edge_vectors(x)
        return 0.5 * _norm(np.cross(e1, e2))

    def total_area(self, x=None) -> float:
        """Sum of the face areas.

        Args:
            x: positions, shape (vertex_count, 3); defaults to `vertices`.
        """
        return float(self.face_areas(x).sum())

    def face_normals(self, x=None) -> np.ndarray:
        """Unit normal of each face (right-handed with the vertex order), float64, shape (face_count, 3).

        Zero-area faces get a zero vector.

        Args:
            x: positions, shape (vertex_count, 3); defaults to `vertices`.
        """
        _, e1, e2 = self._face_edge_vectors(x)
        return _normalized(np.cross(e1, e2))

    def vertex_normals(self, x=None) -> np.ndarray:
        """Area-weighted unit vertex normals, float64, shape (vertex_count, 3).

        A vertex whose weighted normals cancel gets a zero vector.

        Args:
            x: positions, shape (vertex_count, 3); defaults to `vertices`.
        """
        _, e1, e2 = self._face_edge_vectors(x)
        weighted = np.cross(e1, e2)  # 2 * area * unit normal
        idx = self._faces.reshape(-1)
        n = self.vertex_count
        acc = np.stack(
            [np.bincount(idx, weights=np.repeat(weighted[:, c], 3), minlength=n) for c in range(3)], axis=1
        )
        return _normalized(acc)

    def face_rest_frames(self, x=None) -> np.ndarray:
        """Per-face rest matrix ``Dm`` of the edge vectors in a 2D frame of the face's plane.

        The frame's first axis runs along x1 - x0, the second lies in the plane so that (axis 1,
        axis 2, face normal) is right-handed. ``Dm[f]`` has columns (x1 - x0) and (x2 - x0) in that
        frame: ``[[|x1-x0|, (x2-x0).t1], [0, (x2-x0).t2]]``, so ``det Dm = 2 * area > 0``. It is the
        rest matrix of a deformation gradient ``F = Ds Dm^-1``. Zero-area faces give a singular Dm.

        Args:
            x: positions, shape (vertex_count, 3); defaults to `vertices`.

        Returns:
            float64, shape (face_count, 2, 2).
        """
        return self._rest_frames(x)[0]

    def _rest_frames(self, x) -> tuple[np.ndarray, np.ndarray]:
        """Dm (m, 2, 2) and the degenerate-face mask (m,)."""
        _, e1, e2 = self._face_edge_vectors(x)
        l1 = _norm(e1)
        twice_area = _norm(np.cross(e1, e2))
        safe_l1 = np.where(l1 > 0, l1, 1.0)
        t1 = e1 / safe_l1[:, None]
        # (x2-x0).t2 with t2 = n x t1 equals |e1 x e2| / |e1|
        dm = np.zeros((e1.shape[0], 2, 2))
        dm[:, 0, 0] = l1
        dm[:, 0, 1] = np.einsum("ij,ij->i", e2, t1)
        dm[:, 1, 1] = np.where(l1 > 0, twice_area / safe_l1, 0.0)
        e3 = e2 - e1
        longest_sq = np.maximum(np.maximum(l1 * l1, np.einsum("ij,ij->i", e2, e2)), np.einsum("ij,ij->i", e3, e3))
        degenerate = twice_area <= _DEGENERATE_RTOL * longest_sq
        return dm, degenerate

    def face_rest_frame_inverses(self, x=None) -> np.ndarray:
        """Inverses ``Dm^-1`` of `face_rest_frames`, float64, shape (face_count, 2, 2).

        Args:
            x: positions, shape (vertex_count, 3); defaults to `vertices`.

        Raises:
            MeshError: some faces have (numerically) zero area.
        """
        dm, degenerate = self._rest_frames(x)
        if degenerate.any():
            twice_area = dm[:, 0, 0] * dm[:, 1, 1]
            bad = np.flatnonzero(degenerate)
            raise MeshError(
                f"{self.source}: faces {_first(bad)} have zero area (face {bad[0]} = "
                f"{self._faces[bad[0]].tolist()}, area {0.5 * twice_area[bad[0]]:.3g}); expected "
                f"non-degenerate triangles to invert their rest frames"
            )
        inv = np.empty_like(dm)
        a, b, d = dm[:, 0, 0], dm[:, 0, 1], dm[:, 1, 1]
        inv[:, 0, 0] = 1.0 / a
        inv[:, 0, 1] = -b / (a * d)
        inv[:, 1, 0] = 0.0
        inv[:, 1, 1] = 1.0 / d
        return inv

    def __repr__(self) -> str:
        return (
            f"TriMesh(source={self.source!r}, vertex_count={self.vertex_count}, face_count={self.face_count}, "
            f"edge_count={self.edge_count}, boundary_edges={self._boundary_edges.size})"
        )


def _norm(v: np.ndarray) -> np.ndarray:
    """Row norms of an (k, 3) array (einsum: faster than np.linalg.norm on large arrays)."""
    return np.sqrt(np.einsum("ij,ij->i", v, v))


def _normalized(v: np.ndarray) -> np.ndarray:
    norm = _norm(v)[:, None]
    return np.divide(v, norm, out=np.zeros_like(v), where=norm > 0)


# ---------------------------------------------------------------------- file formats

_V_LINE = re.compile(r"^[ \t]*v[ \t]+(.*)$", re.M)
_F_LINE = re.compile(r"^[ \t]*f[ \t]+(.*)$", re.M)
_VF_KIND = re.compile(r"^[ \t]*([vf])[ \t]", re.M)


def _read_obj(path: pathlib.Path) -> tuple[np.ndarray, np.ndarray]:
    """Parses ``v`` and ``f`` lines of an OBJ file; returns float64 (n, 3) and int64 (m, 3), 0-based."""
    text = path.read_bytes().decode("utf-8", errors="replace")
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\\\n", " ")
    if "#" in text:
        text = re.sub(r"#[^\n]*", "", text)

    v_rows = _V_LINE.findall(text)
    if v_rows:
        counts = np.fromiter((len(s.split()) for s in v_rows), dtype=np.int64, count=len(v_rows))
        if counts.min() < 3:
            k = int(np.argmax(counts < 3))
            raise MeshError(f"{path}: vertex {k} ('v {v_rows[k].strip()}') has {counts[k]} coordinates; expected 3")
        try:
            if counts.min() == counts.max():
                vertices = np.array(" ".join(v_rows).split(), dtype=np.float64).reshape(-1, counts[0])[:, :3]
            else:
                vertices = np.array([s.split()[:3] for s in v_rows], dtype=np.float64)
        except ValueError:
            for k, s in enumerate(v_rows):
                try:
                    [float(t) for t in s.split()]
                except ValueError:
                    raise MeshError(f"{path}: vertex {k} ('v {s.strip()}') is not a list of numbers") from None
            raise
    else:
        vertices = np.zeros((0, 3))

    f_rows = _F_LINE.findall(text)
    if not f_rows:
        return vertices, np.zeros((0, 3), dtype=np.int64)
    sizes = np.fromiter((len(s.split()) for s in f_rows), dtype=np.int64, count=len(f_rows))
    if sizes.min() < 3:
        k = int(np.argmax(sizes < 3))
        raise MeshError(f"{path}: face line {k} ('f {f_rows[k].strip()}') has {sizes[k]} vertices; expected >= 3")
    joined = "\n".join(f_rows)
    if "/" in joined:
        joined = re.sub(r"/\S*", "", joined)
    try:
        corners = np.array(joined.split(), dtype=np.int64)
    except ValueError:
        bad = next(t for t in joined.split() if not re.fullmatch(r"[+-]?\d+", t))
        raise MeshError(f"{path}: face vertex index {bad!r} is not an integer") from None
    if (corners == 0).any():
        k = int(np.searchsorted(np.cumsum(sizes), int(np.argmax(corners == 0)), side="right"))
        raise MeshError(f"{path}: face line {k} ('f {f_rows[k].strip()}') uses index 0; OBJ indices start at 1")
    if (corners < 0).any():
        # relative index: -1 is the last vertex defined before this face line
        kinds = _VF_KIND.findall(text)
        is_v = np.array([k == "v" for k in kinds])
        defined_before = np.cumsum(is_v)[~is_v]
        corners = np.where(corners < 0, np.repeat(defined_before, sizes) + corners, corners - 1)
    else:
        corners = corners - 1

    if (sizes == 3).all():
        return vertices, corners.reshape(-1, 3)
    # fan-triangulate polygons: (c0, c_i, c_{i+1}) for i = 1 .. size-2
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    tri_per_face = sizes - 2
    base = np.repeat(offsets, tri_per_face)
    i = np.arange(tri_per_face.sum()) - np.repeat(np.cumsum(tri_per_face) - tri_per_face, tri_per_face) + 1
    faces = np.stack([corners[base], corners[base + i], corners[base + i + 1]], axis=1)
    return vertices, faces


def _read_with_trimesh(path: pathlib.Path, ext: str) -> tuple[np.ndarray, np.ndarray]:
    import trimesh  # noqa: PLC0415 (heavy, only needed here)

    try:
        loaded = trimesh.load(str(path), file_type=ext[1:], process=False, maintain_order=True, force="mesh")
    except Exception as exc:
        raise MeshError(f"{path}: could not be read as {ext[1:].upper()} ({type(exc).__name__}: {exc})") from exc
    faces = getattr(loaded, "faces", None)
    if faces is None:
        raise MeshError(f"{path}: contains no triangle faces (read a {type(loaded).__name__}); expected a mesh")
    return np.asarray(loaded.vertices), np.asarray(faces)


def _write_obj(out, vertices: np.ndarray, faces: np.ndarray, uv) -> None:
    out.write(b"# written by warp_meshad\n")
    np.savetxt(out, vertices, fmt="v %.17g %.17g %.17g")
    one_based = faces.astype(np.int64) + 1
    if uv is None:
        np.savetxt(out, one_based, fmt="f %d %d %d")
    else:
        np.savetxt(out, uv, fmt="vt %.17g %.17g")
        np.savetxt(out, np.repeat(one_based, 2, axis=1), fmt="f %d/%d %d/%d %d/%d")


def _write_off(out, vertices: np.ndarray, faces: np.ndarray, uv) -> None:
    out.write(f"OFF\n{vertices.shape[0]} {faces.shape[0]} 0\n".encode())
    np.savetxt(out, vertices, fmt="%.17g %.17g %.17g")
    np.savetxt(out, faces, fmt="3 %d %d %d")


def _write_ply(out, vertices: np.ndarray, faces: np.ndarray, uv) -> None:
    header = (
        "ply\nformat binary_little_endian 1.0\ncomment written by warp_meshad\n"
        f"element vertex {vertices.shape[0]}\nproperty double x\nproperty double y\nproperty double z\n"
        f"element face {faces.shape[0]}\nproperty list uchar int vertex_indices\nend_header\n"
    )
    out.write(header.encode("ascii"))
    out.write(np.ascontiguousarray(vertices, dtype="<f8").tobytes())
    packed = np.empty(faces.shape[0], dtype=[("count", "u1"), ("index", "<i4", (3,))])
    packed["count"] = 3
    packed["index"] = faces
    out.write(packed.tobytes())


_WRITERS = {".obj": _write_obj, ".off": _write_off, ".ply": _write_ply}

"""Triangle meshes: validated host-side storage, topology stencils and rest-shape geometry.

`TriMesh` holds an oriented, edge-manifold triangle mesh as numpy arrays and derives, once, every
connectivity array the toolkit's terms use as element stencils (`faces`, `edges`, `edge_diamonds`,
`edge_faces`, `vertex_indices`, `vertex_one_rings`) plus boundary information and rest-shape helpers (edge lengths,
areas, normals, per-face 2D rest frames ``Dm``).

Everything here is pure numpy/scipy on the host and vectorised (meshes of millions of faces);
Warp is not imported. Construction validates the input and raises `MeshError` with a message that
names the source, what is wrong, where, and what was expected.

Half-edge convention used throughout: face ``f = (a, b, c)`` owns the three oriented half-edges
``a->b, b->c, c->a`` (corner ``k`` of the face starts half-edge ``k``), so ``3 * f + k`` indexes the
half-edge leaving corner ``k`` and the vertex opposite it is corner ``(k + 2) % 3``.
"""

from __future__ import annotations

import functools

import numpy as np

from warp_meshad._src.mesh.checks import (
    SHOW,
    UNREFERENCED_MODES,
    ElementWords,
    MeshError,
    check_arrays,
    check_folder,
    check_mesh_file,
    check_option,
    check_save_path,
    first_items,
    readonly,
    referenced_vertices,
)
from warp_meshad._src.mesh.content_cache import cached, is_enabled
from warp_meshad._src.mesh.files import TRIANGLE_WRITERS, atomic_write, read_obj, read_with_trimesh
from warp_meshad._src.mesh.one_rings import OneRings, build_one_rings
from warp_meshad._src.mesh.sorting import sorted_groups
from warp_meshad._src.mesh.vertex_mesh import VertexMesh
from warp_meshad._src.plural import plural

__all__ = ["MeshError", "TriMesh"]

_SUPPORTED_EXTENSIONS = (".obj", ".off", ".ply")
_PACKED_SORT_BITS = 63  # edge keys and half-edge ids packed into one int64 when they fit (else argsort)
_DEGENERATE_RTOL = 1e-12  # a face is degenerate when |(x1-x0) x (x2-x0)| <= rtol * (longest edge)^2

_TRIANGLES = ElementWords(
    mesh="TriMesh", array="faces", single="face", noun="triangle", valence=3,
    shape_hint=" (only triangles are supported)", index_dtype="stored as int32",
    repeat_hint="degenerate index triples, ", file_kind="mesh",
)  # the words of TriMesh's messages


class TriMesh(VertexMesh):
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
        check_option(self.source, "unreferenced", unreferenced, UNREFERENCED_MODES)
        v, f = check_arrays(self.source, vertices, faces, _TRIANGLES)
        self._vertices, self._faces, self.vertex_map, self.removed_vertices, unused = referenced_vertices(
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
        starts, counts, halfedge_edge = sorted_groups(sorted_key, order)

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
                shown = ", ".join(f"({edges[e, 0]}, {edges[e, 1]}) in {counts[e]} faces" for e in over[:SHOW])
                more = ", ..." if over.size > SHOW else ""
                parts.append(f"{plural(over.size, 'edge is', 'edges are')} shared by more than 2 faces [{shown}{more}]")
            if same.size:
                shown = ", ".join(f"({edges[e, 0]}, {edges[e, 1]})" for e in same[:SHOW])
                more = ", ..." if same.size > SHOW else ""
                parts.append(
                    f"{plural(same.size, 'edge is', 'edges are')} used twice with the same orientation, i.e. "
                    f"neighbouring faces are inconsistently oriented [{shown}{more}]"
                )
            raise MeshError(
                f"{self.source}: non-manifold mesh: " + "; ".join(parts) + ". Expected an oriented "
                "edge-manifold mesh (each edge in one or two faces, traversed in opposite directions by "
                "the two); repair the mesh first (e.g. split non-manifold edges, reorient faces)"
            )

        self._edges = readonly(edges.astype(np.int32))
        self._face_edges = readonly(halfedge_edge.reshape(m, 3).astype(np.int32))
        self._edge_face_counts = readonly(counts.astype(np.int32))
        self._boundary_edges = readonly(np.flatnonzero(counts == 1).astype(np.int32))
        interior = np.flatnonzero(counts == 2)
        self._interior_edges = readonly(interior.astype(np.int32))

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
        self._edge_faces = readonly(edge_faces)
        self._edge_diamonds = readonly(diamonds)

    # ------------------------------------------------------------------ constructors

    @classmethod
    def from_file(cls, path, *, unreferenced: str = "error") -> TriMesh:
        """Loads a triangle mesh from an OBJ, OFF or PLY file, keeping the file's vertices exactly.

        OBJ is parsed here (``v`` and ``f`` lines only; ``f a/b/c`` and negative indices are
        understood, texture and normal indices ignored, so vertices are never split at UV or normal
        seams; polygons are fan-triangulated). OFF and PLY go through trimesh with
        ``process=False, maintain_order=True``. Vertex count and order always match the file.
        Inside an app run the parsed arrays are kept in the content cache, keyed by the file's bytes
        (:mod:`~warp_meshad._src.mesh.content_cache`); the mesh is validated and built from them
        each time.

        Args:
            path: file path (str or os.PathLike); the extension picks the format (case-insensitive).
            unreferenced: ``"error"`` or ``"remove"``, as in `TriMesh`.

        Returns:
            The mesh, with `source` set to the path.

        Raises:
            MeshError: missing file, unsupported extension, unreadable file, or an invalid mesh.
        """
        p, ext = check_mesh_file(path, _SUPPORTED_EXTENSIONS, _TRIANGLES)

        def read():
            v, f = read_obj(p) if ext == ".obj" else read_with_trimesh(p, ext)
            return {"vertices": v, "faces": f}

        arrays = cached(f"{ext[1:]}-file", [p.read_bytes()], read, ("vertices", "faces")) if is_enabled() else read()
        return cls(arrays["vertices"], arrays["faces"], unreferenced=unreferenced, source=str(p))

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
        mesh.vertex_map = readonly(self.vertex_map[order].astype(np.int32))
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
        p, ext = check_save_path(path, _SUPPORTED_EXTENSIONS)
        if uv is not None:
            uv = np.asarray(uv, dtype=np.float64)
            if uv.shape != (self.vertex_count, 2):
                raise MeshError(f"{p}: cannot save: uv has shape {uv.shape}; expected ({self.vertex_count}, 2)")
            if ext != ".obj":
                raise MeshError(f"{p}: cannot save: uv is only written to .obj files, got {ext}")
        check_folder(p)

        def write(tmp):
            with open(tmp, "wb") as out:
                TRIANGLE_WRITERS[ext](out, self._vertices, self._faces, uv)

        atomic_write(p, write)

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

    def vertex_one_rings(self) -> OneRings:
        """Each vertex's one-ring (its neighbours, counter-clockwise), padded with the vertex itself to one width.

        The stencil of variable-valence terms: ``rings.elements`` (vertex_count, 1 + R) holds each vertex and its
        ring, the ring padded with the centre vertex beyond ``rings.valence[i]`` (R = the largest valence), ready for
        :meth:`~warp_meshad.Problem.add_term`; ``rings.by_valence()`` groups the vertices for one term per valence.
        Interior rings are closed and start at their smallest neighbour; boundary rings are open and run from the
        neighbour across the outgoing boundary edge to the one across the incoming one (see :class:`OneRings`).
        Computed once (vectorised over the half-edges) and cached.

        Example, the uniform Laplacian energy ``sum_i |sum_k (x_k - x_i)|^2`` of scalar variables: the padded
        slots add ``x_i - x_i = 0``::

            rings = mesh.vertex_one_rings()           # here with max_valence 6

            @wp.func
            def laplacian(e: int, xc: Any, x0: Any, x1: Any, x2: Any, x3: Any, x4: Any, x5: Any):
                d = (x0 - xc) + (x1 - xc) + (x2 - xc) + (x3 - xc) + (x4 - xc) + (x5 - xc)
                return d * d

            problem.add_term(elements=rings.elements, energy=laplacian)

        Returns:
            :class:`OneRings`: ``ring`` and ``faces`` int32 (vertex_count, max_valence), ``valence`` int32
            (vertex_count,), read-only.
        """
        return self._one_rings

    @functools.cached_property
    def _one_rings(self) -> OneRings:
        return build_one_rings(self._faces, self._halfedge_twin, self.vertex_count)

    @functools.cached_property
    def boundary_vertices(self) -> np.ndarray:
        """Vertices on the boundary, int32, shape (number of boundary vertices,), sorted."""
        return readonly(np.unique(self._edges[self._boundary_edges]).astype(np.int32))

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
            loops.append(readonly(loop.astype(np.int32)))
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
                f"{self.source}: faces {first_items(bad)} have zero area (face {bad[0]} = "
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

"""Tetrahedral meshes: validated host-side storage, stencils, boundary surface and rest shapes.

`TetMesh` holds a positively oriented, face-manifold tetrahedral mesh as numpy arrays and derives, once, the
connectivity the toolkit's terms use as element stencils (`tets`, `faces`, `edges`, `vertex_indices`), the boundary
surface (`boundary_faces`, oriented outward, and `boundary_mesh` as a :class:`~warp_meshad.TriMesh`) and rest-shape
helpers (signed volumes, rest matrices ``Dm`` and their inverses, lumped vertex volumes).

Orientation convention: tet ``(a, b, c, d)`` is positive when its signed volume
``det[x_b - x_a, x_c - x_a, x_d - x_a] / 6`` is > 0 (VTK's and Gmsh's convention: ``a, b, c`` turn counter-clockwise
seen from ``d``). Its four faces, each opposite one corner and oriented outward, are
``(b, c, d), (a, d, c), (a, b, d), (a, c, b)``.

Everything here is vectorised numpy on the host; Warp is not imported. Files are read with meshio (Gmsh ``.msh``,
VTK ``.vtk`` / ``.vtu``, Medit ``.mesh``), imported only there. Construction validates the input and raises
:class:`~warp_meshad.MeshError` naming the source, what is wrong, where (tet or vertex indices) and what was expected.
"""

from __future__ import annotations

import functools

import numpy as np

from warp_meshad._src.mesh.checks import (
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
from warp_meshad._src.mesh.files import atomic_write
from warp_meshad._src.mesh.sorting import sorted_groups
from warp_meshad._src.mesh.trimesh import TriMesh
from warp_meshad._src.mesh.vertex_mesh import VertexMesh
from warp_meshad._src.plural import plural

__all__ = ["TetMesh"]

_SUPPORTED_EXTENSIONS = (".msh", ".vtk", ".vtu", ".mesh")
_MESHIO_FORMATS = {".msh": "gmsh", ".vtk": "vtk", ".vtu": "vtu", ".mesh": "medit"}  # meshio's reader/writer modules
_INVERTED_MODES = ("error", "flip")
_DEGENERATE_RTOL = 1e-12  # a tet is degenerate when |6 V| <= rtol * (longest edge)^3 (regular tet: 6 V = 0.707 L^3)
# the four faces of tet (a, b, c, d), face k opposite corner k, each oriented outward for a positive tet
_TET_FACES = np.array([[1, 2, 3], [0, 3, 2], [0, 1, 3], [0, 2, 1]], dtype=np.int64)
_TET_EDGES = np.array([[0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]], dtype=np.int64)
_TETRAHEDRA = ElementWords(
    mesh="TetMesh", array="tets", single="tet", noun="tetrahedron", valence=4,
    shape_hint=" (only linear tetrahedra, 4 vertices each, are supported)", index_dtype="int32", repeat_hint="",
    file_kind="tet mesh",
)  # the words of TetMesh's messages


def _tet_edge_vectors(x: np.ndarray, tets: np.ndarray) -> np.ndarray:
    """Columns x_b - x_a, x_c - x_a, x_d - x_a of every tet, float64, shape (m, 3, 3) (the matrix ``Ds``)."""
    x0 = np.take(x, tets[:, 0], axis=0)
    cols = [np.take(x, tets[:, k], axis=0) - x0 for k in (1, 2, 3)]
    return np.stack(cols, axis=2)


def _det3(a: np.ndarray) -> np.ndarray:
    """Determinants of a stack of 3x3 matrices (explicit formula: several times faster than np.linalg.det)."""
    return (
        a[:, 0, 0] * (a[:, 1, 1] * a[:, 2, 2] - a[:, 1, 2] * a[:, 2, 1])
        - a[:, 0, 1] * (a[:, 1, 0] * a[:, 2, 2] - a[:, 1, 2] * a[:, 2, 0])
        + a[:, 0, 2] * (a[:, 1, 0] * a[:, 2, 1] - a[:, 1, 1] * a[:, 2, 0])
    )


class TetMesh(VertexMesh):
    """A positively oriented, face-manifold tetrahedral mesh with cached stencils, boundary and rest shapes.

    Construction validates the arrays and raises `MeshError` for: wrong shapes or dtypes, an empty mesh, non-finite
    coordinates, tet indices out of range, a vertex repeated within a tet, degenerate tets (signed volume
    ``|V| <= 1e-12 L^3 / 6``, L the tet's longest edge), inverted tets (V < 0; ``inverted="flip"`` reorients them),
    non-manifold faces (a triangle shared by more than two tets, or by two tets on the same side of it: overlapping
    tets) and unreferenced vertices (unless ``unreferenced="remove"``).

    All arrays are numpy, computed once and read-only (copy them to modify).

    Args:
        vertices: vertex positions, shape (n, 3), any real dtype; stored as float64, C-contiguous.
        tets: tetrahedra as vertex indices, shape (m, 4), integer dtype; stored as int32. Positively oriented (see
            the module docstring).
        unreferenced: ``"error"`` (default) refuses vertices used by no tet; ``"remove"`` drops them, reindexes the
            tets and records the mapping in `vertex_map` and `removed_vertices`.
        inverted: ``"error"`` (default) refuses tets of negative signed volume; ``"flip"`` swaps their last two
            vertices (for files written with the opposite orientation convention) and records them in `flipped_tets`.
        source: name used in error messages (a file path); defaults to ``"TetMesh(...)"``.

    Attributes:
        source: the file path, or ``"TetMesh(...)"``; named in every error message.
        vertex_map: original index of each kept vertex, int32, shape (vertex_count,); the identity ``arange`` when
            no vertex was removed.
        removed_vertices: original indices of the vertices dropped by ``unreferenced="remove"``, int32, sorted.
        flipped_tets: indices of the tets reoriented by ``inverted="flip"``, int32, sorted; empty otherwise.

    Raises:
        MeshError: the input is not a valid tet mesh (see above).
    """

    def __init__(self, vertices, tets, *, unreferenced: str = "error", inverted: str = "error", source=None):
        self.source = "TetMesh(...)" if source is None else str(source)
        check_option(self.source, "unreferenced", unreferenced, UNREFERENCED_MODES)
        check_option(self.source, "inverted", inverted, _INVERTED_MODES)
        v, t = check_arrays(self.source, vertices, tets, _TETRAHEDRA)
        t, flipped = self._check_volumes(v, t, inverted)
        self._vertices, self._tets, self.vertex_map, self.removed_vertices, unused = referenced_vertices(
            self.source, v, t, unreferenced, _TETRAHEDRA
        )
        self.flipped_tets = readonly(flipped.astype(np.int32))
        # topology before unreferenced vertices, as TriMesh: a non-manifold mesh reports that first
        self._build_faces()
        if unused is not None:
            raise unused

    # ------------------------------------------------------------------ validation

    def _check_volumes(self, v: np.ndarray, t: np.ndarray, inverted: str) -> tuple[np.ndarray, np.ndarray]:
        """Refuses degenerate tets; refuses (or flips) inverted ones. Returns the tets and the flipped indices."""
        src = self.source
        ds = _tet_edge_vectors(v, t)
        six_vol = _det3(ds)
        e = v[t[:, _TET_EDGES[:, 1]]] - v[t[:, _TET_EDGES[:, 0]]]  # (m, 6, 3)
        longest = np.sqrt(np.einsum("mek,mek->me", e, e).max(axis=1))
        degenerate = np.abs(six_vol) <= _DEGENERATE_RTOL * longest**3
        if degenerate.any():
            bad = np.flatnonzero(degenerate)
            b = bad[0]
            raise MeshError(
                f"{src}: tets {first_items(bad)} are degenerate (flat or collapsed: tet {b} = {t[b].tolist()} has signed "
                f"volume {six_vol[b] / 6:.3g} with longest edge {longest[b]:.3g}); expected |volume| > "
                f"{_DEGENERATE_RTOL:g} x (longest edge)^3 / 6"
            )
        negative = np.flatnonzero(six_vol < 0)
        if negative.size and inverted == "error":
            b = negative[0]
            every = " (all of them: the source may use the opposite orientation convention)" if (
                negative.size == t.shape[0]) else ""
            raise MeshError(
                f"{src}: tets {first_items(negative)} are inverted{every}: tet {b} = {t[b].tolist()} has signed volume "
                f"{six_vol[b] / 6:.3g}; expected det[x_b - x_a, x_c - x_a, x_d - x_a] > 0 for every tet (a, b, c, d). "
                f'Pass inverted="flip" to reorient them'
            )
        if negative.size:
            t = t.copy()
            t[negative] = t[negative][:, [0, 1, 3, 2]]
        return t, negative

    # ------------------------------------------------------------------ topology

    def _build_faces(self) -> None:
        """Unique triangles from the 4 m oriented tet faces with one sort; checks that the mesh is face-manifold."""
        t = self._tets.astype(np.int64)
        n, m = self._vertices.shape[0], t.shape[0]
        local = t[:, _TET_FACES].reshape(-1, 3)  # (4m, 3): face k of tet j is row 4 j + k, oriented outward
        s = np.sort(local, axis=1)
        # parity of the permutation sorting each face: even = same cyclic orientation as the sorted triple
        even = (local == s).all(axis=1) | (local == s[:, [1, 2, 0]]).all(axis=1) | (local == s[:, [2, 0, 1]]).all(axis=1)
        if n ** 3 < 2**62:
            key = (s[:, 0] * n + s[:, 1]) * n + s[:, 2]
            order = np.argsort(key, kind="stable")
            starts, counts, local_face = sorted_groups(key[order], order)
        else:
            order = np.lexsort((s[:, 2], s[:, 1], s[:, 0]))
            starts, counts, local_face = sorted_groups(s[order], order)
        even_count = np.bincount(local_face, weights=even, minlength=starts.size).astype(np.int64)

        over = np.flatnonzero(counts > 2)
        same = np.flatnonzero((counts == 2) & (even_count != 1))
        if over.size or same.size:
            faces_sorted = s[order[starts]]
            parts = []
            if over.size:
                tets_of = [np.unique(order[starts[f]:starts[f] + counts[f]] // 4).tolist() for f in over[:3]]
                shown = ", ".join(f"{faces_sorted[f].tolist()} in tets {ts}" for f, ts in zip(over[:3], tets_of))
                more = ", ..." if over.size > 3 else ""
                parts.append(f"{plural(over.size, 'triangle is', 'triangles are')} shared by more than 2 tets "
                             f"[{shown}{more}]")
            if same.size:
                tets_of = [(order[starts[f]:starts[f] + 2] // 4).tolist() for f in same[:3]]
                shown = ", ".join(f"{faces_sorted[f].tolist()} in tets {ts}" for f, ts in zip(same[:3], tets_of))
                more = ", ..." if same.size > 3 else ""
                parts.append(
                    f"{plural(same.size, 'triangle is', 'triangles are')} shared by two tets lying on the same side of "
                    f"them (overlapping "
                    f"tets) [{shown}{more}]"
                )
            raise MeshError(
                f"{self.source}: non-manifold tet mesh: " + "; ".join(parts) + ". Expected each triangle in one tet "
                "(boundary) or two tets on opposite sides of it (interior)"
            )

        first = order[starts]  # the first local face of each unique triangle, in its tet's outward orientation
        self._faces = readonly(local[first].astype(np.int32))
        self._tet_faces = readonly(local_face.reshape(m, 4).astype(np.int32))
        self._face_tet_counts = readonly(counts.astype(np.int32))
        self._boundary_face_indices = readonly(np.flatnonzero(counts == 1).astype(np.int32))

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_file(cls, path, unreferenced: str = "error", inverted: str = "error") -> TetMesh:
        """Reads the tetrahedra of a Gmsh ``.msh``, VTK ``.vtk`` / ``.vtu`` or Medit ``.mesh`` file (with meshio).

        Every ``tetra`` cell block of the file is kept, in file order; other cells (triangles, lines, points) are
        ignored. Vertex count and order match the file, so ``unreferenced="remove"`` is needed where the file also
        holds points that no tet uses.

        Args:
            path: file path (str or os.PathLike); the extension picks the format (case-insensitive).
            unreferenced: ``"error"`` or ``"remove"``, as in `TetMesh`.
            inverted: ``"error"`` or ``"flip"``, as in `TetMesh`.

        Returns:
            The mesh, with `source` set to the path.

        Raises:
            MeshError: missing file, unsupported extension, unreadable file, no linear tets, or an invalid mesh.
        """
        p, ext = check_mesh_file(path, _SUPPORTED_EXTENSIONS, _TETRAHEDRA)
        meshio = _meshio(p)
        try:
            # the format's own reader: meshio.read() would try other formats and call sys.exit() when all fail
            data = getattr(meshio, _MESHIO_FORMATS[ext]).read(str(p))
        except Exception as exc:  # meshio raises ReadError, ValueError, KeyError, ... on bad files
            raise MeshError(f"{p}: could not be read as a tet mesh ({type(exc).__name__}: {exc})") from exc
        blocks = [c.data for c in data.cells if c.type == "tetra"]
        if not blocks:
            kinds = sorted({c.type for c in data.cells})
            hint = " (higher-order tets: export linear 4-node tets)" if any(k.startswith("tetra") for k in kinds) else ""
            raise MeshError(
                f"{p}: contains no linear tetrahedra (cell types found: {', '.join(kinds) or 'none'}){hint}; "
                f"expected 'tetra' cells"
            )
        tets = np.concatenate([np.asarray(b) for b in blocks], axis=0)
        return cls(np.asarray(data.points), tets, unreferenced=unreferenced, inverted=inverted, source=str(p))

    @classmethod
    def box(cls, nx: int, ny: int, nz: int, width: float = 1.0, height: float = 1.0, depth: float = 1.0) -> TetMesh:
        """A structured tet mesh of the box [0, width] x [0, height] x [0, depth].

        Vertex ``i + nx * (j + ny * k)`` lies at ``(width i / (nx - 1), height j / (ny - 1), depth k / (nz - 1))``;
        each cell is split into 6 tets around its diagonal from corner (0, 0, 0) to corner (1, 1, 1) (Kuhn's
        subdivision: neighbouring cells split their shared face along the same diagonal, so the mesh is conforming).

        Args:
            nx, ny, nz: vertices along x, y and z, each >= 2.
            width, height, depth: extents along x, y and z.

        Returns:
            A mesh with ``nx ny nz`` vertices and ``6 (nx - 1)(ny - 1)(nz - 1)`` tets, all of volume
            ``width height depth / (6 (nx - 1)(ny - 1)(nz - 1))``.
        """
        source = f"TetMesh.box({nx}, {ny}, {nz})"
        if any(int(c) != c or c < 2 for c in (nx, ny, nz)):
            raise MeshError(f"{source}: nx={nx}, ny={ny}, nz={nz}; expected integers >= 2")
        if not all(float(e) > 0.0 for e in (width, height, depth)):
            raise MeshError(f"{source}: width={width}, height={height}, depth={depth}; expected extents > 0")
        nx, ny, nz = int(nx), int(ny), int(nz)
        gz, gy, gx = np.meshgrid(
            np.linspace(0.0, float(depth), nz), np.linspace(0.0, float(height), ny), np.linspace(0.0, float(width), nx),
            indexing="ij",
        )
        vertices = np.stack([gx.ravel(), gy.ravel(), gz.ravel()], axis=1)
        k, j, i = np.meshgrid(np.arange(nz - 1), np.arange(ny - 1), np.arange(nx - 1), indexing="ij")
        base = (i + nx * (j + ny * k)).ravel()
        step = np.array([1, nx, nx * ny])  # index offset of a unit step along x, y, z
        tets = []
        for perm, parity in (((0, 1, 2), 1), ((1, 2, 0), 1), ((2, 0, 1), 1), ((0, 2, 1), -1), ((2, 1, 0), -1),
                             ((1, 0, 2), -1)):
            c1 = step[perm[0]]
            c2 = c1 + step[perm[1]]
            c3 = c2 + step[perm[2]]
            corners = [0, c1, c2, c3] if parity > 0 else [0, c1, c3, c2]  # det[e_p0, e_p1, e_p2] = sign(perm)
            tets.append(np.stack([base + c for c in corners], axis=1))
        tets = np.stack(tets, axis=1).reshape(-1, 4)  # the 6 tets of a cell consecutive
        return cls(vertices, tets, source=source)

    # ------------------------------------------------------------------ output

    def save(self, path) -> None:
        """Writes the mesh (points and tetra cells) with meshio, atomically (temp file + ``os.replace``).

        Args:
            path: destination ``.msh`` (Gmsh 4.1 ASCII), ``.vtk``, ``.vtu`` or ``.mesh``; the extension picks it.

        Raises:
            MeshError: unsupported extension.
            FileNotFoundError: the destination folder does not exist.
        """
        p, ext = check_save_path(path, _SUPPORTED_EXTENSIONS)
        check_folder(p)
        meshio = _meshio(p)
        out = meshio.Mesh(self._vertices, [("tetra", self._tets)])
        options = {"file_format": "gmsh", "binary": False} if ext == ".msh" else {"file_format": _MESHIO_FORMATS[ext]}
        atomic_write(p, lambda tmp: meshio.write(tmp, out, **options), suffix=ext)  # meshio wants the extension

    # ------------------------------------------------------------------ counts and stencils

    @property
    def tet_count(self) -> int:
        """Number of tetrahedra m."""
        return self._tets.shape[0]

    @property
    def face_count(self) -> int:
        """Number of distinct triangles (interior and boundary)."""
        return self._faces.shape[0]

    @property
    def edge_count(self) -> int:
        """Number of undirected edges."""
        return self.edges.shape[0]

    @property
    def tets(self) -> np.ndarray:
        """Tetrahedra (TV stencil, valence 4: four vec3 variables per element), int32, shape (tet_count, 4),
        positively oriented."""
        return self._tets

    @property
    def faces(self) -> np.ndarray:
        """Distinct triangles (FV stencil), int32, shape (face_count, 3), each oriented outward from the first tet
        that uses it (for a boundary triangle: outward from the mesh)."""
        return self._faces

    @property
    def tet_faces(self) -> np.ndarray:
        """Index into `faces` of each tet's four faces (face k opposite corner k), int32, shape (tet_count, 4)."""
        return self._tet_faces

    @property
    def face_tet_counts(self) -> np.ndarray:
        """Number of tets using each triangle of `faces` (1 boundary, 2 interior), int32, shape (face_count,)."""
        return self._face_tet_counts

    @functools.cached_property
    def edges(self) -> np.ndarray:
        """Unique undirected edges (EV stencil), int32, shape (edge_count, 2); ``edges[:, 0] < edges[:, 1]``, rows
        sorted lexicographically."""
        t = self._tets.astype(np.int64)
        pairs = np.sort(t[:, _TET_EDGES].reshape(-1, 2), axis=1)
        n = self.vertex_count
        key = np.unique(pairs[:, 0] * n + pairs[:, 1])
        return readonly(np.stack(np.divmod(key, n), axis=1).astype(np.int32))

    @functools.cached_property
    def boundary_faces(self) -> np.ndarray:
        """Boundary triangles (used by one tet), oriented outward, int32, shape (B, 3), indices into `vertices`."""
        return readonly(self._faces[self._boundary_face_indices])

    @property
    def boundary_face_indices(self) -> np.ndarray:
        """Indices into `faces` of the boundary triangles, int32, shape (B,), ascending."""
        return self._boundary_face_indices

    @functools.cached_property
    def boundary_face_tets(self) -> np.ndarray:
        """The tet owning each boundary triangle, int32, shape (B,), rows as `boundary_faces`."""
        owner = np.full(self.face_count, -1, dtype=np.int64)
        owner[self._tet_faces.ravel()] = np.repeat(np.arange(self.tet_count), 4)
        return readonly(owner[self._boundary_face_indices].astype(np.int32))

    @functools.cached_property
    def boundary_vertices(self) -> np.ndarray:
        """Vertices on the boundary surface, int32, sorted."""
        return readonly(np.unique(self.boundary_faces).astype(np.int32))

    @functools.cached_property
    def _boundary_mesh(self) -> TriMesh:
        bv = self.boundary_vertices
        new_index = np.full(self.vertex_count, -1, dtype=np.int64)
        new_index[bv] = np.arange(bv.size)
        surface = TriMesh(self._vertices[bv], new_index[self.boundary_faces], source=f"{self.source} (boundary)")
        surface.vertex_map = readonly(bv.copy())
        return surface

    def boundary_mesh(self) -> TriMesh:
        """The boundary surface as a :class:`~warp_meshad.TriMesh` (computed once).

        Its vertices are `boundary_vertices` in order (``surface.vertex_map`` holds their indices into this mesh's
        `vertices`, so ``x[surface.vertex_map]`` are the surface positions of tet positions ``x``); its faces are
        `boundary_faces` renumbered, oriented outward.

        Raises:
            MeshError: the boundary is not an edge-manifold surface (e.g. two tets touching only along an edge).
        """
        return self._boundary_mesh

    # ------------------------------------------------------------------ geometry

    def rest_matrices(self, x=None) -> np.ndarray:
        """Per-tet matrix ``Dm = [x_b - x_a, x_c - x_a, x_d - x_a]`` (edge vectors as columns), float64, shape
        (tet_count, 3, 3); ``det Dm = 6 V > 0``. The deformation gradient of positions x' is ``F = Ds(x') Dm^-1``.

        Args:
            x: positions, shape (vertex_count, 3); defaults to `vertices` (the rest shape).
        """
        return _tet_edge_vectors(self._positions(x), self._tets)

    def rest_matrix_inverses(self, x=None) -> np.ndarray:
        """Inverses ``Dm^-1`` of `rest_matrices`, float64, shape (tet_count, 3, 3).

        Args:
            x: positions, shape (vertex_count, 3); defaults to `vertices`.

        Raises:
            MeshError: some tets of ``x`` are degenerate (only possible for positions other than the rest shape).
        """
        dm = self.rest_matrices(x)
        det = _det3(dm)
        scale = np.abs(dm).max(axis=(1, 2))
        bad = np.flatnonzero(np.abs(det) <= _DEGENERATE_RTOL * scale**3)
        if bad.size:
            raise MeshError(
                f"{self.source}: tets {first_items(bad)} are degenerate in the given positions (tet {bad[0]} = "
                f"{self._tets[bad[0]].tolist()}, 6 x volume {det[bad[0]]:.3g}); expected non-degenerate tets to "
                f"invert their rest matrices"
            )
        return np.linalg.inv(dm)

    def volumes(self, x=None) -> np.ndarray:
        """Signed volume of each tet, ``det Dm / 6``, float64, shape (tet_count,) (> 0 at the rest shape).

        Args:
            x: positions, shape (vertex_count, 3); defaults to `vertices`.
        """
        return _det3(self.rest_matrices(x)) / 6.0

    def total_volume(self, x=None) -> float:
        """Sum of the signed tet volumes.

        Args:
            x: positions, shape (vertex_count, 3); defaults to `vertices`.
        """
        return float(self.volumes(x).sum())

    def vertex_volumes(self, x=None) -> np.ndarray:
        """Lumped volume per vertex: a quarter of the volume of each incident tet, float64, shape (vertex_count,).

        Times a density it gives the lumped masses of a mass matrix; the entries sum to `total_volume`.

        Args:
            x: positions, shape (vertex_count, 3); defaults to `vertices`.
        """
        vol = self.volumes(x)
        return np.bincount(self._tets.ravel(), weights=np.repeat(vol / 4.0, 4), minlength=self.vertex_count)

    def __repr__(self) -> str:
        return (
            f"TetMesh(source={self.source!r}, vertex_count={self.vertex_count}, tet_count={self.tet_count}, "
            f"boundary_faces={self._boundary_face_indices.size})"
        )


def _meshio(path):
    try:
        import meshio  # noqa: PLC0415 (only needed for files)
    except ImportError:
        raise ImportError(f"{path}: reading and writing tet mesh files needs meshio: pip install meshio") from None
    return meshio

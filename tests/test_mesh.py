"""Tests for warp_meshad._src.mesh.trimesh: loading, validation messages, topology stencils, rest geometry."""

import os
import pathlib
import re

import numpy as np
import pytest

from warp_meshad._src.mesh.trimesh import MeshError, TriMesh

MESHES = pathlib.Path(__file__).resolve().parents[1] / "assets" / "meshes"

# (file, V, F, Euler characteristic, boundary loops) from assets/meshes/README.md; stanford-bunny after
# removing its 1113 unreferenced vertices (README V counts the file's v lines).
TABLE = [
    ("spot.obj", 2930, 5856, 2, 0),
    ("sphere.obj", 2562, 5120, 2, 0),
    ("armadillo-cut-low.obj", 32121, 62382, 1, 1),
    ("bunny-cut.obj", 9850, 18954, 1, 1),
    ("woody.obj", 694, 1267, 1, 1),
    ("cheburashka.off", 6669, 13334, 2, 0),
    ("homer.obj", 6002, 12000, 2, 0),
    ("fandisk.obj", 6475, 12946, 2, 0),
]


@pytest.fixture(scope="module")
def woody():
    return TriMesh.from_file(MESHES / "woody.obj")


@pytest.fixture(scope="module")
def spot():
    return TriMesh.from_file(MESHES / "spot.obj")


def _obj_v_line_count(path):
    with open(path, "rb") as f:
        return sum(1 for line in f if line.startswith(b"v "))


def _tetrahedron():
    v = np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    f = np.array([[0, 2, 1], [0, 1, 3], [1, 2, 3], [0, 3, 2]])
    return v, f


# ---------------------------------------------------------------------- loading and counts


@pytest.mark.parametrize("name,V,F,chi,loops", TABLE)
def test_asset_counts(name, V, F, chi, loops):
    mesh = TriMesh.from_file(MESHES / name)
    assert (mesh.vertex_count, mesh.face_count) == (V, F)
    assert mesh.euler_characteristic == chi
    assert mesh.edge_count == V + F - chi
    assert len(mesh.boundary_loops) == loops
    assert mesh.is_closed == (loops == 0)
    if name.endswith(".obj"):  # no vertex split at UV or normal seams (spot has vt lines)
        assert mesh.vertex_count == _obj_v_line_count(MESHES / name)
    assert mesh.vertices.dtype == np.float64 and mesh.vertices.flags.c_contiguous
    assert mesh.faces.dtype == np.int32 and mesh.faces.shape == (F, 3)
    assert mesh.source == str(MESHES / name)


def test_closed_mesh_every_edge_interior(spot):
    assert spot.is_closed and spot.euler_characteristic == 2
    assert spot.edge_count == spot.vertex_count + spot.face_count - 2
    assert 2 * spot.edge_count == 3 * spot.face_count
    assert spot.boundary_edges.size == 0 and spot.boundary_vertices.size == 0
    assert np.all(spot.edge_face_counts == 2)


def test_obj_vertices_match_file_order(spot):
    rows = [line.split()[1:4] for line in (MESHES / "spot.obj").read_text().splitlines() if line.startswith("v ")]
    np.testing.assert_array_equal(spot.vertices, np.array(rows, dtype=np.float64))


def test_woody_is_a_disk_with_one_boundary_loop(woody):
    assert woody.euler_characteristic == 1
    (loop,) = woody.boundary_loops
    np.testing.assert_array_equal(np.sort(loop), woody.boundary_vertices)
    assert loop.size == woody.boundary_edges.size
    # consecutive loop vertices form boundary half-edges with the faces' orientation
    halfedges = {tuple(h) for h in woody.faces[:, [0, 1, 1, 2, 2, 0]].reshape(-1, 2).tolist()}
    for a, b in zip(loop.tolist(), np.roll(loop, -1).tolist()):
        assert (a, b) in halfedges and (b, a) not in halfedges


def test_stanford_bunny_unreferenced_error_and_remove():
    path = MESHES / "stanford-bunny.obj"
    with pytest.raises(MeshError, match=r"stanford-bunny\.obj.*1113 of 35947 vertices.*unreferenced=\"remove\""):
        TriMesh.from_file(path)
    mesh = TriMesh.from_file(path, unreferenced="remove")
    assert mesh.vertex_count == 35947 - 1113 and mesh.face_count == 69451
    assert mesh.removed_vertices.size == 1113
    assert mesh.vertex_map.dtype == np.int32 and mesh.vertex_map.shape == (mesh.vertex_count,)
    assert np.all(np.diff(mesh.vertex_map) > 0)
    assert np.intersect1d(mesh.vertex_map, mesh.removed_vertices).size == 0
    assert mesh.vertex_map.size + mesh.removed_vertices.size == 35947
    rows = [line.split()[1:4] for line in path.read_text().splitlines() if line.startswith("v ")]
    original = np.array(rows, dtype=np.float64)
    np.testing.assert_array_equal(mesh.vertices, original[mesh.vertex_map])
    # faces still describe the same triangles in original numbering
    raw = TriMesh(original, np.asarray(mesh.vertex_map)[mesh.faces], unreferenced="remove")
    np.testing.assert_array_equal(raw.faces, mesh.faces)
    assert len(mesh.boundary_loops) == 5  # the bunny's 5 holes


def test_vertex_map_identity_when_nothing_removed(woody):
    np.testing.assert_array_equal(woody.vertex_map, np.arange(woody.vertex_count))
    assert woody.removed_vertices.size == 0


def test_off_and_ply_load_through_trimesh(tmp_path, woody):
    for ext in (".off", ".ply"):
        path = tmp_path / f"woody{ext}"
        woody.save(path)
        back = TriMesh.from_file(path)
        np.testing.assert_array_equal(back.faces, woody.faces)
        np.testing.assert_array_equal(back.vertices, woody.vertices)  # written exactly


def test_obj_slashes_negative_indices_and_polygons(tmp_path):
    text = "\n".join(
        [
            "# a unit square as one quad and a triangle with relative indices",
            "v 0 0 0", "v 1 0 0", "v 1 1 0", "v 0 1 0",
            "vt 0 0", "vt 1 0", "vt 1 1", "vt 0 1",
            "vn 0 0 1",
            "f 1/1/1 2/2/1 3/3/1 4/4/1",
            "v 2 0 0",
            "f -4//1 -1//1 -3//1",
        ]
    )  # fmt: skip
    path = tmp_path / "quad.obj"
    path.write_text(text + "\n")
    mesh = TriMesh.from_file(path)
    assert mesh.vertex_count == 5
    np.testing.assert_array_equal(mesh.faces, [[0, 1, 2], [0, 2, 3], [1, 4, 2]])
    np.testing.assert_allclose(mesh.total_area(), 1.5)


# ---------------------------------------------------------------------- validation errors


def test_beetle_non_manifold_edges():
    with pytest.raises(MeshError, match=r"beetle\.obj: non-manifold mesh: 47 edges are shared by more than 2 faces"):
        TriMesh.from_file(MESHES / "beetle.obj")


def test_inconsistent_orientation_is_non_manifold():
    v, f = _tetrahedron()
    f = f.copy()
    f[0] = f[0][::-1]
    pattern = r"TriMesh\(\.\.\.\): non-manifold.*3 edges are used twice with the same orientation"
    with pytest.raises(MeshError, match=pattern):
        TriMesh(v, f)


def test_edge_in_three_faces_names_the_edge():
    v = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1]], dtype=float)
    f = np.array([[0, 1, 2], [1, 0, 3], [0, 1, 4]])
    with pytest.raises(MeshError, match=r"1 edge is shared by more than 2 faces \[\(0, 1\) in 3 faces\]"):
        TriMesh(v, f)


def test_out_of_range_index():
    v, f = _tetrahedron()
    f = f.copy()
    f[2, 1] = 7
    pattern = r"TriMesh\(\.\.\.\): faces \[2\] \(1 in total\).*face 2 = \[1, 7, 3\] uses index 7.*0 <= index < 4"
    with pytest.raises(MeshError, match=pattern):
        TriMesh(v, f)
    f[2, 1] = -1
    with pytest.raises(MeshError, match=r"uses index -1"):
        TriMesh(v, f)


def test_nan_and_inf_coordinates():
    v, f = _tetrahedron()
    v = v.copy()
    v[3, 1] = np.nan
    v[1, 0] = np.inf
    with pytest.raises(MeshError, match=r"vertices \[1, 3\] \(2 in total\) have NaN or infinite coordinates"):
        TriMesh(v, f)


def test_empty_mesh():
    v, f = _tetrahedron()
    with pytest.raises(MeshError, match=r"empty mesh.*0 faces"):
        TriMesh(v, np.zeros((0, 3), dtype=np.int32))
    with pytest.raises(MeshError, match=r"empty mesh: 0 vertices"):
        TriMesh(np.zeros((0, 3)), f)
    with pytest.raises(MeshError, match=r"empty mesh"):
        TriMesh([], [])


def test_counts_agree_with_their_nouns(tmp_path):
    """One of a thing reads "1 edge is", more "2 edges are" (issue 21 point 4): the exact messages."""
    from warp_meshad._src.plural import plural

    assert [plural(0, "edge"), plural(1, "edge"), plural(2, "edge")] == ["0 edges", "1 edge", "2 edges"]
    assert [plural(1, "vertex", "vertices"), plural(3, "vertex", "vertices")] == ["1 vertex", "3 vertices"]
    v, f = _tetrahedron()
    with pytest.raises(MeshError) as info:
        TriMesh(v[:1], np.zeros((0, 3), dtype=np.int32))
    assert str(info.value) == ("TriMesh(...): empty mesh: 1 vertex (array shape (1, 3)) and 0 faces (array shape "
                               "(0, 3)); expected at least one vertex and one triangle")
    path = tmp_path / "short.obj"
    path.write_text("v 0 0 0\nv 1 0 0\nv 0 1\nf 1 2 3\n")
    with pytest.raises(MeshError) as info:
        TriMesh.from_file(path)
    assert str(info.value) == f"{path}: vertex 2 ('v 0 1') has 2 coordinates; expected 3"
    path.write_text("v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 3\nf 1\n")
    with pytest.raises(MeshError) as info:
        TriMesh.from_file(path)
    assert str(info.value) == f"{path}: face line 1 ('f 1') has 1 vertex; expected >= 3"
    edge_in_three = np.array([[0, 1, 2], [1, 0, 3], [0, 1, 4]])
    with pytest.raises(MeshError) as info:
        TriMesh(np.vstack([v, [[0.0, 0.0, 1.0]]]), edge_in_three)
    assert str(info.value).startswith("TriMesh(...): non-manifold mesh: 1 edge is shared by more than 2 faces "
                                      "[(0, 1) in 3 faces]. Expected"), str(info.value)


def test_repeated_vertex_in_face():
    v, f = _tetrahedron()
    f = np.vstack([f, [[1, 1, 2]], [[3, 0, 3]]])
    with pytest.raises(MeshError, match=r"faces \[4, 5\] \(2 in total\) repeat a vertex.*face 4 = \[1, 1, 2\]"):
        TriMesh(v, f)


def test_unreferenced_vertex_arrays():
    v, f = _tetrahedron()
    v = np.vstack([v[:2], [[9.0, 9.0, 9.0]], v[2:]])
    f = np.where(f >= 2, f + 1, f)
    with pytest.raises(MeshError, match=r"1 of 5 vertices is not used.*\[2\].*unreferenced=\"remove\""):
        TriMesh(v, f)
    mesh = TriMesh(v, f, unreferenced="remove")
    np.testing.assert_array_equal(mesh.vertex_map, [0, 1, 3, 4])
    np.testing.assert_array_equal(mesh.removed_vertices, [2])
    np.testing.assert_array_equal(mesh.faces, _tetrahedron()[1])
    with pytest.raises(ValueError, match=r"unreferenced='keep' is not an option"):
        TriMesh(v, f, unreferenced="keep")


@pytest.mark.parametrize(
    "vertices,faces,pattern",
    [
        (np.zeros((4, 2)), [[0, 1, 2]], r"vertices have shape \(4, 2\); expected \(n, 3\)"),
        (np.zeros(12), [[0, 1, 2]], r"vertices have shape \(12,\); expected \(n, 3\)"),
        (np.zeros((4, 3)), [[0, 1, 2, 3]], r"faces have shape \(1, 4\); expected \(m, 3\) \(only triangles"),
        (np.zeros((4, 3)), np.array([[0.0, 1.0, 2.0]]), r"faces have dtype float64; expected an integer dtype"),
        (np.array([["a", "b", "c"]] * 3), [[0, 1, 2]], r"vertices have dtype <U1; expected a real floating-point"),
    ],
)
def test_wrong_shapes_and_dtypes(vertices, faces, pattern):
    with pytest.raises(MeshError, match=r"TriMesh\(\.\.\.\): " + pattern):
        TriMesh(vertices, faces)


def test_missing_file_and_unknown_extension(tmp_path):
    missing = tmp_path / "nope.obj"
    with pytest.raises(MeshError, match=re.escape(str(missing)) + r": mesh file not found"):
        TriMesh.from_file(missing)
    stl = tmp_path / "mesh.stl"
    stl.write_text("solid x\nendsolid x\n")
    pattern = r"mesh\.stl: unsupported mesh file extension '\.stl'; supported: \.obj, \.off, \.ply"
    with pytest.raises(MeshError, match=pattern):
        TriMesh.from_file(stl)
    with pytest.raises(MeshError, match=r"unsupported extension '\.stl'"):
        TriMesh.grid(2, 2).save(stl)


def test_degenerate_face_rest_frame_inverse():
    v = np.array([[0, 0, 0], [1, 0, 0], [2, 0, 0], [0, 1, 0]], dtype=float)
    f = np.array([[0, 1, 3], [1, 2, 3], [0, 2, 1]])  # the last face is collinear (zero area)
    mesh = TriMesh(v, f, source="flat")
    with pytest.raises(MeshError, match=r"flat: faces \[2\] \(1 in total\) have zero area"):
        mesh.face_rest_frame_inverses()
    assert np.all(np.isfinite(mesh.face_rest_frames()))
    np.testing.assert_array_equal(mesh.face_normals()[2], 0.0)


# ---------------------------------------------------------------------- topology


@pytest.mark.parametrize("nx,ny", [(2, 2), (3, 5), (17, 9)])
def test_grid_topology(nx, ny):
    mesh = TriMesh.grid(nx, ny, width=2.0, height=3.0)
    assert mesh.vertex_count == nx * ny
    assert mesh.face_count == 2 * (nx - 1) * (ny - 1)
    assert mesh.edge_count == 3 * nx * ny - 2 * nx - 2 * ny + 1
    assert mesh.boundary_edges.size == 2 * (nx - 1) + 2 * (ny - 1)
    assert mesh.euler_characteristic == 1
    i, j = 1 % nx, ny - 1
    np.testing.assert_allclose(mesh.vertices[i + nx * j], [2.0 * i / (nx - 1), 3.0 * j / (ny - 1), 0.0])
    np.testing.assert_allclose(mesh.face_normals(), np.tile([0.0, 0.0, 1.0], (mesh.face_count, 1)))
    np.testing.assert_allclose(mesh.total_area(), 6.0)
    (loop,) = mesh.boundary_loops
    assert loop.size == 2 * (nx - 1) + 2 * (ny - 1)
    np.testing.assert_array_equal(loop[:3], [0, 1, 2] if nx > 2 else [0, 1, 3])  # counter-clockwise


def test_edges_sorted_unique_and_face_edges(woody):
    e = woody.edges
    assert e.dtype == np.int32 and np.all(e[:, 0] < e[:, 1])
    keys = e[:, 0].astype(np.int64) * woody.vertex_count + e[:, 1]
    assert np.all(np.diff(keys) > 0)
    f = woody.faces
    for k in range(3):
        a, b = f[:, k], f[:, (k + 1) % 3]
        np.testing.assert_array_equal(e[woody.face_edges[:, k]], np.stack([np.minimum(a, b), np.maximum(a, b)], 1))
    np.testing.assert_array_equal(np.bincount(woody.face_edges.ravel()), woody.edge_face_counts)
    assert woody.boundary_edges.size + woody.interior_edges.size == woody.edge_count
    np.testing.assert_array_equal(woody.vertex_indices[:, 0], np.arange(woody.vertex_count))
    assert woody.vertex_indices.shape == (woody.vertex_count, 1)


@pytest.mark.parametrize("name", ["woody.obj", "spot.obj"])
def test_edge_faces_and_diamonds_consistent(name):
    mesh = TriMesh.from_file(MESHES / name)
    f = mesh.faces
    ef, dia = mesh.edge_faces, mesh.edge_diamonds
    v0, v1 = mesh.edges[mesh.interior_edges].T
    np.testing.assert_array_equal(dia[:, :2], np.stack([v0, v1], 1))
    assert ef.shape == (mesh.interior_edges.size, 2) and dia.shape == (mesh.interior_edges.size, 4)

    def has_halfedge(face, a, b):
        return np.any([(face[:, k] == a) & (face[:, (k + 1) % 3] == b) for k in range(3)], axis=0)

    assert np.all(has_halfedge(f[ef[:, 0]], v0, v1))
    assert np.all(has_halfedge(f[ef[:, 1]], v1, v0))
    # the opposite vertices complete each face: face f0 = {v0, v1, a}, face f1 = {v0, v1, b}
    np.testing.assert_array_equal(np.sort(f[ef[:, 0]], 1), np.sort(dia[:, [0, 1, 2]], 1))
    np.testing.assert_array_equal(np.sort(f[ef[:, 1]], 1), np.sort(dia[:, [0, 1, 3]], 1))
    assert np.all(dia[:, 2] != dia[:, 3])


def test_argsort_fallback_matches_packed_sort(monkeypatch, woody):
    import warp_meshad._src.mesh.trimesh as mesh_module

    monkeypatch.setattr(mesh_module, "_PACKED_SORT_BITS", 0)
    other = TriMesh(woody.vertices, woody.faces)
    for name in ("edges", "face_edges", "edge_faces", "edge_diamonds", "boundary_edges"):
        np.testing.assert_array_equal(getattr(other, name), getattr(woody, name))


def test_bowtie_boundary_loops():
    # two triangles sharing only vertex 0: one boundary loop per triangle
    v = np.array([[0, 0, 0], [1, 0, 0], [1, 1, 0], [-1, 0, 0], [-1, -1, 0]], dtype=float)
    mesh = TriMesh(v, [[0, 1, 2], [0, 3, 4]])
    loops = [lp.tolist() for lp in mesh.boundary_loops]
    assert sorted(loops) == [[0, 1, 2], [0, 3, 4]]


def test_arrays_are_read_only(woody):
    with pytest.raises(ValueError):
        woody.vertices[0, 0] = 1.0
    with pytest.raises(ValueError):
        woody.faces[0, 0] = 1


def test_large_grid_is_fast():
    import time

    start = time.perf_counter()
    mesh = TriMesh.grid(400, 400)
    _ = mesh.edge_diamonds, mesh.boundary_loops
    assert mesh.edge_count == 3 * 400 * 400 - 4 * 400 + 1
    assert time.perf_counter() - start < 5.0


# ---------------------------------------------------------------------- geometry


def test_areas_normals_and_lengths(spot):
    areas = spot.face_areas()
    assert np.all(areas > 0)
    np.testing.assert_allclose(areas.sum(), spot.total_area())
    n = spot.face_normals()
    np.testing.assert_allclose(np.linalg.norm(n, axis=1), 1.0)
    vn = spot.vertex_normals()
    np.testing.assert_allclose(np.linalg.norm(vn, axis=1), 1.0)
    # closed surface: sum of area-weighted normals vanishes; outward orientation gives positive volume
    np.testing.assert_allclose((areas[:, None] * n).sum(0), 0.0, atol=1e-12)
    x = spot.vertices[spot.faces]
    volume = np.einsum("ij,ij->i", x[:, 0], np.cross(x[:, 1], x[:, 2])).sum() / 6.0
    assert volume > 0
    e = spot.edges
    lengths = np.linalg.norm(spot.vertices[e[:, 0]] - spot.vertices[e[:, 1]], axis=1)
    np.testing.assert_allclose(spot.edge_lengths(), lengths)
    lo, hi = spot.bounding_box()
    np.testing.assert_allclose(lo, spot.vertices.min(0))
    np.testing.assert_allclose(hi, spot.vertices.max(0))


def test_geometry_with_positions_argument(woody):
    rng = np.random.default_rng(0)
    rot, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    x = 2.0 * woody.vertices @ rot.T
    np.testing.assert_allclose(woody.face_areas(x), 4.0 * woody.face_areas(), rtol=1e-12)
    np.testing.assert_allclose(woody.edge_lengths(x), 2.0 * woody.edge_lengths(), rtol=1e-12)
    np.testing.assert_allclose(woody.face_rest_frames(x), 2.0 * woody.face_rest_frames(), rtol=1e-10, atol=1e-14)
    with pytest.raises(MeshError, match=r"positions have shape \(3, 3\); expected \(694, 3\)"):
        woody.face_areas(np.zeros((3, 3)))


@pytest.mark.parametrize("name", ["woody.obj", "spot.obj"])
def test_face_rest_frames(name):
    mesh = TriMesh.from_file(MESHES / name)
    dm = mesh.face_rest_frames()
    assert dm.shape == (mesh.face_count, 2, 2) and dm.dtype == np.float64
    np.testing.assert_allclose(np.linalg.det(dm), 2.0 * mesh.face_areas(), rtol=1e-10)
    x = mesh.vertices[mesh.faces]
    e1, e2 = x[:, 1] - x[:, 0], x[:, 2] - x[:, 0]
    np.testing.assert_allclose(np.linalg.norm(dm[:, :, 0], axis=1), np.linalg.norm(e1, axis=1), rtol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(dm[:, :, 1], axis=1), np.linalg.norm(e2, axis=1), rtol=1e-12)
    np.testing.assert_allclose(
        np.linalg.norm(dm[:, :, 1] - dm[:, :, 0], axis=1), np.linalg.norm(e2 - e1, axis=1), rtol=1e-10
    )
    np.testing.assert_allclose(dm[:, 1, 0], 0.0)
    inv = mesh.face_rest_frame_inverses()
    np.testing.assert_allclose(dm @ inv, np.broadcast_to(np.eye(2), dm.shape), atol=1e-9)
    # F = Ds Dm^-1 of the rest shape is an isometry onto the face plane: F^T F = I
    ds = np.stack([e1, e2], axis=2)  # (m, 3, 2)
    F = ds @ inv
    np.testing.assert_allclose(np.swapaxes(F, 1, 2) @ F, np.broadcast_to(np.eye(2), dm.shape), atol=1e-8)
    # second frame axis completes a right-handed frame with the normal: F[:, :, 0] x F[:, :, 1] = n
    np.testing.assert_allclose(np.cross(F[:, :, 0], F[:, :, 1]), mesh.face_normals(), atol=1e-8)


# ---------------------------------------------------------------------- saving


def test_save_load_round_trip_obj_with_uv(tmp_path, woody):
    rng = np.random.default_rng(1)
    uv = rng.random((woody.vertex_count, 2))
    path = tmp_path / "woody_uv.obj"
    woody.save(path, uv=uv)
    text = path.read_text()
    assert sum(line.startswith("vt ") for line in text.splitlines()) == woody.vertex_count
    a, b, c = woody.faces[0] + 1
    assert f"f {a}/{a} {b}/{b} {c}/{c}" in text
    back = TriMesh.from_file(path)
    np.testing.assert_array_equal(back.vertices, woody.vertices)  # %.17g is exact
    np.testing.assert_array_equal(back.faces, woody.faces)
    vt = np.array([line.split()[1:] for line in text.splitlines() if line.startswith("vt ")], dtype=float)
    np.testing.assert_array_equal(vt, uv)
    assert [p.name for p in tmp_path.iterdir()] == ["woody_uv.obj"]  # no temp file left behind
    with pytest.raises(MeshError, match=r"uv has shape \(3, 2\); expected \(694, 2\)"):
        woody.save(tmp_path / "bad.obj", uv=np.zeros((3, 2)))
    with pytest.raises(MeshError, match=r"uv is only written to \.obj"):
        woody.save(tmp_path / "bad.ply", uv=uv)


def test_saved_files_get_ordinary_permissions(tmp_path):
    """TriMesh.save writes through a temporary file (mkstemp: 0600) and gives the result the mode a plain open()
    would (0666 less the umask)."""
    import stat

    old = os.umask(0o027)
    try:
        TriMesh.grid(2, 2).save(tmp_path / "g.obj")
        with open(tmp_path / "plain.txt", "w") as f:
            f.write("x")
    finally:
        os.umask(old)
    mode = stat.S_IMODE((tmp_path / "g.obj").stat().st_mode)
    assert mode == stat.S_IMODE((tmp_path / "plain.txt").stat().st_mode) == 0o640


def test_obj_reader_variants_and_bad_tokens(tmp_path):
    """The vectorized OBJ reader: vertex lines with colours, tabs, comments, polygons with v/vt/vn corners, relative
    indices; and its messages for a non-number coordinate and a non-integer index."""
    from warp_meshad._src.mesh.files import read_obj

    path = tmp_path / "mixed.obj"
    path.write_text("# a quad and a triangle\nv 0 0 0 1 0 0\nv\t1 0 0\n  v 1 1 0 # corner\nv 0 1 0 0.5 0.5 0.5\n"
                    "vt 0 0\nf 1/1/1 2/1/1 3/1/1 4/1/1\nv 2 0 0\nf -4 -1 -3\n")
    vertices, faces = read_obj(path)
    np.testing.assert_array_equal(vertices, [[0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0], [2, 0, 0]])
    np.testing.assert_array_equal(faces, [[0, 1, 2], [0, 2, 3], [1, 4, 2]])
    path.write_text("v 0 0 0\nv 1 zero 0\nv 0 1 0\nf 1 2 3\n")
    with pytest.raises(MeshError) as info:
        read_obj(path)
    assert str(info.value) == f"{path}: vertex 1 ('v 1 zero 0') is not a list of numbers"
    path.write_text("v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 3.5\n")
    with pytest.raises(MeshError) as info:
        read_obj(path)
    assert str(info.value) == f"{path}: face vertex index '3.5' is not an integer"

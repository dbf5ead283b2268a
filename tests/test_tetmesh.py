"""Tests for warp_meshad._src.mesh.tetmesh: validation messages, stencils, boundary surface, rest shapes, file round trips."""

import pathlib
import subprocess
import sys

import numpy as np
import pytest

import warp_meshad as wm
from warp_meshad import MeshError, TetMesh
from warp_meshad._src.mesh.files import new_file_mode

MESHES = pathlib.Path(__file__).resolve().parents[1] / "assets" / "meshes"
UNIT_TET = np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])


def _two_tets():
    """Two positive tets sharing the triangle (0, 1, 2), on opposite sides of it."""
    v = np.vstack([UNIT_TET, [[0.2, 0.2, -1.0]]])
    return v, np.array([[0, 1, 2, 3], [0, 2, 1, 4]])


def _divergence_volume(x, faces):
    """Volume enclosed by a closed outward-oriented surface: sum of x_0 . (e_1 x e_2) / 6."""
    n = np.cross(x[faces[:, 1]] - x[faces[:, 0]], x[faces[:, 2]] - x[faces[:, 0]])
    return float(np.einsum("ij,ij->i", n, x[faces[:, 0]]).sum() / 6.0)


# ---------------------------------------------------------------------- structure


def test_single_tet_stencils_and_outward_faces():
    mesh = TetMesh(UNIT_TET, [[0, 1, 2, 3]])
    assert (mesh.vertex_count, mesh.tet_count, mesh.face_count, mesh.edge_count) == (4, 1, 4, 6)
    assert mesh.tets.dtype == np.int32 and mesh.vertices.dtype == np.float64
    np.testing.assert_array_equal(mesh.edges, [[0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]])
    np.testing.assert_array_equal(mesh.vertex_indices, np.arange(4).reshape(4, 1))
    np.testing.assert_allclose(mesh.volumes(), [1.0 / 6.0])
    # each face is opposite one corner and its normal points away from that corner
    assert mesh.boundary_faces.shape == (4, 3)
    for face in mesh.boundary_faces:
        opposite = np.setdiff1d(np.arange(4), face)[0]
        x = UNIT_TET
        normal = np.cross(x[face[1]] - x[face[0]], x[face[2]] - x[face[0]])
        assert normal @ (x[face].mean(axis=0) - x[opposite]) > 0
    np.testing.assert_array_equal(mesh.faces[mesh.tet_faces[0]], mesh.tets[0][[[1, 2, 3], [0, 3, 2], [0, 1, 3],
                                                                              [0, 2, 1]]])
    assert not mesh.tets.flags.writeable and not mesh.boundary_faces.flags.writeable


@pytest.mark.parametrize("n", [(2, 2, 2), (5, 3, 4)])
def test_box_is_conforming_closed_and_outward(n):
    nx, ny, nz = n
    size = (2.0, 0.5, 0.75)
    mesh = TetMesh.box(nx, ny, nz, *size)
    cells = (nx - 1) * (ny - 1) * (nz - 1)
    assert (mesh.vertex_count, mesh.tet_count) == (nx * ny * nz, 6 * cells)
    np.testing.assert_allclose(mesh.volumes(), np.prod(size) / (6 * cells), rtol=1e-12)
    assert mesh.total_volume() == pytest.approx(np.prod(size), rel=1e-12)
    np.testing.assert_allclose(mesh.vertex_volumes().sum(), np.prod(size), rtol=1e-12)
    lo, hi = mesh.bounding_box()
    np.testing.assert_allclose(lo, 0.0, atol=0)
    np.testing.assert_allclose(hi, size)
    # boundary: 2 triangles per boundary cell face, closed genus-0 surface enclosing the box, outward
    quads = 2 * ((nx - 1) * (ny - 1) + (ny - 1) * (nz - 1) + (nx - 1) * (nz - 1))
    assert mesh.boundary_faces.shape == (2 * quads, 3)
    assert np.sum(mesh.face_tet_counts == 1) == 2 * quads and set(np.unique(mesh.face_tet_counts)) <= {1, 2}
    surface = mesh.boundary_mesh()
    assert isinstance(surface, wm.TriMesh) and surface.is_closed and surface.euler_characteristic == 2
    assert surface.total_area() == pytest.approx(2 * (size[0] * size[1] + size[1] * size[2] + size[0] * size[2]))
    assert _divergence_volume(surface.vertices, surface.faces) == pytest.approx(np.prod(size), rel=1e-12)
    np.testing.assert_array_equal(surface.vertex_map, mesh.boundary_vertices)
    np.testing.assert_array_equal(surface.vertices, mesh.vertices[surface.vertex_map])
    on_box = np.any(np.isclose(mesh.vertices, 0.0) | np.isclose(mesh.vertices, size), axis=1)
    np.testing.assert_array_equal(mesh.boundary_vertices, np.flatnonzero(on_box))
    # the owner tet of each boundary face contains it
    owners = mesh.tets[mesh.boundary_face_tets]
    assert all(set(f) <= set(t) for f, t in zip(mesh.boundary_faces.tolist(), owners.tolist()))
    # Euler characteristic of a ball: V - E + F - T = 1
    assert mesh.vertex_count - mesh.edge_count + mesh.face_count - mesh.tet_count == 1


def test_rest_matrices_and_inverses():
    rng = np.random.default_rng(0)
    mesh = TetMesh.box(3, 3, 2, 1.0, 2.0, 0.5)
    dm = mesh.rest_matrices()
    inv = mesh.rest_matrix_inverses()
    np.testing.assert_allclose(np.einsum("mij,mjk->mik", inv, dm), np.broadcast_to(np.eye(3), dm.shape), atol=1e-12)
    np.testing.assert_allclose(np.linalg.det(dm) / 6.0, mesh.volumes(), rtol=1e-12)
    # F = Ds(x) Dm^-1 of an affine map x -> A x + b is A in every tet
    a = rng.normal(size=(3, 3)) + 2 * np.eye(3)
    x = mesh.vertices @ a.T + rng.normal(size=3)
    f = np.einsum("mij,mjk->mik", mesh.rest_matrices(x), inv)
    np.testing.assert_allclose(f, np.broadcast_to(a, f.shape), atol=1e-12)
    np.testing.assert_allclose(mesh.volumes(x), np.linalg.det(a) * mesh.volumes(), rtol=1e-10)
    flat = mesh.vertices * [1.0, 1.0, 0.0]
    with pytest.raises(MeshError, match=r"TetMesh.box\(3, 3, 2\): tets \[0, 1, 2, 3, 4, \.\.\.\] \(24 in total\) are "
                                        r"degenerate in the given positions"):
        mesh.rest_matrix_inverses(flat)
    with pytest.raises(MeshError, match=r"positions have shape \(18, 2\); expected \(18, 3\)"):
        mesh.volumes(np.zeros((18, 2)))


# ---------------------------------------------------------------------- validation messages


@pytest.mark.parametrize(
    "vertices,tets,message",
    [
        (np.zeros((0, 3)), np.zeros((0, 4), int), r"empty mesh: 0 vertices .* expected at least one vertex"),
        (UNIT_TET[:, :2], [[0, 1, 2, 3]], r"vertices have shape \(4, 2\); expected \(n, 3\)"),
        (UNIT_TET, [[0, 1, 2]], r"tets have shape \(1, 3\); expected \(m, 4\) \(only linear tetrahedra"),
        (UNIT_TET, [[0.0, 1.0, 2.0, 3.0]], r"tets have dtype float64; expected an integer dtype"),
        (UNIT_TET.astype(complex), [[0, 1, 2, 3]], r"vertices have dtype complex128; expected a real"),
        (np.vstack([UNIT_TET, [[np.nan, 0, 0]]]), [[0, 1, 2, 3]], r"vertices \[4\] \(1 in total\) have NaN or "
                                                                   r"infinite coordinates \(vertex 4 = \[nan, 0.0"),
        (UNIT_TET, [[0, 1, 2, 3], [0, 1, 2, 4]], r"tets \[1\] \(1 in total\) have vertex indices out of range "
                                                 r"\(tet 1 = \[0, 1, 2, 4\] uses index 4\); expected 0 <= index < 4"),
        (UNIT_TET, [[0, 1, 2, -1]], r"tets \[0\] .* uses index -1\); expected 0 <= index < 4"),
        (UNIT_TET, [[0, 1, 2, 2]], r"tets \[0\] \(1 in total\) repeat a vertex \(tet 0 = \[0, 1, 2, 2\]\); expected "
                                   r"four distinct vertices"),
        (np.vstack([UNIT_TET, [[0.3, 0.3, 0.0]]]), [[0, 1, 2, 3], [0, 1, 2, 4]],
         r"tets \[1\] \(1 in total\) are degenerate \(flat or collapsed: tet 1 = \[0, 1, 2, 4\] has signed volume 0"),
        (UNIT_TET, [[0, 2, 1, 3]], r"tets \[0\] \(1 in total\) are inverted \(all of them: the source may use the "
                                   r"opposite orientation convention\): tet 0 = \[0, 2, 1, 3\] has signed volume "
                                   r"-0.167; expected det\[x_b - x_a.* Pass inverted=\"flip\""),
    ],
)
def test_invalid_arrays_are_refused_with_what_where_and_expected(vertices, tets, message):
    with pytest.raises(MeshError, match=r"^TetMesh\(\.\.\.\): " + message):
        TetMesh(vertices, tets)


def test_inverted_tets_are_named_and_can_be_flipped():
    v, t = _two_tets()
    t_bad = t.copy()
    t_bad[1] = t_bad[1][[0, 1, 3, 2]]
    with pytest.raises(MeshError, match=r"^mine: tets \[1\] \(1 in total\) are inverted: tet 1 = \[0, 2, 4, 1\]"):
        TetMesh(v, t_bad, source="mine")
    mesh = TetMesh(v, t_bad, inverted="flip")
    np.testing.assert_array_equal(mesh.flipped_tets, [1])
    assert (mesh.volumes() > 0).all()
    np.testing.assert_array_equal(mesh.tets[0], t[0])
    assert set(mesh.tets[1]) == set(t[1])
    assert TetMesh(v, t).flipped_tets.size == 0
    with pytest.raises(MeshError, match=r"inverted='fix' is not an option; expected one of \('error', 'flip'\)"):
        TetMesh(v, t, inverted="fix")


def test_non_manifold_and_overlapping_tets_are_refused():
    v, t = _two_tets()
    mesh = TetMesh(v, t)
    assert mesh.face_count == 7 and np.sum(mesh.face_tet_counts == 2) == 1
    assert mesh.boundary_mesh().is_closed
    # a third tet on the shared triangle
    v3 = np.vstack([v, [[0.3, 0.3, 2.0]]])
    with pytest.raises(MeshError, match=r"non-manifold tet mesh: 1 triangle is shared by more than 2 tets "
                                        r"\[\[0, 1, 2\] in tets \[0, 1, 2\]\]"):
        TetMesh(v3, np.vstack([t, [[0, 1, 2, 5]]]))
    # two tets on the same side of a triangle overlap
    v2 = np.vstack([UNIT_TET, [[0.1, 0.1, 0.5]]])
    with pytest.raises(MeshError, match=r"1 triangle is shared by two tets lying on the same side of them "
                                        r"\(overlapping tets\) \[\[0, 1, 2\] in tets \[0, 1\]\]"):
        TetMesh(v2, [[0, 1, 2, 3], [0, 1, 2, 4]])


def test_unreferenced_vertices_error_or_remove():
    v = np.vstack([[[5.0, 5.0, 5.0]], UNIT_TET, [[7.0, 7.0, 7.0]]])
    t = [[1, 2, 3, 4]]
    with pytest.raises(MeshError, match=r"2 of 6 vertices are not used by any tet \(unreferenced vertices \[0, 5\] "
                                        r"\(2 in total\)\); expected every vertex in a tet. Pass unreferenced=\"remove\""):
        TetMesh(v, t)
    mesh = TetMesh(v, t, unreferenced="remove")
    np.testing.assert_array_equal(mesh.tets, [[0, 1, 2, 3]])
    np.testing.assert_array_equal(mesh.vertex_map, [1, 2, 3, 4])
    np.testing.assert_array_equal(mesh.removed_vertices, [0, 5])
    np.testing.assert_array_equal(mesh.vertices, UNIT_TET)
    with pytest.raises(MeshError, match=r"unreferenced='drop' is not an option"):
        TetMesh(v, t, unreferenced="drop")


def test_box_arguments_are_checked():
    with pytest.raises(MeshError, match=r"TetMesh.box\(1, 2, 2\): nx=1, ny=2, nz=2; expected integers >= 2"):
        TetMesh.box(1, 2, 2)
    with pytest.raises(MeshError, match=r"expected extents > 0"):
        TetMesh.box(2, 2, 2, width=0.0)


# ---------------------------------------------------------------------- files


@pytest.mark.parametrize("ext", [".msh", ".vtk", ".vtu", ".mesh"])
def test_save_and_load_round_trip(tmp_path, ext):
    pytest.importorskip("meshio")
    rng = np.random.default_rng(3)
    mesh = TetMesh(TetMesh.box(3, 2, 2).vertices + 0.01 * rng.normal(size=(12, 3)), TetMesh.box(3, 2, 2).tets)
    path = tmp_path / f"bar{ext}"
    mesh.save(path)
    back = TetMesh.from_file(path)
    assert back.source == str(path)
    np.testing.assert_array_equal(back.tets, mesh.tets)
    np.testing.assert_array_equal(back.vertices, mesh.vertices)  # every format keeps 17 significant digits
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no temporary file left
    assert path.stat().st_mode & 0o777 == new_file_mode()  # an ordinary new file's permissions, not mkstemp's 0600


def test_file_errors_name_the_file(tmp_path):
    meshio = pytest.importorskip("meshio")
    with pytest.raises(MeshError, match=r"none.msh: mesh file not found"):
        TetMesh.from_file(tmp_path / "none.msh")
    with pytest.raises(MeshError, match=r"a.obj: unsupported tet mesh file extension '.obj'; supported: .msh, .vtk"):
        TetMesh.from_file(tmp_path / "a.obj")
    with pytest.raises(MeshError, match=r"cannot save: unsupported extension '.ply'"):
        TetMesh.box(2, 2, 2).save(tmp_path / "a.ply")
    surface = tmp_path / "surface.vtk"
    meshio.write(str(surface), meshio.Mesh(UNIT_TET, [("triangle", np.array([[0, 1, 2], [0, 1, 3]]))]))
    with pytest.raises(MeshError, match=r"surface.vtk: contains no linear tetrahedra \(cell types found: triangle\)"):
        TetMesh.from_file(surface)
    garbage = tmp_path / "garbage.msh"
    garbage.write_text("this is not a mesh\n")
    with pytest.raises(MeshError, match=r"garbage.msh: could not be read as a tet mesh"):
        TetMesh.from_file(garbage)
    # a file whose tets are written with the opposite orientation: named, and readable with inverted="flip"
    flipped = tmp_path / "flipped.vtk"
    box = TetMesh.box(2, 2, 2)
    meshio.write(str(flipped), meshio.Mesh(box.vertices, [("tetra", box.tets[:, [0, 2, 1, 3]])]))
    with pytest.raises(MeshError, match=r"flipped.vtk: tets \[0, 1, 2, 3, 4, \.\.\.\] \(6 in total\) are inverted "
                                        r"\(all of them"):
        TetMesh.from_file(flipped)
    assert TetMesh.from_file(flipped, inverted="flip").flipped_tets.size == 6
    # a bad tet in a file names the file and the tet
    bad = tmp_path / "bad.msh"
    tets = box.tets.copy()
    tets[4, 3] = tets[4, 0]
    meshio.write(str(bad), meshio.Mesh(box.vertices, [("tetra", tets)]), file_format="gmsh", binary=False)
    with pytest.raises(MeshError, match=r"bad.msh: tets \[4\] \(1 in total\) repeat a vertex"):
        TetMesh.from_file(bad)


def test_import_stays_light():
    code = "import sys, warp_meshad; print('meshio' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_shipped_bunny_loads_with_defaults():
    pytest.importorskip("meshio")
    mesh = TetMesh.from_file(MESHES / "bunny-tet.msh")  # counts as in assets/meshes/README.md
    assert (mesh.vertex_count, mesh.tet_count, mesh.boundary_faces.shape[0]) == (1046, 3171, 1772)
    assert mesh.flipped_tets.size == 0 and mesh.removed_vertices.size == 0 and (mesh.volumes() > 0).all()
    surface = mesh.boundary_mesh()
    assert surface.is_closed and surface.euler_characteristic == 2
    assert _divergence_volume(surface.vertices, surface.faces) == pytest.approx(mesh.total_volume(), rel=1e-12)

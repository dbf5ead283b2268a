"""Tests for warp_meshad._src.mesh.one_rings: TriMesh.vertex_one_rings against a plain Python walk of each vertex's
faces, on a real mixed-valence mesh with a boundary, hand-made meshes (a boundary, a bowtie, two tets sharing a
vertex) and a one-ring energy assembled from the padded stencil."""

import pathlib
from typing import Any

import numpy as np
import pytest
import warp as wp

import warp_meshad as wm
from warp_meshad._src.mesh.trimesh import TriMesh

MESHES = pathlib.Path(__file__).resolve().parents[1] / "assets" / "meshes"


def reference_rings(faces, vertex_count):
    """Per vertex: (ring list, face list) by walking the corner map a -> b of the faces (c, a, b) around c."""
    step = [dict() for _ in range(vertex_count)]  # centre -> {first neighbour: (last neighbour, face)}
    for f, tri in enumerate(np.asarray(faces).tolist()):
        for k in range(3):
            c, a, b = tri[k], tri[(k + 1) % 3], tri[(k + 2) % 3]
            step[c][a] = (b, f)
    out = []
    for c in range(vertex_count):
        nxt = step[c]
        targets = {b for b, _ in nxt.values()}
        fans = []  # (ring, faces, closed)
        for start in sorted(a for a in nxt if a not in targets):  # open fans
            ring, fs, a = [start], [], start
            while a in nxt:
                b, f = nxt[a]
                ring.append(b)
                fs.append(f)
                a = b
            fans.append((ring, fs + [-1], False))
        seen = {v for ring, _, _ in fans for v in ring}
        for start in sorted(nxt):  # closed fans, each from its smallest neighbour
            if start in seen:
                continue
            ring, fs, a = [], [], start
            while True:
                b, f = nxt[a]
                ring.append(a)
                fs.append(f)
                seen.add(a)
                a = b
                if a == start:
                    break
            fans.append((ring, fs, True))
        fans.sort(key=lambda fan: fan[0][0])
        if len(fans) > 1:  # the face closing a closed fan among several is left out
            fans = [(r, fs[:-1] + [-1] if closed else fs, closed) for r, fs, closed in fans]
        out.append(([v for r, _, _ in fans for v in r], [f for _, fs, _ in fans for f in fs]))
    return out


def check_against_reference(mesh):
    rings = mesh.vertex_one_rings()
    ref = reference_rings(mesh.faces, mesh.vertex_count)
    width = max(len(r) for r, _ in ref)
    assert rings.max_valence == width
    assert rings.ring.shape == rings.faces.shape == (mesh.vertex_count, width)
    assert rings.ring.dtype == rings.faces.dtype == rings.valence.dtype == np.int32
    np.testing.assert_array_equal(rings.valence, [len(r) for r, _ in ref])
    for i, (r, fs) in enumerate(ref):
        pad = width - len(r)
        np.testing.assert_array_equal(rings.ring[i], r + [i] * pad, err_msg=f"ring of vertex {i}")
        np.testing.assert_array_equal(rings.faces[i], fs + [-1] * pad, err_msg=f"faces of vertex {i}")
    return rings


def flap_mesh():
    """A hexagon fanned around vertex 0, plus a triangle (1, 7, 2) outside its edge (1, 2): valences 2, 3, 4, 6."""
    angles = np.arange(6) * np.pi / 3
    v = np.vstack([[0, 0, 0], np.stack([np.cos(angles), np.sin(angles), np.zeros(6)], axis=1), [1.2, 1.0, 0]])
    f = [[0, 1 + i, 1 + (i + 1) % 6] for i in range(6)] + [[1, 7, 2]]
    return TriMesh(v, f)


def test_armadillo_rings_match_reference():
    mesh = TriMesh.from_file(MESHES / "armadillo-cut-low.obj")
    rings = check_against_reference(mesh)
    assert set(np.unique(rings.valence).tolist()) == set(range(2, 14))  # mixed valence, 2 to 13
    # open exactly at the boundary vertices
    np.testing.assert_array_equal(np.flatnonzero(~rings.closed), mesh.boundary_vertices)


def test_flap_mesh_rings_by_hand():
    mesh = flap_mesh()
    rings = check_against_reference(mesh)
    np.testing.assert_array_equal(rings.valence, [6, 4, 4, 3, 3, 3, 3, 2])
    np.testing.assert_array_equal(rings.ring[0], [1, 2, 3, 4, 5, 6])  # closed, from the smallest neighbour
    np.testing.assert_array_equal(rings.faces[0], [0, 1, 2, 3, 4, 5])  # the last face joins 6 back to 1
    # vertex 1 is on the boundary: it leaves along 1 -> 7 and ends at 6 (the edge 6 -> 1 enters it)
    np.testing.assert_array_equal(rings.ring[1], [7, 2, 0, 6, 1, 1])
    np.testing.assert_array_equal(rings.faces[1], [6, 0, 5, -1, -1, -1])
    np.testing.assert_array_equal(rings.ring[7], [2, 1, 7, 7, 7, 7])
    np.testing.assert_array_equal(rings.closed, [True] + [False] * 7)


def test_rings_are_consistent_with_the_edges_and_faces():
    for mesh in (flap_mesh(), TriMesh.grid(5, 4), TriMesh.from_file(MESHES / "spot.obj")):
        rings = mesh.vertex_one_rings()
        neighbours = [set() for _ in range(mesh.vertex_count)]
        for a, b in mesh.edges.tolist():
            neighbours[a].add(b)
            neighbours[b].add(a)
        for i in range(mesh.vertex_count):
            assert set(rings.ring[i, : rings.valence[i]].tolist()) == neighbours[i]
        i, k = np.nonzero(rings.faces >= 0)
        nxt = rings.ring[i, (k + 1) % rings.valence[i]]
        tri = mesh.faces[rings.faces[i, k]]
        # (i, ring[k], ring[k + 1]) is the face, in its own vertex order up to rotation
        for c, a, b, t in zip(i, rings.ring[i, k], nxt, tri):
            assert (c, a, b) in {tuple(np.roll(t, -r).tolist()) for r in range(3)}
        assert i.size == 3 * mesh.face_count  # every face once from each corner


def test_several_fans_at_a_vertex():
    # a bowtie: two open fans at vertex 0, listed by their first neighbour
    v = np.array([[0, 0, 0], [1, 0, 0], [1, 1, 0], [-1, 0, 0], [-1, -1, 0]], dtype=float)
    rings = check_against_reference(TriMesh(v, [[0, 3, 4], [0, 1, 2]]))
    np.testing.assert_array_equal(rings.ring[0], [1, 2, 3, 4])
    np.testing.assert_array_equal(rings.faces[0], [1, -1, 0, -1])
    # two tetrahedra sharing vertex 0: two closed fans there, each without its closing face
    v = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [-1, 0, 0], [0, -1, 0], [0, 0, -1]], dtype=float)
    tet = np.array([[0, 2, 1], [0, 1, 3], [1, 2, 3], [0, 3, 2]])
    other = np.where(tet == 0, 0, tet + 3)
    rings = check_against_reference(TriMesh(v, np.vstack([tet, other])))
    assert rings.valence[0] == 6
    assert (rings.faces[0] >= 0).sum() == 4 and not rings.closed[0]
    assert rings.closed[1:].all()


def test_elements_mask_and_buckets():
    mesh = flap_mesh()
    rings = mesh.vertex_one_rings()
    assert rings is mesh.vertex_one_rings()  # cached
    assert rings.elements.shape == (8, 7) and rings.elements.dtype == np.int32
    np.testing.assert_array_equal(rings.elements[:, 0], np.arange(8))
    np.testing.assert_array_equal(rings.elements[:, 1:], rings.ring)
    np.testing.assert_array_equal(rings.mask.sum(axis=1), rings.valence)
    # padding is the centre itself
    i, k = np.nonzero(~rings.mask)
    np.testing.assert_array_equal(rings.ring[i, k], i)
    buckets = rings.by_valence()
    assert list(buckets) == [2, 3, 4, 6]
    np.testing.assert_array_equal(buckets[3], [3, 4, 5, 6])
    np.testing.assert_array_equal(np.sort(np.concatenate(list(buckets.values()))), np.arange(8))
    for v, idx in buckets.items():
        assert idx.dtype == np.int32 and (rings.valence[idx] == v).all()
    for name in ("ring", "valence", "faces", "elements", "mask"):
        with pytest.raises(ValueError):
            getattr(rings, name).flat[0] = 1
    assert wm.OneRings is type(rings)


@wp.func
def _uniform_laplacian(e: int, xc: Any, x0: Any, x1: Any, x2: Any, x3: Any, x4: Any, x5: Any):
    """E = (sum_k (x_k - x_c))^2 over the padded ring."""
    d = (x0 - xc) + (x1 - xc) + (x2 - xc) + (x3 - xc) + (x4 - xc) + (x5 - xc)
    return d * d


def test_padded_one_ring_term_assembles_the_uniform_laplacian():
    # the padded slots repeat the centre's variable: energy, gradient and Hessian are those of the real rings
    mesh = flap_mesh()
    rings = mesh.vertex_one_rings()
    n = mesh.vertex_count
    problem = wm.Problem(variable_count=n, variable_dim=1, dtype=wp.float64, device="cpu")
    problem.add_term(elements=rings.elements, energy=_uniform_laplacian)
    x = np.random.default_rng(3).standard_normal(n)
    f, g, H = problem.eval_with_hessian(wp.array(x, dtype=wp.float64, device="cpu"))
    L = np.zeros((n, n))  # (L x)_i = sum over neighbours j of (x_j - x_i)
    for a, b in mesh.edges.tolist():
        L[a, b] += 1.0
        L[b, a] += 1.0
    L -= np.diag(L.sum(axis=1))
    np.testing.assert_allclose(f, np.sum((L @ x) ** 2), rtol=1e-12)
    np.testing.assert_allclose(g.numpy(), 2.0 * L.T @ (L @ x), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(wm.to_scipy(H).toarray(), 2.0 * L.T @ L, rtol=1e-12, atol=1e-12)

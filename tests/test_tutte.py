"""Tutte embedding (warp_meshad._src.mesh.tutte): boundary on the unit circle by arc length, interior
vertices at the average of their neighbours, no flipped triangle on real disk meshes."""

import pathlib

import numpy as np
import pytest

import warp_meshad as wm
from warp_meshad._src.mesh.tutte import tutte_embedding

MESHES = pathlib.Path(__file__).resolve().parents[1] / "assets" / "meshes"


def _signed_areas(faces, uv):
    a = uv[faces[:, 1]] - uv[faces[:, 0]]
    b = uv[faces[:, 2]] - uv[faces[:, 0]]
    return 0.5 * (a[:, 0] * b[:, 1] - a[:, 1] * b[:, 0])


def _neighbour_mean(mesh, uv):
    e = mesh.edges
    total = np.zeros_like(uv)
    np.add.at(total, e[:, 0], uv[e[:, 1]])
    np.add.at(total, e[:, 1], uv[e[:, 0]])
    degree = np.bincount(e.ravel(), minlength=mesh.vertex_count)
    return total / degree[:, None]


@pytest.mark.parametrize("name", ["woody.obj", "bunny-cut.obj"])
def test_tutte_embedding(name):
    mesh = wm.TriMesh.from_file(MESHES / name)
    uv = tutte_embedding(mesh)
    assert uv.shape == (mesh.vertex_count, 2) and uv.dtype == np.float64
    assert np.all(np.isfinite(uv))

    loop = mesh.boundary_loops[0]
    np.testing.assert_allclose(np.linalg.norm(uv[loop], axis=1), 1.0, rtol=0, atol=1e-14)
    np.testing.assert_allclose(uv[loop[0]], [1.0, 0.0], atol=1e-14)
    # counter-clockwise, spaced by arc length: angle steps proportional to 3D edge lengths
    angles = np.unwrap(np.arctan2(uv[loop, 1], uv[loop, 0]))
    steps = np.diff(np.append(angles, angles[0] + 2 * np.pi))
    seg = np.linalg.norm(mesh.vertices[np.roll(loop, -1)] - mesh.vertices[loop], axis=1)
    np.testing.assert_allclose(steps, 2 * np.pi * seg / seg.sum(), rtol=1e-9, atol=1e-12)

    areas = _signed_areas(mesh.faces, uv)
    assert areas.min() > 0, f"{int((areas <= 0).sum())} flipped or degenerate triangles"
    np.testing.assert_allclose(areas.sum(), np.pi, rtol=1e-2)  # the inscribed polygon of the unit disk

    interior = np.setdiff1d(np.arange(mesh.vertex_count), loop)
    np.testing.assert_allclose(uv[interior], _neighbour_mean(mesh, uv)[interior], rtol=0, atol=1e-12)


def test_tutte_embedding_of_grid_is_exact_on_interior():
    # a 3 x 3 grid has one interior vertex: the mean of its 6 neighbours on the circle
    mesh = wm.TriMesh.grid(3, 3)
    uv = tutte_embedding(mesh)
    loop = mesh.boundary_loops[0]
    assert loop.size == 8
    np.testing.assert_allclose(uv[4], _neighbour_mean(mesh, uv)[4], atol=1e-15)
    assert _signed_areas(mesh.faces, uv).min() > 0


def test_tutte_embedding_rejects_closed_mesh():
    mesh = wm.TriMesh.from_file(MESHES / "spot.obj")
    with pytest.raises(wm.MeshError, match="no boundary|closed"):
        tutte_embedding(mesh)


def test_tutte_embedding_rejects_disconnected_mesh():
    v = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [5, 0, 0], [6, 0, 0], [5, 1, 0], [6, 1, 0]], dtype=float)
    f = np.array([[0, 1, 2], [3, 4, 6], [3, 6, 5]])
    with pytest.raises(wm.MeshError, match="connected"):
        tutte_embedding(wm.TriMesh(v, f))


def test_tutte_embedding_rejects_non_mesh():
    with pytest.raises(TypeError, match="TriMesh"):
        tutte_embedding(np.zeros((3, 3)))

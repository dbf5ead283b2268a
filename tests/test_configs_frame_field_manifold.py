"""Every config in configs/frame_field and configs/manifold_opt runs at its test size and passes check_final; the
PolyVector residuals and the sphere-embedding energy against central differences, against independent NumPy
formulas and known answers (zero for a constant field on a plane, the smoothest field of a plane is parallel,
re-centering keeps the energy); Newton and L-BFGS reach the same sphere embedding; check_final catches broken
results."""

import json
import os
import pathlib

import numpy as np
import pytest
import warp as wp

import warp_meshad as wm
from derivcheck import check_problem_derivatives
from warp_meshad import app as appmod
from warp_meshad.app import ConfigError, load_config
from warp_meshad.app import run as run_app
from warp_meshad.kernels.energies import (
    PolyCurlData,
    PolyVectorFaceData,
    SphereEmbeddingData,
    polycurl,
    polyvector_barrier,
    polyvector_closeness,
    polyvector_smoothness,
    sphere_embedding,
)

from warp_meshad.apps import frame_field as ff
from warp_meshad.apps import manifold_opt as mo

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEVICE = os.environ.get("WARP_MESHAD_TEST_DEVICE", "cpu")  # apps and problems run on the test device
CONFIGS = sorted((ROOT / "configs" / "frame_field").glob("*.yaml")) + sorted(
    (ROOT / "configs" / "manifold_opt").glob("*.yaml"))


def small(path, **overrides):
    """The config's test size, on the test device."""
    return load_config(path, test=True, overrides={"screenshot": False, "device": DEVICE, **overrides})


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_config_runs_small_and_passes_check_final(path, tmp_path):
    config = small(path, output=str(tmp_path))
    report = run_app(config, quiet=True)
    app = report.app
    assert app.steps_done == config.steps > 0
    assert report.metrics["check_final"] == "passed"
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["scene"] == path.stem and metrics["iterations"] >= 1
    assert (tmp_path / f"final.{config.mesh_format}").is_file()
    assert metrics["final_energy"] < metrics["energy"][0]
    for key in ("steepest_descent_fallbacks", "linear_solves_capped"):  # totals of the steps' counts
        assert metrics[key] == sum(r[key] for r in metrics["per_step"])
    backend = getattr(app.solver, "linear_solver", None)
    assert metrics["cudss_skipped_reason"] == getattr(backend, "cudss_skipped_reason", None)
    if app.name == "frame_field":
        assert metrics["final_polycurl"] < metrics["start_polycurl"]
        kinds = [kind for kind, _ in app.quantities().values()]
        assert kinds.count("face_vectors") == 4  # the cross +-alpha, +-beta
    else:
        assert metrics["min_volume"] > 0.0 and metrics["max_radius_error"] <= 1e-12


def test_every_config_has_a_small_test_block():
    for path in CONFIGS:
        full, test = load_config(path), load_config(path, test=True)
        assert full.test, f"{path} has no test block"
        assert test.steps <= 3 and test.steps * test.iterations <= 20, path


def test_bad_configs_name_the_key(tmp_path):
    cfg = tmp_path / "open.yaml"
    cfg.write_text(f"app: manifold_opt\nmesh: {ROOT / 'assets' / 'meshes' / 'woody.obj'}\n")
    with pytest.raises(ConfigError, match=r"open.yaml: key 'mesh': .*expected a closed genus-0 mesh"):
        appmod.app_class("manifold_opt")(load_config(cfg))
    cfg.write_text("app: manifold_opt\nsolver: newton_cg\n")
    with pytest.raises(ConfigError, match="key 'solver': expected one of 'lbfgs', 'newton'"):
        load_config(cfg)
    cfg.write_text("app: frame_field\nconstrained_faces: [99999]\nbarrier_start: 0.5\n")
    with pytest.raises(ConfigError, match="key 'constrained_faces': indices must be < face_count 13334"):
        appmod.app_class("frame_field")(load_config(cfg))
    cfg.write_text("app: frame_field\nbarrier_start: 1.5\n")
    with pytest.raises(ConfigError, match=r"key 'barrier_start': expected a number in \(0, 1\)"):
        load_config(cfg)


# ----------------------------------------------------------------------------------------------------------------------
# Frame field: PolyVector residuals
# ----------------------------------------------------------------------------------------------------------------------


def octahedron() -> wm.TriMesh:
    v = np.array([[1, 0, 0], [-1, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1], [0, 0, -1]], dtype=np.float64)
    f = np.array([[0, 2, 4], [2, 1, 4], [1, 3, 4], [3, 0, 4], [2, 0, 5], [1, 2, 5], [3, 1, 5], [0, 3, 5]])
    return wm.TriMesh(v, f)


def edge_data(mesh, smoothness=0.7, curl=100.0, quotient=10.0):
    e_f, e_g = ff.edge_directions(mesh, *ff.face_frames(mesh))
    d = PolyCurlData()
    d.edge_f = wp.array(e_f, dtype=wp.vec2d)
    d.edge_g = wp.array(e_g, dtype=wp.vec2d)
    d.smoothness_weight = wp.float64(smoothness)
    d.curl_weight = wp.float64(curl)
    d.quotient_weight = wp.float64(quotient)
    return d, e_f, e_g


def random_crosses(rng, n, s_range=(0.3, 1.2)):
    """alpha of random angle and unit length, beta at a random angle in (30, 150) degrees from it."""
    theta = rng.uniform(0.0, 2.0 * np.pi, n)
    phi = theta + rng.uniform(np.pi / 6, 5 * np.pi / 6, n)
    r = rng.uniform(*s_range, n)
    return np.stack([np.cos(theta), np.sin(theta), r * np.cos(phi), r * np.sin(phi)], axis=1)


def test_polyvector_edge_residual_derivatives():
    mesh = octahedron()
    d, _, _ = edge_data(mesh)
    problem = wm.Problem(mesh.face_count, 4, wp.float64, DEVICE)
    problem.add_residual_term(mesh.edge_faces, polyvector_smoothness, d, weight=2.0)
    problem.add_residual_term(mesh.edge_faces, polycurl, d, weight=2.0)
    x = random_crosses(np.random.default_rng(0), mesh.face_count)
    check_problem_derivatives(problem, x, check_proj=False)


def test_polyvector_face_residual_derivatives_in_the_barrier_band():
    rng = np.random.default_rng(1)
    n = 8
    x = random_crosses(rng, n, s_range=(0.4, 1.3))
    s = x[:, 0] * x[:, 3] - x[:, 1] * x[:, 2]
    assert (s > 0).all() and (s < 0.9).sum() >= 3 and (s > 0.9).sum() >= 1  # inside and beyond the barrier band
    d = PolyVectorFaceData()
    d.reference = wp.array(x + 0.1 * rng.normal(size=x.shape), dtype=wp.vec4d)
    d.closeness_weight = wp.array(rng.uniform(0.5, 2.0, n), dtype=wp.float64)
    d.barrier_weight = wp.float64(0.1)
    d.barrier_start = wp.float64(0.9)
    problem = wm.Problem(n, 4, wp.float64, DEVICE)
    faces = np.arange(n)[:, None]
    problem.add_residual_term(faces, polyvector_closeness, d, weight=2.0)
    problem.add_residual_term(faces, polyvector_barrier, d, weight=2.0)
    check_problem_derivatives(problem, x, check_proj=False)
    # the barrier is +inf once beta is not counter-clockwise of alpha
    flipped = x.copy()
    flipped[0, 2:] = -flipped[0, 2:]
    assert problem.eval(wp.array(flipped, dtype=wp.vec4d)) == np.inf


def test_polyvector_residuals_match_numpy_formulas():
    """Warp residuals against the paper's complex-number formulas evaluated in NumPy (independent code)."""
    mesh = octahedron()
    rng = np.random.default_rng(2)
    x = random_crosses(rng, mesh.face_count)
    d, e_f, e_g = edge_data(mesh, smoothness=0.7, curl=1.0, quotient=0.0)
    xw = wp.array(x, dtype=wp.vec4d)
    for term, expected in (("smoothness", None), ("polycurl", np.sum(ff.polycurl_per_edge(x, mesh, e_f, e_g) ** 2))):
        problem = wm.Problem(mesh.face_count, 4, wp.float64, DEVICE)
        problem.add_residual_term(mesh.edge_faces, polyvector_smoothness if term == "smoothness" else polycurl, d,
                                  weight=2.0)
        if expected is None:
            alpha, beta = x[:, 0] + 1j * x[:, 1], x[:, 2] + 1j * x[:, 3]
            c0, c2 = alpha**2 * beta**2, -(alpha**2 + beta**2)
            f, g = mesh.edge_faces[:, 0], mesh.edge_faces[:, 1]
            t = np.conj(e_f[:, 0] + 1j * e_f[:, 1]) / np.conj(e_g[:, 0] + 1j * e_g[:, 1])
            expected = 0.7 * np.sum(np.abs(c0[f] * t**4 - c0[g]) ** 2 + np.abs(c2[f] * t**2 - c2[g]) ** 2)
        np.testing.assert_allclose(problem.eval(xw), expected, rtol=1e-12)


def test_constant_cross_on_a_plane_has_zero_residuals_and_is_the_smoothest_field():
    mesh = wm.TriMesh.grid(5, 4, width=1.3, height=0.9)
    t1, t2 = ff.face_frames(mesh)
    a3, b3 = np.array([0.8, 0.6, 0.0]), np.array([-0.3, 0.9, 0.0])  # any constant pair, not orthogonal
    x = np.stack([t1 @ a3, t2 @ a3, t1 @ b3, t2 @ b3], axis=1)
    d, e_f, e_g = edge_data(mesh)
    problem = wm.Problem(mesh.face_count, 4, wp.float64, DEVICE)
    problem.add_residual_term(mesh.edge_faces, polyvector_smoothness, d, weight=2.0)
    problem.add_residual_term(mesh.edge_faces, polycurl, d, weight=2.0)
    assert problem.eval(wp.array(x, dtype=wp.vec4d)) < 1e-26
    assert problem.eval(wp.array(random_crosses(np.random.default_rng(3), mesh.face_count), dtype=wp.vec4d)) > 1e-2
    # the smoothest cross field of a plane is parallel: eigenvalue 0, alpha^4 the same in world coordinates
    start, eigenvalue = ff.smoothest_cross_field(mesh, e_f, e_g)
    assert abs(eigenvalue) < 1e-10
    alpha = (start[:, 0:1] * t1 + start[:, 1:2] * t2) @ np.array([1.0, 1j, 0.0])
    np.testing.assert_allclose(alpha**4, np.full(mesh.face_count, alpha[0] ** 4), atol=1e-8)
    np.testing.assert_allclose(np.abs(alpha), 1.0, rtol=1e-12)


def test_frame_field_check_final_catches_broken_fields():
    sphere = str(ROOT / "assets" / "meshes" / "sphere.obj")
    app = appmod.app_class("frame_field")(small(ROOT / "configs" / "frame_field" / "cheburashka.yaml", mesh=sphere))
    app.run()
    app.check_final()
    good = app.field()
    broken = good.copy()
    broken[5, 2:] = 0.0
    app.x = wp.array(broken, dtype=wp.vec4d)
    with pytest.raises(AssertionError, match="face 5 has a vector of length"):
        app.check_final()
    broken = good.copy()
    broken[7, 2:] = -broken[7, 2:]
    app.x = wp.array(broken, dtype=wp.vec4d)
    with pytest.raises(AssertionError, match="face 7 has beta not counter-clockwise"):
        app.check_final()
    app.x = wp.array(good, dtype=wp.vec4d)
    app.history[0]["energies"][-1] = app.history[0]["energies"][0] * 2.0
    with pytest.raises(AssertionError, match="energy rose"):
        app.check_final()


# ----------------------------------------------------------------------------------------------------------------------
# Manifold optimization: sphere embedding
# ----------------------------------------------------------------------------------------------------------------------


def hull_mesh(tmp_path, count=40, seed=4) -> pathlib.Path:
    """A small random genus-0 mesh: the convex hull of points on an ellipsoid, faces oriented outward."""
    from scipy.spatial import ConvexHull

    rng = np.random.default_rng(seed)
    p = rng.normal(size=(count, 3))
    p = p / np.linalg.norm(p, axis=1, keepdims=True) * np.array([1.5, 1.0, 0.6])
    faces = ConvexHull(p).simplices.copy()
    n = np.cross(p[faces[:, 1]] - p[faces[:, 0]], p[faces[:, 2]] - p[faces[:, 0]])
    inward = np.einsum("ij,ij->i", n, p[faces].mean(axis=1)) < 0
    faces[inward] = faces[inward][:, ::-1]
    path = tmp_path / "hull.obj"
    wm.TriMesh(p, faces).save(path)
    return path


def embedding_problem(mesh, points, target=0):
    data = SphereEmbeddingData()
    data.faces = wp.array(mesh.faces, dtype=wp.int32)
    data.points = wp.array(points, dtype=wp.vec3d)
    data.tangent1 = wp.zeros(mesh.vertex_count, dtype=wp.vec3d)
    data.tangent2 = wp.zeros(mesh.vertex_count, dtype=wp.vec3d)
    data.barrier_weight = wp.float64(0.1)
    data.target = target
    zero = wp.zeros(mesh.vertex_count, dtype=wp.vec2d)
    wp.launch(mo._recenter, dim=mesh.vertex_count, inputs=[zero, data.points, data.tangent1, data.tangent2])
    problem = wm.Problem(mesh.vertex_count, 2, wp.float64, DEVICE)
    problem.add_term(mesh.faces, sphere_embedding, data)
    return problem, data


def test_sphere_embedding_derivatives_values_and_recentering(tmp_path):
    mesh = wm.TriMesh.from_file(hull_mesh(tmp_path, count=12))
    tutte, info = mo.initial_sphere_embedding(mesh, "tutte", cut_vertex=3)
    assert info["method"] == "tutte" and mo.face_volumes(tutte, mesh.faces).min() > 0.0
    np.testing.assert_allclose(tutte[3], [0.0, 0.0, 1.0])  # the cut vertex at the north pole
    points, _ = mo.initial_sphere_embedding(mesh, "normalize")
    problem, data = embedding_problem(mesh, points, target=2)
    rng = np.random.default_rng(5)
    v = 0.02 * rng.normal(size=(mesh.vertex_count, 2))
    check_problem_derivatives(problem, v)
    # at v = 0: the NumPy energy plus the north-pole pull (every corner of every face)
    zero = wp.zeros(mesh.vertex_count, dtype=wp.vec2d)
    pull = np.sum((1.0 - points[mesh.faces][:, :, 1]) ** 2)
    np.testing.assert_allclose(problem.eval(zero), mo._energy(points, mesh.faces, 0.1) + pull, rtol=1e-12)
    # re-centering: points move to the retracted ones (on the sphere), bases stay orthonormal, the energy is kept
    vw = wp.array(v, dtype=wp.vec2d)
    before = problem.eval(vw)
    wp.launch(mo._recenter, dim=mesh.vertex_count, inputs=[vw, data.points, data.tangent1, data.tangent2])
    np.testing.assert_allclose(problem.eval(zero), before, rtol=1e-12)
    np.testing.assert_array_equal(vw.numpy(), 0.0)
    p, b1, b2 = data.points.numpy(), data.tangent1.numpy(), data.tangent2.numpy()
    np.testing.assert_allclose(np.linalg.norm(p, axis=1), 1.0, atol=1e-15)
    np.testing.assert_allclose(np.einsum("ij,ij->i", b1, p), 0.0, atol=1e-15)
    np.testing.assert_allclose(np.cross(b1, b2), p, atol=1e-15)
    # rotation invariant without target; +inf once mirrored (every face flipped)
    problem0, _ = embedding_problem(mesh, points)
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    rot = q * np.sign(np.diag(r))
    if np.linalg.det(rot) < 0:
        rot[:, 0] = -rot[:, 0]
    rotated, _ = embedding_problem(mesh, points @ rot.T)
    np.testing.assert_allclose(rotated.eval(zero), problem0.eval(zero), rtol=1e-12)
    mirrored, _ = embedding_problem(mesh, points * np.array([1.0, 1.0, -1.0]))
    assert mirrored.eval(zero) == np.inf


def test_newton_and_lbfgs_reach_the_same_sphere_embedding():
    """From the same stereographic Tutte start on sphere.obj, projected Newton and L-BFGS stop at the same minimum:
    the same energy and the same points up to a rotation of the sphere (the energy is rotation invariant)."""
    runs = {}
    for solver in ("newton", "lbfgs"):
        config = load_config(ROOT / "configs" / "manifold_opt" / f"sphere_{solver}.yaml",
                             overrides={"tolerance": 1e-10, "screenshot": False, "device": DEVICE})
        app = appmod.app_class("manifold_opt")(config)
        app.run()
        app.check_final()
        assert app.history[-1]["converged"], solver
        runs[solver] = app
    newton, lbfgs = runs["newton"], runs["lbfgs"]
    np.testing.assert_allclose(lbfgs.energy, newton.energy, rtol=1e-9)
    assert newton.energy < newton.history[0]["energies"][0] - 1.0
    p, q = newton.positions(), lbfgs.positions()
    u, _, vt = np.linalg.svd(q.T @ p)  # orthogonal Procrustes: rotation taking q closest to p
    np.testing.assert_allclose(q @ (u @ vt), p, atol=1e-4)


def test_manifold_check_final_catches_broken_embeddings():
    app = appmod.app_class("manifold_opt")(small(ROOT / "configs" / "manifold_opt" / "sphere_newton.yaml", steps=1))
    app.run()
    app.check_final()
    good = app.positions()
    moved = good.copy()
    moved[4] *= 1.001
    app.data.points = wp.array(moved, dtype=wp.vec3d)
    with pytest.raises(AssertionError, match="vertex 4 is 1.000e-03 off the unit sphere"):
        app.check_final()
    app.data.points = wp.array(good * np.array([1.0, 1.0, -1.0]), dtype=wp.vec3d)
    with pytest.raises(AssertionError, match=f"{app.mesh.face_count} flipped faces"):
        app.check_final()

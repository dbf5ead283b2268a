"""Every config in configs/param and configs/arap runs at its test size and passes check_final; the known answers
(symmetric Dirichlet minimum E/A = 4 on the planar woody; ARAP is zero under a rigid motion, and the local step finds
that motion); the ARAP energy against central differences; check_final and the configs catch broken results."""

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
from warp_meshad.kernels.energies import ArapData, arap
from warp_meshad.apps.arap import cotangent_weights
from warp_meshad.apps.param import face_distortion, signed_uv_areas

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEVICE = os.environ.get("WARP_MESHAD_TEST_DEVICE", "cpu")  # apps and problems run on the test device
CONFIGS = sorted((ROOT / "configs" / "param").glob("*.yaml")) + sorted((ROOT / "configs" / "arap").glob("*.yaml"))


def small(path, **overrides):
    """The config's test size, on the test device."""
    return load_config(path, test=True, overrides={"screenshot": False, "device": DEVICE, **overrides})


def make_app(app, scene, **overrides):
    return appmod.app_class(app)(small(ROOT / "configs" / app / f"{scene}.yaml", **overrides))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_config_runs_small_and_passes_check_final(path, tmp_path):
    config = small(path, output=str(tmp_path))
    report = run_app(config, quiet=True)
    app = report.app
    assert app.steps_done == config.steps > 0
    assert report.metrics["check_final"] == "passed"
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["scene"] == path.stem and metrics["iterations"] >= 1
    obj = (tmp_path / "final.obj").read_text()
    for key in ("steepest_descent_fallbacks", "linear_solves_capped"):  # totals of the steps' counts
        assert metrics[key] == sum(r[key] for r in metrics["per_step"])
    backend = getattr(app.solver, "linear_solver", None)
    assert metrics["cudss_skipped_reason"] == getattr(backend, "cudss_skipped_reason", None)
    if app.name == "param":
        assert obj.count("\nvt ") == app.mesh.vertex_count  # the uv coordinates, one per vertex
        assert metrics["flipped_faces"] == 0 and metrics["energy_per_area"] >= 4.0
        e = metrics["energy"]
        assert all(b <= a for a, b in zip(e, e[1:])) and e[-1] < e[0]
    else:
        assert metrics["moved_vertex_count"] > 0 and metrics["fixed_vertex_count"] > 0


def test_every_config_has_a_small_test_block():
    for path in CONFIGS:
        full, test = load_config(path), load_config(path, test=True)
        assert full.test, f"{path} has no test block"
        if path.stem in ("bunny_cut", "armadillo"):  # TinyAD's setup at full size, a few iterations under test
            assert test.iterations <= 5 and test.expected_energy_per_area is None, path
            assert full.expected_energy_per_area is not None and full.initial_scale == "unit", path
        assert test.steps <= 3, path


# ----------------------------------------------------------------------------------------------------------------------
# param
# ----------------------------------------------------------------------------------------------------------------------


def test_woody_reaches_the_isometric_minimum():
    """woody is planar: the symmetric Dirichlet minimum is the isometry, E = 4 A, reached by projected Newton."""
    app = make_app("param", "woody")
    assert app.config.initial_scale == "area"
    np.testing.assert_allclose(signed_uv_areas(app.uv0, app.mesh.faces).sum(), app.total_area, rtol=1e-12)
    app.run()
    app.check_final()
    rec = app.history[-1]
    assert rec["converged"] and rec["reason"] == "newton_decrement", rec["reason"]
    assert app.newton_decrements[-1] < app.config.tolerance
    np.testing.assert_allclose(app.energy_per_area, 4.0, rtol=1e-6)
    uv = app.uv_coordinates()
    # an isometry: every face keeps its area and has distortion 4
    np.testing.assert_allclose(signed_uv_areas(uv, app.mesh.faces), app.mesh.face_areas(), rtol=1e-3)
    dist = face_distortion(uv, app.mesh.faces, app.rest_inverse)
    np.testing.assert_allclose(dist, 4.0, rtol=1e-4)
    # the viewer's distortion is the energy density: sum_f A_f dist_f = E
    np.testing.assert_allclose(np.sum(app.mesh.face_areas() * dist), app.energy, rtol=1e-12)


def test_param_check_final_catches_flips_rises_and_a_wrong_minimum():
    app = make_app("param", "woody", iterations=3, expected_energy_per_area=None)
    app.run()
    app.check_final()
    uv = app.uv_coordinates()
    flipped = uv.copy()
    flipped[:, 0] *= -1.0  # a mirror image: every triangle flipped
    app.uv = wp.array(flipped, dtype=wp.vec2d)
    with pytest.raises(AssertionError, match="flipped or degenerate uv triangles"):
        app.check_final()
    app.uv = wp.array(uv, dtype=wp.vec2d)
    app.history[0]["energies"].insert(2, app.history[0]["energies"][1] * 2.0)
    with pytest.raises(AssertionError, match="energy rose"):
        app.check_final()
    del app.history[0]["energies"][2]
    app.config.expected_energy_per_area = 4.0  # 3 iterations are not enough to reach it
    with pytest.raises(AssertionError, match=r"E/A = .* expected 4\.0+ \(relative error"):
        app.check_final()


def test_param_device_loop_takes_the_host_loops_steps():
    """``device_loop: true`` / ``"capture"`` (the host loop where there is no CUDA) give the host loop's iterates."""
    runs = []
    for loop in (False, True, "capture"):
        app = make_app("param", "bunny_cut", device_loop=loop)
        app.run()
        runs.append((app.history[-1]["iterations"], app.energy))
    assert runs[1][0] == runs[0][0] and runs[2][0] == runs[0][0], runs
    np.testing.assert_allclose([r[1] for r in runs[1:]], runs[0][1], rtol=1e-12)


def test_param_hessian_shift_keeps_the_minimum_and_the_iterations():
    """``hessian_shift`` (the projected Hessian shifted by sigma I, no pin): the translations get eigenvalues ~sigma,
    the rest changes by ~sigma / lambda, so the run reaches the unshifted minimum in as many iterations (+-1); with
    cuDSS it is factored by Cholesky."""
    runs = {}
    for shift in (0.0, 1e-8):
        app = make_app("param", "bunny_cut", hessian_shift=shift, iterations=300)
        app.run()
        runs[shift] = app
    shifted, plain = runs[1e-8], runs[0.0]
    if shifted.solver.linear_solver.name == "cudss":
        assert shifted.solver.linear_solver.active_matrix_type == "spd"
    assert shifted.history[-1]["reason"] == plain.history[-1]["reason"] == "newton_decrement"
    assert abs(shifted.history[-1]["iterations"] - plain.history[-1]["iterations"]) <= 1
    np.testing.assert_allclose(shifted.energy_per_area, plain.energy_per_area, rtol=1e-8)


def test_param_pin_vertex_only_removes_the_translation_gauge():
    """Pinning one vertex (``pin_vertex``) keeps it at its start and reaches the unpinned run's minimum in as many
    iterations: the symmetric Dirichlet energy does not see translations. (Step by step the runs agree to ~1e-6 only:
    the unpinned Hessian is singular up to the projection's 1e-9 clamp, so its solves carry round-off amplified by a
    condition number near 1e9.) With cuDSS the pinned projected Hessian is factorized by Cholesky."""
    runs = {}
    for pin in (None, 7):
        app = make_app("param", "bunny_cut", pin_vertex=pin, iterations=300)
        app.run()
        runs[pin] = app
    pinned, free = runs[7], runs[None]
    np.testing.assert_array_equal(pinned.uv_coordinates()[7], pinned.uv0[7])
    if pinned.solver.linear_solver.name == "cudss":
        assert pinned.solver.linear_solver.active_matrix_type == "spd"
    assert pinned.history[-1]["reason"] == free.history[-1]["reason"] == "newton_decrement"
    assert abs(pinned.history[-1]["iterations"] - free.history[-1]["iterations"]) <= 1
    np.testing.assert_allclose(pinned.energy_per_area, free.energy_per_area, rtol=1e-8)


@pytest.mark.device
def test_param_deterministic_repeats_bitwise_on_the_cpu_and_reaches_the_same_minimum():
    """``deterministic: true`` builds the problem without float atomics (and leaves cuDSS's deterministic mode off).
    On the CPU two runs give bitwise the same uv, with the default assembly's iterations and energy.

    On CUDA cuDSS's solves vary at round-off, and on the unpinned (singular) Hessian along its null space; those
    components bound the flip-free step size, so runs part from the first step (after the test config's 4
    iterations the energies differ by ~7e-5, H200). There the runs go to the minimum (about 110 iterations, a
    fraction of a second) and must agree on it and, within 5%, on the iterations."""
    cuda = wp.get_device(DEVICE).is_cuda
    full = {"iterations": 1000} if cuda else {}
    runs = []
    for det in (True, True, False):
        app = make_app("param", "bunny_cut", deterministic=det, **full)
        assert app.problem.deterministic is det
        if app.solver.linear_solver.name == "cudss":
            assert app.solver.linear_solver.deterministic is False
        app.run()
        runs.append(app)
    its = [run.history[-1]["iterations"] for run in runs]
    if cuda:
        assert all(run.history[-1]["converged"] for run in runs), [run.history[-1]["reason"] for run in runs]
        for other in runs[1:]:
            assert abs(its[0] - its[runs.index(other)]) <= max(1, round(0.05 * its[0])), its
            np.testing.assert_allclose(other.energy, runs[0].energy, rtol=1e-8)
        np.testing.assert_allclose(runs[0].energy_per_area, 4.1365885, rtol=1e-6)  # TinyAD's minimum (the config)
    else:
        np.testing.assert_array_equal(runs[1].uv_coordinates(), runs[0].uv_coordinates())
        assert runs[1].energy == runs[0].energy
        assert abs(its[0] - its[2]) <= 1, its
        np.testing.assert_allclose(runs[0].energy, runs[2].energy, rtol=1e-9)


def test_deterministic_is_refused_where_contact_terms_have_no_such_assembly():
    from warp_meshad.apps.shells import ShellsConfig

    errors = dict(ShellsConfig(deterministic=True).validate())
    assert "expected false (the shells app's contact terms have no deterministic assembly)" in errors["deterministic"]
    assert "deterministic" not in dict(small(ROOT / "configs" / "param" / "bunny_cut.yaml", deterministic=True)
                                       .validate())  # fmt: skip


def test_device_loop_auto_is_the_captured_loop_on_cuda_only_for_apps_that_take_it():
    from warp_meshad._src.solve.options import DeviceLoop

    param = small(ROOT / "configs" / "param" / "bunny_cut.yaml")
    arap = small(sorted((ROOT / "configs" / "arap").glob("*.yaml"))[0])
    assert param.device_loop == "auto" and arap.device_loop == "auto"
    assert param.device_loop_option("cpu") is False and arap.device_loop_option("cpu") is False
    if wp.get_cuda_device_count() > 0:
        assert param.device_loop_option("cuda:0") == DeviceLoop(capture=True)
        assert arap.device_loop_option("cuda:0") is False


def test_param_unit_start_is_the_tutte_disk():
    app = make_app("param", "bunny_cut", iterations=0)
    r = np.linalg.norm(app.uv0[app.mesh.boundary_loops[0]], axis=1)
    np.testing.assert_allclose(r, 1.0, rtol=1e-12)
    assert (signed_uv_areas(app.uv0, app.mesh.faces) > 0).all()


@pytest.mark.parametrize(
    "text, key, fragment",
    [
        ("mesh_format: ply\n", "mesh_format", "expected 'obj'"),
        ("dtype: float32\n", "dtype", "expected one of 'float64'"),
        ("initial_scale: huge\n", "initial_scale", "expected one of 'area', 'unit'"),
        ("expected_energy_per_area: 3.5\n", "expected_energy_per_area", ">= 4"),
        ("mesh: grid\n", "mesh", "has no generator"),
        ("tollerance: 1.0\n", "tollerance", "did you mean 'tolerance'"),
        ("pin_vertex: -1\n", "pin_vertex", "expected a vertex index >= 0 or null"),
        ("hessian_shift: -1.0e-8\n", "hessian_shift", "expected a finite number >= 0"),
    ],
)
def test_bad_param_config_names_the_key(tmp_path, text, key, fragment):
    path = tmp_path / "bad.yaml"
    path.write_text(f"app: param\nmesh: {ROOT / 'assets' / 'meshes' / 'woody.obj'}\n" + text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.key == key and fragment in str(info.value), str(info.value)


# ----------------------------------------------------------------------------------------------------------------------
# arap
# ----------------------------------------------------------------------------------------------------------------------


def _random_rotation(rng):
    q, _ = np.linalg.qr(rng.standard_normal((3, 3)))
    return q if np.linalg.det(q) > 0 else -q


def test_arap_is_zero_under_a_rigid_motion_and_the_local_step_finds_it():
    app = make_app("arap", "homer")
    rng = np.random.default_rng(0)
    q = _random_rotation(rng)
    x = wp.array(app.x0 @ q.T + rng.standard_normal(3), dtype=wp.vec3d)
    # the rest shape with R = I, and its rigid motion with R = Q: zero energy, zero gradient
    assert app.problem.eval(wp.array(app.x0, dtype=wp.vec3d)) == 0.0
    app.rotation.assign(np.broadcast_to(q, (app.mesh.vertex_count, 3, 3)))
    f, g = app.problem.eval_with_gradient(x)
    scale = float(np.sum(app.weights * app.mesh.edge_lengths() ** 2))
    assert abs(f) <= 1e-13 * scale
    np.testing.assert_allclose(g.numpy(), 0.0, atol=1e-12)
    # the local step recovers Q in every cell (non-negative weights: each cell covariance is C Q^T with C PSD)
    app.rotation.zero_()
    app.local_step(x)
    np.testing.assert_allclose(app.rotation.numpy(), np.broadcast_to(q, (app.mesh.vertex_count, 3, 3)), atol=1e-9)
    assert abs(app.problem.eval(x)) <= 1e-13 * scale


def test_arap_energy_derivatives_and_closed_form():
    """Against central differences on a bumpy 4 x 4 grid with random rotations, and against the formula in numpy."""
    rng = np.random.default_rng(1)
    mesh = wm.TriMesh.grid(4, 4)
    rest = mesh.vertices.copy()
    rest[:, 2] = 0.2 * rng.standard_normal(mesh.vertex_count)
    mesh = wm.TriMesh(rest, mesh.faces)
    edges = mesh.edges
    w = cotangent_weights(mesh)
    rot = np.stack([_random_rotation(rng) for _ in range(mesh.vertex_count)])
    data = ArapData()
    data.rest_edge = wp.array(rest[edges[:, 0]] - rest[edges[:, 1]], dtype=wp.vec3d)
    data.weight = wp.array(w, dtype=wp.float64)
    data.edge_vertex_indices = wp.array(edges, dtype=wp.int32)
    data.rotation = wp.array(rot, dtype=wp.mat33d)
    problem = wm.Problem(mesh.vertex_count, 3, wp.float64, DEVICE)
    problem.add_term(edges, arap, data)
    x = rest + 0.1 * rng.standard_normal(rest.shape)
    check_problem_derivatives(problem, x)
    r = rest[edges[:, 0]] - rest[edges[:, 1]]
    d = x[edges[:, 0]] - x[edges[:, 1]]
    ra = d - np.einsum("eij,ej->ei", rot[edges[:, 0]], r)
    rb = d - np.einsum("eij,ej->ei", rot[edges[:, 1]], r)
    expected = np.sum(0.5 * w * (np.sum(ra * ra, axis=1) + np.sum(rb * rb, axis=1)))
    np.testing.assert_allclose(problem.eval(wp.array(x, dtype=wp.vec3d)), expected, rtol=1e-12)


def test_cotangent_weights_known_answer():
    """Right isosceles triangle (0,0), (1,0), (0,1): the legs face 45 degrees (cot 1), the hypotenuse 90 (cot 0)."""
    mesh = wm.TriMesh(np.array([[0.0, 0, 0], [1, 0, 0], [0, 1, 0]]), np.array([[0, 1, 2]]))
    w = dict(zip(map(tuple, mesh.edges.tolist()), cotangent_weights(mesh)))
    np.testing.assert_allclose([w[(0, 1)], w[(0, 2)], w[(1, 2)]], [0.5, 0.5, 0.0], atol=1e-15)


def test_arap_handles_hold_and_energy_falls_monotonically():
    app = make_app("arap", "homer", steps=3)
    start = app.problem.eval(app.x)
    app.run()
    app.check_final()
    energies = [e for rec in app.history for e in rec["energies"]]
    assert energies[0] == start and np.all(np.diff(energies) <= 1e-12 * start) and energies[-1] < 0.2 * start
    x = app.positions()
    np.testing.assert_array_equal(x[app.fixed], app.x0[app.fixed])
    np.testing.assert_array_equal(x[app.moved], app.targets)
    free = np.setdiff1d(np.arange(app.mesh.vertex_count), app.pinned)
    assert np.linalg.norm(x[free] - app.x0[free], axis=1).max() > 0.05  # the body follows the head
    # check_final is not vacuous: a moved handle, a NaN fail
    bad = x.copy()
    bad[app.moved[0]] += 0.01
    app.x = wp.array(bad, dtype=wp.vec3d)
    with pytest.raises(AssertionError, match="from their targets"):
        app.check_final()
    bad = x.copy()
    bad[app.fixed[0]] += 0.01
    app.x = wp.array(bad, dtype=wp.vec3d)
    with pytest.raises(AssertionError, match="fixed handle vertices moved"):
        app.check_final()
    app.x = wp.array(np.full_like(x, np.nan), dtype=wp.vec3d)
    with pytest.raises(AssertionError, match="non-finite"):
        app.check_final()


def test_arap_without_motion_stays_at_rest():
    app = make_app("arap", "homer", steps=1, translation=[0.0, 0.0, 0.0], rotation_degrees=0.0)
    app.run()
    app.check_final()
    np.testing.assert_allclose(app.positions(), app.x0, rtol=0, atol=1e-12)
    assert abs(app.energy) <= 1e-20


@pytest.mark.parametrize(
    "text, key, fragment",
    [
        ("fixed_below: 0.5\nmoved_above: 0.4\n", "moved_above", "fixed_below < moved_above"),
        ("rotation_axis: [0, 0, 0]\n", "rotation_axis", "non-zero"),
        ("weights: cotan\n", "weights", "expected one of 'cotangent'"),
        ("translation: [1, 2]\n", "translation", "expected a list of 3"),
        ("device_loop: true\n", "device_loop", "expected false (the arap app's solver runs host-side steps"),
    ],
)
def test_bad_arap_config_names_the_key(tmp_path, text, key, fragment):
    path = tmp_path / "bad.yaml"
    path.write_text(f"app: arap\nmesh: {ROOT / 'assets' / 'meshes' / 'homer.obj'}\n" + text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.key == key and fragment in str(info.value), str(info.value)

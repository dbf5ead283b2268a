"""Every config in configs/cloth and configs/smoothing runs at its test size and passes check_final; the cloth
energies (inertia + gravity, sphere barrier) against central differences and closed forms; check_final catches
broken results."""

import json
import os
import pathlib

import numpy as np
import pytest
import warp as wp

import warp_meshad as wm
from derivcheck import check_problem_derivatives
from warp_meshad import LinearSolveError
from warp_meshad import app as appmod
from warp_meshad._src.solve.linear import CGSolver
from warp_meshad.app import load_config
from warp_meshad.app import run as run_app
from warp_meshad.kernels.energies import InertiaGravityData, SphereBarrierData, inertia_gravity, sphere_barrier
from warp_meshad.apps.cloth import ClothConfig


ROOT = pathlib.Path(__file__).resolve().parents[1]
DEVICE = os.environ.get("WARP_MESHAD_TEST_DEVICE", "cpu")  # apps and problems run on the test device
CONFIGS = sorted((ROOT / "configs" / "cloth").glob("*.yaml")) + sorted((ROOT / "configs" / "smoothing").glob("*.yaml"))


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
    for key in ("steepest_descent_fallbacks", "linear_solves_capped"):  # totals of the steps' counts
        assert metrics[key] == sum(r[key] for r in metrics["per_step"])
    if app.name == "cloth":
        assert app.mesh.vertex_count <= 16 * 16  # the test size, also for the GPU-sized grid_1000
        backend = getattr(app.solver, "linear_solver", None)
        assert metrics["cudss_skipped_reason"] == getattr(backend, "cudss_skipped_reason", None)


def test_steepest_descent_fallbacks_reach_metrics_json(tmp_path, monkeypatch):
    def fail(self, A, b, x):
        raise LinearSolveError("cg: made to fail for this test")

    monkeypatch.setattr(CGSolver, "solve", fail)
    config = small(ROOT / "configs" / "cloth" / "hanging.yaml", output=str(tmp_path), linear_solver="cg", iterations=3)
    run_app(config, quiet=True)  # every Newton iteration steps along -g: the energy still falls, check_final passes
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["steps"] == 2 and metrics["iterations"] >= 2
    for rec in metrics["per_step"]:
        assert rec["iterations"] >= 1 and rec["steepest_descent_fallbacks"] == rec["iterations"]
        assert rec["fallback_reasons"] == {"linear_solve_failed": rec["iterations"]}
        assert rec["linear_solves_capped"] == 0  # failed, not capped
    assert metrics["steepest_descent_fallbacks"] == metrics["iterations"]
    assert metrics["linear_solver"] == "cg" and metrics["cudss_skipped_reason"] is None


def test_cloth_keeps_the_start_factors_with_the_same_steps():
    """``keep_start_factors`` (cloth's default): each step after the first takes its first direction from the factors
    the last step ended with (a back-end that keeps factors: QDLDL, cuDSS); the run is the one without it."""
    runs = {}
    for keep in (False, True):
        config = small(ROOT / "configs" / "cloth" / "hanging.yaml", steps=3, keep_start_factors=keep)
        app = appmod.app_class(config.app)(config)
        app.run()
        runs[keep] = app
    plain, kept = runs[False], runs[True]
    assert [r["iterations"] for r in kept.history] == [r["iterations"] for r in plain.history]
    np.testing.assert_allclose([e for r in kept.history for e in r["energies"]],
                               [e for r in plain.history for e in r["energies"]], rtol=1e-12)
    np.testing.assert_allclose(kept.positions(), plain.positions(), rtol=0, atol=1e-9)
    expected = 2 if kept.solver.linear_solver.keeps_factors else 0
    assert plain.solver.kept_solves == 0 and kept.solver.kept_solves == expected
    assert ClothConfig().keep_start_factors  # the default


def test_every_config_has_a_small_test_block():
    for path in CONFIGS:
        full, test = load_config(path), load_config(path, test=True)
        assert full.test, f"{path} has no test block"
        assert test.steps <= 3, path


# ----------------------------------------------------------------------------------------------------------------------
# Cloth
# ----------------------------------------------------------------------------------------------------------------------


def cloth_app(name="hanging", **overrides):
    return appmod.app_class("cloth")(small(ROOT / "configs" / "cloth" / f"{name}.yaml", **overrides))


def test_hanging_cloth_pins_hold_and_cloth_falls():
    app = cloth_app(steps=3)
    x0 = app.positions()
    assert app.pinned.tolist() == [0, 7]  # the two ends of the first grid row
    app.run()
    app.check_final()
    x = app.positions()
    np.testing.assert_array_equal(x[app.pinned], x0[app.pinned])
    assert x[:, 1].mean() < x0[:, 1].mean() - 1e-3
    for rec in app.history:
        assert rec["energies"][-1] < rec["energies"][0]
    # check_final is not vacuous: a moved pin, a NaN, a rising energy fail
    app.x = wp.array(np.where(np.arange(len(x))[:, None] == 0, x + 0.1, x), dtype=wp.vec3d)
    with pytest.raises(AssertionError, match="pinned vertices moved"):
        app.check_final()
    app.x = wp.array(np.full_like(x, np.nan), dtype=wp.vec3d)
    with pytest.raises(AssertionError, match="non-finite"):
        app.check_final()
    app.x = wp.array(x, dtype=wp.vec3d)
    app.history[0]["energies"][-1] = app.history[0]["energies"][0] + 1.0
    with pytest.raises(AssertionError, match="energy rose"):
        app.check_final()


def test_free_fall_matches_backward_euler_closed_form():
    """Without pins the springs stay at rest, so every vertex follows x_{n+1} = x_n + h v_n + h^2 g."""
    app = cloth_app(pins="none", steps=2, tolerance=1e-12)
    h, g = app.config.time_step, np.asarray(app.config.gravity)
    app.run()
    expected = app.x0 + 3.0 * h * h * g  # step 1: h^2 g, step 2: + h v_1 + h^2 g = 2 h^2 g
    np.testing.assert_allclose(app.positions(), expected, rtol=0, atol=1e-9)
    np.testing.assert_allclose(app.v.numpy(), np.broadcast_to(2.0 * h * g, app.x0.shape), atol=1e-7)


def test_drape_barrier_active_and_outside_sphere():
    app = cloth_app("drape")
    s = app.config.sphere
    app.run()
    app.check_final()
    gap = np.linalg.norm(app.positions() - np.asarray(s.center), axis=1) - s.radius
    assert 0.0 < gap.min() < s.activation_distance  # in contact through the barrier, never inside
    # the CCD bound stops a step that would cross the sphere: a vertex 0.1 above it moving down 1.0
    x = wp.array(np.array([[0.0, s.radius + 0.1, 0.0], [1.0, 1.0, 1.0]]), dtype=wp.vec3d)
    d = wp.array(np.array([[0.0, -1.0, 0.0], [0.0, 0.0, 1.0]]), dtype=wp.vec3d)
    assert app._sphere_step_bound(x, d) == pytest.approx(0.09)
    assert app._sphere_step_bound(x, wp.array(-d.numpy(), dtype=wp.vec3d)) == np.inf


def test_drape_float32_matches_float64():
    a64, a32 = cloth_app("drape"), cloth_app("drape", dtype="float32")
    assert a32.x.dtype == wp.vec3f and a32.problem.dtype == wp.float32
    a64.run()
    a32.run()
    a32.check_final()
    np.testing.assert_allclose(a32.positions(), a64.positions(), rtol=0, atol=1e-4)


def test_cloth_starting_inside_sphere_is_a_config_error():
    with pytest.raises(appmod.ConfigError, match="key 'sphere': the cloth starts inside the sphere"):
        cloth_app("drape", center=[0.0, 0.1, 0.0])


def test_inertia_gravity_derivatives_and_minimizer():
    rng = np.random.default_rng(0)
    n = 5
    problem = wm.Problem(n, 3, wp.float64, DEVICE)
    data = InertiaGravityData(wp.float64)
    data.mass = wp.array(rng.uniform(0.5, 2.0, n), dtype=wp.float64)
    target = rng.standard_normal((n, 3))
    data.target = wp.array(target, dtype=wp.vec3d)
    data.gravity = wp.vec3d(0.0, -9.81, 0.0)
    data.inv_h2 = wp.float64(1.0 / 0.1**2)
    problem.add_term(np.arange(n)[:, None], inertia_gravity, data)
    check_problem_derivatives(problem, rng.standard_normal((n, 3)))
    x_star = target + 0.01 * np.array([0.0, -9.81, 0.0])  # x~ + h^2 g
    f, g = problem.eval_with_gradient(wp.array(x_star, dtype=wp.vec3d))
    np.testing.assert_allclose(g.numpy(), 0.0, atol=1e-12)


def test_sphere_barrier_values_and_derivatives():
    rng = np.random.default_rng(1)
    r, dhat, kappa = 0.5, 0.1, 3.0
    data = SphereBarrierData(wp.float64)
    data.center = wp.vec3d(0.1, -0.2, 0.3)
    data.radius = wp.float64(r)
    data.activation_distance = wp.float64(dhat)
    data.stiffness = wp.float64(kappa)
    dirs = rng.standard_normal((6, 3))
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    dist = np.array([0.01, 0.03, 0.05, 0.08, 0.095, 0.099])  # inside the activation band
    x = np.array([0.1, -0.2, 0.3]) + (r + dist)[:, None] * dirs
    problem = wm.Problem(len(x), 3, wp.float64, DEVICE)
    problem.add_term(np.arange(len(x))[:, None], sphere_barrier, data)
    check_problem_derivatives(problem, x)
    expected = np.sum(-kappa * (dist - dhat) ** 2 * np.log(dist / dhat))
    assert problem.eval(wp.array(x, dtype=wp.vec3d)) == pytest.approx(expected, rel=1e-12)
    far = np.array([0.1, -0.2, 0.3]) + (r + 0.2) * dirs
    assert problem.eval(wp.array(far, dtype=wp.vec3d)) == 0.0
    inside = x.copy()
    inside[2] = np.array([0.1, -0.2, 0.3]) + 0.9 * r * dirs[2]
    assert problem.eval(wp.array(inside, dtype=wp.vec3d)) == np.inf


# ----------------------------------------------------------------------------------------------------------------------
# Smoothing
# ----------------------------------------------------------------------------------------------------------------------


def test_smoothing_energy_is_monotone_and_check_final_catches_a_rise():
    a = appmod.app_class("smoothing")(small(ROOT / "configs" / "smoothing" / "spot_dirichlet.yaml"))
    a.run()
    a.check_final()
    energies = [e for rec in a.history for e in rec["energies"]]
    assert np.all(np.diff(energies) <= 0.0) and energies[-1] < energies[0]
    a.history[-1]["energies"].append(energies[-1] * 2.0)
    with pytest.raises(AssertionError, match="energy rose"):
        a.check_final()


def test_smoothing_fixed_boundary_on_open_mesh(tmp_path):
    """A bumpy open grid under area flow with its boundary fixed flattens toward the minimal (flat) surface."""
    m = wm.TriMesh.grid(6, 6)
    v = m.vertices.copy()
    inner = np.setdiff1d(np.arange(m.vertex_count), m.boundary_vertices)
    v[inner, 2] = 0.2 * np.random.default_rng(2).standard_normal(inner.size)
    wm.TriMesh(v, m.faces).save(tmp_path / "bumpy.obj")
    cfg = tmp_path / "bumpy.yaml"
    cfg.write_text("app: smoothing\nmesh: bumpy.obj\nenergy: area\nsteps: 3\niterations: 20\nstep_size: 0.5\n")
    app = appmod.app_class("smoothing")(load_config(cfg, overrides={"device": DEVICE}))
    app.run()
    app.check_final()
    assert app.fixed.size == 20
    assert np.abs(app.positions()[inner, 2]).max() < 0.5 * np.abs(v[inner, 2]).max()

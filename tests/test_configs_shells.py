"""The shells app (elastic Spot shells, IPC contact): both configs run at their test size (on the test device) and
pass check_final, with the exact triangle-triangle intersection test over all non-adjacent face pairs run after every
step; per-phase timings, capped CG solves and steepest-descent fallbacks reach metrics.json; check_final catches
intersections, vertices below the ground and objects that rose."""

import json
import os
import pathlib

import numpy as np
import pytest
import warp as wp

from warp_meshad.app import load_config
from warp_meshad.app import run as run_app

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEVICE = os.environ.get("WARP_MESHAD_TEST_DEVICE", "cpu")  # the apps run on the test device
CONFIGS = ROOT / "configs" / "shells"
PHASES = ("contact_detection", "derivatives_assembly", "linear_solve", "line_search")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    # spot_drop_cg: one step of spot_drop with CG capped at 20 iterations, which never meet its 1e-8 tolerance here
    cg = {"linear_solver": "cg", "cg_max_iterations": 20, "steps": 1, "iterations": 3}
    for run, scene, extra in (("spot_drop", "spot_drop", {}), ("spot_pile", "spot_pile", {}),
                              ("spot_drop_cg", "spot_drop", cg)):
        folder = tmp_path_factory.mktemp(run)
        config = load_config(CONFIGS / f"{scene}.yaml", test=True, overrides={
            "screenshot": False, "device": DEVICE, "output": str(folder), **extra})
        out[run] = (run_app(config, quiet=True), folder)
    return out


@pytest.mark.parametrize("scene", ["spot_drop", "spot_pile"])
def test_config_runs_small_and_passes_check_final(runs, scene):
    report, folder = runs[scene]
    app = report.app
    assert app.name == "shells" and app.steps_done == app.config.steps > 0
    assert report.metrics["check_final"] == "passed"
    assert app.device == DEVICE and app.count == 2
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["scene"] == scene and metrics["iterations"] >= 1
    # the exact intersection test ran after every step and found nothing
    assert metrics["intersections_per_step"] == [0] * app.steps_done
    for rec in metrics["per_step"]:
        assert all(np.isfinite(rec["energies"])) and rec["intersections"] == 0
        assert set(PHASES) <= set(rec["phase_ms"]) and all(rec["phase_ms"][k] >= 0.0 for k in PHASES)
    assert set(metrics["phase_ms"]) == set(PHASES) and sum(metrics["phase_fraction"].values()) == pytest.approx(1.0)
    # failures made visible: none here (direct solves of a projected Hessian), and the totals are the steps' sums
    assert metrics["linear_solves_capped_per_step"] == [0] * app.steps_done == [
        r["linear_solves_capped"] for r in metrics["per_step"]]
    assert metrics["steepest_descent_fallbacks"] == sum(metrics["steepest_descent_fallbacks_per_step"]) == 0
    assert metrics["cudss_skipped_reason"] == app.linear_solver.cudss_skipped_reason
    if DEVICE == "cpu":
        assert "the device is the CPU" in metrics["cudss_skipped_reason"]
    assert (folder / "final.obj").is_file()
    x = app.positions()
    assert app.heights(x).min() > 0.0
    assert 0.0 < app.d_hat < 1e-3 and app.kappa == pytest.approx(app.config.young * app.config.thickness / app.d_hat**2)


def test_cg_solves_stopped_at_their_cap_are_counted_per_step(runs):
    report, folder = runs["spot_drop_cg"]
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["linear_solver"] == "cg" and metrics["steps"] == 1
    (step,) = metrics["per_step"]
    assert step["linear_iterations"] and max(step["linear_iterations"]) <= 20
    # every solve stopped at 20 iterations above tolerance, and each was counted, per step and in all
    assert step["linear_solves_capped"] == len(step["linear_iterations"]) >= 1
    assert metrics["linear_solves_capped_per_step"] == [step["linear_solves_capped"]]
    assert metrics["linear_solves_capped"] == step["linear_solves_capped"]
    assert metrics["cudss_skipped_reason"] is None  # 'cg' was named, not picked by 'auto'


def test_drop_reaches_the_ground_barrier(runs):
    app = runs["spot_drop"][0].app
    assert app.heights().min() < app.d_hat  # the ground barrier is active, and every vertex stays above the plane


def test_pile_test_size_has_active_contact_pairs(runs):
    app = runs["spot_pile"][0].app
    rec = app.history[0]
    assert rec["point_triangle_pairs"] > 0 and rec["edge_edge_pairs"] > 0  # the Spots start closer than d_hat
    assert app.search.intersecting_face_pairs(app.x).shape == (0, 2)


def test_pile_full_size_is_about_700_spots_on_gpu():
    full = load_config(CONFIGS / "spot_pile.yaml")
    count = int(np.prod(full.layout))
    assert 650 <= count <= 750 and full.device == "cuda"
    assert 1.9e6 <= count * 2930 <= 2.3e6  # spot.obj has 2930 vertices
    drop = load_config(CONFIGS / "spot_drop.yaml")
    assert 2 <= int(np.prod(drop.layout)) <= 4
    for path in (CONFIGS / "spot_drop.yaml", CONFIGS / "spot_pile.yaml"):
        assert load_config(path, test=True).steps <= 3


def test_check_final_catches_broken_results(runs):
    app = runs["spot_drop"][0].app
    x, history = app.positions(), [dict(r) for r in app.history]
    app.check_final()
    try:
        app.history[-1]["intersections"] = 1
        with pytest.raises(AssertionError, match="intersecting face pairs"):
            app.check_final()
        app.history[-1]["intersections"] = 0
        below = x.copy()
        low = int(np.argmin(app.heights(x)))  # the lowest vertex poked just below the plane (no intersection)
        below[low, 1] = app.config.ground_height - 1e-4
        app.x = wp.array(below, dtype=wp.vec3d)
        with pytest.raises(AssertionError, match="below the ground"):
            app.check_final()
        app.x = wp.array(app.x0 + np.array([0.0, 0.01, 0.0]), dtype=wp.vec3d)
        with pytest.raises(AssertionError, match="did not fall"):
            app.check_final()
        # two copies pushed into each other: the exact test finds intersections
        shifted = app.x0.copy()
        upper = app.object_id == 1
        shifted[upper] -= np.array([0.0, 0.1, 0.0])  # half a Spot height into the lower one
        assert app.search.intersecting_face_pairs(wp.array(shifted, dtype=wp.vec3d)).shape[0] > 0
    finally:
        app.x = wp.array(x, dtype=wp.vec3d)
        app.history[:] = history

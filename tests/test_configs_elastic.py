"""The elastic app (tet meshes, stable Neo-Hookean / ARAP, backward Euler, projected Newton): every config in
configs/elastic runs at its test size and passes check_final; backward Euler's free fall is exact; config errors name
the file and the key; check_final catches inverted tets and moved pins."""

import json
import os
import pathlib

import numpy as np
import pytest

pytest.importorskip("yaml")

import warp_meshad as wm  # noqa: E402
from warp_meshad.app import ConfigError, load_config  # noqa: E402
from warp_meshad.app import run as run_app  # noqa: E402
from warp_meshad.apps.elastic import App, BarConfig, ElasticConfig  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEVICE = os.environ.get("WARP_MESHAD_TEST_DEVICE", "cpu")
pytestmark = pytest.mark.device  # every test runs on DEVICE: the GPU subset under a CUDA test device
CONFIGS = sorted((ROOT / "configs" / "elastic").glob("*.yaml"))
TINY_BAR = {"nx": 4, "ny": 2, "nz": 2, "length": 0.4, "width": 0.1, "height": 0.1}


def small(path, **overrides):
    """The config's test size, on the test device."""
    return load_config(path, test=True, overrides={"screenshot": False, "device": DEVICE, **overrides})


def test_there_are_configs():
    assert {p.stem for p in CONFIGS} >= {"bar_twist", "bunny"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_runs_small_and_passes_check_final(path, tmp_path):
    config = small(path, output=str(tmp_path))
    report = run_app(config, quiet=True)
    app = report.app
    assert app.name == "elastic" and app.steps_done == config.steps > 0
    assert report.metrics["check_final"] == "passed"
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["scene"] == path.stem and metrics["iterations"] >= config.steps
    assert metrics["tet_mesh"]["tet_count"] == app.tet_mesh.tet_count > 0
    assert 0.0 < metrics["min_volume_ratio"] <= 1.0 <= metrics["max_volume_ratio"]
    assert metrics["linear_solver"] == ("qdldl" if DEVICE == "cpu" else metrics["linear_solver"])
    assert all(r["converged"] for r in metrics["per_step"]), [r["reason"] for r in metrics["per_step"]]
    # final.obj is the boundary surface at the final positions
    final = wm.TriMesh.from_file(tmp_path / "final.obj")
    assert final.face_count == app.mesh.face_count and final.is_closed
    np.testing.assert_allclose(final.vertices, app.positions(), atol=1e-12)


def test_every_config_has_a_small_test_block():
    for path in CONFIGS:
        full, test = load_config(path), load_config(path, test=True)
        assert full.test, f"{path} has no test block"
        assert test.steps <= 3, path


def test_free_fall_is_exact_and_rigid():
    """No pins: the elastic energy stays zero and backward Euler drops the bar by g h^2 k (k + 1) / 2 after k steps."""
    h, steps = 0.05, 3
    app = App(ElasticConfig(device=DEVICE, bar=BarConfig(**TINY_BAR), pins=[], steps=steps, time_step=h, screenshot=False, tolerance=1e-12))
    app.run()
    app.check_final()
    x = app.tet_positions()
    drop = 9.81 * h * h * steps * (steps + 1) / 2
    np.testing.assert_allclose(x - app.x0, np.broadcast_to([0.0, -drop, 0.0], x.shape), atol=1e-9)
    np.testing.assert_allclose(app.v.numpy(), np.broadcast_to([0.0, -9.81 * h * steps, 0.0], x.shape), atol=1e-7)


@pytest.mark.parametrize("device_loop", [False, True, pytest.param("capture", marks=pytest.mark.gpu)],
                         ids=["host_loop", "device_loop", "captured"])
def test_keep_start_factors_takes_the_same_steps_with_a_factorization_less_per_step(device_loop):
    """``keep_start_factors``: each step after the first solves its first Newton system with the factors the last
    step ended with (the same matrix: the inertia target does not enter the Hessian), so the run is the same up to
    round-off and takes steps - 1 factorizations less. Captured (CUDA), that slot is a graph of its own."""
    if device_loop == "capture" and not DEVICE.startswith("cuda"):
        pytest.skip("the captured loop needs a CUDA test device (WARP_MESHAD_TEST_DEVICE=cuda:0)")
    runs = {}
    for keep in (False, True):
        app = App(ElasticConfig(device=DEVICE, bar=BarConfig(**TINY_BAR), pins=["x_min"], steps=3, time_step=0.02,
                                screenshot=False, tolerance=1e-10, keep_start_factors=keep, device_loop=device_loop))
        app.run()
        app.check_final()
        runs[keep] = app
    plain, kept = runs[False], runs[True]
    assert [r["iterations"] for r in kept.history] == [r["iterations"] for r in plain.history]
    np.testing.assert_allclose([e for r in kept.history for e in r["energies"]],
                               [e for r in plain.history for e in r["energies"]], rtol=1e-12)
    np.testing.assert_allclose(kept.tet_positions(), plain.tet_positions(), rtol=0, atol=1e-12)
    assert plain.solver.kept_solves == 0 and kept.solver.kept_solves == 2
    if device_loop == "capture":
        runner = kept.solver._device_loop
        assert runner.kept_capture_error is None and runner.solve_capture_error is None
        assert any(key[-1] == "kept" for key in runner._graphs)  # the kept slot replayed from its own graph


def test_driven_side_follows_its_ramp():
    app = App(ElasticConfig(device=DEVICE, bar=BarConfig(**TINY_BAR),
                            pins=["x_min", "x_max"], driven_side="x_max", twist=90.0, stretch=0.5, ramp_steps=2,
                            steps=1, screenshot=False))
    rest = app.x0[app.driven]
    assert app.driven.size == 4 and np.allclose(rest[:, 0], 0.4)
    np.testing.assert_allclose(app.driven_positions(0), rest)
    end = app.driven_positions(5)  # past the ramp: 90 degrees about +x, pulled out by half the length
    center = rest.mean(axis=0)
    expected = center + (rest - center) @ np.array([[1, 0, 0], [0, 0, -1], [0, 1, 0]]).T + [0.2, 0.0, 0.0]
    np.testing.assert_allclose(end, expected, atol=1e-12)
    c, s = np.cos(np.pi / 4), np.sin(np.pi / 4)  # halfway: 45 degrees, a quarter of the length
    half = center + (rest - center) @ np.array([[1, 0, 0], [0, c, -s], [0, s, c]]).T + [0.1, 0.0, 0.0]
    np.testing.assert_allclose(app.driven_positions(1), half, atol=1e-12)
    app.run()
    app.check_final()
    np.testing.assert_allclose(app.tet_positions()[app.driven], app.driven_positions(1), atol=1e-12)


def test_check_final_catches_inverted_tets_and_moved_pins():
    app = App(ElasticConfig(device=DEVICE, bar=BarConfig(**TINY_BAR),
                            steps=1, screenshot=False))
    app.run()
    app.check_final()
    x = app.tet_positions()
    free = np.setdiff1d(np.arange(len(x)), app.pinned)
    bad = x.copy()
    bad[free[-1]] = app.x0[free[-1]] - [0.0, 0.0, 1.0]  # pushed through its neighbours
    app.x.assign(bad)
    with pytest.raises(AssertionError, match=r"elastic: \d+ inverted tets"):
        app.check_final()
    bad = x.copy()
    bad[app.pinned[0]] += 1e-3
    app.x.assign(bad)
    with pytest.raises(AssertionError, match="elastic: fixed pinned vertices moved"):
        app.check_final()


def test_config_errors_name_the_file_and_the_key(tmp_path):
    def write(text):
        path = tmp_path / "scene.yaml"
        path.write_text("app: elastic\n" + text)
        return path

    cases = [
        ("mesh: spot.txt\n", "mesh", r"expected 'bar' or an .msh/.vtk/.vtu/.mesh/.obj/.off/.ply file, got 'spot.txt'"),
        ("mesh: none.msh\n", "mesh", r"mesh file not found: .*none.msh"),
        ("pins: [x_min]\ndriven_side: x_max\n", "driven_side", r"expected one of pins \['x_min'\] or null"),
        ("twist: 30.0\n", "driven_side", "twist and stretch move the driven side"),
        ("pins: [left]\n", r"pins\[0\]", r"expected one of 'x_min'"),
        ("poisson: 0.5\n", "poisson", r"expected a number in \(-1, 0.5\)"),
        ("bar: {nx: 1}\n", "bar.nx", "expected an int >= 2"),
        ("material: corotated\n", "material", "expected one of 'stable_neo_hookean', 'arap'"),
        ("youngs: 1.0\n", "youngs", r"unknown key for app 'elastic' \(did you mean 'young'\?\)"),
    ]
    for text, key, message in cases:
        with pytest.raises(ConfigError, match=rf"scene.yaml: key '{key}': {message}"):
            load_config(write(text))
    # an invalid tet mesh file: the MeshError under key 'mesh', naming the file and the tet
    meshio = pytest.importorskip("meshio")
    box = wm.TetMesh.box(2, 2, 2)
    meshio.write(str(tmp_path / "flipped.vtk"), meshio.Mesh(box.vertices, [("tetra", box.tets[:, [0, 2, 1, 3]])]))
    config = load_config(write("mesh: flipped.vtk\n"), overrides={"device": DEVICE})
    with pytest.raises(ConfigError, match=r"scene.yaml: key 'mesh': .*flipped.vtk: tets \[0, 1, 2, 3, 4, \.\.\.\] "
                                          r"\(6 in total\) are inverted"):
        App(config)
    # a valid surface is refused with a hint (a broken one reports its own MeshError, as tests/test_cli.py checks)
    spot = ROOT / "assets" / "meshes" / "spot.obj"
    with pytest.raises(ConfigError, match=r"scene.yaml: key 'mesh': .*spot.obj: a triangle surface \(2930 vertices, "
                                          r"5856 faces\), not a tet mesh; .*\(tetrahedralize the surface first"):
        App(load_config(write(f"mesh: {spot}\n"), overrides={"device": DEVICE}))
    with pytest.raises(ConfigError, match=r"key 'pinned_vertices': indices must be < vertex_count 16"):
        App(ElasticConfig(device=DEVICE, bar=BarConfig(**TINY_BAR),
                          pinned_vertices=[16]))


def test_bar_twist_with_the_arap_material(tmp_path):
    config = small(ROOT / "configs" / "elastic" / "bar_twist.yaml", output=str(tmp_path), material="arap")
    report = run_app(config, quiet=True)
    assert report.metrics["check_final"] == "passed" and report.metrics["material"]["name"] == "arap"
    assert report.metrics["material"]["mu"] == pytest.approx(config.young / (2 * (1 + config.poisson)))
    assert all(r["converged"] for r in report.metrics["per_step"])

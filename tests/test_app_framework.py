"""App framework: typed configs from YAML (overrides, errors naming file and key), the CLI, outputs, the viewer logic
and the headless screenshot. The apps run at their test size (8 x 8 cloth, 2 steps)."""

import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from warp_meshad.__main__ import main  # noqa: E402
from warp_meshad import app as appmod  # noqa: E402
from warp_meshad._src.app.base import resolve_device  # noqa: E402
from warp_meshad._src.app.loader import parse_set  # noqa: E402
from warp_meshad._src.app.outputs import json_safe  # noqa: E402
from warp_meshad._src.app.progress import Progress  # noqa: E402
from warp_meshad._src.mesh.files import atomic_write  # noqa: E402
from warp_meshad.app import ConfigError, load_config  # noqa: E402
from warp_meshad.app import run as run_app  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
HANGING = ROOT / "configs" / "cloth" / "hanging.yaml"
SPOT = ROOT / "assets" / "meshes" / "spot.obj"


def write_config(folder: pathlib.Path, text: str, name: str = "scene.yaml") -> pathlib.Path:
    p = folder / name
    p.write_text(text)
    return p


def test_load_config_types_defaults_and_override_order(tmp_path):
    path = write_config(tmp_path, "app: cloth\nsteps: 7\ngrid: {nx: 10}\ngravity: [0, -1, 0]\n"
                                  "test: {steps: 2, grid: {ny: 4}}\n")
    c = load_config(path)
    assert type(c).__name__ == "ClothConfig"
    assert (c.steps, c.grid.nx, c.grid.ny, c.grid.width) == (7, 10, 32, 1.0)  # nested keys merge into the defaults
    assert c.gravity == (0.0, -1.0, 0.0) and all(isinstance(v, float) for v in c.gravity)  # ints accepted as floats
    assert (c.scene, pathlib.Path(c.source)) == ("scene", path.resolve())
    # order: file < test block < --set < flags
    c = load_config(path, test=True)
    assert (c.steps, c.grid.nx, c.grid.ny) == (2, 10, 4)
    c = load_config(path, overrides=parse_set(["steps=3", "grid.nx=5"]), test=True, flags={"--steps": {"steps": 4}})
    assert (c.steps, c.grid.nx, c.grid.ny) == (4, 5, 4)


def test_parse_set_nested_yaml_values():
    assert parse_set(["a=1", "b.c=[0, -9.8, 0]", "b.d=true", "e=null", "f=text"]) == {
        "a": 1, "b": {"c": [0, -9.8, 0], "d": True}, "e": None, "f": "text"}
    with pytest.raises(ConfigError, match="--set: key 'steps5': expected key=value"):
        parse_set(["steps5"])


def test_exponent_without_a_dot_is_a_number(tmp_path):
    # PyYAML follows YAML 1.1, where 1e-4 is a string; configs and --set read it as the number a user means
    assert parse_set(["a=1e-4", "b=-2E+3", "c=[1e3, 2]", "d=1.5", "e=1e-4x"]) == {
        "a": 1e-4, "b": -2000.0, "c": [1000.0, 2], "d": 1.5, "e": "1e-4x"}
    c = load_config(write_config(tmp_path, "app: cloth\ntime_step: 1e-3\n"))
    assert c.time_step == 1e-3


@pytest.mark.parametrize(
    "text, key, fragment",
    [
        ("app: cloth\nstifness: 3\n", "stifness", "did you mean 'stiffness'"),
        ("app: cloth\ngrid: {nx: 8, nz: 3}\n", "grid.nz", "unknown key"),
        ("app: cloth\ntest: {stepz: 1}\n", "test.stepz", "unknown key"),
        ("app: cloth\nsteps: ten\n", "steps", "expected an int, got str 'ten'"),
        ("app: cloth\nsteps: 2.5\n", "steps", "expected an int, got float"),
        ("app: cloth\nviewer: 1\n", "viewer", "expected true/false"),
        ("app: cloth\ngravity: [0, -9.8]\n", "gravity", "expected a list of 3"),
        ("app: cloth\ngrid: {nx: 1.5}\n", "grid.nx", "expected an int"),
        ("app: cloth\nsolver: magic\n", "solver", "expected one of 'newton', 'newton_cg'"),
        ("app: cloth\ndtype: float16\n", "dtype", "expected one of 'float64', 'float32'"),
        ("app: cloth\ngrid: {nx: 1}\n", "grid.nx", "expected an int >= 2"),
        ("app: cloth\ntime_step: -0.1\n", "time_step", "> 0"),
        ("app: cloth\nsphere: {radius: 0}\n", "sphere.radius", "> 0"),
        ("app: cloth\ndevice: gpu0\n", "device", "'cpu', 'cuda' or 'cuda:N'"),
        ("app: cloth\nmesh: missing.obj\n", "mesh", "mesh file not found"),
        ("app: cloth\nmesh: notes.txt\n", "mesh", "expected 'grid' or an .obj/.off/.ply file"),
        ("app: smoothing\nenergy: magic\n", "energy", "expected one of 'area', 'dirichlet'"),
        ("app: clothes\n", "app", "did you mean 'cloth'"),
        ("steps: 3\n", "app", "missing"),
        ("app: cloth\ntest: {app: smoothing}\n", "test.app", "cannot be overridden"),
    ],
)
def test_bad_config_names_file_and_key(tmp_path, text, key, fragment):
    path = write_config(tmp_path, text, "bad.yaml")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: key '{key}': "), msg
    assert fragment in msg, msg
    assert info.value.key == key


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("- app\n- cloth\n", "expected a mapping"),
        ("app: cloth\nsteps: [\n", "not valid YAML"),
        ("app: !!python/object/apply:os.system ['echo hacked']\n", "not valid YAML"),  # the safe loader refuses tags
    ],
)
def test_bad_yaml_names_file(tmp_path, text, fragment):
    path = write_config(tmp_path, text, "bad.yaml")
    with pytest.raises(ConfigError, match=fragment) as info:
        load_config(path)
    assert str(info.value).startswith(str(path))


def test_overrides_errors_name_their_flag(tmp_path):
    with pytest.raises(ConfigError, match=r"^--set grid.nx=abc: key 'grid.nx': expected an int"):
        load_config(HANGING, overrides=parse_set(["steps=2", "grid.nx=abc"]))
    with pytest.raises(ConfigError, match=r"^--set gravity=\[0, x, 0\]: key 'gravity\[1\]': expected a number"):
        load_config(HANGING, overrides=parse_set(["gravity=[0, x, 0]"]))
    with pytest.raises(ConfigError, match=r"^--set colour=1: key 'colour': unknown key"):
        load_config(HANGING, overrides=parse_set(["colour=1"]))
    with pytest.raises(ConfigError, match=r"^--steps -1: key 'steps': expected an int >= 0"):
        load_config(HANGING, flags={"--steps": {"steps": -1}})
    with pytest.raises(ConfigError, match=r"^--set: key 'app'"):
        load_config(HANGING, overrides={"app": "smoothing"})


def test_mesh_path_resolves_against_the_config_folder(tmp_path, monkeypatch):
    (tmp_path / "meshes").mkdir()
    (tmp_path / "meshes" / "tri.obj").write_text("v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 3\n")
    (tmp_path / "configs").mkdir()
    path = write_config(tmp_path / "configs", "app: smoothing\nmesh: ../meshes/tri.obj\n")
    monkeypatch.chdir(ROOT)  # the current folder does not matter
    c = load_config(path)
    assert pathlib.Path(c.mesh) == (tmp_path / "meshes" / "tri.obj").resolve()
    # a path given with --set is relative to the current folder
    monkeypatch.chdir(tmp_path / "meshes")
    assert pathlib.Path(load_config(path, overrides={"mesh": "tri.obj"}).mesh) == c.mesh_path().resolve()
    with pytest.raises(ConfigError, match=r"^--set mesh=../meshes/none.obj: key 'mesh': mesh file not found"):
        load_config(path, overrides={"mesh": "../meshes/none.obj"})


def test_config_names_and_listing():
    assert load_config("cloth/hanging").scene == "hanging"
    configs = appmod.available_configs()
    assert {"cloth", "smoothing"} <= set(appmod.available_apps())
    assert [p.stem for p in configs["cloth"]] == ["drape", "grid_1000", "hanging"]
    with pytest.raises(ConfigError, match="config file not found"):
        load_config("cloth/nope")


def test_resolve_device_default_and_missing_cuda(monkeypatch):
    import warp as wp

    monkeypatch.setattr(wp, "get_cuda_device_count", lambda: 0)
    assert resolve_device(None) == ("cpu", "no CUDA device found (default)")
    with pytest.raises(ConfigError, match=r"x.yaml: key 'device': 'cuda:1' requested"):
        resolve_device("cuda:1", "x.yaml")
    monkeypatch.setattr(wp, "get_cuda_device_count", lambda: 2)
    assert resolve_device(None)[0] == "cuda:0"
    assert resolve_device("cuda:1")[0] == "cuda:1"


def test_atomic_write_keeps_old_file_on_failure(tmp_path):
    target = tmp_path / "metrics.json"
    target.write_text("old")

    def fail(tmp):
        pathlib.Path(tmp).write_text("half")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        atomic_write(target, fail)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]  # no temporary file left


def test_json_safe_and_progress(capsys):
    assert json_safe({"a": [1.0, float("nan"), np.float64(np.inf)], "b": np.int64(3)}) == {
        "a": [1.0, None, None], "b": 3}

    class Sink:
        def __init__(self, tty=False):
            self.text = ""
            self.tty = tty

        def write(self, s):
            self.text += s

        def flush(self):
            pass

        def isatty(self):
            return self.tty

    quiet, quiet_tty, loud, tty = Sink(), Sink(tty=True), Sink(), Sink(tty=True)
    for sink, q in ((quiet, True), (quiet_tty, True), (loud, False), (tty, False)):
        p = Progress(3, quiet=q, stream=sink, interval_s=0.0)
        for i in range(4):
            p.update(i, f"E={i}")
    assert quiet.text == "" and quiet_tty.text == ""
    lines = loud.text.splitlines()  # not a terminal: one plain line per update past the interval, none for step 0
    assert len(lines) == 3 and "\r" not in loud.text and "1/3" in lines[0] and "E=1" in lines[0], loud.text
    assert lines[-1].startswith("100%|") and "3/3" in lines[-1] and "E=3" in lines[-1], loud.text
    assert "\r" in tty.text and "3/3" in tty.text and "E=3" in tty.text and tty.text.endswith("\n")  # tqdm's bar


# ----------------------------------------------------------------------------------------------------------------------
# Running: the runner's outputs, the CLI
# ----------------------------------------------------------------------------------------------------------------------


def test_run_app_writes_outputs(tmp_path):
    c = load_config(HANGING, test=True, overrides={"screenshot": False, "mesh_format": "ply"},
                    flags={"--output": {"output": str(tmp_path / "out")}})
    report = run_app(c, quiet=True)
    out = tmp_path / "out"
    assert set(report.files) >= {"mesh", "metrics"}
    assert (out / "final.ply").is_file() and not (out / "screenshot.png").exists()
    m = json.loads((out / "metrics.json").read_text())
    assert m["app"] == "cloth" and m["scene"] == "hanging" and m["device"] == report.app.device
    assert m["check_final"] == "passed" and m["steps"] == 2
    assert len(m["per_step"]) == 2 and len(m["energy"]) == sum(len(s["energies"]) for s in m["per_step"])
    assert len(m["gradient_norm"]) == len(m["energy"])
    assert {"solver_derivatives", "solver_linear_solve", "solver_line_search", "setup", "run", "outputs"} <= set(
        m["time_ms"])
    assert m["versions"]["warp"].startswith("1.19") and m["mesh"]["vertex_count"] == 64
    # compile and load times: the first step pays for the kernels a cold cache compiles
    c = m["compile"]
    assert set(c) == {"cache_warm", "modules_loaded", "modules_compiled", "compile_s", "load_s", "kernel_cache",
                      "modules", "first_step_s", "median_step_s"}
    assert c["modules_loaded"] == len(c["modules"]) and c["modules_compiled"] == sum(r["compiled"] for r in c["modules"])
    assert c["cache_warm"] is (c["modules_compiled"] == 0)
    # compile_s: the loads that compiled; load_s: the others (compile time excluded)
    np.testing.assert_allclose(c["compile_s"], sum(r["seconds"] for r in c["modules"] if r["compiled"]))
    np.testing.assert_allclose(c["load_s"], sum(r["seconds"] for r in c["modules"] if not r["compiled"]))
    assert all(re.fullmatch(r"[0-9a-f]{7}", r["hash"]) for r in c["modules"]), c["modules"]
    assert c["first_step_s"] > 0.0 and c["median_step_s"] > 0.0  # 2 steps: one after the first
    np.testing.assert_allclose(m["time_ms"]["compile"], 1000.0 * c["compile_s"])
    assert m["config"]["grid"]["nx"] == 8
    import warp_meshad as wm

    final = wm.TriMesh.from_file(out / "final.ply")
    np.testing.assert_allclose(final.vertices, report.app.positions())
    if _has("matplotlib"):
        png = (out / "convergence.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary files left


def _has(module: str) -> bool:
    try:
        __import__(module)
        return True
    except ImportError:
        return False


def test_check_final_failure_is_reported_after_outputs(tmp_path, monkeypatch):
    from warp_meshad.apps import cloth

    def broken(self):
        raise AssertionError("cloth: broken on purpose")

    monkeypatch.setattr(cloth.App, "check_final", broken)
    c = load_config(HANGING, test=True, overrides={"screenshot": False, "steps": 1},
                    flags={"--output": {"output": str(tmp_path)}})
    with pytest.raises(AssertionError, match="broken on purpose"):
        run_app(c, quiet=True)
    assert json.loads((tmp_path / "metrics.json").read_text())["check_final"].startswith("failed: cloth: broken")


def test_run_app_keeps_setup_objects_out_of_full_collections_during_the_steps(tmp_path, monkeypatch):
    import gc

    from warp_meshad.apps import cloth

    seen = []
    step = cloth.App.step

    def recorded(self):
        seen.append(gc.get_freeze_count())
        return step(self)

    monkeypatch.setattr(cloth.App, "step", recorded)
    c = load_config(HANGING, test=True, overrides={"screenshot": False, "steps": 2},
                    flags={"--output": {"output": str(tmp_path / "a")}})
    assert gc.get_freeze_count() == 0
    run_app(c, quiet=True)
    assert len(seen) == 2 and min(seen) > 0, seen  # the steps ran with the setup's objects frozen
    assert gc.get_freeze_count() == 0  # and they are collectable again after
    # objects the caller froze stay frozen: the runner leaves a managed collector alone
    gc.freeze()
    try:
        c = load_config(HANGING, test=True, overrides={"screenshot": False, "steps": 1},
                        flags={"--output": {"output": str(tmp_path / "b")}})
        run_app(c, quiet=True)
        assert gc.get_freeze_count() > 0  # not unfrozen by the runner (freed objects leave the count as usual)
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0


def test_cli_list_and_errors(capsys, tmp_path):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "cloth/hanging (default)" in out and "smoothing/spot_area" in out and "  cloth\n" in out
    bad = write_config(tmp_path, "app: cloth\nstifness: 1\n", "bad.yaml")
    assert main(["run", str(bad), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: key 'stifness': unknown key" in err
    with pytest.raises(SystemExit):
        main(["run", "--viewer", "--headless"])


def test_cli_run_test_in_process(tmp_path, capsys, device):
    rc = main(["run", "cloth/hanging", "--test", "--steps", "1", "--output", str(tmp_path), "--device", device,
               "--set", "screenshot=false"])
    assert rc == 0
    err = capsys.readouterr().err
    assert f"on {device}" in err and "check_final passed" in err
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["steps"] == 1 and m["mesh"]["vertex_count"] == 64


def test_cli_subprocess_python_m_quiet(tmp_path):
    """``python -m warp_meshad run --test --quiet`` from another folder: the default config, nothing printed."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-m", "warp_meshad", "run", "--test", "--quiet", "--headless", "--output", str(tmp_path),
         "--set", "screenshot=false"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "warp-meshad:" not in proc.stderr and proc.stdout == ""
    assert (tmp_path / "metrics.json").is_file() and (tmp_path / "final.obj").is_file()


# ----------------------------------------------------------------------------------------------------------------------
# Viewer
# ----------------------------------------------------------------------------------------------------------------------


def _small_app():
    return appmod.app_class("cloth")(load_config(HANGING, test=True, overrides={"screenshot": False}))


def test_viewer_controller_logic_without_a_window():
    from warp_meshad._src.app.viewer import ViewerController

    ctl = ViewerController(_small_app())
    assert not ctl.playing and ctl.app.steps_done == 0
    ctl.tick()
    assert ctl.app.steps_done == 0  # paused: nothing happens
    ctl.single_step()
    assert ctl.app.steps_done == 1 and not ctl.playing
    ctl.play()
    ctl.tick()
    assert ctl.app.steps_done == 2 and ctl.done
    ctl.tick()
    assert ctl.app.steps_done == 2 and not ctl.playing  # stops at config.steps
    ctl.play()
    assert not ctl.playing
    lines = ctl.status_lines()
    assert lines[1] == "step 2 / 2  (done)" and lines[3].startswith("energy: ")


def test_viewer_with_polyscope_mock_backend():
    ps = pytest.importorskip("polyscope", reason="polyscope (the viewer extra) is not installed")
    from warp_meshad._src.app import viewer as viewer

    ps.set_use_prefs_file(False)
    ps.init("openGL_mock")
    ps.remove_all_structures()
    app = _small_app()
    ctl = viewer.ViewerController(app, ps)
    assert ps.has_surface_mesh(viewer.MESH_NAME)
    ctl.play()
    ps.set_user_callback(ctl.callback)
    ps.show(forFrames=4)  # the callback draws the buttons and steps while playing
    ps.clear_user_callback()
    assert app.steps_done == 2 and not ctl.playing
    ctl.single_step()  # a user may step past the end
    assert app.steps_done == 3
    # every quantity kind registers, and a refresh keeps the user's choice of the shown quantity
    n, m = app.mesh.vertex_count, app.mesh.face_count
    extra = {"vv": ("vertex_vectors", np.ones((n, 3))), "fv": ("face_vectors", np.ones((m, 3))),
             "vs": ("vertices", np.arange(n)), "fs": ("faces", np.arange(m))}
    viewer._update_quantities(ctl.mesh, extra, first=True)
    viewer._update_quantities(ctl.mesh, extra)
    with pytest.raises(ValueError, match="unknown kind"):
        viewer._update_quantities(ctl.mesh, {"bad": ("edges", np.ones(3))})
    # show() opens paused: frames draw but do not step
    shown = viewer.show(app, backend="openGL_mock", frames=3)
    assert shown.frames >= 1 and app.steps_done == 3 and ps.has_point_cloud("sphere 0") is False
    ps.remove_all_structures()


def test_headless_screenshot_or_skip(tmp_path):
    pytest.importorskip("polyscope", reason="polyscope (the viewer extra) is not installed")
    from warp_meshad._src.app import viewer as viewer

    app = _small_app()
    app.run()
    ok, why = viewer.screenshot(app, tmp_path / "screenshot.png")
    if not ok:
        pytest.skip(f"no headless rendering here: {why}")
    imread = pytest.importorskip("matplotlib.image").imread

    img = imread(tmp_path / "screenshot.png")
    assert img.ndim == 3 and img.shape[0] > 100
    assert img[..., :3].std() > 0.01, "the screenshot is blank"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["screenshot.png"]


def test_screenshot_runs_the_other_outputs_while_its_child_renders(tmp_path):
    """``screenshot(..., while_rendering=f)`` runs ``f`` in this process while the child renders (the run writes its
    mesh and convergence plot then); an exception from ``f`` stops the child, leaves no temporary file and is
    raised."""
    pytest.importorskip("polyscope", reason="polyscope (the viewer extra) is not installed")
    from warp_meshad._src.app import viewer as viewer

    app = _small_app()
    ran = []
    ok, why = viewer.screenshot(app, tmp_path / "shot.png", while_rendering=lambda: ran.append(len(ran)))
    assert ran == [0]
    assert ok or why.startswith("headless rendering unavailable"), why

    def failing():
        raise RuntimeError("the plot failed")

    with pytest.raises(RuntimeError, match="the plot failed"):
        viewer.screenshot(app, tmp_path / "other.png", while_rendering=failing)
    assert sorted(p.name for p in tmp_path.iterdir()) == (["shot.png"] if ok else [])


def test_a_failing_screenshot_still_leaves_the_mesh_and_the_plot(tmp_path, monkeypatch):
    """The mesh and the plot are written while the screenshot renders; a screenshot that fails before its child
    starts (here: the scene cannot be read from the app) does not take them along: the run's outputs are complete
    without it (manifest included) and the run says why it is missing."""
    pytest.importorskip("polyscope", reason="polyscope (the viewer extra) is not installed")
    from warp_meshad._src.app import runner

    def broken(*args, **kwargs):
        raise RuntimeError("no scene")

    monkeypatch.setattr(appmod.app_class("cloth"), "quantities", broken)
    config = load_config(ROOT / "configs" / "cloth" / "hanging.yaml", test=True,
                         overrides={"device": "cpu", "output": str(tmp_path), "screenshot": True})
    report = runner.run_app(config, quiet=True)
    assert "screenshot.png skipped: RuntimeError: no scene" in report.messages
    assert sorted(p.name for p in tmp_path.iterdir()) == ["convergence.png", "final.obj", "manifest.json",
                                                          "metrics.json"]
    assert appmod.verify_outputs(tmp_path, ["final.obj", "metrics.json"])[1] == ""


def test_screenshot_child_does_not_import_warp(tmp_path, monkeypatch):
    """The rendering child runs viewer.py by path with numpy, Polyscope and matplotlib only: a ``warp`` that fails to
    import (first on its path) does not stop it (importing the package cost the child 0.55 of 1.76 s)."""
    pytest.importorskip("polyscope", reason="polyscope (the viewer extra) is not installed")
    from warp_meshad._src.app import viewer as viewer

    app = _small_app()
    fake = tmp_path / "fake_site" / "warp"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('the rendering child imported warp')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(fake.parent), os.environ.get("PYTHONPATH")])))
    out = tmp_path / "out"
    out.mkdir()
    ok, why = viewer.screenshot(app, out / "screenshot.png")
    if not ok and why.startswith("headless rendering unavailable"):  # no EGL here (not: the child failed)
        pytest.skip(f"no headless rendering here: {why}")
    assert ok, why

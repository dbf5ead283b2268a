"""The screenshot's child started ahead (warp_meshad/_src/app/viewer.py ScreenshotWorker): it renders what a child
started at the end renders, one that died is reported, not waited for, and the command line's run renders through
it without importing Polyscope or matplotlib itself."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("polyscope", reason="polyscope (the viewer extra) is not installed")
pytest.importorskip("yaml")
pytestmark = pytest.mark.cpu

from warp_meshad._src.app import viewer  # noqa: E402
from warp_meshad._src.app.output_set import verify_outputs  # noqa: E402
from warp_meshad.app import app_class, load_config  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def app():
    a = app_class("cloth")(load_config("cloth/hanging", test=True, overrides={"screenshot": False, "device": "cpu"}))
    a.run()
    return a


def test_the_child_started_ahead_renders_what_a_child_started_at_the_end_renders(app, tmp_path):
    imread = pytest.importorskip("matplotlib.image").imread
    ok, why = viewer.screenshot(app, tmp_path / "fresh.png")
    if not ok:
        pytest.skip(f"no headless rendering here: {why}")
    ran = []
    with viewer.ScreenshotWorker().start() as worker:
        ok, why = viewer.screenshot(app, tmp_path / "ahead.png", while_rendering=lambda: ran.append(1), worker=worker)
    assert ok, why
    assert ran == [1] and worker.proc is None  # taken
    np.testing.assert_array_equal(imread(tmp_path / "ahead.png"), imread(tmp_path / "fresh.png"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ahead.png", "fresh.png"]


def test_a_child_given_no_scene_is_stopped_and_one_that_died_is_reported(app, tmp_path):
    idle = viewer.ScreenshotWorker().start()
    idle.close()
    assert idle.proc.poll() is not None
    dead = viewer.ScreenshotWorker().start()
    dead.proc.kill()
    dead.proc.wait()
    with dead:
        ok, why = viewer.screenshot(app, tmp_path / "shot.png", worker=dead)
    assert not ok and why.startswith("headless rendering failed (Polyscope + EGL, exit status -9)"), why
    assert list(tmp_path.iterdir()) == []  # no scene file, no temporary PNG left


def test_the_command_line_renders_through_its_children(tmp_path):
    out = tmp_path / "out"
    code = ("import sys; from warp_meshad.__main__ import main; "
            f"rc = main(['run', 'cloth/hanging', '--test', '--device', 'cpu', '--headless', '-q', '--output', "
            f"{str(out)!r}]); "
            "print(rc, sorted({m.split('.')[0] for m in sys.modules} & {'matplotlib', 'polyscope'}))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "0 []", proc.stdout  # neither imported in the run's own process
    manifest, why = verify_outputs(out, ["convergence.png", "final.obj", "metrics.json"])
    assert why == "", why
    if "screenshot.png" not in manifest["files"]:
        pytest.skip("no headless rendering here")
    assert (out / "screenshot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

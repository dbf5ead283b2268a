"""convergence.png drawn by a child process (warp_meshad/_src/app/plot.py): the child's PNG is the one this process
draws, a failing child makes the run draw it itself, and the command line's run leaves matplotlib out of its own
process."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("matplotlib")
pytestmark = pytest.mark.cpu

from warp_meshad._src.app import plot  # noqa: E402
from warp_meshad._src.app.output_set import verify_outputs  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _history(steps: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(steps):
        e = np.sort(rng.random(4))[::-1] + k
        out.append({"step": k, "energies": e.tolist(), "gradient_norms": (10.0 ** -np.arange(4.0)).tolist(),
                    "time": 0.02 * (k + 1), "iterations": 3})
    return out


@pytest.mark.parametrize("steps, per_step", [(3, True), (12, True), (2, False)], ids=["legend", "colour-bar", "one"])
def test_the_child_draws_the_png_this_process_draws(steps, per_step):
    history = _history(steps)
    with plot.PlotWorker(timeout_s=120.0).start() as worker:
        worker.submit(history, "cloth/test (newton, cpu)", per_step)
        png, why = worker.result()
    assert why == "" and png is not None
    assert png == plot.convergence_png(plot.plot_records(history), "cloth/test (newton, cpu)", per_step)
    assert worker.proc.returncode == 0


def test_plot_records_keep_what_the_figure_reads_as_json():
    rec = {"step": np.int64(2), "energies": [np.float64(1.5), 1.0], "gradient_norms": [np.float32(0.5)],
           "time": np.float64(0.1), "per_step_solver": object()}
    (out,) = plot.plot_records([rec])
    assert out == {"step": 2, "energies": [1.5, 1.0], "gradient_norms": [0.5], "time": 0.1}
    assert json.loads(json.dumps(out)) == out
    assert plot.plot_records([{"step": 0, "energies": [], "gradient_norms": []}])[0]["time"] is None


def test_a_failing_child_gives_no_png_and_says_why(monkeypatch):
    monkeypatch.setattr(plot, "plot_records", lambda history: history)  # records sent as given: the child's KeyError
    with plot.PlotWorker().start() as broken:
        broken.submit([{"step": 0}], "t", True)
        png, why = broken.result()
    assert png is None and why == "the plot's child process failed (exit status 1): KeyError: 'energies'", why
    idle = plot.PlotWorker().start()
    idle.close()  # closed before any job: the child is stopped, and result says that nothing was asked
    assert idle.proc.poll() is not None
    assert idle.result() == (None, "no figure was asked of the plot's child process")


def test_a_child_that_fails_makes_the_run_draw_the_plot_itself(tmp_path, monkeypatch):
    from warp_meshad.app import load_config, run

    monkeypatch.setattr(plot.PlotWorker, "result", lambda self: (None, "the child broke (test)"))
    said = []
    c = load_config("cloth/hanging", test=True, overrides={"screenshot": False, "device": "cpu",
                                                            "output": str(tmp_path)})
    report = run(c, log=said.append, start_children=True)
    assert "drawing convergence.png in this process: the child broke (test)" in said
    assert report.files["convergence"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert verify_outputs(tmp_path, ["convergence.png", "final.obj", "metrics.json"])[1] == ""


def test_the_command_line_draws_the_plot_in_its_child_without_importing_matplotlib(tmp_path):
    out = tmp_path / "out"
    code = ("import sys; from warp_meshad.__main__ import main; "
            f"rc = main(['run', 'cloth/hanging', '--test', '--device', 'cpu', '--headless', '-q', '--set', "
            f"'screenshot=false', '--output', {str(out)!r}]); "
            "print(rc, sorted(m for m in sys.modules if m.split('.')[0] in ('matplotlib', 'polyscope')))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "0 []", proc.stdout  # exit status 0, and neither matplotlib nor polyscope here
    manifest, why = verify_outputs(out, ["convergence.png", "final.obj", "metrics.json"])
    assert why == "" and (out / "convergence.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in out.iterdir() if p.name.startswith(".")]

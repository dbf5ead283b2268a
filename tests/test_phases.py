"""Where a run's seconds go (warp_meshad/_src/app/phases.py): RunPhases' groups, laps and table, and a run's
``metrics.json["phases_s"]`` and ``--profile`` table (the 8 x 8 cloth and a param patch of about 600 faces, on the
CPU)."""

import json
import os
import pathlib
import re
import time

import numpy as np
import pytest

pytest.importorskip("yaml")
pytestmark = pytest.mark.cpu

from warp_meshad.__main__ import main  # noqa: E402
from warp_meshad._src.app.phases import GROUPS, RunPhases, process_age_s  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
PATCH = ROOT / "assets" / "datasets" / "param_patches_small" / "patch_001.obj"


def test_a_group_adds_up_to_its_wall_time_with_other():
    phases = RunPhases()
    with phases.group("setup"):
        with phases.timed("setup", "mesh read"):
            time.sleep(0.02)
        phases.add("setup", "checks", 0.001)
        phases.add("setup", "checks", 0.002)  # a repeated phase adds
        time.sleep(0.02)  # not attributed: "other"
    d = phases.as_dict()
    assert list(d) == ["setup"] and list(d["setup"]) == ["mesh read", "checks", "other"]
    np.testing.assert_allclose(d["setup"]["checks"], 0.003)
    assert d["setup"]["mesh read"] >= 0.02 and d["setup"]["other"] >= 0.015  # 0.02 s less the 3 ms added by hand
    np.testing.assert_allclose(sum(d["setup"].values()), phases.total_s(), rtol=1e-3)
    with pytest.raises(ValueError, match=r"group expected one of \('start', 'setup', 'steps', 'outputs'\), got 'x'"):
        phases.add("x", "y", 1.0)


def test_groups_come_in_their_order_and_begin_is_idempotent():
    phases = RunPhases(started=time.perf_counter())
    phases.add("outputs", "mesh", 0.5)
    phases.begin("setup")
    t_open = phases._open["setup"]
    phases.begin("setup")  # the command line began it before the config: run_app's begin keeps that start
    assert phases._open["setup"] == t_open
    time.sleep(0.002)
    phases.end("setup")
    phases.add("start", "python", 0.1)
    assert list(phases.as_dict()) == ["start", "setup", "outputs"]
    assert set(GROUPS) >= set(phases.as_dict())


def test_the_table_lists_each_phase_with_its_share_and_the_total():
    phases = RunPhases(started=0.0)
    phases.update("setup", {"mesh read": 0.25, "solver": 0.75})
    phases.add("steps", "first", 1.0)
    text = phases.table("title")
    lines = text.splitlines()
    assert lines[0] == "title"
    assert re.search(r"setup\s+mesh read\s+0\.250\s+12\.5%", text), text
    assert re.search(r"\(setup\)\s+1\.000", text) and re.search(r"steps\s+first\s+1\.000\s+50\.0%", text), text
    assert re.search(r"^  total\s+2\.000$", lines[-1]), text  # no process start known: the phases' sum


def test_process_age_is_the_time_since_this_process_started():
    age = process_age_s()
    if age is None:
        pytest.skip("no /proc/self/stat here")
    # this process has imported pytest and Warp (more than 50 ms), and it is not older than the machine's uptime
    assert 0.05 < age < time.clock_gettime(time.CLOCK_BOOTTIME) + 1.0
    later = process_age_s()
    assert later >= age - 0.011  # 10 ms ticks


def _phases(out: pathlib.Path) -> dict:
    return json.loads((out / "metrics.json").read_text())


def test_a_run_records_its_phases_in_metrics_and_profile_prints_them(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", "cloth/hanging", "--test", "--device", "cpu", "--headless", "--set", "screenshot=false",
                 "--output", str(out), "--profile"]) == 0
    err = capsys.readouterr().err
    m = _phases(out)
    p = m["phases_s"]
    assert list(p) == ["start", "setup", "steps", "outputs"]
    assert {"python", "imports"} <= set(p["start"])
    # the CLI's config, the runner's folder, the base's device and mesh, the cloth's own laps
    assert {"config", "output folder", "config check", "device", "mesh read", "checks", "start point", "problem",
            "solver"} <= set(p["setup"]), p["setup"]
    assert set(p["steps"]) >= {"first", "rest"}
    assert {"check", "mesh", "plot", "metrics"} <= set(p["outputs"]), p["outputs"]
    assert "screenshot" not in p["outputs"]
    values = [s for g in p.values() for s in g.values()]
    assert all(s >= 0.0 for s in values)
    # the phases cover the process up to metrics.json, a few ms of glue aside
    assert sum(values) <= m["phases_total_s"] + 1e-3
    assert sum(values) >= 0.9 * m["phases_total_s"], (sum(values), m["phases_total_s"])
    np.testing.assert_allclose(p["steps"]["first"], m["compile"]["first_step_s"], atol=1e-6)  # kept to 1 us
    # the setup's legacy total (ms) is the build from the app's module on: the phases from there on cover it, and
    # little else than the children's start and the glue between the command line and the runner
    build = sum(s for k, s in p["setup"].items() if k not in ("config", "output folder", "children"))
    assert "children" in p["setup"]
    assert m["time_ms"]["setup"] / 1000.0 - 1e-3 <= build <= m["time_ms"]["setup"] / 1000.0 + 0.05
    # --profile: a table of the same phases, then the commit (after metrics.json) and the total
    assert "where the seconds of cloth/hanging went" in err
    for name in ("python", "imports", "config", "mesh read", "start point", "solver", "first", "plot",
                 "metrics write", "commit"):
        assert re.search(rf"\b{re.escape(name)}\s+\d+\.\d{{3}}\s+\d+\.\d%", err), (name, err)
    assert re.search(r"\n  total\s+\d+\.\d{3}\n?$", err.rstrip() + "\n"), err


def test_a_run_without_profile_prints_no_table_and_param_laps_its_start_point(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", "param/patches", "--test", "--device", "cpu", "--headless", "--set", "screenshot=false",
                 "--set", f"mesh={PATCH}", "--output", str(out), "-q"]) == 0
    assert "where the seconds" not in capsys.readouterr().err
    setup = _phases(out)["phases_s"]["setup"]
    assert list(setup)[:2] == ["config", "output folder"]
    # param's build in its order: the mesh, its check, the Tutte start, the problem, the solver
    order = [k for k in setup if k in ("mesh read", "checks", "start point", "problem", "solver")]
    assert order == ["mesh read", "checks", "start point", "problem", "solver"], setup


def test_run_app_without_the_command_line_records_setup_steps_and_outputs(tmp_path):
    from warp_meshad.app import load_config, run

    c = load_config("cloth/hanging", test=True, overrides={"screenshot": False, "device": "cpu",
                                                            "output": str(tmp_path)})
    report = run(c, quiet=True)
    p = report.metrics["phases_s"]
    assert list(p) == ["setup", "steps", "outputs"]  # no process start or imports: the caller's
    assert "config" not in p["setup"] and "mesh read" in p["setup"]
    # the report's phases also hold what came after metrics.json
    after = report.phases.as_dict()["outputs"]
    assert {"metrics write", "commit"} <= set(after) and "commit" not in p["outputs"]
    assert report.phases.total_s() >= report.metrics["phases_total_s"]
    assert os.path.isfile(tmp_path / "metrics.json")


def test_the_program_leaves_its_objects_out_of_the_collections_at_exit(tmp_path):
    """main() as the program (no argv) ends with gc.freeze(): the interpreter's collections at exit skip Warp's and
    the run's objects; main(argv) called from Python leaves the collector as it was."""
    import subprocess
    import sys

    code = ("import gc, sys; from warp_meshad.__main__ import main; sys.argv = ['warp-meshad', 'list']; "
            "main(); print('frozen', gc.get_freeze_count() > 0); gc.unfreeze(); main(['list']); "
            "print('frozen', gc.get_freeze_count())")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [ln for ln in proc.stdout.splitlines() if ln.startswith("frozen")] == ["frozen True", "frozen 0"]

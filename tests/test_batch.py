"""``warp-meshad batch``: a scene over a dataset, in process and on Ray; bad meshes recorded, interrupted batches
resumed without redoing finished meshes (param/patches at its test size on the shipped small dataset)."""

import csv
import json
import pathlib
import shutil
import sys

import pytest

from warp_meshad import app as appmod
from warp_meshad.__main__ import main
from warp_meshad.app import ConfigError, find_meshes, load_config, run_batch

ROOT = pathlib.Path(__file__).resolve().parents[1]
SMALL = ROOT / "assets" / "datasets" / "param_patches_small"
GOOD = ["patch_001", "patch_003", "patch_010", "patch_019"]  # the smallest four (586 to 691 faces)
BAD = {"nan": ("v nan 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 3\n", "NaN or infinite coordinates"),
       # a closed tetrahedron: a valid mesh, but no disk for the Tutte embedding
       "closed": ("v 0 0 0\nv 1 0 0\nv 0 1 0\nv 0 0 1\nf 1 3 2\nf 1 2 4\nf 2 3 4\nf 1 4 3\n", "boundary")}


def _dataset(folder: pathlib.Path) -> pathlib.Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in GOOD:
        shutil.copy(SMALL / f"{name}.obj", folder / f"{name}.obj")
    for name, (text, _) in BAD.items():
        (folder / f"{name}.obj").write_text(text)
    return folder


def _config():
    return load_config("param/patches", test=True, flags={"--device": {"device": "cpu"}})


def _csv(path: pathlib.Path) -> dict:
    return {r["name"]: r for r in csv.DictReader(open(path))}


@pytest.fixture(scope="module")
def in_process(tmp_path_factory):
    """The six meshes in process, in batched chunks of two, interrupted in the third chunk (the two bad ones and two
    good ones finished), then resumed."""
    root = tmp_path_factory.mktemp("batch")
    meshes, out = _dataset(root / "meshes"), root / "out"
    from warp_meshad._src.app import runner

    real, calls = runner.run_apps_batched, []

    def interrupted(configs, **kw):
        calls.extend(pathlib.Path(c.mesh).stem for c in configs)
        if len(calls) >= 5:
            raise KeyboardInterrupt
        return real(configs, **kw)

    runner.run_apps_batched = interrupted
    try:
        with pytest.raises(KeyboardInterrupt):
            run_batch(_config(), meshes, out, batch_size=2, quiet=True)
    finally:
        runner.run_apps_batched = real
    assert calls == sorted(BAD) + GOOD  # every chunk of two went to the batched runner
    first = _csv(out / "summary.csv")  # written after each mesh: the four before the interruption
    report = run_batch(_config(), meshes, out, batch_size=2, quiet=True)
    return meshes, out, first, report


def test_bad_meshes_are_recorded_and_the_others_done(in_process):
    meshes, out, _, report = in_process
    rows = {r["name"]: r for r in report.rows}
    assert [r["name"] for r in report.rows] == sorted(BAD) + GOOD  # the folder's files, sorted
    assert report.counts == {"done": 4, "failed": 0, "error": 2} and not report.ok
    for name, (_, why) in BAD.items():
        assert rows[name]["status"] == "error" and why in rows[name]["error"], rows[name]
        assert not (out / name / "metrics.json").exists()
    for name in GOOD:
        r = rows[name]
        assert r["status"] == "done" and r["error"] == "", r
        metrics = json.loads((out / name / "metrics.json").read_text())
        assert metrics["check_final"] == "passed" and metrics["mesh"]["face_count"] == r["faces"]
        assert r["iterations"] == metrics["iterations"] >= 1 and r["final_energy"] == metrics["final_energy"]
        assert r["energy_per_area"] >= 4.0 and (out / name / "final.obj").is_file()
    table = _csv(out / "summary.csv")
    assert list(table) == [r["name"] for r in report.rows]
    assert list(next(iter(table.values()))) == list(appmod.SUMMARY_COLUMNS)
    assert (out / "summary.png").stat().st_size > 10_000


def test_an_interrupted_batch_resumes_without_redoing_finished_meshes(in_process):
    _, _, first, report = in_process
    assert list(first) == sorted(BAD) + GOOD[:2]
    ran = {r["name"]: r["ran"] for r in report.rows}
    # the two finished good meshes are skipped; error rows have no outputs, so they run again
    assert ran == {**dict.fromkeys(BAD, "now"), GOOD[0]: "earlier", GOOD[1]: "earlier", GOOD[2]: "now",
                   GOOD[3]: "now"} and report.ran == 4
    for name in GOOD[:2]:
        assert {k: str(v) for k, v in {r["name"]: r for r in report.rows}[name].items() if k != "ran"} == {
            k: v for k, v in first[name].items() if k != "ran"}


def test_a_rerun_runs_only_the_meshes_without_complete_outputs(in_process, tmp_path):
    meshes, out, _, report = in_process
    done = {r["name"]: r for r in report.rows}
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    (copy / GOOD[1] / "metrics.json").unlink()  # an interrupted write: the mesh is not complete
    again = run_batch(_config(), meshes, copy, quiet=True)
    ran = {r["name"] for r in again.rows if r["ran"] == "now"}
    assert ran == {GOOD[1], *BAD} and again.ran == 3
    redone = {r["name"]: r for r in again.rows}[GOOD[1]]
    # batched with other meshes than before: the same solve to round-off
    assert redone["iterations"] == done[GOOD[1]]["iterations"]
    assert redone["final_energy"] == pytest.approx(done[GOOD[1]]["final_energy"], rel=1e-10)


def test_ray_workers_give_the_same_results(in_process, tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'warp-meshad[batch]')")
    meshes, _, _, report = in_process
    on_ray = run_batch(_config(), meshes, tmp_path / "ray", workers=2, batch_size=2, quiet=True)
    assert on_ray.engine == "ray" and on_ray.counts == report.counts
    for a, b in zip(report.rows, on_ray.rows):
        keys = ("name", "vertices", "faces", "iterations", "status")
        assert [a[k] for k in keys] == [b[k] for k in keys]
        if a["status"] == "done":
            assert b["final_energy"] == pytest.approx(a["final_energy"], rel=1e-10)
        assert (b["error"] != "") == (a["error"] != "")


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "one_at_a_time"])
def test_building_ahead_in_other_processes_gives_the_same_rows(in_process, tmp_path, batched):
    """``build_jobs=2``: meshes read and Tutte starts computed in spawned processes (bad meshes' errors come back
    from there) give the rows of the in-process build."""
    meshes, _, _, report = in_process
    ahead = run_batch(_config(), meshes, tmp_path / "ahead", batch_size=2, quiet=True, build_jobs=2, batched=batched)
    assert ahead.counts == report.counts
    for a, b in zip(report.rows, ahead.rows):
        keys = ("name", "vertices", "faces", "iterations", "status")
        assert [a[k] for k in keys] == [b[k] for k in keys]
        if a["status"] == "done":
            assert b["final_energy"] == pytest.approx(a["final_energy"], rel=1e-10)
        else:
            assert b["error"] == a["error"], (a["error"], b["error"])


def test_find_meshes_reads_folders_globs_and_lists(tmp_path):
    meshes = _dataset(tmp_path / "m")
    names = lambda ps: [p.stem for p in ps]  # noqa: E731
    assert names(find_meshes(meshes)) == sorted(BAD) + GOOD
    assert names(find_meshes(str(meshes / "patch_*.obj"))) == GOOD
    lst = tmp_path / "list.txt"
    lst.write_text(f"# two of them\nm/{GOOD[2]}.obj\n\n{meshes / GOOD[0]}.obj\n")
    assert names(find_meshes(lst)) == [GOOD[2], GOOD[0]]
    (tmp_path / "bad.txt").write_text("m/none.obj\n")
    with pytest.raises(ConfigError, match="1 listed file not found"):
        find_meshes(tmp_path / "bad.txt")
    with pytest.raises(ConfigError, match="no mesh files"):
        find_meshes(str(tmp_path / "*.obj"))


def test_cli_batch_errors_exit_2(tmp_path, capsys, monkeypatch):
    args = ["batch", "param/patches", "--test", "--device", "cpu", "--output", str(tmp_path / "o")]
    assert main(args + ["--meshes", str(tmp_path / "nothing")]) == 2
    assert "--meshes" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    assert main(args + ["--meshes", str(SMALL), "--workers", "2"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'warp-meshad[batch]'" in err and "--workers 1" in err
    assert main(args + ["--meshes", str(SMALL), "--build-jobs", "-1"]) == 2
    assert "--build-jobs: key 'build_jobs': expected an int >= 0, got -1" in capsys.readouterr().err
    assert not (tmp_path / "o" / "patch_000").exists()  # nothing ran


def test_batched_chunks_equal_mesh_by_mesh(tmp_path):
    """A chunk solved as one ProblemBatch gives each mesh's own run: same iterations (+-1), E within 1e-8."""
    from warp_meshad._src.app.batch import _items, run_chunk

    items = _items([SMALL / f"{n}.obj" for n in GOOD], tmp_path)
    one = run_chunk(_config(), [dict(i, folder=i["folder"] + "_one") for i in items], batched=False)
    together = run_chunk(_config(), items, batched=True)
    for a, b in zip(one, together):
        assert a["status"] == b["status"] == "done", (a, b)
        assert abs(a["iterations"] - b["iterations"]) <= 1
        assert b["final_energy"] == pytest.approx(a["final_energy"], rel=1e-8)
        ma, mb = (json.loads((tmp_path / f"{b['name']}{s}" / "metrics.json").read_text()) for s in ("_one", ""))
        assert mb["check_final"] == "passed" and mb["per_step"][0]["reason"] == ma["per_step"][0]["reason"]


def test_ray_batch_of_the_shipped_dataset_interrupted_and_resumed(tmp_path, monkeypatch):
    """The 20 shipped patches and one bad mesh on a local Ray with 2 workers, interrupted after some chunks, then
    resumed on Ray: the bad mesh's row says why, every other mesh is done, finished meshes are not run again."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'warp-meshad[batch]')")
    from warp_meshad._src.app import batch as batchmod

    meshes = tmp_path / "m"
    meshes.mkdir()
    for p in sorted(SMALL.glob("*.obj")):
        shutil.copy(p, meshes / p.name)
    (meshes / "bad.obj").write_text(BAD["nan"][0])
    out = tmp_path / "out"
    real = batchmod.write_summary_csv

    def interrupted(path, rows):  # the summary is written after every chunk: stop the batch after the third
        real(path, rows)
        if len(rows) >= 9:
            raise KeyboardInterrupt

    monkeypatch.setattr(batchmod, "write_summary_csv", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_batch(_config(), meshes, out, workers=2, batch_size=3, quiet=True)
    monkeypatch.setattr(batchmod, "write_summary_csv", real)
    first = _csv(out / "summary.csv")
    finished = {n for n, r in first.items() if r["status"] == "done"}
    assert 0 < len(finished) < 20
    # a chunk in flight when the batch stopped may have finished its meshes' outputs after the last summary: those
    # are complete too (each output is written atomically), and must not run again either
    complete = {m.parent.name: m.stat().st_mtime_ns for m in out.glob("*/metrics.json")}
    assert finished <= set(complete)
    report = run_batch(_config(), meshes, out, workers=2, batch_size=3, quiet=True)
    rows = {r["name"]: r for r in report.rows}
    assert report.engine == "ray" and report.counts == {"done": 20, "failed": 0, "error": 1}
    assert rows["bad"]["status"] == "error" and BAD["nan"][1] in rows["bad"]["error"]
    assert {n for n, r in rows.items() if r["ran"] == "earlier"} == set(complete)
    assert report.ran == 21 - len(complete)
    assert all((out / n / "metrics.json").stat().st_mtime_ns == t for n, t in complete.items())  # not rewritten


# -- a mesh that kills its worker or loses the CUDA context (the engines' recovery, with a stand-in for the solve) ----


class _Died(Exception):
    """Stands for the worker process dying (a crash in native code)."""


def _metrics(n: int) -> dict:
    return {"mesh": {"vertex_count": 10 + n, "face_count": 20 + n}, "iterations": 3, "final_energy": 1.0 + n,
            "time_ms": {"run": 1.0}, "check_final": "passed"}


def _stand_in_chunk(config, items, on_row=None, batched=True, prepared=None):
    """run_chunk's contract without a solve: 'kills' takes its worker down, 'loses' fails and loses the device."""
    from warp_meshad._src.app import batch as batchmod

    rows = []
    for k, item in enumerate(items):
        if "kills" in item["name"]:
            raise _Died("segmentation fault")
        if "loses" in item["name"]:
            row = batchmod._row(item, error="RuntimeError: Warp CUDA error 700: an illegal memory access")
        else:
            row = batchmod._row(item, _metrics(k))
        rows.append(row)
        if on_row is not None:
            on_row(row)
        if "loses" in item["name"]:
            raise batchmod.DeviceLost(f"the CUDA context was lost after mesh {item['name']!r} failed (700)", rows)
    return rows


class _FakeRay:
    """What ``_run_ray`` uses of Ray, run in this process: actors are objects, a task runs when its result is read,
    and a task that raises :class:`_Died` is a dead worker (``RayActorError``)."""

    class exceptions:  # noqa: N801 (ray.exceptions)
        class RayError(Exception):
            pass

        class RayActorError(RayError):
            pass

    class _Ref:
        def __init__(self, body, chunk):
            self.body, self.chunk = body, chunk

    def __init__(self):
        self.actors, self.kills, self.chunks = 0, 0, []

    def is_initialized(self):
        return True

    def cluster_resources(self):
        return {"CPU": 2.0}

    def remote(self, **options):
        ray = self

        def wrap(cls):
            class Handle:
                @staticmethod
                def remote(*args):
                    ray.actors += 1
                    body = cls(*args)
                    run = type("Run", (), {"remote": staticmethod(lambda chunk: ray._Ref(body, chunk))})
                    return type("Actor", (), {"run": run})()

            return Handle

        return wrap

    def wait(self, refs, num_returns=1):
        return refs[:1], refs[1:]

    def get(self, ref):
        self.chunks.append([item["name"] for item in ref.chunk])
        try:
            return ref.body.run(ref.chunk)
        except _Died as exc:
            raise self.exceptions.RayActorError(f"The actor died unexpectedly: {exc}") from None

    def kill(self, actor):
        self.kills += 1


def test_ray_worker_death_and_lost_device_cost_no_other_mesh(tmp_path, monkeypatch):
    """A worker that dies in a chunk is replaced and the chunk's meshes run again one per chunk, so only the mesh
    that kills a worker by itself gets an error row; a worker whose mesh lost the CUDA context returns the rows up to
    it, is replaced, and the rest of its chunk runs again. Every mesh gets exactly one row."""
    from warp_meshad._src.app import batch as batchmod

    fake = _FakeRay()
    monkeypatch.setattr(batchmod, "_import_ray", lambda: fake)
    monkeypatch.setattr(batchmod, "run_chunk", _stand_in_chunk)
    names = ["a0", "b_kills", "c2", "d3", "e_loses", "f5"]
    items = batchmod._items([tmp_path / f"{n}.obj" for n in names], tmp_path / "out")
    got, messages = [], []
    batchmod._run_ray(_config(), [items[:3], items[3:]], 2, None, got.extend, messages.append, False)
    rows = {r["name"]: r for r in got}
    assert sorted(rows) == names and len(got) == len(names)
    assert {n: rows[n]["status"] for n in names} == {"a0": "done", "b_kills": "error", "c2": "done", "d3": "done",
                                                     "e_loses": "error", "f5": "done"}
    assert rows["b_kills"]["error"].startswith("the worker process died (RayActorError: The actor died unexpectedly")
    assert rows["e_loses"]["error"].startswith("RuntimeError: Warp CUDA error 700")
    # the dead chunk again mesh by mesh, the lost chunk's rest alone; b_kills kills a worker twice
    assert fake.chunks[:2] == [["a0", "b_kills", "c2"], ["d3", "e_loses", "f5"]]
    assert sorted(fake.chunks[2:]) == [["a0"], ["b_kills"], ["c2"], ["f5"]]
    assert fake.actors == 2 + 3 and fake.kills == 3 + 2
    assert sum("a new worker takes over" in m for m in messages) == 3


def test_in_process_batch_stops_at_a_lost_device_and_says_so(tmp_path, monkeypatch):
    """In this process a lost CUDA context ends the batch: the failed mesh's row says why, the meshes not run say
    so (status error: a rerun runs them), and the summary has every mesh."""
    from warp_meshad._src.app import batch as batchmod

    meshes = tmp_path / "m"
    meshes.mkdir()
    names = ["a0", "b_loses", "c2", "d3"]
    for n in names:
        shutil.copy(SMALL / f"{GOOD[0]}.obj", meshes / f"{n}.obj")
    monkeypatch.setattr(batchmod, "run_chunk", _stand_in_chunk)
    report = run_batch(_config(), meshes, tmp_path / "out", batch_size=2, quiet=True, build_jobs=0)
    rows = {r["name"]: r for r in report.rows}
    assert [r["name"] for r in report.rows] == names and report.counts == {"done": 1, "failed": 0, "error": 3}
    assert rows["b_loses"]["error"].startswith("RuntimeError: Warp CUDA error 700")
    for n in ("c2", "d3"):
        assert rows[n]["error"].startswith("not run: the CUDA context was lost after mesh 'b_loses' failed")
        assert rows[n]["error"].endswith("run the batch again to resume")
    assert set(_csv(tmp_path / "out" / "summary.csv")) == set(names)

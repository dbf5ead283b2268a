"""Nothing lost, nothing half-written (issue 33): interrupts, full disks, two writers on one output folder, damaged
results, degenerate and mutated input, hostile configs and long runs.

The rows about processes run the real command line in subprocesses: SIGINT (Ctrl-C: to the whole process group, as a
terminal sends it) and SIGTERM during the steps and during the outputs, two and three processes on one folder, a lock
left by a killed process; a full disk by injecting ENOSPC at the write (tests/fault_driver.py) and, where this machine
lets the test mount one, on a real small tmpfs. Each asserts the exit status, the one line said and what the folder
holds afterwards. Apps run on the CPU at their test size (the 8 x 8 cloth, param patches of about 600 faces)."""

import contextlib
import errno
import gc
import json
import os
import pathlib
import pickle
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import tracemalloc

import numpy as np
import pytest

pytest.importorskip("yaml")
pytestmark = pytest.mark.cpu

import warp as wp  # noqa: E402

import warp_meshad as wm  # noqa: E402
from warp_meshad import app as appmod  # noqa: E402
from warp_meshad.__main__ import main  # noqa: E402
from warp_meshad._src.app import folder_lock  # noqa: E402
from warp_meshad._src.app.base import step_problem  # noqa: E402
from warp_meshad._src.app.history import StepHistory  # noqa: E402
from warp_meshad._src.app.loader import MAX_EXPANDED_VALUES, parse_set  # noqa: E402
from warp_meshad._src.app.output_set import OutputSet, OutputWriteError, verify_outputs  # noqa: E402
from warp_meshad._src.app.runner import _StepClock  # noqa: E402
from warp_meshad._src.mesh.checks import MeshError, check_nondegenerate  # noqa: E402
from warp_meshad.app import ConfigError, load_config  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
DRIVER = ROOT / "tests" / "fault_driver.py"
PATCHES = ROOT / "assets" / "datasets" / "param_patches_small"
SPOT = ROOT / "assets" / "meshes" / "spot.obj"
CLOTH = ["cloth/hanging", "--test", "--device", "cpu", "--headless", "--set", "screenshot=false"]
OUTPUTS = ["convergence.png", "final.obj", "manifest.json", "metrics.json"]
RUN_AGAIN = "run the same command again to start over (a run does not resume)"
# a child in a process group of its own (its pid is the group's id), so a signal to the group reaches only it and its
# children; ``process_group`` is Python 3.11's, ``setpgrp`` the same call before 3.11
OWN_GROUP = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}


# ----------------------------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------------------------


class Proc:
    """A ``warp-meshad`` subprocess in a process group of its own (a signal to its group reaches only it and its
    children), its stderr read line by line as it comes."""

    def __init__(self, argv, cwd, driver_args=None):
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        cmd = [sys.executable, str(DRIVER), *driver_args, "--", *argv] if driver_args is not None else \
            [sys.executable, "-m", "warp_meshad", *argv]
        self.p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  **OWN_GROUP)
        self.lines = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.p.stderr:
            self.lines.append(line.rstrip("\n"))

    @property
    def pid(self) -> int:
        return self.p.pid

    def wait_for(self, fragment: str, timeout: float = 120.0) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for line in list(self.lines):
                if fragment in line:
                    return line
            if self.p.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"{fragment!r} not seen; stderr:\n" + "\n".join(self.lines))

    def finish(self, timeout: float = 180.0) -> tuple[int, list[str]]:
        rc = self.p.wait(timeout=timeout)
        self._reader.join(timeout=10)
        self.p.stdout.close()
        return rc, self.said()

    def said(self) -> list[str]:
        """The lines of stderr other than Warp's notice on machines without a CUDA driver."""
        return [ln for ln in self.lines if not ln.startswith("Warp CUDA warning")]

    def kill_group(self, sig):
        os.killpg(self.p.pid, sig)


def _cli(argv, cwd, driver_args=None, timeout=180.0) -> tuple[int, list[str]]:
    return Proc(argv, cwd, driver_args).finish(timeout)


def _wait_until(predicate, timeout=120.0, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _names(folder: pathlib.Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def _snapshot(folder: pathlib.Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def _lock_pid(folder: pathlib.Path):
    try:
        return json.loads((folder / folder_lock.LOCK_NAME).read_text()).get("pid")
    except (OSError, ValueError):
        return None


def _one_line(lines: list[str]) -> str:
    assert not any("Traceback" in ln for ln in lines), "\n".join(lines)
    assert len(lines) == 1, "\n".join(lines)
    return lines[0]


def _dataset(folder: pathlib.Path, names) -> pathlib.Path:
    folder.mkdir(parents=True, exist_ok=True)
    for n in names:
        shutil.copy(PATCHES / f"{n}.obj", folder / f"{n}.obj")
    return folder


def _coincident(path: pathlib.Path, source: pathlib.Path, face: int) -> pathlib.Path:
    """``source`` with the third corner of ``face`` moved onto its first: two faces of zero area, one zero-length
    edge; still a valid manifold mesh."""
    m = wm.TriMesh.from_file(source)
    v = np.array(m.vertices)
    a, _, c = m.faces[face]
    v[c] = v[a]
    wm.TriMesh(v, m.faces).save(path)
    return path


# ----------------------------------------------------------------------------------------------------------------------
# 1. Interrupts
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_the_steps_ends_the_run_with_one_line_and_writes_nothing(sig, tmp_path):
    """Ctrl-C (SIGINT to the process group) or SIGTERM while the cloth steps: exit 130 / 143, one line saying how many
    steps were finished and how to start again, and an empty output folder (no outputs, no temporary file, no
    lock)."""
    out = tmp_path / "out"
    run = Proc(["run", *CLOTH, "--steps", "100000", "--output", str(out)], tmp_path)
    run.wait_for("cloth/hanging: 8x8 grid")
    time.sleep(0.5)
    if sig == signal.SIGINT:
        run.kill_group(sig)
    else:
        os.kill(run.pid, sig)
    rc, lines = run.finish()
    assert rc == 128 + sig, lines
    assert not any("Traceback" in ln for ln in lines), "\n".join(lines)
    name = signal.Signals(sig).name
    m = re.fullmatch(rf"warp-meshad: interrupted by {name}: cloth/hanging: (\d+) of 100000 steps finished, stopped in "
                     rf"step (\d+); no outputs written to {re.escape(str(out))}; {re.escape(RUN_AGAIN)}", lines[-1])
    assert m and int(m.group(2)) == int(m.group(1)) + 1, lines[-1]
    assert _names(out) == []


def test_ctrl_c_while_writing_the_outputs_leaves_the_earlier_run_as_it_was(tmp_path, capsys):
    """Ctrl-C while the outputs are written (the plot, with the screenshot's child rendering): the earlier complete
    run in the folder is kept byte for byte, and nothing of the interrupted one is there (before: final.obj and
    convergence.png were written after the signal and left without metrics.json)."""
    out = tmp_path / "out"
    assert main(["run", *CLOTH, "--output", str(out), "-q"]) == 0
    before = _snapshot(out)
    assert sorted(before) == OUTPUTS
    rc, lines = _cli(["run", *CLOTH, "--set", "screenshot=true", "--set", "gravity=[0, -5, 0]", "--output", str(out),
                      "-q"], tmp_path, ["--signal-on", ".convergence.", "--signal", "INT"])
    assert rc == 130, lines
    assert _one_line(lines) == (f"warp-meshad: interrupted by SIGINT: cloth/hanging: all 2 steps finished, stopped "
                                f"while writing the outputs; nothing of this run was written to {out}; {RUN_AGAIN}")
    assert _snapshot(out) == before
    assert verify_outputs(out, ["final.obj", "metrics.json"])[1] == ""


def test_a_signal_while_the_outputs_are_put_in_place_takes_effect_after_them(tmp_path):
    """SIGTERM when the manifest is written (the renames are done): the commit runs whole, then the run ends with
    143 and says that its outputs are complete."""
    out = tmp_path / "out"
    rc, lines = _cli(["run", *CLOTH, "--output", str(out), "-q"], tmp_path,
                     ["--signal-on", ".manifest.", "--signal", "TERM"])
    assert rc == 143, lines
    assert _one_line(lines) == (f"warp-meshad: interrupted by SIGTERM: cloth/hanging had finished; its outputs in "
                                f"{out} are complete")
    assert _names(out) == OUTPUTS and verify_outputs(out, ["final.obj", "metrics.json"])[1] == ""


def test_ctrl_c_during_a_batch_keeps_the_finished_meshes_and_a_rerun_resumes(tmp_path, capsys):
    """Ctrl-C while the second of three meshes writes its outputs: exit 130, one line (1 of 3 finished), the first
    mesh complete, the second's folder empty, summary.csv with the first; a rerun runs only the other two."""
    names = ["patch_001", "patch_003", "patch_010"]
    meshes, out = _dataset(tmp_path / "meshes", names), tmp_path / "out"
    argv = ["batch", "param/patches", "--test", "--device", "cpu", "--meshes", str(meshes), "--output", str(out),
            "--one-at-a-time", "--batch-size", "1", "-q"]
    rc, lines = _cli(argv, tmp_path, ["--signal-on", f"{os.sep}{names[1]}{os.sep}.", "--signal", "INT"])
    assert rc == 130, lines
    assert _one_line(lines) == (
        "warp-meshad: interrupted by SIGINT: param/patches: 1 of 3 meshes finished with complete outputs (1 in this "
        "run, 0 earlier), 2 not; summary.csv lists those before the signal; run the same command again to resume "
        "(finished meshes are skipped)")
    assert _names(out) == [names[0], names[1], "summary.csv"]
    assert verify_outputs(out / names[0], ["final.obj", "metrics.json"])[1] == ""
    assert _names(out / names[1]) == []
    assert [r.split(",")[0] for r in (out / "summary.csv").read_text().splitlines()[1:]] == [names[0]]

    assert main(argv) == 0
    capsys.readouterr()
    rows = {r["name"]: r for r in __import__("csv").DictReader(open(out / "summary.csv"))}
    assert {n: r["ran"] for n, r in rows.items()} == {names[0]: "earlier", names[1]: "now", names[2]: "now"}
    assert all(r["status"] == "done" for r in rows.values())


def test_interrupted_carries_its_signal_and_status():
    stop = appmod.Interrupted(signal.SIGTERM, "x: 1 of 2 steps")
    assert isinstance(stop, KeyboardInterrupt) and stop.exit_status == 143 and str(stop) == (
        "interrupted by SIGTERM: x: 1 of 2 steps")
    again = pickle.loads(pickle.dumps(stop))
    assert (again.signum, again.what) == (signal.SIGTERM, "x: 1 of 2 steps")
    assert appmod.Interrupted.of(KeyboardInterrupt()).exit_status == 130


# ----------------------------------------------------------------------------------------------------------------------
# 2. Atomic, complete outputs
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["final.obj", "convergence.png", "metrics.json", "manifest.json"])
def test_a_full_disk_while_writing_an_output_exits_2_naming_it_and_leaves_nothing(name, tmp_path):
    """ENOSPC half-way through one output (the first write to it fails after writing half its bytes): exit 2, one
    line naming the file and the cause, and an empty folder: no complete-looking final.obj, no temporary file (the
    manifest is written last: its failure removes the outputs already renamed into place)."""
    out = tmp_path / "out"
    stem = pathlib.Path(name).stem
    rc, lines = _cli(["run", *CLOTH, "--output", str(out), "-q"], tmp_path, ["--enospc-on", f".{stem}."])
    assert rc == 2, lines
    assert _one_line(lines) == (f"warp-meshad: error: cannot write {out / name}: No space left on device [Errno 28]; "
                                f"no outputs of this run were written to {out} (its temporary files are removed)")
    assert _names(out) == []


@contextlib.contextmanager
def _small_tmpfs(folder: pathlib.Path, size: str):
    folder.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def test_a_real_full_tmpfs_exits_2_naming_the_file(tmp_path):
    """On a 40 KiB tmpfs the mesh fits and the plot does not (where matplotlib is missing, the metrics do not)."""
    with _small_tmpfs(tmp_path / "small", "40k") as small:
        rc, lines = _cli(["run", *CLOTH, "--output", str(small), "-q"], tmp_path)
        assert rc == 2, lines
        line = _one_line(lines)
        m = re.fullmatch(rf"warp-meshad: error: cannot write {re.escape(str(small))}/(\S+): No space left on device "
                         rf"\[Errno 28\]; no outputs of this run were written to {re.escape(str(small))} \(its "
                         r"temporary files are removed\)", line)
        assert m and m.group(1) in ("convergence.png", "metrics.json", "final.obj"), line
        assert _names(small) == []


@pytest.mark.parametrize("target", ["summary.csv", ".metrics."])
def test_a_full_disk_during_a_batch_exits_2_and_leaves_no_temporary_file(target, tmp_path):
    """ENOSPC on summary.csv (first written after the first mesh) or on a mesh's metrics.json: exit 2, one line
    naming the file; no summary.csv.tmp or other temporary file anywhere; a mesh that was finished stays complete."""
    names = ["patch_001", "patch_003"]
    meshes, out = _dataset(tmp_path / "meshes", names), tmp_path / "out"
    rc, lines = _cli(["batch", "param/patches", "--test", "--device", "cpu", "--meshes", str(meshes), "--output",
                      str(out), "--one-at-a-time", "--batch-size", "1", "-q"], tmp_path, ["--enospc-on", target])
    assert rc == 2, lines
    line = _one_line(lines)
    if target == "summary.csv":
        assert line == (f"warp-meshad: error: cannot write {out / 'summary.csv'}: No space left on device "
                        f"[Errno 28]; no summary.csv was written (no temporary file left); the meshes finished "
                        f"before keep their complete outputs")
        assert _names(out) == [names[0]]
        assert verify_outputs(out / names[0], ["final.obj", "metrics.json"])[1] == ""
    else:
        folder = out / names[0]
        assert line == (f"warp-meshad: error: cannot write {folder / 'metrics.json'}: No space left on device "
                        f"[Errno 28]; no outputs of this run were written to {folder} (its temporary files are "
                        f"removed)")
        assert _names(out) == [names[0]] and _names(folder) == []
    hidden = [str(p) for p in out.rglob("*") if p.name.startswith(".") or p.name.endswith(".tmp")]
    assert hidden == []


def test_output_set_commits_as_one_unit_and_replaces_the_earlier_run(tmp_path):
    """The manifest lists every file with its size and hash; a second set replaces the first's files (one it does
    not write is removed); a set left without commit leaves nothing; a folder whose file changed is not complete."""
    with OutputSet(tmp_path) as first:
        first.write("a.txt", lambda p: pathlib.Path(p).write_text("one"))
        first.write("b.txt", lambda p: pathlib.Path(p).write_text("two"))
        assert all(n.startswith(".") for n in _names(tmp_path))  # nothing in place before the commit
        first.commit({"app": "test"})
    manifest, why = verify_outputs(tmp_path, ["a.txt"])
    assert why == "" and manifest["app"] == "test" and manifest["files"]["a.txt"]["bytes"] == 3
    with OutputSet(tmp_path) as second:
        second.write("a.txt", lambda p: pathlib.Path(p).write_text("ONE!"))
        second.commit()
    assert _names(tmp_path) == ["a.txt", "manifest.json"] and (tmp_path / "a.txt").read_text() == "ONE!"
    with OutputSet(tmp_path) as third:
        third.write("c.txt", lambda p: pathlib.Path(p).write_text("three"))
    assert _names(tmp_path) == ["a.txt", "manifest.json"]  # no commit: its temporary file is gone

    def failing(p):
        pathlib.Path(p).write_text("half")
        raise OSError(errno.EIO, "Input/output error")

    with pytest.raises(OutputWriteError, match=r"cannot write .*/d\.txt: Input/output error \[Errno 5\]"):
        with OutputSet(tmp_path) as fourth:
            fourth.write("d.txt", failing)
    assert _names(tmp_path) == ["a.txt", "manifest.json"]
    (tmp_path / "a.txt").write_text("ONE?")
    assert verify_outputs(tmp_path) == (None, "a.txt differs from its manifest's hash")
    (tmp_path / "a.txt").write_text("")
    assert verify_outputs(tmp_path) == (None, "a.txt has 0 bytes, its manifest 4")
    (tmp_path / "manifest.json").unlink()
    assert verify_outputs(tmp_path) == (None, "no manifest.json")


def test_a_batch_rerun_redoes_meshes_whose_outputs_were_damaged(tmp_path, capsys):
    """After a finished batch, one final.obj emptied and one cut in half: the rerun names both, runs them again (the
    third is skipped) and leaves loadable meshes matching their manifests (before: counted done, not run again)."""
    names = ["patch_001", "patch_003", "patch_010"]
    meshes, out = _dataset(tmp_path / "meshes", names), tmp_path / "out"
    argv = ["batch", "param/patches", "--test", "--device", "cpu", "--meshes", str(meshes), "--output", str(out)]
    assert main([*argv, "-q"]) == 0
    capsys.readouterr()
    first = out / names[0] / "final.obj"
    size = first.stat().st_size
    first.write_bytes(b"")
    second = out / names[1] / "final.obj"
    text = second.read_bytes()
    second.write_bytes(text[: len(text) // 2])
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert (f"run again, their outputs do not match their manifest: {names[0]} (final.obj has 0 bytes, its manifest "
            f"{size}), {names[1]} (final.obj has {len(text) // 2} bytes, its manifest {len(text)})") in err, err
    rows = {r["name"]: r for r in __import__("csv").DictReader(open(out / "summary.csv"))}
    assert {n: r["ran"] for n, r in rows.items()} == {names[0]: "now", names[1]: "now", names[2]: "earlier"}
    for n in names:
        assert verify_outputs(out / n, ["final.obj", "metrics.json"])[1] == ""
        assert wm.TriMesh.from_file(out / n / "final.obj").face_count > 500


# ----------------------------------------------------------------------------------------------------------------------
# 3. One writer per output folder
# ----------------------------------------------------------------------------------------------------------------------


def test_a_second_writer_refuses_at_once_and_a_waiting_one_runs_after_the_first(tmp_path):
    """A long run holds the folder: a second run without --wait exits 2 at once naming the holder's PID; a third with
    --wait says it waits, and once the first is interrupted it runs and leaves its own complete outputs."""
    out = tmp_path / "out"
    first = Proc(["run", *CLOTH, "--steps", "100000", "--output", str(out)], tmp_path)
    _wait_until(lambda: _lock_pid(out) == first.pid, what="the first run's lock")
    waiting = Proc(["run", *CLOTH, "--steps", "3", "--output", str(out), "--wait"], tmp_path)
    rc, lines = _cli(["run", *CLOTH, "--output", str(out), "-q"], tmp_path)
    assert rc == 2, lines
    line = _one_line(lines)
    assert line.startswith(f"warp-meshad: error: --output {out}: key 'output': folder '{out}' is in use by another "
                           f"warp-meshad process (PID {first.pid}: warp-meshad run cloth/hanging --test"), line
    assert line.endswith("; one process writes to a folder at a time: wait for it to finish (--wait waits), or "
                         "choose another folder (--output DIR)"), line
    waiting.wait_for(f"warp-meshad: waiting for another warp-meshad process (PID {first.pid}")
    first.kill_group(signal.SIGINT)
    assert first.finish()[0] == 130
    rc, lines = waiting.finish()
    assert rc == 0, lines
    assert _names(out) == OUTPUTS
    assert json.loads((out / "metrics.json").read_text())["steps"] == 3
    assert verify_outputs(out, ["final.obj", "metrics.json"])[1] == ""


def test_a_lock_left_by_a_killed_run_is_taken_over(tmp_path, capsys):
    """SIGKILL leaves the lock file naming a dead PID: the next run takes the folder over, says whose lock it was,
    and removes the lock file when done."""
    out = tmp_path / "out"
    dead = Proc(["run", *CLOTH, "--steps", "100000", "--output", str(out)], tmp_path)
    _wait_until(lambda: _lock_pid(out) == dead.pid, what="the run's lock")
    dead.kill_group(signal.SIGKILL)
    dead.finish()
    assert _names(out) == [folder_lock.LOCK_NAME] and _lock_pid(out) == dead.pid
    assert main(["run", *CLOTH, "--output", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"warp-meshad: took over the lock of {out} left by PID {dead.pid} (no longer running)" in err, err
    assert _names(out) == OUTPUTS


def test_without_flock_the_pid_in_the_lock_file_decides(tmp_path, monkeypatch):
    """Where the file system has no flock: a live process named in the lock file holds the folder, a dead one's lock
    is taken over."""
    monkeypatch.setattr(folder_lock, "fcntl", None)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        import socket

        (tmp_path / folder_lock.LOCK_NAME).write_text(json.dumps({"pid": sleeper.pid, "host": socket.gethostname()}))
        with pytest.raises(folder_lock.FolderBusy, match=rf"in use by another warp-meshad process \(PID {sleeper.pid}"):
            folder_lock.FolderLock(tmp_path, "--output x").acquire()
    finally:
        sleeper.kill()
        sleeper.wait()
    said = []
    with folder_lock.FolderLock(tmp_path, log=said.append) as lock:
        assert lock.took_over["pid"] == sleeper.pid and _lock_pid(tmp_path) == os.getpid()
    assert said == [f"took over the lock of {tmp_path} left by PID {sleeper.pid} (no longer running)"]
    assert _names(tmp_path) == []


# ----------------------------------------------------------------------------------------------------------------------
# 4. Degenerate and mutated input
# ----------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def degenerate_meshes(tmp_path_factory):
    folder = tmp_path_factory.mktemp("degenerate")
    return {"closed": _coincident(folder / "spot_coincident.obj", SPOT, 100),
            "disk": _coincident(folder / "patch_coincident.obj", PATCHES / "patch_001.obj", 10)}


FACES = "faces {bad} (2 in total) have zero area (face {first}, area 0); expected triangles of positive area ({why})"
DEGENERATE = {  # scene: (mesh, the message after the mesh's path)
    "smoothing/spot_area": ("closed", FACES.format(bad="[94, 100]", first="94 = [822, 823, 212]",
                                                   why="the area energy's gradient is each face's unit normal")),
    "cloth/drape": ("closed", "edges [1218] (1 in total) have zero length (edge 1218 = [212, 822], length 0); "
                              "expected distinct positions at the two ends of every edge (a spring's force acts along "
                              "its edge)"),
    "arap/homer": ("closed", FACES.format(bad="[94, 100]", first="94 = [822, 823, 212]",
                                          why="the cotangent weights divide by twice each face's area")),
    "shells/spot_drop": ("closed", FACES.format(bad="[94, 100]", first="94 = [822, 823, 212]",
                                                why="the membrane inverts each face's rest frame; bending needs face "
                                                    "normals")),
    "frame_field/fandisk": ("closed", FACES.format(bad="[94, 100]", first="94 = [822, 823, 212]",
                                                   why="a face's tangent frame is undefined without area")),
    "manifold_opt/spot_newton": ("closed", FACES.format(bad="[94, 100]", first="94 = [822, 823, 212]",
                                                        why="the area distortion it reports divides by each face's "
                                                            "rest area")),
    "param/patches": ("disk", FACES.format(bad="[10, 227]", first="10 = [311, 4, 122]",
                                           why="the symmetric Dirichlet energy inverts each face's rest frame")),
}


@pytest.mark.parametrize("scene", sorted(DEGENERATE))
def test_apps_refuse_a_degenerate_mesh_naming_the_element(scene, degenerate_meshes, tmp_path, capsys):
    """Two faces of zero area (one zero-length edge): every app whose energies (or reported quantities) need them
    refuses before it runs, naming the first elements and what was expected; exit 2, nothing written."""
    kind, message = DEGENERATE[scene]
    mesh = degenerate_meshes[kind]
    rc = main(["run", scene, "--test", "--device", "cpu", "--headless", "--set", f"mesh={mesh}", "--output",
               str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.splitlines()[-1] == f"warp-meshad: error: --set mesh={mesh}: key 'mesh': {mesh}: {message}", err
    assert _names(tmp_path / "out") == []


def test_the_dirichlet_energy_takes_a_degenerate_mesh(degenerate_meshes, tmp_path, capsys):
    """What an app checks follows its energy: the Dirichlet energy (|x_a - x_b|^2 / 2) has finite derivatives at a
    zero-area face and a zero-length edge, so smoothing with it runs and passes."""
    rc = main(["run", "smoothing/spot_dirichlet", "--test", "--device", "cpu", "--headless", "--set",
               "screenshot=false", "--set", f"mesh={degenerate_meshes['closed']}", "--output", str(tmp_path / "out"),
               "-q"])
    assert rc == 0, capsys.readouterr().err


def test_a_solve_stopped_before_its_first_iteration_fails_check_final(degenerate_meshes, tmp_path, monkeypatch,
                                                                     capsys):
    """With the mesh check out of the way, the area energy's gradient is NaN at the start: the solve stops on
    non_finite_gradient after 0 iterations, and check_final fails with that reason (exit 1), outputs written
    (before: exit 0, "check_final passed")."""
    monkeypatch.setattr(appmod.app_class("smoothing"), "require_nondegenerate", lambda self, **kw: None)
    out = tmp_path / "out"
    rc = main(["run", "smoothing/spot_area", "--test", "--device", "cpu", "--headless", "--set", "screenshot=false",
               "--set", f"mesh={degenerate_meshes['closed']}", "--output", str(out), "-q"])
    err = capsys.readouterr().err
    why = ("smoothing: step 0: the solve stopped before its first iteration (non_finite_gradient: the gradient at "
           "the start point is NaN or infinite; a degenerate mesh or start point gives that)")
    assert rc == 1 and err.splitlines()[-1] == f"warp-meshad: check_final failed: {why}", err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["check_final"] == f"failed: {why}" and metrics["iterations"] == 0
    assert verify_outputs(out, ["final.obj", "metrics.json"])[1] == ""


def test_step_problem_names_what_is_wrong_with_a_step():
    rec = {"step": 3, "iterations": 0, "energies": [1.0], "reason": "non_finite_energy"}
    assert step_problem(rec).startswith("step 3: the solve stopped before its first iteration (non_finite_energy: "
                                        "the energy at the start point")
    assert step_problem({**rec, "reason": "max_iterations"}) is None
    assert step_problem({**rec, "iterations": 2, "energies": [1.0, float("nan"), 0.5], "reason": "x"}) == (
        "step 3: non-finite energy nan at iteration 1")
    assert step_problem({**rec, "iterations": 1, "energies": [1.0, 2.0], "reason": "x"}) == (
        "step 3: energy rose from 1.0 to 2.0")


def test_check_nondegenerate_rules():
    x = np.array([[0.0, 0, 0], [1, 0, 0], [0, 1, 0], [0.5, 1e-14, 0], [0, 0, 1]])
    check_nondegenerate("ok", x, faces=[[0, 1, 2]], edges=[[0, 1]], tets=[[0, 1, 2, 4]])
    with pytest.raises(MeshError, match=r"^m: faces \[1\] \(1 in total\) have zero area \(face 1 = \[0, 1, 3\], "
                                        r"area 5e-15\); expected triangles of positive area \(why\)$"):
        check_nondegenerate("m", x, faces=[[0, 1, 2], [0, 1, 3]], needs="why")  # collinear: tiny, not zero
    x2 = np.vstack([x, x[1]])
    with pytest.raises(MeshError, match=r"^m: edges \[1\] \(1 in total\) have zero length \(edge 1 = \[1, 5\]"):
        check_nondegenerate("m", x2, edges=[[0, 1], [1, 5]])
    with pytest.raises(MeshError, match=r"^m: tets \[0\] \(1 in total\) are degenerate \(tet 0 = \[0, 1, 2, 3\]"):
        check_nondegenerate("m", x, tets=[[0, 1, 2, 3]])


def test_add_term_keeps_its_own_elements():
    """The caller's element array changed after add_term (relabelled, then an index out of range): f, g and the
    Hessian (whose pattern is built later) all stay those of the elements given (before: the pattern came from the
    caller's changed array, 0.99 away, or a numpy broadcast error)."""
    from warp_meshad.kernels.energies import surface_area

    mesh = wm.TriMesh.grid(5, 4)
    rng = np.random.default_rng(33)
    x_np = np.array(mesh.vertices) + 0.1 * rng.normal(size=(mesh.vertex_count, 3))
    x = wp.array(x_np, dtype=wp.vec3d, device="cpu")
    given = np.array(mesh.faces, dtype=np.int32)  # writable, int32, contiguous: check_elements would not copy it
    kept = given.copy()
    p = wm.Problem(mesh.vertex_count, 3, wp.float64, "cpu")
    p.add_term(given, surface_area)
    given[:] = rng.permutation(mesh.vertex_count)[given]
    given[0, 0] = 10**6
    reference = wm.Problem(mesh.vertex_count, 3, wp.float64, "cpu")
    reference.add_term(kept, surface_area)
    f, g, H = p.eval_with_hessian(x)
    rf, rg, rH = reference.eval_with_hessian(x)
    np.testing.assert_allclose(f, rf, rtol=1e-14)
    np.testing.assert_allclose(g.numpy(), rg.numpy(), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(wm.to_scipy(H).toarray(), wm.to_scipy(rH).toarray(), rtol=1e-13, atol=1e-14)
    term = p.terms[0]
    assert not np.shares_memory(term.elements_np, given) and not term.elements_np.flags.writeable
    np.testing.assert_array_equal(term.elements_np, kept)


def test_add_deformation_term_keeps_its_own_elements():
    from warp_meshad.kernels.energies import StableNeoHookeanData, stable_neo_hookean_F

    mesh = wm.TetMesh.box(2, 2, 2, 1.0, 1.0, 1.0)
    tets = np.array(mesh.tets, dtype=np.int32)
    data = StableNeoHookeanData()
    data.rest_inverse = wp.array(mesh.rest_matrix_inverses(), dtype=wp.mat33d, device="cpu")
    data.volume = wp.array(mesh.volumes(), dtype=wp.float64, device="cpu")
    data.mu, data.lam = wp.float64(1.0), wp.float64(1.0)
    p = wm.Problem(mesh.vertex_count, 3, wp.float64, "cpu")
    p.add_deformation_term(tets, stable_neo_hookean_F, rest_inverse=data.rest_inverse, data=data)
    kept = tets.copy()
    tets[:] = tets[::-1]
    term = p.terms[0]
    assert not np.shares_memory(term.elements_np, tets) and not term.elements_np.flags.writeable
    np.testing.assert_array_equal(term.elements_np, kept)
    np.testing.assert_array_equal(term.elements.numpy(), kept)


# ----------------------------------------------------------------------------------------------------------------------
# 5. Hostile configs
# ----------------------------------------------------------------------------------------------------------------------


def _bomb(levels: int) -> str:
    lines = ["app: smoothing", 'a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    lines.append(f"steps: *a{levels - 1}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("levels", [8, 9])
def test_a_yaml_alias_bomb_is_refused_before_it_is_built(levels, tmp_path):
    """9^8 (9^9) values from a file of about 500 bytes: refused in well under a second with a few MB, one short line
    (before: 16.7 s and 724 MB for 8 levels, the message a repr of the expanded value)."""
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb(levels))
    assert path.stat().st_size < 700
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(ConfigError) as info:
            load_config(path)
        seconds = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(info.value) == (f"{path}: refused unread: its aliases (*name) expand it to more than "
                               f"{MAX_EXPANDED_VALUES:,} values; a config is a small mapping (write its values out, "
                               "with fewer aliases)")
    assert seconds < 1.0 and peak < 20e6, (seconds, peak)


def test_recursive_and_set_aliases_are_refused(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text("app: smoothing\nsteps: &a [*a]\n")
    with pytest.raises(ConfigError, match="refused unread: an alias refers to a node that contains it"):
        load_config(path)
    bomb = "[" + ", ".join(["&x [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"] + ["*x"] * 20000) + "]"
    with pytest.raises(ConfigError, match=r"^--set: key 'steps': value '\[&x \[1, 2, .{50,}\.\.\..{50,}\*x\]' "
                                          r"refused unread: its aliases \(\*name\) expand it to more than 100,000 "
                                          r"values") as info:
        parse_set([f"steps={bomb}"])
    assert len(str(info.value)) < 400
    nested = tmp_path / "anchors.yaml"  # aliases below the bound read as before
    nested.write_text("app: smoothing\ngrid: &g {nx: 5, ny: 6}\ntest: {grid: *g}\n")
    assert load_config(nested, test=True).grid.ny == 6


def test_messages_show_at_most_about_200_characters_of_a_value(tmp_path, capsys):
    long_device = tmp_path / "device.yaml"
    long_device.write_text("app: smoothing\ndevice: '" + "x" * 100_000 + "'\n")
    with pytest.raises(ConfigError) as info:
        load_config(long_device)
    text = str(info.value)
    assert text.startswith(f"{long_device}: key 'device': expected 'cpu', 'cuda' or 'cuda:N', got 'xxx")
    assert len(text) < len(str(long_device)) + 300 and text.count("x") <= 210, len(text)
    wrong_type = tmp_path / "steps.yaml"
    wrong_type.write_text("app: smoothing\nsteps: [" + ", ".join(["123456789"] * 50_000) + "]\n")
    with pytest.raises(ConfigError, match=r"key 'steps': expected an int, got list \[123456789, .*\.\.\.$") as info:
        load_config(wrong_type)
    assert len(str(info.value)) < len(str(wrong_type)) + 150
    # an app's own message quoting a long list (cloth's pinned vertices): cut in the middle, the ends kept
    rc = main(["run", *CLOTH, "--output", str(tmp_path / "out"), "--set",
               "pinned_vertices=[" + ", ".join(str(i) for i in range(20_000)) + ", 99999]"])
    err = capsys.readouterr().err.splitlines()[-1]
    assert rc == 2 and len(err) < 800 and err.endswith("19999, 99999]"), (len(err), err[-100:])
    assert "characters]..." in err


def test_the_step_history_is_bounded_and_keeps_totals():
    """The first record and the latest ``capacity``; totals and the check cover every record; it is a list for its
    readers (indexing, JSON) and pickles with its counters."""
    records = [{"step": k, "iterations": k % 3, "energies": [2.0, 1.0], "time_ms": {"a": 1.0, "b": 0.5},
                "converged": True, "reason": "max_iterations"} for k in range(10)]
    records[2]["energies"] = [1.0, 3.0]  # rose: found when it leaves memory
    h = StepHistory(records, capacity=3, check=step_problem)
    assert [r["step"] for r in h] == [0, 7, 8, 9] and h[0]["step"] == 0 and h[-1]["step"] == 9
    assert h.count == 10 and h.dropped == 6 and len(json.loads(json.dumps(h))) == 4
    assert h.total("iterations") == sum(k % 3 for k in range(10)) and h.total("time_ms") == {"a": 10.0, "b": 5.0}
    assert h.total("converged") == 0 and h.total("missing", None) is None  # booleans are not summed
    assert h.dropped_problem == "step 2: energy rose from 1.0 to 3.0"
    again = pickle.loads(pickle.dumps(h))
    assert again == h and (again.count, again.dropped_problem, again.total("iterations")) == (10, h.dropped_problem,
                                                                                              h.total("iterations"))
    clock = _StepClock()
    for _ in range(_StepClock.KEPT + 50):
        clock.tick()
    assert len(clock.later) == _StepClock.KEPT and clock.summary()["first_step_s"] is not None


def test_a_long_run_keeps_its_memory_flat(monkeypatch, tmp_path):
    """steps: 1000000000 no longer grows the history (1.4 KB a step before): over 1,500 more steps of smoothing
    (history capacity 20 here), the traced memory grows by less than 100 KB; metrics.json reports every step's
    iterations, the kept records and how many were dropped."""
    cls = appmod.app_class("smoothing")
    monkeypatch.setattr(cls, "history_capacity", 20)
    config = load_config("smoothing/spot_dirichlet", test=True, overrides={
        "mesh": "grid", "grid": {"nx": 4, "ny": 4}, "fix_boundary": False, "iterations": 1, "steps": 1_000_000_000,
        "device": "cpu"})
    app = cls(config)
    iterations = sum(app.step()["iterations"] for _ in range(300))
    tracemalloc.start()
    try:
        gc.collect()  # the solver's launches leave short-lived reference cycles: count only what stays
        start = tracemalloc.get_traced_memory()[0]
        for _ in range(1500):
            iterations += app.step()["iterations"]
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert grown < 100_000, grown
    assert len(app.history) == 21 and app.history[0]["step"] == 0 and app.history[-1]["step"] == 1799
    from warp_meshad._src.app.outputs import build_metrics

    metrics = build_metrics(app, {}, "not run")
    assert iterations > 0 and metrics["iterations"] == iterations
    assert metrics["steps"] == 1800 and metrics["per_step_dropped"] == 1779 and len(metrics["per_step"]) == 21
    app.check_final()

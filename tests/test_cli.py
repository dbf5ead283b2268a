"""The command line at its borders, as a new user meets them: bad meshes, unwritable output folders, the linear
back-ends a config may name, the first README command's outputs, where --test runs write, file permissions, and
``warmup``. Every error exits 2 with a message naming what is wrong and no traceback. Apps run on the CPU at their test
size (the 8 x 8 cloth), so their kernels are the ones tests/test_app_framework.py compiles."""

import json
import os
import pathlib
import re
import stat
import subprocess
import sys

import pytest

pytest.importorskip("yaml")
pytestmark = pytest.mark.cpu  # the apps run with --device cpu

from warp_meshad.__main__ import main  # noqa: E402
from warp_meshad import app as appmod  # noqa: E402
from warp_meshad.app import load_config, output_folder  # noqa: E402
from warp_meshad._src.mesh.files import atomic_write  # noqa: E402
from warp_meshad._src.solve.linear import LINEAR_SOLVER_NAMES  # noqa: E402


ROOT = pathlib.Path(__file__).resolve().parents[1]
HANGING = ROOT / "configs" / "cloth" / "hanging.yaml"
SMALL = ["--test", "--steps", "1", "--device", "cpu", "--headless", "--set", "screenshot=false"]

BAD_MESHES = {
    # three faces on the edge (1, 2)
    "non_manifold": ("v 0 0 0\nv 1 0 0\nv 0 1 0\nv 0 -1 0\nv 0 0 1\nf 1 2 3\nf 2 1 4\nf 1 5 2\n",
                     "non-manifold mesh: 1 edge is shared by more than 2 faces"),
    "nan": ("v nan 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 3\n", "have NaN or infinite coordinates"),
    "empty": ("# nothing here\n", "empty mesh"),
    "unreferenced": ("v 0 0 0\nv 1 0 0\nv 0 1 0\nv 5 5 5\nf 1 2 3\n", "1 of 4 vertices is not used by any face"),
}


def _scene_of(app: str) -> str:
    return f"{app}/{appmod.available_configs()[app][0].stem}"


@pytest.mark.parametrize("kind", sorted(BAD_MESHES))
@pytest.mark.parametrize("app", appmod.available_apps())
def test_bad_mesh_exits_2_with_the_mesh_error(app, kind, tmp_path, capsys):
    text, fragment = BAD_MESHES[kind]
    mesh = tmp_path / f"{kind}.obj"
    mesh.write_text(text)
    rc = main(["run", _scene_of(app), "--device", "cpu", "--headless", "--output", str(tmp_path / "out"),
               "--set", f"mesh={mesh}"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith(f"warp-meshad: error: --set mesh={mesh}: key 'mesh': {mesh}: ") and fragment in err, err
    assert not (tmp_path / "out" / "metrics.json").exists()


@pytest.mark.parametrize("argv, first_line", [
    (["--set", "mesh=BAD"], "--set mesh=BAD: key 'mesh': expected 'bar' or an .msh/.vtk/.vtu/.mesh/.obj/.off/.ply "
                            "file, got '{cwd}/BAD'"),
    (["--set", "steps=2", "--set", "mesh=BAD.obj"], "--set mesh=BAD.obj: key 'mesh': mesh file not found: "
                                                    "'{cwd}/BAD.obj' (resolved to {cwd}/BAD.obj)"),
    (["--device", "cuda:99"], "--device cuda:99: key 'device': 'cuda:99' requested but {cuda} found; use --device "
                              "cpu"),
    (["--set", "device=cuda:99"], "--set device=cuda:99: key 'device': 'cuda:99' requested but {cuda} found; use "
                                  "--device cpu"),
    (["--set", "pinned_vertices=[0, 99999]"], "--set pinned_vertices=[0, 99999]: key 'pinned_vertices': indices "
                                              "must be < vertex_count 1046, got [0, 99999]"),
])
def test_errors_name_the_flag_that_gave_the_value(argv, first_line, tmp_path, monkeypatch, capsys):
    """The error names the --set pair or flag a bad value came from, not the scene's YAML file (issue 21 point 3)."""
    import warp as wp

    from warp_meshad._src.plural import plural

    monkeypatch.chdir(tmp_path)
    rc = main(["run", "elastic/bunny", "--test", "--headless", "--output", str(tmp_path / "out"), *argv])
    err = capsys.readouterr().err
    cuda = plural(wp.get_cuda_device_count(), "CUDA device")
    assert rc == 2, err
    assert err.splitlines()[-1] == "warp-meshad: error: " + first_line.format(cwd=tmp_path, cuda=cuda), err


def test_bad_mesh_from_a_config_file_in_a_subprocess_has_no_traceback(tmp_path):
    (tmp_path / "nan.obj").write_text(BAD_MESHES["nan"][0])
    config = tmp_path / "scene.yaml"
    config.write_text("app: smoothing\nmesh: nan.obj\n")
    proc = _cli(["run", str(config), "--device", "cpu", "--headless"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("warp-meshad: error: ")]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"warp-meshad: error: {config}: key 'mesh': {tmp_path / 'nan.obj'}: vertices [0] ")
    assert "NaN or infinite coordinates" in lines[0]


def _cli(argv, cwd, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "warp_meshad", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


# ----------------------------------------------------------------------------------------------------------------------
# Linear back-ends
# ----------------------------------------------------------------------------------------------------------------------


def test_every_linear_backend_is_a_valid_config_value(tmp_path):
    for name in LINEAR_SOLVER_NAMES:
        assert load_config(HANGING, overrides={"linear_solver": name}).linear_solver == name
    path = tmp_path / "q.yaml"
    path.write_text("app: cloth\nlinear_solver: qdldl\n")
    assert load_config(path).linear_solver == "qdldl"
    path.write_text("app: cloth\nlinear_solver: ldlt\n")
    with pytest.raises(appmod.ConfigError, match=r"key 'linear_solver': expected one of 'auto', 'scipy', 'qdldl'"):
        load_config(path)


def test_run_with_qdldl(tmp_path, capsys):
    rc = main(["run", "cloth/hanging", *SMALL, "--set", "linear_solver=qdldl", "--output", str(tmp_path)])
    assert rc == 0, capsys.readouterr().err
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["config"]["linear_solver"] == "qdldl" and metrics["linear_solver"] == "qdldl"
    assert metrics["check_final"] == "passed"


# ----------------------------------------------------------------------------------------------------------------------
# Output folders and files
# ----------------------------------------------------------------------------------------------------------------------


def test_test_runs_write_to_their_own_folder(tmp_path, monkeypatch, capsys):
    assert output_folder(load_config(HANGING)) == pathlib.Path("output/cloth_hanging")
    assert output_folder(load_config(HANGING, test=True)) == pathlib.Path("output/cloth_hanging_test")
    assert output_folder(load_config(HANGING, test=True, flags={"--output": {"output": "x"}})) == pathlib.Path("x")
    monkeypatch.chdir(tmp_path)
    assert main(["run", "cloth/hanging", *SMALL]) == 0
    assert "to output/cloth_hanging_test" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "output").iterdir()) == ["cloth_hanging_test"]
    assert (tmp_path / "output" / "cloth_hanging_test" / "metrics.json").is_file()


@pytest.mark.parametrize("case, reason", [("under_a_file", "Not a directory"),
                                          ("is_a_file", "it is a file, not a folder")])
def test_unwritable_output_exits_2_before_the_run(case, reason, tmp_path, capsys):
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a folder")
    out = blocker / "out" if case == "under_a_file" else blocker
    rc = main(["run", "cloth/hanging", *SMALL, "--output", str(out)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err == (f"warp-meshad: error: --output {out}: key 'output': cannot write the outputs to folder '{out}': "
                   f"{reason}; choose another folder (--output DIR)\n")  # the only line: the app was never built
    assert blocker.read_text() == "not a folder"


def test_unwritable_output_from_the_config_names_the_config(tmp_path, capsys):
    (tmp_path / "file.txt").write_text("")
    config = tmp_path / "scene.yaml"
    config.write_text(f"app: cloth\noutput: {tmp_path / 'file.txt' / 'out'}\ntest: {{grid: {{nx: 4, ny: 4}}}}\n")
    assert main(["run", str(config), *SMALL]) == 2
    assert f"warp-meshad: error: {config}: key 'output': cannot write the outputs" in capsys.readouterr().err


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes to read-only folders")
def test_read_only_output_folder_exits_2(tmp_path, capsys):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        assert main(["run", "cloth/hanging", *SMALL, "--output", str(folder)]) == 2
    finally:
        folder.chmod(0o755)
    assert "Permission denied" in capsys.readouterr().err


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_atomic_write_gives_an_ordinary_file_mode(umask, tmp_path):
    old = os.umask(umask)
    try:
        atomic_write(tmp_path / "a.json", lambda tmp: pathlib.Path(tmp).write_text("{}"))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o666 & ~umask


def test_output_files_have_ordinary_permissions(tmp_path, capsys):
    old = os.umask(0o022)
    try:
        assert main(["run", "cloth/hanging", *SMALL, "--output", str(tmp_path)]) == 0
    finally:
        os.umask(old)
    capsys.readouterr()
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert {"final.obj", "metrics.json"} <= set(modes)
    assert modes == {name: 0o644 for name in modes}, modes


# ----------------------------------------------------------------------------------------------------------------------
# The first README command
# ----------------------------------------------------------------------------------------------------------------------


def test_readme_first_command_installs_the_screenshot_renderer():
    tomllib = pytest.importorskip("tomllib")
    readme = (ROOT / "README.md").read_text()
    first = re.search(r"```bash\n(.*?)\n```", readme, re.S).group(1)
    assert first == 'pip install -e ".[apps]" && warp-meshad run cloth/hanging --headless'
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for r in extras["apps"]}
    assert {"pyyaml", "matplotlib", "polyscope"} <= names
    assert "screenshot.png" in readme and "libegl1 libegl-mesa0" in readme  # what EGL needs, where it is missing


def test_headless_run_writes_the_screenshot_or_says_why(tmp_path, capsys):
    argv = ["run", "cloth/hanging", "--test", "--steps", "1", "--device", "cpu", "--headless", "--output",
            str(tmp_path)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    shot = tmp_path / "screenshot.png"
    if shot.exists():
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "screenshot.png" in err.splitlines()[-1]
    else:
        assert re.search(r"screenshot\.png skipped: (polyscope is not installed|headless rendering)", err), err


def test_screenshot_without_egl_says_why_and_what_to_install(tmp_path, monkeypatch):
    pytest.importorskip("polyscope", reason="polyscope is not installed")
    from warp_meshad._src.app import viewer as viewer

    app = appmod.app_class("cloth")(load_config(HANGING, test=True, overrides={"screenshot": False}))
    monkeypatch.setenv("__EGL_VENDOR_LIBRARY_FILENAMES", str(tmp_path / "no-vendor.json"))  # glvnd finds no EGL
    ok, why = viewer.screenshot(app, tmp_path / "screenshot.png")
    assert not ok
    assert why.startswith("headless rendering unavailable: Polyscope could not initialize EGL"), why
    assert "apt-get install libegl1 libegl-mesa0" in why and "screenshot: false" in why
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no temporary files left


# ----------------------------------------------------------------------------------------------------------------------
# warmup
# ----------------------------------------------------------------------------------------------------------------------


def test_warmup_builds_and_steps_without_writing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["warmup", "cloth/hanging", "--test", "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert "warp-meshad: warming up cloth/hanging: 8x8 grid" in err and "1 step, on cpu" in err
    assert re.search(r"(compiled \d+ Warp modules? in|Warp modules loaded from the kernel cache in) .*; warm-up took",
                     err), err
    assert list(tmp_path.iterdir()) == []
    assert main(["warmup", "cloth/nope"]) == 2
    assert "config file not found" in capsys.readouterr().err


def test_help_names_every_subcommand(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    assert "{run,warmup,batch,list}" in capsys.readouterr().out


def test_the_summary_line_counts_in_words(tmp_path, capsys):
    """``1 step, 1 iteration`` / ``2 steps, 7 iterations``: the run's last line (issue 21 point 4)."""
    assert main(["run", "cloth/hanging", *SMALL, "--set", "iterations=1", "--output", str(tmp_path)]) == 0
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("warp-meshad: 1 step, 1 iteration, final energy "), last
    assert main(["run", "cloth/hanging", *SMALL, "--steps", "2", "--output", str(tmp_path)]) == 0
    iterations = json.loads((tmp_path / "metrics.json").read_text())["iterations"]
    assert iterations > 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith(f"warp-meshad: 2 steps, {iterations} iterations, final energy "), last

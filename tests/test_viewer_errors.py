"""``--viewer`` where no window can open: one clear line on stderr (no Polyscope lines, no atexit traceback), and
warp_meshad._src.app.native_output, which holds Polyscope's (and Warp's) native lines back."""

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

HINT = "run without --viewer (or with --headless) to get the outputs and a headless screenshot"


def _cli(tmp_path, env_changes: dict) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env.update(env_changes)
    return subprocess.run(
        [sys.executable, "-m", "warp_meshad", "run", "smoothing/spot_area", "--viewer", "--device", "cpu", "--test",
         "--output", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )


def _no_raw_lines(done):
    for text in (done.stdout, done.stderr):
        assert "[polyscope]" not in text and "Traceback" not in text and "Exception ignored" not in text, text


def test_viewer_without_a_display_prints_one_line(tmp_path):
    done = _cli(tmp_path, {})
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "warp-meshad: error: cannot open the viewer window: no display (neither DISPLAY nor WAYLAND_DISPLAY is set); "
        + HINT
    ]
    assert not (tmp_path / "out").exists()  # stopped before the app was built


@pytest.mark.skipif(importlib.util.find_spec("polyscope") is None, reason="polyscope is not installed")
@pytest.mark.skipif(sys.platform in ("win32", "darwin"), reason="an X11 display name")
def test_viewer_with_a_display_that_does_not_open_prints_glfw_reason(tmp_path):
    done = _cli(tmp_path, {"DISPLAY": ":987"})  # no X server there
    assert done.returncode == 2
    _no_raw_lines(done)
    last = done.stderr.splitlines()[-1]
    assert last == f"warp-meshad: error: cannot open the viewer window: GLFW: X11: Failed to open display :987; {HINT}"


def test_captured_fds_hold_native_writes_and_restore(capfd):
    from warp_meshad._src.app.native_output import captured_fds

    with captured_fds(1, 2) as held:
        os.write(1, b"native out\n")
        os.write(2, b"native err\n")
        print("python out", file=sys.__stdout__, flush=True)  # a Python stream on fd 1 (pytest swaps sys.stdout)
    os.write(2, b"after\n")
    assert held.data == b"native out\nnative err\npython out\n"
    assert held.text.splitlines() == ["native out", "native err", "python out"]
    got = capfd.readouterr()
    assert got.out == "" and got.err == "after\n"
    with pytest.raises(ValueError), captured_fds(2) as held:  # restored however the block ends
        os.write(2, b"x")
        raise ValueError
    assert held.data == b"x"
    os.write(2, b"restored\n")
    assert capfd.readouterr().err == "restored\n"


def test_show_leaves_polyscope_quiet_at_exit_after_a_failed_start(tmp_path):
    pytest.importorskip("polyscope")
    script = textwrap.dedent("""
        import os
        os.environ["DISPLAY"] = ":987"
        from warp_meshad._src.app.viewer import ViewerError, show
        try:
            show(app=None)
        except ViewerError as exc:
            print("ViewerError:", exc)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0
    _no_raw_lines(done)
    assert done.stdout.startswith("ViewerError: cannot open the viewer window: GLFW: X11: Failed to open display :987")
    assert done.stderr == ""

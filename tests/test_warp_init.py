"""Tests for warp_meshad._src.app.warp_init: Warp's CUDA-driver warning stays off stderr unless a CUDA device was
asked for, and everything else Warp prints at its start still comes through."""

import os
import subprocess
import sys
import textwrap

import pytest

from warp_meshad._src.app.warp_init import DRIVER_WARNING, driver_loads

WARNING = DRIVER_WARNING.decode()


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("DISPLAY", None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          timeout=600, env=env)


@pytest.mark.parametrize("device,warned", [("cpu", False), (None, False), ("cuda", True), ("cuda:1", True)])
def test_only_the_driver_warning_is_held_back(device, warned):
    # Warp's native start stands in for itself: it writes the driver warning and another line to file descriptor 2
    done = _python(f"""
        import os, sys
        import warp as wp
        from warp_meshad._src.app import warp_init
        warp_init.driver_loads = lambda: False
        def native_start():
            os.write(2, {WARNING!r}.encode() + b" GPU execution will not be available.\\n")
            os.write(2, b"Warp native: another line\\n")
        wp.init = native_start
        print("before", file=sys.stderr, flush=True)
        warp_init.init_warp({device!r})
        print("after", file=sys.stderr, flush=True)
    """)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert (WARNING in done.stderr) == warned
    assert [line for line in lines if not line.startswith(WARNING)] == ["before", "Warp native: another line", "after"]


def test_a_loading_driver_leaves_warp_alone():
    done = _python("""
        import os
        import warp as wp
        from warp_meshad._src.app import warp_init
        warp_init.driver_loads = lambda: True
        wp.init = lambda: os.write(2, b"as Warp says it\\n")
        warp_init.init_warp("cpu")
    """)
    assert done.stderr == "as Warp says it\n"


def test_cli_on_the_cpu_prints_no_driver_warning(tmp_path):
    done = _python("import sys; from warp_meshad.__main__ import main; sys.exit(main(sys.argv[1:]))", "run",
                   "smoothing/spot_area", "--headless", "--device", "cpu", "--test", "--output", str(tmp_path / "o"))
    assert done.returncode == 0, done.stderr
    assert "NVIDIA CUDA driver" not in done.stderr
    assert "check_final passed" in done.stderr  # the run's own lines still come


@pytest.mark.skipif(driver_loads(), reason="the CUDA driver loads here: Warp has nothing to warn about")
def test_cli_asking_for_cuda_without_a_driver_keeps_the_warning(tmp_path):
    done = _python("import sys; from warp_meshad.__main__ import main; sys.exit(main(sys.argv[1:]))", "run",
                   "smoothing/spot_area", "--headless", "--device", "cuda", "--test", "--output", str(tmp_path / "o"))
    assert done.returncode == 2
    assert WARNING in done.stderr and "'cuda' requested but 0 CUDA devices found" in done.stderr

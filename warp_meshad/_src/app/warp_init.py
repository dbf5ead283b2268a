"""Warp's initialisation for an app run, without the CUDA-driver warning where no CUDA device was asked for.

Warp 1.19 looks for the NVIDIA driver whenever it initialises (``wp.init()``, or the first call that needs the
runtime), and where it cannot load ``libcuda.so`` / ``nvcuda.dll`` its native library prints "Warp CUDA warning:
Could not find or load the NVIDIA CUDA driver. GPU execution will not be available." on the process's stderr. No
``wp.config`` option skips that look-up. For a run on the CPU (``--device cpu``, or no device on a machine without a
driver, where the CPU is the default) the line says nothing the run's header does not: :func:`init_warp` then
initialises Warp with file descriptor 2 pointed at a temporary file and writes back everything else Warp printed.
Where a CUDA device was asked for, or the driver loads, Warp initialises as usual and says what it says.
"""

from __future__ import annotations

import ctypes
import os
import sys

from warp_meshad._src.app.native_output import captured_fds

__all__ = ["DRIVER_WARNING", "driver_loads", "init_warp"]

DRIVER_WARNING = b"Warp CUDA warning: Could not find or load the NVIDIA CUDA driver."  # the start of Warp's line


def driver_loads() -> bool:
    """Whether the NVIDIA driver library loads here, tried by the names Warp 1.19 tries (so Warp will not warn)."""
    names = ("nvcuda.dll",) if sys.platform == "win32" else ("libcuda.so", "libcuda.so.1")
    for name in names:
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return True
    return False


def init_warp(device: str | None) -> None:
    """Initialise Warp (a no-op where it already is), keeping its CUDA-driver warning off stderr unless ``device``
    names a CUDA device.

    Args:
        device: the device the run asked for: ``"cpu"``, ``"cuda"``, ``"cuda:N"``, or None (the default device).
    """
    import warp as wp

    if (device is not None and device.startswith("cuda")) or driver_loads():
        wp.init()
        return
    with captured_fds(2) as printed:
        wp.init()
    kept = b"".join(line for line in printed.data.splitlines(keepends=True) if not line.startswith(DRIVER_WARNING))
    if kept:
        os.write(2, kept)

"""The end of a helper child process of a run (the plot's and the screenshot's workers, started with the run)."""

from __future__ import annotations

import subprocess

__all__ = ["stop_child"]


def stop_child(proc: subprocess.Popen | None, timeout_s: float = 10.0) -> None:
    """Kill ``proc`` if it still runs, wait for it (at most ``timeout_s``), and close its pipes; None does nothing."""
    if proc is None:
        return
    if proc.poll() is None:
        proc.kill()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        try:
            if stream is not None:
                stream.close()
        except OSError:
            pass

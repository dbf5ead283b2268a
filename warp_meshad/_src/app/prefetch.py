"""Building apps ahead: :meth:`App.prepare <warp_meshad.app.App.prepare>` (mesh file, start point: CPU work) for the
next meshes of a batch in other processes while this one solves on the device.

On the 200-patch param dataset, reading the patches and their Tutte embeddings is about a third of a one-process
run's wall time (benchmarks/history/2026-12-02_batch_param_dataset.md); spread over processes and overlapped with the
solves it leaves the critical path. The processes are spawned (not forked: this process may hold a CUDA context),
import only numpy, SciPy and the app's module, and never touch a Warp device.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from warp_meshad._src.app.config import AppConfig

__all__ = ["Prefetch", "default_build_jobs"]


def default_build_jobs() -> int:
    """Processes that build ahead by default: one per core beyond two (at most 8); 0 (build in this process) on a
    machine of two cores or fewer, where a spawned process's start-up costs more than it saves."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(0, min(8, cores - 2))


def _ignore_interrupts() -> None:
    """A build process leaves SIGINT (Ctrl-C reaches the whole process group) to the batch, which stops it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _prepare(config: AppConfig) -> dict:
    from warp_meshad._src.app.registry import app_class

    return app_class(config.app, config.origin("app")).prepare(config)


class Prefetch:
    """``App.prepare`` of every config, in order, in ``jobs`` spawned processes (none: :meth:`get` returns None and
    the app builds itself).

    Args:
        configs: the configs, in the order they will be asked for.
        jobs: processes (0: no prefetching).
    """

    def __init__(self, configs: list[AppConfig], jobs: int):
        if not (isinstance(jobs, int) and jobs >= 0):
            raise ValueError(f"build jobs: expected an int >= 0, got {jobs!r}")
        self._pool = None
        self._futures: list[Future | None] = [None] * len(configs)
        if jobs and configs:
            self._pool = ProcessPoolExecutor(min(jobs, len(configs)), mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_ignore_interrupts)
            self._futures = [self._pool.submit(_prepare, c) for c in configs]

    def get(self, i: int) -> dict | None:
        """Config ``i``'s prepared parts (waits for them); None when not prefetched or when the pool broke (the app
        then builds itself, and reports the same errors).

        Raises:
            Exception: what ``prepare`` raised for this config (a ``ConfigError`` for a bad mesh).
        """
        future = self._futures[i]
        if future is None:
            return None
        try:
            return future.result()
        except (BrokenProcessPool, OSError):  # a pool process died, or a lost pipe: build here
            return None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

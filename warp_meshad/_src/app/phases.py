"""Where the seconds of a run go: :class:`RunPhases`, the wall time of each phase of one ``warp-meshad run``, for
``metrics.json["phases_s"]`` and the table ``--profile`` prints.

A run's phases fall in four groups, in this order:

- ``start`` (the command line only): ``python`` (from the process's start to the first line of ``warp_meshad``'s
  command: the interpreter, ``site``, the package's ``__init__``) and ``imports`` (the modules the command imports
  before it reads the config: Warp, the app framework);
- ``setup``: ``config`` (the YAML read, the app's module imported for its config class, the values checked),
  ``output folder`` (checked and locked), ``children`` (the start of the child processes that draw
  ``convergence.png`` and render ``screenshot.png``), ``app import`` (the app's module, where the config did not
  import it), then the app's own build as the app times it (:meth:`~warp_meshad._src.app.base.App.lap`:
  ``config check``, ``device`` (Warp's start on it), ``mesh read``, ``checks``, ``start point``, ``problem``,
  ``solver``, ...);
- ``steps``: ``first`` (the first step: the Hessian pattern where it is built on first use, the kernels' first
  loads, the linear solver's analysis) and ``rest`` (the later steps);
- ``outputs``: ``check`` (``check_final``), ``mesh``, ``plot``, ``screenshot`` (the time the screenshot added beyond
  the mesh and the plot written while it rendered), ``metrics`` (building ``metrics.json``'s content), then
  ``metrics write`` and ``commit`` (the renames and the manifest): these two come after ``metrics.json`` is written,
  so only the table and :attr:`~warp_meshad._src.app.runner.RunReport.phases` hold them.

Each group's wall time is measured as a whole; what its named phases leave of it is ``other``, so that the phases of
a group add up to its wall time.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager

__all__ = ["GROUPS", "RunPhases", "process_age_s"]

GROUPS = ("start", "setup", "steps", "outputs")
_OTHER_MIN_S = 5e-4  # a group's unattributed rest shorter than this is not listed


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: from ``/proc/self/stat``, 10 ms resolution), or None where that is
    not known."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
        fields = stat[stat.rindex(")") + 2:].split()  # after the command name, which may hold spaces
        start_ticks = int(fields[19])  # field 22 of proc(5); fields[0] is field 3
        return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class RunPhases:
    """The wall time of each phase of one run, by group (:data:`GROUPS`), in the order the phases were first
    recorded [s]. Recording the same phase again adds to it.

    Attributes:
        started: ``time.perf_counter()`` at the process's start when known (the command line), else at the first
            group's start; the table's total counts from it.
    """

    def __init__(self, started: float | None = None):
        self.started = started
        self._groups: dict[str, dict[str, float]] = {}
        self._walls: dict[str, float] = {}
        self._open: dict[str, float] = {}
        self.ended: float | None = None

    @classmethod
    def from_process_start(cls) -> RunPhases:
        """Phases whose :attr:`started` is this process's start (None where it is not known)."""
        age = process_age_s()
        return cls(None if age is None else time.perf_counter() - age)

    def add(self, group: str, name: str, seconds: float) -> None:
        """Add ``seconds`` to phase ``name`` of ``group``."""
        if group not in GROUPS:
            raise ValueError(f"RunPhases.add: group expected one of {GROUPS}, got {group!r}")
        phases = self._groups.setdefault(group, {})
        phases[name] = phases.get(name, 0.0) + float(seconds)

    def update(self, group: str, phases: dict) -> None:
        """Add every ``{name: seconds}`` of ``phases`` to ``group``."""
        for name, seconds in phases.items():
            self.add(group, name, seconds)

    def begin(self, group: str) -> None:
        """The group's wall clock starts now, unless it runs already (the command line starts ``setup`` before it
        reads the config, :func:`~warp_meshad._src.app.runner.run_app` again at its start)."""
        now = time.perf_counter()
        self._open.setdefault(group, now)
        if self.started is None:
            self.started = now

    def end(self, group: str) -> float:
        """The group's wall clock stops now (see :meth:`begin`); its time not attributed to a phase becomes
        ``other``. Returns the group's wall time [s]."""
        wall = time.perf_counter() - self._open.pop(group)
        self._walls[group] = self._walls.get(group, 0.0) + wall
        self.ended = time.perf_counter()
        return wall

    @contextmanager
    def group(self, group: str):
        """``with phases.group("setup"): ...``: :meth:`begin` and :meth:`end` around the block."""
        self.begin(group)
        try:
            yield self
        finally:
            self.end(group)

    @contextmanager
    def timed(self, group: str, name: str):
        """``with phases.timed("outputs", "mesh"): ...``: the block's wall time added to the phase."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(group, name, time.perf_counter() - t0)

    def seconds(self, group: str, name: str) -> float:
        """The time recorded for one phase (0 when none)."""
        return self._groups.get(group, {}).get(name, 0.0)

    def as_dict(self) -> dict[str, dict[str, float]]:
        """``{group: {phase: seconds}}`` (groups in :data:`GROUPS` order, empty ones left out); a group whose wall
        time was measured gets ``other``, the part of it no phase holds."""
        out = {}
        for group in GROUPS:
            phases = dict(self._groups.get(group, {}))
            wall = self._walls.get(group)
            if wall is not None:
                rest = wall - sum(phases.values())
                if rest >= _OTHER_MIN_S:
                    phases["other"] = phases.get("other", 0.0) + rest
            if phases:
                out[group] = {name: round(s, 6) for name, s in phases.items()}
        return out

    def total_s(self, now: bool = False) -> float | None:
        """Wall time from :attr:`started` to the last group's end (``now``: to now); None before any group began."""
        if self.started is None:
            return None
        end = time.perf_counter() if now else self.ended
        return None if end is None else end - self.started

    def table(self, title: str = "") -> str:
        """The phases as a small text table (seconds and share of the total), one line per phase, the groups' sums,
        and the total from the process's start."""
        groups = self.as_dict()
        total = self.total_s()
        if total is None:
            total = sum(sum(p.values()) for p in groups.values())
        lines = [title] if title else []
        lines.append(f"  {'group':<8} {'phase':<16} {'seconds':>8} {'share':>6}")
        for group, phases in groups.items():
            for i, (name, s) in enumerate(phases.items()):
                share = f"{100.0 * s / total:5.1f}%" if total > 0 else ""
                lines.append(f"  {group if i == 0 else '':<8} {name:<16} {s:8.3f} {share:>6}")
            lines.append(f"  {'':<8} {'(' + group + ')':<16} {sum(phases.values()):8.3f}")
        lines.append(f"  {'total':<8} {'':<16} {total:8.3f}")
        return "\n".join(lines)

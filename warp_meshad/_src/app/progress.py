"""What a run shows on stderr while it works: the progress bar (tqdm) and the ``warp-meshad: ...`` messages.

On a terminal the bar redraws in place; when stderr is not a terminal (a log file, CI) a plain line in the same format
is written every ``interval_s`` seconds and at the end; ``quiet`` shows nothing.
"""

from __future__ import annotations

import math
import sys
import time

from tqdm import tqdm

__all__ = ["Progress", "stderr_log"]


class Progress:
    """A one-line progress bar of a run's steps (or a batch's meshes) on stderr.

    Args:
        total: number of steps (at least 1 is shown).
        quiet: show nothing.
        stream: where to write (default ``sys.stderr``).
        interval_s: seconds between the plain lines written when ``stream`` is not a terminal.
        unit: what is counted (``"step"``, ``"mesh"``).
    """

    def __init__(self, total: int, quiet: bool = False, stream=None, interval_s: float = 5.0, unit: str = "step"):
        self.total = max(int(total), 1)
        self.quiet = quiet
        self.stream = stream if stream is not None else sys.stderr
        self.interval_s = interval_s
        self.unit = unit
        self.start = time.perf_counter()
        self._last = -math.inf
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._bar = None
        if self.tty and not quiet:
            self._bar = tqdm(total=self.total, file=self.stream, unit=unit, dynamic_ncols=True, leave=True)

    def update(self, done: int, text: str = "") -> None:
        """Show ``done`` steps of ``total`` with ``text`` (e.g. the energy) after the bar."""
        if self.quiet:
            return
        final = done >= self.total
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)
            self._bar.update(min(done, self.total) - self._bar.n)
            if final:
                self._bar.close()
            return
        now = time.perf_counter()
        if done == 0 or (not final and now - self._last < self.interval_s):
            return
        self._last = now
        line = tqdm.format_meter(min(done, self.total), self.total, now - self.start, ncols=100, ascii=True,
                                 unit=self.unit, postfix=text or None)
        self.stream.write(line + "\n")
        self.stream.flush()


def stderr_log(quiet: bool):
    """``log(text)`` printing ``warp-meshad: text`` to stderr (unless quiet); on a terminal it first clears the line,
    where the progress bar may stand."""
    def log(text):
        if quiet:
            return
        clear = "\r\x1b[K" if getattr(sys.stderr, "isatty", lambda: False)() else ""
        print(f"{clear}warp-meshad: {text}", file=sys.stderr, flush=True)

    return log

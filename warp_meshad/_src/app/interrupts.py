"""Ending a run or a batch on SIGINT or SIGTERM: :class:`Interrupted`, :func:`handling_signals` (installed by the
command line) and :func:`signals_deferred` (the few steps that must not be cut in two).

While :func:`handling_signals` is active, SIGINT (Ctrl-C) and SIGTERM raise :class:`Interrupted` in the main thread,
wherever it is; the runner and the batch add to it what was finished, what was not and how to resume, and the command
line prints that one line and exits with ``128 + signal`` (130, 143). Without it (warp_meshad used as a library) Ctrl-C
raises ``KeyboardInterrupt`` as usual, which the runner turns into :class:`Interrupted` (a subclass) with the same
description. A run's outputs are written under temporary names and renamed into place only at its end, after which no
output is written: an interrupt before that leaves the output folder as it was.
"""

from __future__ import annotations

import contextlib
import signal
import threading

__all__ = ["Interrupted", "handling_signals", "interrupted", "signals_deferred"]

SIGNALS = (signal.SIGINT, signal.SIGTERM)

_state = {"signal": None, "deferred": 0, "pending": None}


class Interrupted(KeyboardInterrupt):
    """A run or a batch ended by a signal.

    Attributes:
        signum: the signal (``signal.SIGINT`` for Ctrl-C or a plain ``KeyboardInterrupt``, ``signal.SIGTERM``).
        what: one line: what was finished, what was not and how to resume ("" until the runner or the batch adds
            it).
    """

    def __init__(self, signum: int = signal.SIGINT, what: str = ""):
        self.signum = int(signum)
        self.what = what
        super().__init__(self.message)

    @property
    def signal_name(self) -> str:
        """``"SIGINT"``, ``"SIGTERM"``."""
        try:
            return signal.Signals(self.signum).name
        except ValueError:
            return f"signal {self.signum}"

    @property
    def exit_status(self) -> int:
        """The shell's status for death by this signal: 128 + signal number (130 for SIGINT, 143 for SIGTERM)."""
        return 128 + self.signum

    @property
    def message(self) -> str:
        """``interrupted by SIGINT: <what>``."""
        return f"interrupted by {self.signal_name}" + (f": {self.what}" if self.what else "")

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):
        return type(self), (self.signum, self.what)

    @classmethod
    def of(cls, exc: BaseException) -> Interrupted:
        """``exc`` itself if it is an :class:`Interrupted`, else one for SIGINT (a plain ``KeyboardInterrupt``)."""
        return exc if isinstance(exc, cls) else cls(signal.SIGINT)


def _handler(signum, frame):
    _state["signal"] = signum
    if _state["deferred"]:
        _state["pending"] = signum
        return
    raise Interrupted(signum)


@contextlib.contextmanager
def handling_signals():
    """Inside: SIGINT and SIGTERM raise :class:`Interrupted` (in the main thread; elsewhere nothing changes). The
    previous handlers are restored on exit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _handler) for s in SIGNALS}
    _state.update(signal=None, deferred=0, pending=None)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        _state.update(signal=None, deferred=0, pending=None)


def interrupted() -> int | None:
    """The signal received while :func:`handling_signals` is active, or None."""
    return _state["signal"]


@contextlib.contextmanager
def signals_deferred():
    """A signal that arrives inside takes effect at the end of the block (as :class:`Interrupted`), so that the block
    runs whole: renaming a run's outputs into place and writing its manifest. Only where :func:`handling_signals` is
    active (a plain ``KeyboardInterrupt`` cannot be deferred)."""
    _state["deferred"] += 1
    try:
        yield
    finally:
        _state["deferred"] -= 1
        pending = _state["pending"]
        if not _state["deferred"] and pending is not None:
            _state["pending"] = None
            raise Interrupted(pending)

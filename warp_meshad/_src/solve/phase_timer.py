"""Phase timers that do not wait for the device.

On a CUDA device, :meth:`PhaseTimer.lap` records a timing event (``wp.Event(enable_timing=True)``) on the device's
current stream and books the interval since the previous event to a phase; :meth:`PhaseTimer.totals_ms` waits once,
for the last event, and sums the GPU time of every interval (``wp.get_event_elapsed_time``). On the CPU, where
launches run when they are made, the host clock (``time.perf_counter``) is read instead. Events are kept and reused
by the next timing with the same timer.
"""

from __future__ import annotations

import time

import warp as wp

__all__ = ["PhaseTimer"]


class PhaseTimer:
    """Milliseconds per named phase of queued device work.

    Args:
        device: the Warp device whose stream is timed.
    """

    def __init__(self, device):
        self.device = wp.get_device(device)
        self._events: list = []
        self.reset()

    def reset(self) -> None:
        """Forget the laps (keeps the events for reuse) and start the clock now."""
        self._laps: list[str] = []
        self._used = 0
        self._marks: list = [self._mark()]

    def _mark(self):
        if not self.device.is_cuda:
            return time.perf_counter()
        if self._used == len(self._events):
            self._events.append(wp.Event(self.device, enable_timing=True))
        event = self._events[self._used]
        self._used += 1
        wp.get_stream(self.device).record_event(event)
        return event

    def lap(self, phase: str) -> None:
        """Book the device work queued since the previous lap (or reset) to ``phase``."""
        self._laps.append(phase)
        self._marks.append(self._mark())

    def totals_ms(self) -> dict[str, float]:
        """Milliseconds per phase, summed over its laps (on CUDA: waits for the last recorded event)."""
        totals: dict[str, float] = {}
        if self.device.is_cuda and self._laps:
            wp.synchronize_event(self._marks[-1])
        for phase, start, end in zip(self._laps, self._marks[:-1], self._marks[1:]):
            if self.device.is_cuda:
                ms = wp.get_event_elapsed_time(start, end, synchronize=False)
            else:
                ms = (end - start) * 1000.0
            totals[phase] = totals.get(phase, 0.0) + ms
        return totals

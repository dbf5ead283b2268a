"""The step records of a run in bounded memory: :class:`StepHistory` (an app's ``history``).

A run of many steps (``steps: 1000000000``) must not grow without bound: the history keeps the first step's record
and the latest ``capacity`` records, and running totals over every step (iterations, fallbacks, milliseconds per
phase, ...). A run of at most ``capacity + 1`` steps keeps every record, so what it reports is unchanged.
"""

from __future__ import annotations

import numbers

__all__ = ["DEFAULT_CAPACITY", "StepHistory"]

DEFAULT_CAPACITY = 1000  # about 1.4 KB a record for a step of a few iterations: ~1.4 MB at most


def _is_number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


class StepHistory(list):
    """An app's step records, oldest first: the first record and the latest ``capacity``, plus totals over all.

    It is a ``list`` of the kept records (indexing, ``len``, iteration and ``json.dumps`` see those), with
    :meth:`append` as its way to grow: once ``capacity + 1`` records are kept, each new one pushes out the oldest but
    the first. ``history[0]`` is then still the run's first step and ``history[-1]`` its last.

    Args:
        records: records to start with (appended in order, as a run would).
        capacity: how many of the latest records are kept besides the first (>= 1).
        check: ``check(record) -> str | None``, run on each record as it is pushed out; the first message it
            returns is kept as :attr:`dropped_problem`, so that a check over the whole run still sees the steps
            no longer kept (a module-level function: the history stays picklable).

    Attributes:
        capacity: as given.
        count: records appended over the run (the steps recorded).
        dropped_problem: the first problem ``check`` found in a record that was pushed out, or None.
    """

    def __init__(self, records=(), capacity: int = DEFAULT_CAPACITY, check=None):
        super().__init__()
        if not (isinstance(capacity, int) and capacity >= 1):
            raise ValueError(f"StepHistory(capacity=...): expected an int >= 1, got {capacity!r}")
        self.capacity = capacity
        self.count = 0
        self.dropped_problem = None
        self._check = check
        self._totals: dict = {}
        for r in records:
            self.append(r)

    def append(self, record: dict) -> None:
        """Add the record of the latest step (a dict); the oldest record but the first leaves once the history is
        full, after ``check`` has seen it."""
        if len(self) > self.capacity:
            gone = super().pop(1)
            if self._check is not None and self.dropped_problem is None:
                self.dropped_problem = self._check(gone)
        super().append(record)
        self.count += 1
        for key, value in record.items():
            if _is_number(value):
                self._totals[key] = self._totals.get(key, 0) + value
            elif isinstance(value, dict) and value and all(_is_number(v) for v in value.values()):
                sums = self._totals.setdefault(key, {})
                if isinstance(sums, dict):
                    for k, v in value.items():
                        sums[k] = sums.get(k, 0) + v

    def extend(self, records) -> None:
        for r in records:
            self.append(r)

    @property
    def dropped(self) -> int:
        """Records pushed out (steps between the first and the kept ones)."""
        return self.count - len(self)

    def total(self, key: str, default=0):
        """The sum of field ``key`` over every step recorded (kept or not): a number for a numeric field
        (``"iterations"``), a dict of sums for a dict of numbers (``"time_ms"``); ``default`` when no record had it.
        Booleans are not summed."""
        value = self._totals.get(key)
        if value is None:
            return default
        return dict(value) if isinstance(value, dict) else value

    def __reduce__(self):  # pickled as its records and counters (a list subclass pickles its items otherwise only)
        return (_rebuild, (list(self), self.capacity, self.count, self.dropped_problem, self._check,
                           self._totals))


def _rebuild(records, capacity, count, dropped_problem, check, totals) -> StepHistory:
    h = StepHistory(capacity=capacity, check=check)
    list.extend(h, records)
    h.count, h.dropped_problem, h._totals = count, dropped_problem, totals
    return h

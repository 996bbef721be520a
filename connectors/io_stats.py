"""Per-process I/O counters: what the readers and writers of this process did.

Read tasks run on workers; they add to these counters as they go (files opened, bytes, row
groups read and row groups skipped by statistics, retries, throttling). The engine may take a
``snapshot(reset=True)`` after each task and ship it to the driver for ``stats()``; tests read
them directly to prove that a filter skipped row groups or that a fault was retried.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass
class IOCounters:
    """Counts since the last reset. Plain data; add with ``record``."""

    files_read: int = 0
    bytes_read: int = 0
    row_groups_read: int = 0
    row_groups_skipped: int = 0
    files_skipped: int = 0
    files_written: int = 0
    rows_written: int = 0
    retries: int = 0
    throttled: int = 0


_LOCK = threading.Lock()
_COUNTERS = IOCounters()


def record(**deltas: int) -> None:
    """Add ``deltas`` (field name -> amount) to this process's counters."""
    with _LOCK:
        for name, amount in deltas.items():
            setattr(_COUNTERS, name, getattr(_COUNTERS, name) + amount)


def snapshot(*, reset: bool = False) -> dict[str, int]:
    """The counters as a dict; with ``reset=True`` they start again from zero."""
    global _COUNTERS
    with _LOCK:
        values = dict(vars(_COUNTERS))  # (dataclasses.asdict deep-copies: 10x slower, twice a task)
        if reset:
            _COUNTERS = IOCounters()
    return values

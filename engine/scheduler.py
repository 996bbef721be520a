"""Which runnable operator gets the next free worker: a pure function of plain data.

Downstream operators go first (they free memory by consuming what is already produced);
among equals, the one holding the fewest bytes. This is what keeps a pipeline streaming
instead of reading everything before the first map runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    """An operator that has a task ready and passes backpressure."""

    key: str
    depth: int
    """Distance from the source; larger is further downstream."""
    held_bytes: int
    in_flight: int


def pick(candidates: Sequence[Candidate]) -> int | None:
    """Index of the candidate to dispatch next, or None when there is none."""
    if not candidates:
        return None
    best = min(range(len(candidates)), key=lambda i: (-candidates[i].depth, candidates[i].in_flight, candidates[i].held_bytes))
    return best

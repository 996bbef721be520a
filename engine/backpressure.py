"""Backpressure as a pure function: may this operator start one more task, and if not, why.

Every operator has a byte budget for its output: blocks it produced that nobody has freed yet
(``held_bytes``) plus what its running tasks are expected to produce. A slow consumer leaves
blocks held, the budget fills, and the reads stop. One task may always run when the operator
holds nothing, so progress never depends on a guess being right.
"""

from __future__ import annotations

from dataclasses import dataclass

WAIT_CONCURRENCY = "concurrency cap"
WAIT_BUDGET = "output budget full (downstream is slower)"
WAIT_WORKER = "no free worker"
WAIT_ACTORS = "actor pool starting"
WAIT_RESOURCES = "its CPUs or custom resources are in use by other tasks"
WAIT_ACTORS_BUSY = "every actor busy (the pool is at its maximum size)"


@dataclass(frozen=True)
class OpLoad:
    """What backpressure needs to know about one operator, as plain data."""

    held_bytes: int
    in_flight: int
    expected_output_bytes: float
    budget: int
    max_concurrency: int | None = None


def blocked_reason(load: OpLoad) -> str | None:
    """None when one more task may start, else the reason it may not."""
    if load.max_concurrency is not None and load.in_flight >= load.max_concurrency:
        return WAIT_CONCURRENCY
    if load.in_flight == 0 and load.held_bytes == 0:
        return None
    if load.held_bytes + (load.in_flight + 1) * load.expected_output_bytes > load.budget:
        return WAIT_BUDGET
    return None

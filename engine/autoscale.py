"""Actor pool sizing as pure functions: how many actors a pool should have, which idle ones go.

The executor feeds them plain numbers (pool size, actors starting and busy, whether work waits,
idle times, the time now) and carries out the answer, so the policy is tested without processes.

* A new pool starts at the size its resources allow (all its GPUs, or one actor per CPU), within
  ``[min_size, max_size]``: starting one actor at a time would make a model-loading pool ramp up
  for minutes.
* A running pool grows by one when work waits, every actor is busy and none is starting.
* An actor idle longer than the idle timeout retires while the pool is above its minimum.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PoolState:
    """One actor pool, as plain data."""

    min_size: int
    max_size: int
    live: int
    """Actors started or starting (not dead, not retiring)."""
    starting: int
    busy: int
    work_waiting: bool
    """The operator has a task ready that no actor can take."""
    affordable: int
    """Actors its resources allow at once (GPUs free for its ``num_gpus``, or CPUs)."""


def target_size(pool: PoolState, new: bool) -> int:
    """How many actors ``pool`` should have now (``new``: it has none yet)."""
    if new:
        return max(pool.min_size, min(pool.max_size, pool.affordable))
    if pool.work_waiting and pool.starting == 0 and pool.busy == pool.live:
        return max(pool.min_size, min(pool.max_size, pool.live + 1))
    return pool.min_size


def to_retire(idle_since: Sequence[float | None], min_size: int, idle_timeout_s: float, now: float) -> list[int]:
    """Indexes of actors to retire: idle (``idle_since`` not None) longer than ``idle_timeout_s``,
    oldest first, while the pool stays at ``min_size`` or more."""
    idle = sorted(
        (since, i) for i, since in enumerate(idle_since) if since is not None and now - since > idle_timeout_s
    )
    room = max(0, len(idle_since) - min_size)
    return [i for _, i in idle[:room]]

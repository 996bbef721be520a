"""Backpressure as pure functions: how many bytes an operator may hold, and may it start a task.

Every operator that runs tasks has a byte budget for the blocks it produced and nobody has freed
yet (``held_bytes``: queued at its downstream, parked for ordering, in the consumer's hands) plus
what its running tasks are expected to produce. A slow consumer leaves blocks held, the budget
fills, and the reads stop.

Budgets are not fixed byte counts. ``op_budget`` derives one from the object store's capacity
and the CPU count: enough for two waves of the operator's parallel tasks at the block size it
actually produces (one wave and a block for the operator feeding the consumer), so the pool
stays busy at any block size, 1 MiB or 256 MiB; never less than a floor, never more than its
share of half the store (the other half is headroom shared by all, as Ray Data's resource
manager reserves half the store per operator and shares the rest). The size is learned from
finished tasks, and the operator whose downstream is backlogged (input queued, every slot busy)
gets the floor only: more parallel tasks upstream would only hold more memory.

Two rules keep every plan moving whatever the shapes:

* one task may always run when the operator holds nothing, so progress never depends on a guess;
* an operator whose downstream is starved (it needs more rows than have arrived before it can
  run at all: a batch size, a rows-per-file minimum) is admitted whatever its budget says.
  Those rows are needed anyway; past the store's capacity they spill to disk.
"""

from __future__ import annotations

from dataclasses import dataclass

WAIT_CONCURRENCY = "concurrency cap"
WAIT_BUDGET = "output budget full (downstream or the consumer is slower)"
WAIT_WORKER = "no free worker"
WAIT_ACTORS = "actor pool starting"
WAIT_RESOURCES = "its CPUs or custom resources are in use by other tasks"
WAIT_ACTORS_BUSY = "every actor busy (the pool is at its maximum size)"
WAIT_MEMORY = "workers' memory is high (one task at a time until it falls)"

STORE_SHARE = 0.5
"""The part of the object store split between operators' budgets; the rest is shared headroom."""
WAVES = 2
"""Budgets hold this many waves of an operator's parallel tasks' output."""


@dataclass(frozen=True)
class OpLoad:
    """What backpressure needs to know about one operator, as plain data."""

    held_bytes: int
    in_flight: int
    expected_output_bytes: float
    budget: int
    max_concurrency: int | None = None
    downstream_starved: bool = False
    """Its downstream holds input it cannot run yet and waits for more rows."""
    backlogged: bool = False
    """What it feeds is behind (its downstream has input queued and every slot busy, or the
    consumer has a block unread besides the one it is reading): one task at a time is enough."""
    consumer_blocks: int = 0
    """For the operator feeding the consumer: blocks made and not yet taken by the consumer."""
    max_consumer_blocks: int = 0
    """No more tasks while ``consumer_blocks`` is at this (0: no cap)."""


def op_budget(
    store_capacity: int,
    task_operators: int,
    slots: int,
    expected_output_bytes: float,
    floor: int,
    feeds_consumer: bool = False,
    first_wave: bool = False,
    pool_starting: bool = False,
) -> int:
    """Bytes one operator may hold: ``WAVES`` waves of ``slots`` tasks of its expected output, at
    least ``floor`` (capped by the share), at most its share of the store.

    While the actor pool it feeds is starting (none of its actor processes is up yet: the first
    ones of a session wait for the zygote to import the frameworks the driver imported, torch
    0.7 s here), its whole share: every row read then is one the pool will need, and the CPUs
    would otherwise wait for the pool. Once an actor is up, the usual budget holds again and the
    operator waits until its held bytes fall under it.

    The operator feeding the consumer gets one wave plus one block: every slot busy while the
    consumer reads the block it holds, but no more (what the consumer has not read counts, and a
    slow consumer should not hold two waves of blocks). Before any of its tasks has finished
    (``first_wave``, ``expected_output_bytes`` then a whole-block guess): one wave of ``slots``
    guesses, so every slot gets a task where the share holds them, and no more until the
    guess has been replaced by what tasks made."""
    share = int(store_capacity * STORE_SHARE / max(1, task_operators))
    if pool_starting:
        return share
    if first_wave:
        tasks = max(1, slots)
    else:
        tasks = max(1, slots) + 1 if feeds_consumer else WAVES * max(1, slots)
    want = int(tasks * expected_output_bytes)
    return max(min(floor, share), min(want, share))


MIN_TASK_OUTPUT = 1 << 20
"""A task's output cap never goes below this (a smaller store than that makes tasks tiny)."""


def task_output_cap(store_capacity: int, task_operators: int, slots: int, block_target: int) -> int:
    """Bytes one task of an operator should leave in the store at most: ``block_target`` (the
    execution's ``target_max_block_size``), or less where a store this small would not hold
    ``WAVES`` waves of the operator's ``slots`` tasks in its share. Bundles stop growing and big
    input blocks are cut at this size, so a task never outgrows what its budget admits."""
    share = store_capacity * STORE_SHARE / max(1, task_operators)
    fits = int(share / (WAVES * max(1, slots)))
    return max(1, min(block_target, max(MIN_TASK_OUTPUT, fits)))


def consumer_block_cap(slots: int) -> int:
    """Blocks that may wait for the consumer before the operator feeding it stops: a byte budget
    alone lets a job whose blocks are tiny (a UDF that sums each batch to one row) run to its end
    on a worker while nobody reads it. Two waves of the operator's tasks, at least 32."""
    return max(32, 2 * slots)


def blocked_reason(load: OpLoad) -> str | None:
    """None when one more task may start, else the reason it may not."""
    if load.max_concurrency is not None and load.in_flight >= load.max_concurrency:
        return WAIT_CONCURRENCY
    if load.in_flight == 0 and load.held_bytes == 0:
        return None
    if load.max_consumer_blocks and load.consumer_blocks >= load.max_consumer_blocks:
        return WAIT_BUDGET
    if load.downstream_starved:
        return None
    if load.backlogged and load.in_flight >= 1:
        return WAIT_BUDGET
    if load.held_bytes + (load.in_flight + 1) * load.expected_output_bytes > load.budget:
        return WAIT_BUDGET
    return None

"""MapOperator: bundles its inputs into tasks that run a fused BlockTransform on workers.

Inputs are block refs from an upstream operator, or read tasks from a source (a lazy iterator,
pulled at most 64 items ahead of dispatch, on its own thread in the multi-process engine, so
listing 100,000 files streams and a slow listing never stalls the executor). Small inputs are
bundled until a task has ``min_bundle_bytes`` of input. With a callable-class UDF the operator
runs on an actor pool (``ActorPoolSpec``): dedicated workers that construct the class once.
"""

from __future__ import annotations

import itertools
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from engine import serialization
from engine.object_store import BlockRef, BlockSlice
from engine.operators.base import OperatorContext, PhysicalOperator
from engine.operators.source import WAITING, BackgroundSource
from engine.options import ExecutionOptions
from engine.task import OUTPUT_BLOCKS, OUTPUT_COUNT, OUTPUT_PARTITIONS, TaskResult, TaskSpec
from engine.transform import BlockTransform
from engine.units import unit_of

EXACT_TASK_BYTES = 32 << 20
"""Input bytes per task for operators fed exact multiples of a batch size (actor pools)."""

SOFT_ORDER_BYTES = 8 << 20
SOFT_ORDER_TASKS = 64
"""Without ``preserve_order``, the outputs of an operator's first ``SOFT_ORDER_TASKS`` tasks
wait for an earlier running task of it (``MapOperator.soft_in_order``) while they total at
most ``SOFT_ORDER_BYTES``: what ``take``, ``show`` and small jobs see comes in input order;
a long stream flows as its tasks finish (waiting there cost 2,000 tiny blocks 25 %)."""

TASK_TARGET_S = 0.1
"""Bundles stop growing at about this much work, once finished tasks have shown their time per
input byte: a slow function's small blocks stay one task each, spread over the workers, where
bundling them by bytes would queue them all on one. Fast functions still bundle up to
``min_bundle_bytes`` (a task costs well under a millisecond of overhead)."""

_task_ids = itertools.count(1)
_op_ids = itertools.count(1)


@dataclass(frozen=True)
class Resources:
    """What one task (or one actor) needs."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    custom: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class ActorPoolSpec:
    """An actor pool between ``min_size`` and ``max_size`` actors."""

    min_size: int = 1
    max_size: int = 1


@dataclass
class Pending:
    """A dispatched task: what it consumed, so it can be retried or its inputs freed."""

    spec: TaskSpec
    bundle: list[Any]
    """The input items it consumed (read tasks, block refs or slices)."""
    input_bytes: int
    started_at: float = 0.0
    """``time.monotonic()`` when it was handed out (for timeouts and long-running reports)."""
    expected_bytes: int = 0
    """What it was expected to leave in the store when it was sent to a worker."""


@dataclass
class _Item:
    value: Any
    size: int


class MapOperator(PhysicalOperator):
    runs_tasks = True

    def __init__(
        self,
        name: str,
        transform: BlockTransform,
        *,
        upstream: PhysicalOperator | None = None,
        source: Iterable[Any] | None = None,
        resources: Resources | None = None,
        actor_pool: ActorPoolSpec | None = None,
        max_concurrency: int | None = None,
        task_timeout_s: float | None = None,
        min_bundle_bytes: int = 4 << 20,
        output: str = OUTPUT_BLOCKS,
        sink: Any = None,
        min_rows_per_task: int | None = None,
        exact_batch_rows: int | None = None,
        whole_units: bool = False,
        min_batch_rows: int | None = None,
    ) -> None:
        super().__init__(name, [upstream] if upstream is not None else [])
        self.key = f"op{next(_op_ids)}"
        self.transform = transform
        self.digest = f"{os.getpid()}-{self.key}"
        """Names the transform in worker caches: one operator, one transform."""
        self._transform_bytes: bytes | None = None
        self.resources = resources or Resources()
        self.actor_pool = actor_pool
        self.max_concurrency = max_concurrency
        self.task_timeout_s = task_timeout_s
        """Its own task time limit; None: the execution's ``task_timeout_s``."""
        self.min_bundle_bytes = min_bundle_bytes
        self.min_rows_per_task = min_rows_per_task
        self.exact_batch_rows = exact_batch_rows
        """Tasks get a multiple of this many rows (blocks are sliced), so a batch UDF sees
        exactly ``batch_size`` rows in every batch but the very last."""
        self.min_batch_rows = min_batch_rows
        """A task function's ``batch_size``: while more input is coming a task gets at least
        this many rows (small blocks are bundled, as Ray bundles them), so its batches are full
        but for one per task; beyond it tasks are bundled by bytes as usual."""
        self.whole_units = whole_units
        """Each task takes every block of one input unit (a resumable write's): the unit is
        complete once a block of the next one is queued or the inputs are done."""
        self._slices: dict[str, int] = {}
        self._finished_out_of_order: dict[int, list[BlockRef]] = {}
        self._next_in_order = 0
        self.output = output
        self.sink = sink
        self.output_sampler: Callable[[Any], Any] | None = None
        """Set when this operator feeds a sort: each task samples the blocks it makes."""
        self._source: Iterator[Any] | BackgroundSource | None = iter(source) if source is not None else None
        self._lazy_source = source is not None and not isinstance(source, (list, tuple))
        self.inputs_done = source is None and upstream is None
        self._queue: deque[_Item] = deque()
        self._queued_bytes = 0
        self._queued_rows = 0
        self._unknown_rows = 0
        """Queued read tasks that do not say their rows (``min_batch_rows`` cannot wait on them)."""
        self.pending: dict[int, Pending] = {}
        self._task_index = itertools.count()
        self.results: list[Any] = []
        self.rows_counted = 0
        self.retry_queue: deque[Pending] = deque()
        self._out_bytes_per_task: float | None = None
        self._out_ratio: float | None = None
        """Bytes a task leaves in the store per byte of input (a moving average of finished tasks)."""
        self._secs_per_byte: float | None = None
        """A task's wall time per byte of input (a moving average of finished tasks)."""
        self._timed_bundles = True
        """Bundles stop at ``TASK_TARGET_S`` of work; off where the execution must be
        deterministic (``preserve_order``: how blocks are bundled would depend on timing)."""
        self.max_task_output_bytes = ExecutionOptions.target_max_block_size
        """What one task should leave in the store at most: bundles shrink to fit it once the
        output-to-input ratio is known (the execution's ``target_max_block_size``)."""

    @property
    def transform_bytes(self) -> bytes:
        """The pickled transform, made when a worker first needs it (never for in-driver tasks,
        which keeps cloudpickle off a small job's path to its first row)."""
        if self._transform_bytes is None:
            self._transform_bytes = serialization.dumps(self.transform)
        return self._transform_bytes

    def start(self, ctx: OperatorContext) -> None:
        self._timed_bundles = not (ctx.preserve_order or self.ordered_output)

    # inputs ------------------------------------------------------------------------------
    def add_input(self, item: Any, index: int) -> None:
        size = _item_bytes(item)
        self._queue.append(_Item(item, size))
        self._queued_bytes += size
        self._queued_rows += _item_rows(item)
        self._unknown_rows += _rows_unknown(item)

    def pull_source_in_background(self, wake: Callable[[], None]) -> None:
        """Have a thread pull a lazy source (a listing), waking the executor as items arrive,
        instead of the executor's thread pulling it (see ``engine.operators.source``)."""
        if self._lazy_source and isinstance(self._source, Iterator):
            self._source = BackgroundSource(self._source, wake, name=f"listing-{self.key}")

    def close_source(self) -> None:
        if isinstance(self._source, BackgroundSource):
            self._source.close()
        self._source = None

    def _pull_source(self) -> None:
        """Pull from the source until a bundle is full, the source ends, or (pulled in the
        background) nothing has arrived yet."""
        while self._source is not None and (self._queued_bytes < self.min_bundle_bytes or self._rows_wanted()):
            try:
                item = self._source.poll() if isinstance(self._source, BackgroundSource) else next(self._source)
            except StopIteration:
                self._source = None
                self.inputs_done = True
                return
            if item is WAITING:
                return
            self.add_input(item, 0)

    def has_pending_work(self) -> bool:
        return bool(self._queue or self.pending or self.retry_queue or self._source is not None)

    def in_flight(self) -> int:
        return len(self.pending)

    def queued_bytes(self) -> int:
        return self._queued_bytes

    def next_input_bytes(self) -> int:
        """Bytes of input the next task takes at least: a retried task's, or the first queued item's."""
        if self.retry_queue:
            return int(self.retry_queue[0].input_bytes)
        return int(self._queue[0].size) if self._queue else 0

    def queued(self) -> int:
        """Inputs waiting for a task (blocks, or read tasks of a source) and tasks waiting for
        a retry (any thread may ask: lengths of deques)."""
        return len(self._queue) + len(self.retry_queue)

    def has_ready_task(self, upstream_busy: bool) -> bool:
        """Is there a bundle worth dispatching now?"""
        if self.cancelled:
            return False
        if self.retry_queue:
            return True
        self._pull_source()
        if not self._queue:
            return False
        if isinstance(self._source, BackgroundSource):
            upstream_busy = True  # more is being listed: bundle as if it had all been listed
        if self.inputs_done or self._head_unit_complete():
            return True
        if self.whole_units:
            return False
        if self.exact_batch_rows is not None:
            return self._queued_rows >= self._exact_task_rows()
        if self.min_rows_per_task is not None:
            return self._queued_rows >= self.min_rows_per_task
        if self._rows_wanted():
            return False
        return self._queued_bytes >= self.min_bundle_bytes or not upstream_busy

    def _rows_wanted(self) -> bool:
        """A task should wait for more rows to fill its batch (``min_batch_rows``): fewer are
        queued, and every queued input says its rows."""
        return self.min_batch_rows is not None and not self._unknown_rows and self._queued_rows < self.min_batch_rows

    def _head_unit_complete(self) -> bool:
        """The first queued unit has all its inputs here: a later unit's follow it (inputs
        arrive in order when they carry units), or it is a read task (a unit by itself)."""
        head = self._queue[0].value
        if not isinstance(head, (BlockRef, BlockSlice)):
            return unit_of(head) is not None
        return unit_of(head) is not None and unit_of(self._queue[-1].value) != unit_of(head)

    def next_task(self) -> Pending:
        """Take the next bundle (or a task to retry) as a task."""
        if self.retry_queue:
            retry = self.retry_queue.popleft()
            retry.spec.task_id = next(_task_ids)
            retry.spec.attempt += 1
            retry.started_at = time.monotonic()
            self.pending[retry.spec.task_id] = retry
            return retry
        bundle: list[Any] = []
        size = rows = 0
        unknown = False  # a read task of unknown rows is in the bundle: it may hold the batch
        limit = self._bundle_limit()
        if self.exact_batch_rows is not None:
            bundle, size = self._exact_bundle()
        while self._queue and self.exact_batch_rows is None:
            item = self._queue[0]
            if bundle and unit_of(item.value) != unit_of(bundle[0]):
                break  # one input unit per task
            if bundle and self.whole_units:
                pass  # the whole unit, whatever its size
            elif bundle and self.min_rows_per_task is None and size + item.size > limit:
                if self.min_batch_rows is None or rows >= self.min_batch_rows or unknown:
                    break
            if bundle and self.min_rows_per_task is not None and rows >= self.min_rows_per_task:
                break
            cap = self._output_cap() if not bundle and self._slices_inputs() else None
            if cap is not None and item.size > cap:
                head = self._split_head(int(_item_rows(item.value) * cap / item.size))
                if head is not None:  # a block whose rows would outgrow a task's output: a slice of it
                    bundle.append(head)
                    size += head.size_bytes
                    rows += head.num_rows
                    break
            self._queue.popleft()
            self._queued_bytes -= item.size
            item_rows = _item_rows(item.value)
            self._queued_rows -= item_rows
            if _rows_unknown(item.value):
                self._unknown_rows -= 1
                unknown = True
            bundle.append(item.value)
            size += item.size
            rows += item_rows
        spec = TaskSpec(
            task_id=next(_task_ids),
            op_key=self.key,
            transform_digest=self.digest,
            inputs=list(bundle),
            output=self.output,
            sink=self.sink,
            task_index=next(self._task_index),
            sampler=self.output_sampler,
        )
        pending = Pending(spec, bundle, size, time.monotonic())
        self.pending[spec.task_id] = pending
        return pending

    def _bundle_limit(self) -> int:
        """Input bytes one task bundles: ``min_bundle_bytes``, or less where the operator's output
        outgrows its input (a UDF that turns 8-byte ids into 1 MiB rows), so that one task does
        not leave far more than ``max_task_output_bytes`` in the store. Until a task has
        finished the ratio is unknown: one input item per task."""
        limit = max(self.min_bundle_bytes, 1)
        if self._timed_bundles and self._secs_per_byte is not None and self.output in (OUTPUT_BLOCKS, OUTPUT_COUNT):
            limit = max(1, min(limit, int(TASK_TARGET_S / max(self._secs_per_byte, 1e-12))))
        if self.output not in (OUTPUT_BLOCKS, OUTPUT_PARTITIONS):
            return limit  # counts and writes leave nothing behind
        if self._out_ratio is None:
            return 1
        cap = self._output_cap()
        return limit if cap is None else max(1, min(limit, cap))

    def _output_cap(self) -> int | None:
        """Input bytes whose output fills ``max_task_output_bytes``, once the ratio is known and
        where the output stays in the store; None otherwise."""
        if self._out_ratio is None or self._out_ratio <= 0 or self.output not in (OUTPUT_BLOCKS, OUTPUT_PARTITIONS):
            return None
        return int(self.max_task_output_bytes / self._out_ratio)

    def _exact_task_rows(self) -> int:
        assert self.exact_batch_rows is not None
        row_bytes = max(1.0, self._queued_bytes / max(1, self._queued_rows))
        # an actor's task is worth more than a few batches: per-task costs (mapping inputs,
        # one output file per task when writing) should not show next to the model's
        batches = max(1, int(max(self.min_bundle_bytes, EXACT_TASK_BYTES) / row_bytes) // self.exact_batch_rows)
        if self.inputs_done and self.actor_pool is not None:
            # everything is here: spread it over the pool instead of one big task
            share = self._queued_rows // (self.actor_pool.max_size * self.exact_batch_rows)
            batches = max(1, min(batches, share))
        return batches * self.exact_batch_rows

    def _exact_bundle(self) -> tuple[list[Any], int]:
        """Inputs totalling a multiple of ``exact_batch_rows`` rows, slicing the last block."""
        want = self._exact_task_rows()
        bundle: list[Any] = []
        size = rows = 0
        while self._queue and rows < want:
            if bundle and unit_of(self._queue[0].value) != unit_of(bundle[0]):
                break  # one input unit per task
            item = self._queue.popleft()
            value = item.value
            n = _item_rows(value)
            if rows + n > want and isinstance(value, (BlockRef, BlockSlice)):
                self._queue.appendleft(item)  # put back, then cut: the tail stays first
                head = self._split_head(want - rows)
                assert head is not None
                bundle.append(head)
                size += head.size_bytes
                rows += head.num_rows
                break
            self._queued_bytes -= item.size
            self._queued_rows -= n
            bundle.append(value)
            size += item.size
            rows += n
        return bundle, size

    def _slices_inputs(self) -> bool:
        """May a block be cut to keep a task's output small? Only where a task's rows are free
        to choose (no exact batches, row minimums or whole units), the output ratio is known, and
        the output is plain blocks (an exchange's map side numbers rows by whole input blocks)."""
        return (self._out_ratio is not None and self.output == OUTPUT_BLOCKS and self.exact_batch_rows is None
                and self.min_rows_per_task is None and self.min_batch_rows is None and not self.whole_units)

    def _split_head(self, take: int) -> BlockSlice | None:
        """Cut the first ``take`` rows (at least 1) off the first queued block: the head is
        returned for a task, the rest stays first in the queue. None when it is not a block of
        more than one row, or ``take`` covers it all."""
        item = self._queue[0]
        value = item.value
        n = _item_rows(value)
        take = max(1, take)
        if not isinstance(value, (BlockRef, BlockSlice)) or take >= n:
            return None
        ref, offset = (value, 0) if isinstance(value, BlockRef) else (value.ref, value.offset)
        head, tail = BlockSlice(ref, offset, take), BlockSlice(ref, offset + take, n - take)
        self._slices[ref.block_id] = self._slices.get(ref.block_id, 1) + 1
        self._queue[0] = _Item(tail, tail.size_bytes)
        self._queued_bytes += tail.size_bytes - item.size
        self._queued_rows -= take
        return head

    def slices_left(self, block_id: str) -> int:
        return self._slices.get(block_id, 1)

    def release_slice(self, piece: BlockSlice) -> bool:
        """A task is done with ``piece``; True when no other slice of its block remains."""
        left = self._slices.get(piece.ref.block_id, 1) - 1
        if left > 0:
            self._slices[piece.ref.block_id] = left
            return False
        self._slices.pop(piece.ref.block_id, None)
        return True

    def outputs_owner(self, pending: Pending) -> PhysicalOperator:
        """The operator whose budget a finished task's outputs count against: this one, but for
        an exchange's pushed merge (its output replaces the map outputs it merged)."""
        return self

    def keep_outputs(self, pending: Pending, refs: list[BlockRef]) -> bool:
        """True when the operator keeps a finished task's outputs itself instead of emitting
        them (an exchange's pushed merge); they are owned by it either way."""
        return False

    def in_order(self, task_index: int, refs: list[BlockRef]) -> list[BlockRef]:
        """The outputs that may be emitted now so that tasks' outputs come out in task order."""
        self._finished_out_of_order[task_index] = refs
        ready: list[BlockRef] = []
        while self._next_in_order in self._finished_out_of_order:
            ready += self._finished_out_of_order.pop(self._next_in_order)
            self._next_in_order += 1
        return ready

    def soft_in_order(self, task_index: int, refs: list[BlockRef]) -> list[BlockRef]:
        """Without ``preserve_order``: the outputs that may be emitted now, in task order while
        that costs little. A finished task's outputs wait for an earlier task of this operator
        that is still running, as long as what waits is under ``SOFT_ORDER_BYTES``; past that,
        or when the task waited for is not running (lost, queued for a retry), everything
        waiting leaves in task order, and a task whose turn has passed leaves as it finishes.
        Small jobs then give rows in input order (as Ray's usually do) without a straggler
        holding big blocks back; past the first ``SOFT_ORDER_TASKS`` tasks, outputs go on as
        their tasks finish."""
        if task_index < self._next_in_order:
            return refs
        if task_index >= SOFT_ORDER_TASKS:  # past the head of the output: as tasks finish
            return self._give_up_waiting() + refs if self._finished_out_of_order else refs
        ready = self.in_order(task_index, refs)
        if self._finished_out_of_order and not self._worth_waiting():
            ready += self._give_up_waiting()
        return ready

    def flush_soft_order(self) -> list[BlockRef]:
        """Outputs that waited for a task that is no longer running (it was lost)."""
        if self._finished_out_of_order and not self._worth_waiting():
            return self._give_up_waiting()
        return []

    def flush_order(self) -> list[BlockRef]:
        """Every output waiting for its turn, in task order (none: [])."""
        return self._give_up_waiting()

    def _worth_waiting(self) -> bool:
        waiting = sum(ref.size_bytes for refs in self._finished_out_of_order.values() for ref in refs)
        if waiting > SOFT_ORDER_BYTES:
            return False
        return any(p.spec.task_index == self._next_in_order for p in self.pending.values())

    def _give_up_waiting(self) -> list[BlockRef]:
        ready: list[BlockRef] = []
        for index in sorted(self._finished_out_of_order):
            ready += self._finished_out_of_order.pop(index)
            self._next_in_order = index + 1
        return ready

    def held_out_of_order(self) -> list[BlockRef]:
        refs = [r for refs in self._finished_out_of_order.values() for r in refs]
        self._finished_out_of_order.clear()
        return refs

    def needs_more_input(self) -> bool:
        """Waiting for rows: it has input queued, nothing running, and cannot form a task until
        more arrives (a batch size or a rows-per-file minimum not reached yet)."""
        if self.cancelled or self.inputs_done or self.pending or self.retry_queue or not self._queue:
            return False
        if self._head_unit_complete():
            return False
        if self.whole_units:
            return True
        if self.exact_batch_rows is not None:
            return self._queued_rows < self._exact_task_rows()
        if self.min_rows_per_task is not None:
            return self._queued_rows < self.min_rows_per_task
        if self.min_batch_rows is not None:
            return self._rows_wanted()
        return False

    def expected_output_bytes(self, prior: float) -> float:
        """Bytes of blocks a new task is expected to leave in the store.

        Learned from finished tasks (a moving average); before the first one comes back, the
        larger of its input size and ``prior`` (a conservative guess the caller picks: a whole
        block), so a first wave of tasks cannot overshoot a budget by the CPU count. Counting and
        writing tasks leave no blocks behind: 0.
        """
        if self.output not in (OUTPUT_BLOCKS, OUTPUT_PARTITIONS):
            return 0.0
        sized_by_bytes = (self.exact_batch_rows is None and self.min_rows_per_task is None
                          and self.min_batch_rows is None and not self.whole_units)
        if self._out_ratio is not None and sized_by_bytes and (self._queue or self.retry_queue):
            # bundles grow once the ratio is known: the next one's input, not the last tasks' average
            head = self.next_input_bytes()
            return self._out_ratio * max(head, min(self._queued_bytes, self._bundle_limit()))
        if self._out_bytes_per_task is not None:
            return self._out_bytes_per_task
        return float(max(min(self._queued_bytes, self.min_bundle_bytes), prior))

    def expected_bytes_of(self, pending: Pending) -> float:
        """Bytes a running task is expected to leave in the store: its input times the learned
        output-to-input ratio, else the learned output per task, else its input size."""
        if self.output not in (OUTPUT_BLOCKS, OUTPUT_PARTITIONS):
            return 0.0
        if self._out_ratio is not None and pending.input_bytes > 0:
            return self._out_ratio * pending.input_bytes
        if self._out_bytes_per_task is not None:
            return self._out_bytes_per_task
        return float(pending.input_bytes)

    def learned_output_bytes(self) -> float | None:
        """Bytes a task left in the store, on average, once one has finished (else None)."""
        if self.output not in (OUTPUT_BLOCKS, OUTPUT_PARTITIONS):
            return 0.0
        return self._out_bytes_per_task

    def slots(self, cpus: int) -> int:
        """How many of its tasks can run at once on ``cpus`` CPUs (its pool, its cap, its CPUs each)."""
        n = cpus if self.resources.num_cpus <= 0 else max(1, int(cpus / self.resources.num_cpus))
        if self.actor_pool is not None:
            n = self.actor_pool.max_size
        if self.max_concurrency is not None:
            n = min(n, self.max_concurrency)
        return max(1, n)

    def task_finished(self, task_id: int, result: TaskResult) -> Pending:
        pending = self.pending.pop(task_id)
        self.stats.tasks += 1
        self.stats.task_wall_s += result.wall_s
        self.stats.task_cpu_s += result.cpu_s
        for name, amount in result.io.items():
            self.stats.io[name] = self.stats.io.get(name, 0) + amount
        for name, rows in result.rows_skipped.items():
            self.stats.rows_skipped += rows
            self.stats.errors[name] = self.stats.errors.get(name, 0) + rows
        out = float(result.size_bytes)
        self._out_bytes_per_task = out if self._out_bytes_per_task is None else 0.8 * self._out_bytes_per_task + 0.2 * out
        if pending.input_bytes > 0 and result.error is None:
            ratio = out / pending.input_bytes
            self._out_ratio = ratio if self._out_ratio is None else 0.8 * self._out_ratio + 0.2 * ratio
            pace = result.wall_s / pending.input_bytes
            self._secs_per_byte = pace if self._secs_per_byte is None else 0.8 * self._secs_per_byte + 0.2 * pace
        return pending

    def requeue(self, task_id: int) -> None:
        """A task that never started (queued behind one on a worker that died): run it again,
        as the same attempt."""
        pending = self.pending.pop(task_id)
        pending.spec.attempt -= 1  # next_task counts a retry as a new attempt
        self.retry_queue.append(pending)

    def task_lost(self, task_id: int) -> Pending:
        """The task's worker died: queue it again (same inputs) and return it."""
        pending = self.pending.pop(task_id)
        self.stats.tasks_retried += 1
        self.retry_queue.append(pending)
        return pending

    def cancel(self) -> list[Any]:
        self.cancelled = True
        items: list[Any] = [i.value for i in self._queue]
        items.extend(self.held_out_of_order())
        for retry in self.retry_queue:
            items.extend(retry.bundle)
        self._queue.clear()
        self.retry_queue.clear()
        self._queued_bytes = 0
        self.close_source()
        return items


def _item_bytes(item: Any) -> int:
    if isinstance(item, (BlockRef, BlockSlice)):
        return item.size_bytes
    metadata = getattr(item, "metadata", None)
    size = getattr(metadata, "size_bytes", None)
    return int(size) if size else 1 << 20


def _rows_unknown(item: Any) -> bool:
    """A read task whose metadata does not say its rows (a block always does)."""
    return not isinstance(item, (BlockRef, BlockSlice)) and getattr(getattr(item, "metadata", None), "num_rows", None) is None


def _item_rows(item: Any) -> int:
    if isinstance(item, (BlockRef, BlockSlice)):
        return item.num_rows
    metadata = getattr(item, "metadata", None)
    rows = getattr(metadata, "num_rows", None)
    return int(rows) if rows else 0



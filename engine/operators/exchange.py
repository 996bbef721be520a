"""The operators of an all-to-all step: ``PartitionOperator`` (map side) and ``ReduceOperator``.

Both are map operators to the executor: they run tasks, with the same budgets, retries,
ownership and stats as any map. What differs is when a task is ready and what it gets:

* a ``PartitionOperator`` runs a task per bundle of input as it arrives (hash and random
  partitioning stream), or, for a range partitioning (sort), samples keys from every block as
  it arrives and runs its tasks once the last block is in and the boundaries are known;
* a ``ReduceOperator`` is the barrier: it holds the map outputs until every input is done, then
  plans its tasks from the partition counts (contiguous ranges of partitions, sized from the
  bytes that actually arrived) or from row counts (``zip``, ``repartition`` without shuffle),
  and emits their outputs in order. While the map tasks run it merges their outputs, 32 at a
  time once 64 wait (``MERGE_FAN_IN``), so a reduce task reads few slices however many map
  tasks there were.

A sort straight over a source that can read its key columns alone runs its map side in the
read (``SampledReadPartitionOperator``): a key-only read fits the ranges, then the tasks that
read the rows partition them, so no row waits in the store (or the spill folder) for the ranges.

An input of at most ``small_exchange_bytes`` in all skips the map tasks: the
``PartitionOperator`` holds it, then hands the blocks over unpartitioned (``direct``), and one
reduce task partitions and reduces them at once, with the same result.

While it waits for all its input it says so (``needs_more_input``), which admits what feeds it
whatever its budget: those rows are needed before anything can come out, and past the store's
capacity they are written to the spill directory, which is what makes every exchange work out
of core. Inputs arrive in order (what feeds an exchange emits in order), so the map index, the
global row offset and the result are the same on every run and with any number of workers.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from engine.exchange import PartitionTransform, ReduceTransform, partition_counts
from engine.object_store import BlockRef, BlockSlice
from engine.operators.base import OperatorContext, PhysicalOperator
from engine.operators.map import MapOperator, Pending, Resources, _task_ids
from engine.task import OUTPUT_BLOCKS, OUTPUT_PARTITIONS, TaskSpec
from engine.transform import BlockTransform

BY_PARTITIONS = "partitions"
BY_ROWS = "rows"
BLOCK_ORDER = "blocks"

MIN_REDUCE_BYTES = 1 << 20
"""The smallest size a reduce task is planned for: smaller ranges of partitions are joined."""

MERGE_FAN_IN = 32
"""Map outputs one pushed merge takes. While map tasks still run, once twice this many of
their outputs wait unmerged, the oldest ``MERGE_FAN_IN`` are merged by a task into one
partitioned block (an aggregation's partial states merged per group on the way), so a reduce
task reads about 1/32 as many slices: 10,000 map tasks leave ~320 blocks, not 10,000. A job
of fewer than 64 map tasks merges nothing."""


class _Merging:
    """Where a pushed merge's output will go in the arrival order while its task runs."""

    __slots__ = ("merge_id",)

    def __init__(self, merge_id: int) -> None:
        self.merge_id = merge_id



class PartitionOperator(MapOperator):
    def __init__(
        self,
        name: str,
        transform: PartitionTransform,
        upstream: PhysicalOperator,
        *,
        sampler: Callable[[pa.Table], Any] | None = None,
        resources: Resources | None = None,
        min_bundle_bytes: int = 4 << 20,
        small_bytes: int = 0,
    ) -> None:
        super().__init__(name, transform, upstream=upstream, resources=resources,
                         min_bundle_bytes=min_bundle_bytes, output=OUTPUT_PARTITIONS)
        self.small_bytes = small_bytes
        """Hold the input while it totals at most this many bytes; if it ends there, hand the
        blocks to the reducer unpartitioned (``direct``) instead of running map tasks. 0: never.

        Partitioning a few MiB over the workers costs more in task round trips than it saves (a
        200k-row shuffle: 3 map and 5 reduce tasks, 55 ms, against 37 ms with one task). The
        result is the same: the one task partitions the rows as the map side would (a shuffle's
        keys come from global row positions), then reduces them all at once."""
        self.direct = False
        self.ordered_output = True
        self.sampler = sampler
        """Range partitioning: keys sampled from each input block in the driver; the tasks
        wait until all are in and the partitioner is fitted on them."""
        self._samples: list[Any] | None = []
        """None once the partitioner is fitted."""
        self._offsets: dict[str, int] = {}
        self._rows_seen = 0
        self._ctx: OperatorContext | None = None

    def start(self, ctx: OperatorContext) -> None:
        self._ctx = ctx

    def add_input(self, item: Any, index: int) -> None:
        ref: BlockRef = item
        self._offsets[ref.block_id] = self._rows_seen
        self._rows_seen += ref.num_rows
        if self.sampler is not None and self._samples is not None and ref.num_rows:
            assert self._ctx is not None
            try:
                if ref.sample is None:  # a block no task of ours made (materialized input): read it here
                    self._samples.append(self.sampler(self._ctx.read(ref)))
                elif isinstance(ref.sample, BaseException):
                    raise ref.sample
                else:
                    self._samples.append(ref.sample)
            except Exception as err:  # a sort key the data does not have
                self._ctx.fail(err)
        if self.cancelled:  # failed (now or before): nobody will run it
            assert self._ctx is not None
            self._ctx.release(ref)
            return
        super().add_input(item, index)

    def _holding(self) -> bool:
        """Still small enough that it may all go to one reduce task: dispatch nothing yet."""
        if self.small_bytes and (self._queued_bytes > self.small_bytes or self.pending or self.retry_queue):
            self.small_bytes = 0  # too big: partition as usual from now on
        return bool(self.small_bytes) and not self.inputs_done and not self.cancelled

    def upstream_finished(self, index: int) -> None:
        super().upstream_finished(index)
        if self.inputs_done and not self.direct and not self.cancelled:
            self._holding()  # (forgets small_bytes if the input outgrew it)
            if self.small_bytes:  # all of it is here and small: the reducer takes the blocks as they are
                self.direct = True
                self._samples = None
                self._offsets.clear()
                while self._queue:
                    self.emit(self._queue.popleft().value)
                self._queued_bytes = self._queued_rows = 0
        if self.inputs_done and self.sampler is not None and self._samples is not None:  # (called again on every route)
            samples, self._samples = self._samples, None
            try:
                self.transform.partitioner.fit(samples)  # type: ignore[attr-defined]
            except Exception as err:  # keys that cannot be ordered together (mixed types)
                assert self._ctx is not None
                self._ctx.fail(err)

    def has_ready_task(self, upstream_busy: bool) -> bool:
        if (self.sampler is not None and not self.inputs_done) or self._holding():
            return False
        return super().has_ready_task(upstream_busy)

    def needs_more_input(self) -> bool:
        if self._holding():
            return True
        if self.sampler is not None:
            return not self.inputs_done and not self.cancelled
        return super().needs_more_input()

    def next_task(self) -> Pending:
        pending = super().next_task()
        first = pending.bundle[0] if pending.bundle else None
        if pending.spec.params is None and isinstance(first, BlockRef):
            pending.spec.params = self._offsets.pop(first.block_id, 0)
            for item in pending.bundle[1:]:
                self._offsets.pop(getattr(item, "block_id", ""), None)
        return pending


class SampledReadPartitionOperator(MapOperator):
    """A range exchange's map side fused into the read that feeds it (a sort over a file
    source): its tasks first read the sort-key columns alone and sample them; once every sample
    is in and the ranges are fitted, its tasks read the whole rows and partition them in the
    same task. The unfused path must read all of the input, and past the store's capacity
    spill it, before the first map task can start, then read it all back: at 1.4 GB through a
    256 MiB store that is 1.4 GB written to disk and read again.

    The sampling tasks' blocks (key columns only) never leave the operator: their samples are
    kept and the blocks freed as each task ends. The partitioning tasks are numbered from 0, so
    their outputs reach the reduce in input order (a stable sort keeps ties in that order)."""

    def __init__(
        self,
        name: str,
        transform: PartitionTransform,
        sample_tasks: Iterable[Any],
        read_tasks: Iterable[Any],
        sampler: Callable[[pa.Table], Any],
        *,
        min_bundle_bytes: int,
    ) -> None:
        super().__init__(name, BlockTransform([]), source=list(sample_tasks), min_bundle_bytes=min_bundle_bytes)
        self.partition_transform = transform
        self.output_sampler = sampler
        self.ordered_output = True
        self.sampling = True
        self._read_tasks = read_tasks
        self._samples: list[Any] = []
        self._ctx: OperatorContext | None = None
        self._wake: Callable[[], None] | None = None

    def start(self, ctx: OperatorContext) -> None:
        self._ctx = ctx

    def pull_source_in_background(self, wake: Callable[[], None]) -> None:
        self._wake = wake  # for the full read's listing, once the sampling is done
        super().pull_source_in_background(wake)

    def has_pending_work(self) -> bool:
        return self.sampling or super().has_pending_work()

    def has_ready_task(self, upstream_busy: bool) -> bool:
        if self.cancelled:
            return False
        self._pull_source()
        self._partition_when_sampled()
        return super().has_ready_task(upstream_busy)

    def keep_outputs(self, pending: Pending, refs: list[BlockRef]) -> bool:
        if pending.spec.output != OUTPUT_BLOCKS:
            return False
        assert self._ctx is not None
        self.stats.sampling_tasks += 1
        for ref in refs:  # a sampling task's key columns: their samples stay, the blocks go
            if isinstance(ref.sample, BaseException):  # a sort key the data does not have
                self._ctx.fail(ref.sample)
            elif ref.sample is not None:
                self._samples.append(ref.sample)
            self._ctx.release(ref)
        self._partition_when_sampled()
        return True

    def _partition_when_sampled(self) -> None:
        """Every sampling task is done: fit the ranges, then read and partition."""
        if (not self.sampling or self.cancelled or self._source is not None or self._queue or self.pending
                or self.retry_queue):
            return
        self.sampling = False
        samples, self._samples = self._samples, []
        try:
            self.partition_transform.partitioner.fit(samples)  # type: ignore[attr-defined]
        except Exception as err:  # keys that cannot be ordered together (mixed types): the job's end
            assert self._ctx is not None
            self._ctx.fail(err)
            return
        self.transform = self.partition_transform
        self._transform_bytes = None
        self.digest += "-ranges"  # workers cached the sampling transform under the old digest
        self.output = OUTPUT_PARTITIONS
        self.output_sampler = None
        self._source = iter(self._read_tasks)
        self._lazy_source = True
        if self._wake is not None:  # listed by a thread, as any source, never by the loop
            self.pull_source_in_background(self._wake)
        self.inputs_done = False
        self._task_index = itertools.count()
        self._next_in_order = 0
        self._out_ratio = self._out_bytes_per_task = None  # key columns told nothing about whole rows


class PositionedReadPartitionOperator(MapOperator):
    """A random shuffle's or a round-robin repartition's map side fused into the read that feeds
    it, where the source counts each read task's rows up front (``counted_read_tasks``: a
    Parquet source, from the footers). Those partitioners need each row's global position; the
    unfused path learns it from the blocks as they arrive in order, after the read has put them
    all in the store. Here each task gets the position of its first row (its ``params``) from
    the counts of the read tasks before it, so the result is the unfused path's, row for row,
    and no row crosses the store on its way to the map side."""

    def __init__(self, name: str, transform: PartitionTransform, read_tasks: Iterable[Any], **kwargs: Any) -> None:
        self._offsets: dict[int, int] = {}
        """The global position of each queued read task's first row, by ``id`` of the task."""
        super().__init__(name, transform, source=self._positioned(read_tasks), output=OUTPUT_PARTITIONS, **kwargs)
        self.ordered_output = True  # map outputs reach the reduce in read order: the same result every run

    def _positioned(self, read_tasks: Iterable[Any]) -> Iterable[Any]:
        offset = 0
        for task in read_tasks:  # (each one's position is in before the queue has it)
            self._offsets[id(task)] = offset
            offset += task.metadata.num_rows
            yield task

    def next_task(self) -> Pending:
        pending = super().next_task()
        if pending.spec.params is None:  # (a retry keeps its own)
            pending.spec.params = self._offsets.pop(id(pending.bundle[0]))
            for task in pending.bundle[1:]:  # (read after the first, in order, in the same task)
                self._offsets.pop(id(task), None)
        return pending


class ReduceOperator(MapOperator):
    def __init__(
        self,
        name: str,
        transform: ReduceTransform | None,
        upstream: list[PhysicalOperator],
        *,
        grouping: str = BY_PARTITIONS,
        num_tasks: int | None = None,
        rows_per_task: int | None = None,
        seed: int | None = None,
        resources: Resources | None = None,
        merge_fan_in: int = 0,
    ) -> None:
        super().__init__(name, transform, resources=resources, min_bundle_bytes=1)  # type: ignore[arg-type]
        self.merge_fan_in = merge_fan_in
        """Pushed merges of this many map outputs (0: none; one input side only)."""
        self._merged_upto = 0
        """Arrivals before this position are merged (or being merged)."""
        self._merges: dict[int, _Merging] = {}
        """Merges running, by merge id."""
        self.upstream = list(upstream)
        self.inputs_done = False
        self.ordered_output = True
        self.grouping = grouping
        self.num_tasks = num_tasks
        """Exactly this many reduce tasks (``repartition(n)``, ``join(num_partitions=n)``)."""
        self.keep_empty_blocks = False
        """A task with no rows gets a zero-row slice of the input (its schema), so it outputs an
        empty block: ``repartition(n)`` makes ``n`` blocks whatever the row count, as Ray's."""
        self.rows_per_task = rows_per_task
        self.seed = seed
        self._arrived: list[list[BlockRef]] = [[] for _ in upstream]
        self._planned: deque[tuple[list[Any], tuple[int, tuple[int, ...]], int]] = deque()
        self._planned_tasks = itertools.count()
        """Task indexes, one per planned task in plan order (ranges without rows get no task,
        so a range's index, which reducers see, may skip numbers; the output order may not)."""
        self._is_planned = False
        self._ctx: OperatorContext | None = None

    def start(self, ctx: OperatorContext) -> None:
        self._ctx = ctx

    # collecting ------------------------------------------------------------------------------
    def add_input(self, item: Any, index: int) -> None:
        if self.cancelled:
            assert self._ctx is not None
            self._ctx.release(item)
            return
        self._arrived[index].append(item)

    def upstream_finished(self, index: int) -> None:
        super().upstream_finished(index)
        self._plan_when_ready()

    def _plan_when_ready(self) -> None:
        """Plan the reduce tasks once every input is in and no merge is still running."""
        if self.inputs_done and not self._is_planned and not self.cancelled and not self._merges:
            self._is_planned = True
            try:
                self._plan()
            except Exception as err:  # a mismatch the user made (zip of unequal datasets)
                assert self._ctx is not None
                self._ctx.fail(err)

    def needs_more_input(self) -> bool:
        return not self.inputs_done and not self.cancelled

    def queued_bytes(self) -> int:
        return sum(size for _, _, size in self._planned)

    def expected_output_bytes(self, prior: float) -> float:
        """Before a reduce task is back, the next one's planned input, not a whole block: the
        plan sized the tasks from the bytes that arrived so that one per CPU fits in the store
        (``_target_bytes``). With a whole block as the guess, a 256 MiB store ran the first
        reduce task of a join alone, the other CPU idle for its 60 ms."""
        if self._planned and self._out_ratio is None and self._out_bytes_per_task is None and not self.retry_queue:
            return float(self._planned[0][2])
        return super().expected_output_bytes(prior)

    def queued(self) -> int:
        """Planned reduce tasks not started yet, and tasks waiting for a retry."""
        return len(self._planned) + len(self.retry_queue)

    def has_pending_work(self) -> bool:
        return bool(not self._is_planned or self._planned or self.pending or self.retry_queue)

    def has_ready_task(self, upstream_busy: bool) -> bool:
        if self.cancelled:
            return False
        return bool(self.retry_queue or self._planned or self._merge_ready())

    def _merge_ready(self) -> bool:
        return bool(self.merge_fan_in and not self.inputs_done
                    and len(self._arrived[0]) - self._merged_upto >= 2 * self.merge_fan_in)

    def next_task(self) -> Pending:
        if self.retry_queue:
            return super().next_task()
        if not self._planned:
            return self._next_merge()
        bundle, params, size = self._planned.popleft()
        spec = TaskSpec(
            task_id=next(_task_ids),
            op_key=self.key,
            transform_digest=self.digest,
            inputs=list(bundle),
            output=self.output,  # (a write straight after a repartition: its tasks write)
            sink=self.sink,
            task_index=next(self._planned_tasks),
            params=params,
            # map outputs are read by their slices alone: each one's pages can go once it is read
            read_pages=self.grouping == BY_PARTITIONS,
        )
        pending = Pending(spec, bundle, size, time.monotonic())
        self.pending[spec.task_id] = pending
        return pending

    def _next_merge(self) -> Pending:
        """The oldest ``merge_fan_in`` unmerged map outputs, as one merge task (they leave the
        arrival order; its output takes their place)."""
        start = self._merged_upto
        refs: list[BlockRef] = self._arrived[0][start : start + self.merge_fan_in]
        merge_id = next(_task_ids)
        self._merges[merge_id] = placeholder = _Merging(merge_id)
        self._arrived[0][start : start + len(refs)] = [placeholder]
        self._merged_upto = start + 1
        num_partitions = max((len(r.partitions or b"") // 4 for r in refs), default=1)
        spec = TaskSpec(
            task_id=next(_task_ids),
            op_key=self.key,
            transform_digest=self.digest,
            inputs=list(refs),
            output=OUTPUT_PARTITIONS,
            task_index=-1,
            params=("merge", tuple(r.partitions or b"" for r in refs), num_partitions, merge_id),
        )
        pending = Pending(spec, list(refs), sum(r.size_bytes for r in refs), time.monotonic())
        self.pending[spec.task_id] = pending
        return pending

    @staticmethod
    def _is_merge(pending: Pending) -> bool:
        params = pending.spec.params
        return isinstance(params, tuple) and bool(params) and params[0] == "merge"

    def outputs_owner(self, pending: Pending) -> PhysicalOperator:
        # a merge's output is still the map side's: counted as the outputs it replaces were,
        # not as this operator's (which would then block the reduce tasks it feeds)
        return self.upstream[0] if self._is_merge(pending) else self

    def keep_outputs(self, pending: Pending, refs: list[BlockRef]) -> bool:
        """A merge's output goes back where its inputs were, to be reduced later."""
        if not self._is_merge(pending):
            return False
        params = pending.spec.params
        placeholder = self._merges.pop(params[3])
        side = self._arrived[0]
        at = next(i for i, item in enumerate(side) if item is placeholder)
        side[at : at + 1] = refs
        self._merged_upto += len(refs) - 1
        self.stats.tasks -= 1  # counted as merges, not as the step's tasks
        self.stats.merges += 1
        self._plan_when_ready()
        return True

    def cancel(self) -> list[Any]:
        items = super().cancel()
        for bundle, _, _ in self._planned:
            items.extend(bundle)
        for side in self._arrived:  # not planned yet
            items.extend(r for r in side if not isinstance(r, _Merging))
        self._merges.clear()
        self._planned.clear()
        self._arrived = [[] for _ in self._arrived]
        return items

    # planning --------------------------------------------------------------------------------
    def _plan(self) -> None:
        if self.grouping == BLOCK_ORDER:
            refs = self._arrived[0]
            order = np.random.default_rng(self.seed).permutation(len(refs))
            for i in order:
                self.emit(refs[i])
        elif self.grouping == BY_ROWS:
            self._plan_by_rows()
        else:
            self._plan_by_partitions()
        self._arrived = [[] for _ in self._arrived]

    def _target_bytes(self, total: int) -> int:
        assert self._ctx is not None
        cpus = max(1, self._ctx.num_cpus)
        # at least two tasks per CPU, and small enough that every CPU's reducer (which holds
        # about three times its input while it sorts or joins) fits in the store together
        return int(max(MIN_REDUCE_BYTES, min(total / (2 * cpus), self._ctx.store_capacity / (4 * cpus))))

    def _plan_direct(self) -> None:
        """One task over every input block, whole (the map side found the input small)."""
        refs = self._arrived[0]
        if not any(r.num_rows for r in refs):  # as when map tasks make no partition
            self._release_unused(refs)
            return
        self._planned.append((list(refs), (0, (len(refs),), True), sum(r.size_bytes for r in refs)))

    def _plan_by_partitions(self) -> None:
        sides = self._arrived
        if len(sides) == 1 and any(getattr(up, "direct", False) for up in self.upstream):
            self._plan_direct()
            return
        all_refs = [r for side in sides for r in side]
        if not all_refs:
            return
        offsets = {r.block_id: np.concatenate(([0], np.cumsum(partition_counts(r.partitions or b""), dtype=np.int64)))
                   for r in all_refs}
        # what a reducer is sent: the counts (4 bytes a partition) and sort samples are the
        # planner's, and would otherwise travel in every slice to every reducer
        lean = {r.block_id: dataclasses.replace(r, partitions=None, sample=None) for r in all_refs}
        num_parts = max(len(o) - 1 for o in offsets.values())
        part_bytes = np.zeros(num_parts, dtype=np.float64)
        for r in all_refs:
            if r.num_rows:
                part_bytes += np.diff(offsets[r.block_id]) * (r.size_bytes / r.num_rows)
        assert self._ctx is not None
        ranges = reduce_ranges(part_bytes, self.num_tasks, self._target_bytes(int(part_bytes.sum())), max(1, self._ctx.num_cpus))
        for index, (lo, hi) in enumerate(ranges):
            bundle: list[Any] = []
            counts = []
            size = 0
            for side in sides:
                n = 0
                for r in side:
                    o = offsets[r.block_id]
                    start, end = int(o[lo]), int(o[hi])
                    if end > start:
                        piece = BlockSlice(lean[r.block_id], start, end - start)
                        bundle.append(piece)
                        size += piece.size_bytes
                        self._slices[r.block_id] = self._slices.get(r.block_id, 0) + 1
                        n += 1
                if n == 0 and side and (len(sides) > 1 or self.keep_empty_blocks):  # no rows: its schema
                    bundle.append(BlockSlice(lean[side[0].block_id], 0, 0))
                    self._slices[side[0].block_id] = self._slices.get(side[0].block_id, 0) + 1
                    n = 1
                counts.append(n)
            if bundle or self.num_tasks is not None:
                self._planned.append((bundle, (index, tuple(counts)), size))
        self._release_unused(all_refs)

    def _plan_by_rows(self) -> None:
        sides = self._arrived
        totals = [sum(r.num_rows for r in side) for side in sides]
        if len(set(totals)) > 1:
            msg = f"Cannot zip datasets of different number of rows: {', '.join(map(str, totals))}"
            self._release_unused([r for side in sides for r in side])
            raise ValueError(msg)
        total = totals[0] if totals else 0
        if self.rows_per_task is not None:
            cuts = [*range(0, total, self.rows_per_task), total] if total else []
        elif self.num_tasks is not None:
            n = max(1, self.num_tasks)
            cuts = [total * i // n for i in range(n + 1)]
        else:  # zip: the first input's blocks
            cuts = [0]
            for r in sides[0]:
                if r.num_rows:
                    cuts.append(cuts[-1] + r.num_rows)
        for index in range(len(cuts) - 1):
            lo, hi = cuts[index], cuts[index + 1]
            bundle: list[Any] = []
            counts = []
            size = 0
            for side in sides:
                pieces = _row_range(side, lo, hi)
                if not pieces and side and self.keep_empty_blocks:  # no rows: the schema
                    pieces = [BlockSlice(side[0], 0, 0)]
                for piece in pieces:
                    self._slices[piece.ref.block_id] = self._slices.get(piece.ref.block_id, 0) + 1
                    size += piece.size_bytes
                bundle.extend(pieces)
                counts.append(len(pieces))
            self._planned.append((bundle, (index, tuple(counts)), size))
        self._release_unused([r for side in sides for r in side])

    def _release_unused(self, refs: list[BlockRef]) -> None:
        assert self._ctx is not None
        for r in refs:
            if r.block_id not in self._slices:
                self._ctx.release(r)


def reduce_ranges(part_bytes: np.ndarray, num_tasks: int | None, target: int, cpus: int = 1) -> list[tuple[int, int]]:
    """Contiguous ranges of partitions: exactly ``num_tasks`` of about equal bytes, or (None)
    ranges of at most ``target`` bytes (where no partition alone is bigger): as many as the
    targets' worth rounded up to a multiple of ``cpus``, of equal bytes, so that the last wave
    of reduce tasks has one for every CPU (4.2 targets' worth is 6 ranges on 2 CPUs, not 4 and
    a sliver that one CPU runs while the other waits), up to two waves more when equal ranges
    end more than a tenth over the target; greedily cut at ``target`` when the partitions are
    too coarse for equal ranges to stay under it."""
    p = len(part_bytes)
    if num_tasks is not None:
        return _equal_ranges(part_bytes, num_tasks)
    total = float(part_bytes.sum())
    if total <= 0 or p == 0:
        return [(0, p)]
    wanted = max(1, int(np.ceil(total / max(1, target))))
    cum = np.concatenate(([0.0], np.cumsum(part_bytes)))
    first = -(-wanted // cpus) * cpus
    for n in range(min(p, first), min(p, first + 2 * cpus) + 1, cpus):
        ranges = _equal_ranges(part_bytes, n)
        if max(cum[hi] - cum[lo] for lo, hi in ranges) <= target * 1.1:
            return [(lo, hi) for lo, hi in ranges if hi > lo]
    ranges = []
    lo, acc = 0, 0.0
    for i, size in enumerate(part_bytes):
        if acc > 0 and acc + size > target:
            ranges.append((lo, i))
            lo, acc = i, 0.0
        acc += size
    if acc > 0 or not ranges:
        ranges.append((lo, p))
    return ranges


def _equal_ranges(part_bytes: np.ndarray, n: int) -> list[tuple[int, int]]:
    """``n`` contiguous ranges of partitions of about equal bytes (empty ones included)."""
    p = len(part_bytes)
    cum = np.concatenate(([0.0], np.cumsum(part_bytes)))
    total = cum[-1]
    if total <= 0 or n >= p:
        bounds = [min(p, p * i // max(1, n)) for i in range(n + 1)]
    else:
        bounds = [0] + [int(np.searchsorted(cum, total * i / n, side="left")) for i in range(1, n)] + [p]
        bounds = list(np.maximum.accumulate(bounds))
    return [(int(bounds[i]), int(bounds[i + 1])) for i in range(n)]


def _row_range(refs: list[BlockRef], lo: int, hi: int) -> list[BlockSlice]:
    """Slices of ``refs`` (in order) covering global rows [lo, hi)."""
    pieces = []
    start = 0
    for r in refs:
        end = start + r.num_rows
        a, b = max(lo, start), min(hi, end)
        if b > a:
            pieces.append(BlockSlice(r, a - start, b - a))
        start = end
        if start >= hi:
            break
    return pieces

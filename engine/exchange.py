"""What an exchange's tasks run: the map side groups rows by partition, the reduce side combines
one range of partitions.

An all-to-all step (shuffle, sort, groupby, join, repartition) is two kinds of task inside the
streaming executor, not a separate engine. A *map* task concatenates its input blocks, asks a
``Partitioner`` for each row's partition, and stores ONE block with its rows grouped by
partition (stably: rows keep their order within a partition) and the count of each partition on
its ``BlockRef``. A *reduce* task gets, for a contiguous range of partitions, one zero-copy slice
of every map block in map order (``engine.operators.exchange`` plans them), and a ``Reducer``
turns them into output blocks. No M x P small objects: a map writes one file however many
partitions there are.

Partitioners and reducers are supplied by the plan (``dataflow.exchanges``): the engine only
moves rows. Errors they raise reach the caller as themselves, named after the step.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from engine.block_format import concat_blocks as concat
from engine.transform import TaskTransform, UDFFailure, _shape_output

FINE_PARTITIONS = 256
"""Partitions a map task cuts its rows into when the plan does not fix the number. Reduce tasks
then take contiguous ranges of them, sized from the bytes that actually arrived."""


class Partitioner(Protocol):
    num_partitions: int

    def assign(self, table: pa.Table, row_offset: int) -> tuple[pa.Table, np.ndarray]:
        """The table to store (it may add a column) and each row's partition (ints < P).
        ``row_offset`` is the global position of the table's first row when the exchange's
        input arrives in order (else 0)."""
        ...


class Reducer(Protocol):
    exact_blocks: bool
    """True: each block it yields is an output block as is (repartition); False: blocks are
    cut to the target block size."""

    def __call__(self, sides: list[list[pa.Table]], index: int) -> Iterator[pa.Table]:
        """Output blocks for one reduce task: ``sides[s]`` are the inputs from input ``s``
        (one per map block, in map order); ``index`` is the task's position in the output.
        A reducer may also have ``merge(table, group_keys)``, which a pushed merge applies to
        several map outputs, and ``prepare(table)``, which it applies to each one first."""
        ...




def grouping_order(parts: np.ndarray, num_partitions: int) -> np.ndarray:
    """The row order that groups rows by partition, stably. Partition numbers fit in 16 bits
    (as a rule): numpy then sorts them by counting, 10x faster than a comparison sort."""
    if num_partitions <= 1 << 16:
        parts = parts.astype(np.uint16)
    return np.argsort(parts, kind="stable")


_ROW_INDEX = "__dataflow_row"


def grouped_rows(table: pa.Table, keys: Sequence[str]) -> tuple[pa.Table, list[Any], np.ndarray]:
    """``table`` with its rows grouped (the groups in key order, nulls last; a group's rows in
    input order), each group's key (a tuple for several keys), and where each group starts,
    the end last: one take of the whole table, then zero-copy slices, not a take per group
    (``map_groups``, grouped aggregations, and a partitioned write's folders)."""
    if not keys:
        return table, [None], np.array([0, table.num_rows], dtype=np.int64)
    import pyarrow.compute as pc  # (here: a process that never groups does not import it)

    indexed = table.select(list(keys)).append_column(_ROW_INDEX, pa.array(np.arange(table.num_rows)))
    listed = indexed.group_by(list(keys), use_threads=False).aggregate([(_ROW_INDEX, "list")])
    listed = listed.take(pc.sort_indices(listed, sort_keys=[(k, "ascending", "at_end") for k in keys]))
    rows = listed.column(f"{_ROW_INDEX}_list").combine_chunks()
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(pc.list_value_length(rows).to_numpy(zero_copy_only=False), out=offsets[1:])
    key_rows = listed.select(list(keys)).to_pylist()
    group_keys = [r[keys[0]] for r in key_rows] if len(keys) == 1 else [tuple(r[k] for k in keys) for r in key_rows]
    return table.take(pc.list_flatten(rows)), group_keys, offsets


class PartitionTransform(TaskTransform):
    """The map side of an exchange: one partitioned block per task."""

    def __init__(self, name: str, partitioner: Partitioner) -> None:
        self.name = name
        self.partitioner = partitioner

    def partition(self, blocks: Iterable[pa.Table], params: Any) -> Iterator[tuple[pa.Table, bytes]]:
        tables = [b for b in blocks if b.num_columns]
        if not tables:
            return
        table = concat(tables)
        try:
            table, parts = self.partitioner.assign(table, int(params or 0))
        except UDFFailure:
            raise
        except Exception as err:
            raise UDFFailure(self.name, err) from err
        counts = np.bincount(parts, minlength=self.partitioner.num_partitions).astype("<u4")
        if table.num_rows > 1:
            table = self._grouped(table, parts)
        yield table, counts.tobytes()

    def _grouped(self, table: pa.Table, parts: np.ndarray) -> pa.Table:
        """``table``'s rows grouped by partition: in the partitioner's own order when it has one
        (``row_order``: a sort's map output sorted by key, which groups it by range too), else
        stably by partition number; not moved when they already are."""
        row_order = getattr(self.partitioner, "row_order", None)
        order = row_order(table) if row_order is not None else None
        if order is not None:
            return table if bool(np.all(order[1:] > order[:-1])) else table.take(order)
        if np.any(parts[1:] < parts[:-1]):
            return table.take(grouping_order(parts, self.partitioner.num_partitions))
        return table

    def __call__(self, blocks: Iterable[pa.Table], params: Any = None) -> Iterator[pa.Table]:
        for table, _ in self.partition(blocks, params):
            yield table


class MappedPartitionTransform(TaskTransform):
    """An exchange's map side run by the tasks of the map steps that feed it
    (``read_parquet(...).map_batches(f).groupby(k)``): the steps' blocks are partitioned in the
    task that made them instead of crossing the store to map tasks of their own. A step's error
    names the step, a partitioning error the exchange, as when they run apart."""

    def __init__(self, stages: TaskTransform, partition: PartitionTransform) -> None:
        self.stages = stages
        self.partition_transform = partition
        self.name = f"{stages.name}->{partition.name}"
        self.chunk_bytes = int(getattr(stages, "target_block_bytes", 128 << 20))
        """The steps' blocks are partitioned this many bytes at a time, each chunk a partitioned
        block of its own: a step that makes far more than it reads (a ``flat_map``) is never
        held whole in the task."""

    @property
    def max_retries(self) -> int | None:  # type: ignore[override]
        return self.stages.max_retries

    def prepare(self) -> None:
        self.stages.prepare()

    def partition(self, blocks: Iterable[pa.Table], params: Any) -> Iterator[tuple[pa.Table, bytes]]:
        chunk: list[pa.Table] = []
        size = 0
        for table in self.stages(blocks, params):
            chunk.append(table)
            size += table.nbytes
            if size >= self.chunk_bytes:
                yield from self.partition_transform.partition(chunk, None)
                chunk, size = [], 0
        if chunk:
            yield from self.partition_transform.partition(chunk, None)

    def __call__(self, blocks: Iterable[pa.Table], params: Any = None) -> Iterator[pa.Table]:
        for table, _ in self.partition(blocks, params):
            yield table


class ReduceTransform(TaskTransform):
    """The reduce side: hands one task's slices to the reducer, side by side."""

    def __init__(self, name: str, reducer: Reducer, target_block_bytes: int,
                 partitioner: Partitioner | None = None) -> None:
        self.name = name
        self.reducer = reducer
        self.target_block_bytes = target_block_bytes
        self.partitioner = partitioner
        """The map side's, for a task given the whole input unpartitioned (a small exchange)."""

    def partition(self, blocks: Iterable[pa.Table], params: Any) -> Iterator[tuple[pa.Table, bytes]]:
        """A pushed merge (``("merge", counts of each block, partitions, merge id)``): several
        map outputs as one partitioned block, groups merged where the reducer knows how."""
        _, counts, num_partitions, _ = params
        merge = getattr(self.reducer, "merge", None)
        prepare = getattr(self.reducer, "prepare", None)
        keys = getattr(self.reducer, "keys", ())
        combine = (lambda table: merge(table, [*keys, MERGE_PART])) if merge is not None else None
        try:
            tables = [prepare(t) for t in blocks] if prepare is not None else list(blocks)
            yield merge_partitioned(tables, list(counts), num_partitions, combine)
        except Exception as err:
            raise UDFFailure(self.name, err) from err

    def __call__(self, blocks: Iterable[pa.Table], params: Any = None) -> Iterator[pa.Table]:
        index, counts, *direct = params
        if getattr(self.reducer, "pieces", False) and len(counts) == 1 and not (direct and direct[0]):
            # a reducer that passes its input on piece by piece (a repartition whose task writes
            # its file): one block at a time, not every block of the task mapped first
            try:
                yield from self.reducer([blocks], index)  # type: ignore[list-item]
            except UDFFailure:
                raise
            except Exception as err:
                raise UDFFailure(self.name, err) from err
            return
        tables = list(blocks)
        sides, start = [], 0
        for n in counts:
            sides.append(tables[start : start + n])
            start += n
        try:
            if direct and direct[0]:  # the map side's work first: all rows, in order, are here
                assert self.partitioner is not None
                whole = [t for t in sides[0] if t.num_columns]
                sides = [[self._keyed(concat(whole))]] if whole else [[]]
            out = self.reducer(sides, index)
            if not self.reducer.exact_blocks:
                out = _shape_output(out, self.target_block_bytes)
            yield from out
        except UDFFailure:
            raise
        except Exception as err:
            raise UDFFailure(self.name, err) from err

    def _keyed(self, table: pa.Table) -> pa.Table:
        """The whole input as the map side would store it; a partitioner with a ``keyed``
        method skips computing partition numbers nobody reads."""
        assert self.partitioner is not None
        keyed = getattr(self.partitioner, "keyed", None)
        return keyed(table, 0) if keyed is not None else self.partitioner.assign(table, 0)[0]


class WholeExchangeTransform(TaskTransform):
    """A whole small exchange in the task that reads its input: the reduce side of a small
    exchange (``ReduceTransform`` given every block unpartitioned), fed by the read tasks
    themselves, so no block goes through the store on its way. The plan chooses it when the
    source says its data is small; the result is the partitioned path's."""

    def __init__(self, reduce: ReduceTransform) -> None:
        assert reduce.partitioner is not None
        self.reduce = reduce
        self.name = reduce.name

    def __call__(self, blocks: Iterable[pa.Table], params: Any = None) -> Iterator[pa.Table]:
        tables = list(blocks)
        yield from self.reduce(tables, (0, (len(tables),), True))


MERGE_PART = "__dataflow_merge_partition"


def merge_partitioned(tables: list[pa.Table], counts: list[bytes], num_partitions: int,
                      combine: Any = None) -> tuple[pa.Table, bytes]:
    """Several map tasks' partitioned blocks as one: rows grouped by partition, each
    partition's rows in map order; ``combine(table, group_keys)`` (an aggregation's) may
    first merge the rows of each group, given the partition as an extra key."""
    parts = np.concatenate([np.repeat(np.arange(len(c), dtype=np.intp), c)
                            for c in (partition_counts(b) for b in counts)]) if counts else np.zeros(0, np.intp)
    table = concat(tables)
    if combine is not None:
        merged = combine(table.append_column(MERGE_PART, pa.array(parts)))
        parts = merged.column(MERGE_PART).to_numpy().astype(np.intp)
        table = merged.drop_columns([MERGE_PART])
    if table.num_rows > 1 and np.any(parts[1:] < parts[:-1]):
        table = table.take(grouping_order(parts, num_partitions))
    return table, np.bincount(parts, minlength=num_partitions).astype("<u4").tobytes()


def partition_counts(ref_partitions: bytes) -> np.ndarray:
    return np.frombuffer(ref_partitions, dtype="<u4")

"""In-memory sources: ``range``, Python items, Arrow tables, pandas/polars frames, numpy arrays.

Each splits its data into read tasks that carry their slice of the data, so they run on workers
like any other read. ``from_arrow``, ``from_items`` and the other ``from_*`` put the same slices
(``ArrowDatasource.slices``) into the store from the driver instead (``engine.runner.hold``):
no task, no copy through a socket, no message limit.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from connectors.base import BlockMetadata, Datasource, ReadTask


def _meta(table: pa.Table) -> BlockMetadata:
    return BlockMetadata(num_rows=table.num_rows, size_bytes=table.nbytes, schema=table.schema)


class _TableSlice:
    """A picklable read function returning one table."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    def __call__(self) -> Iterable[pa.Table]:
        return [self.table]

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # as an Arrow IPC stream, which holds the slice's rows only: pickle writes a slice's
        # whole buffers, so each of 200 slices of a 1 GB table pickled to 1 GB
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, self.table.schema) as writer:
            writer.write_table(self.table)
        return _slice_from_ipc, (sink.getvalue(),)


def _slice_from_ipc(data: pa.Buffer) -> _TableSlice:
    return _TableSlice(pa.ipc.open_stream(data).read_all())


class _RangeSlice:
    def __init__(self, start: int, stop: int, column: str) -> None:
        self.start, self.stop, self.column = start, stop, column

    def __call__(self) -> Iterable[pa.Table]:
        ids = np.arange(self.start, self.stop, dtype=np.int64)
        # from_buffers, not pa.array: the latter imports pandas (0.4 s) on first use
        column = pa.Array.from_buffers(pa.int64(), len(ids), [None, pa.py_buffer(ids)])
        return [pa.Table.from_arrays([column], names=[self.column])]


def _split(n: int, parts: int) -> list[tuple[int, int]]:
    parts = max(1, min(parts, n)) if n else 1
    bounds = [n * i // parts for i in range(parts + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(parts)]


def default_num_blocks(num_rows: int, row_bytes: int = 8, min_blocks: int = 1) -> int:
    """Blocks for an in-memory source: about 1 MiB each, at most 200 (Ray's read floor), and at
    least ``min_blocks`` (the caller's 2 per CPU, as Ray's parallelism has) where there are rows
    enough: six slow rows are six tasks for the workers to share, not one."""
    by_bytes = min(200, num_rows * row_bytes // (1 << 20) + 1)
    return max(1, min(max(by_bytes, min_blocks), num_rows))


class RangeDatasource(Datasource):
    """Rows ``0..n-1`` in column ``id`` (``ray.data.range``)."""

    def __init__(self, n: int, num_blocks: int | None = None, column: str = "id", min_blocks: int = 1) -> None:
        if n < 0:
            msg = f"range() needs n >= 0, got {n}"
            raise ValueError(msg)
        self.n = n
        self.num_blocks = num_blocks or default_num_blocks(n, min_blocks=min_blocks)
        self.column = column

    def get_name(self) -> str:
        return "ReadRange"

    def get_read_tasks(self, parallelism: int) -> Iterable[ReadTask]:
        schema = pa.schema([(self.column, pa.int64())])
        for start, stop in _split(self.n, self.num_blocks):
            meta = BlockMetadata(num_rows=stop - start, size_bytes=8 * (stop - start), schema=schema)
            yield ReadTask(_RangeSlice(start, stop, self.column), meta)

    def estimate_inmemory_data_size(self) -> int:
        return 8 * self.n

    def count_rows(self) -> int:
        return self.n

    def schema(self) -> pa.Schema:
        return pa.schema([(self.column, pa.int64())])


class ArrowDatasource(Datasource):
    """Arrow tables already in memory, split into about ``num_blocks`` blocks."""

    def __init__(self, tables: Sequence[pa.Table], num_blocks: int | None = None, name: str = "FromArrow") -> None:
        # tables without rows add no blocks; if every one is empty, the first keeps the schema
        self.tables = [t for t in tables if t.num_rows] or list(tables[:1])
        self.num_blocks = num_blocks
        self.name = name

    def get_name(self) -> str:
        return self.name

    def get_read_tasks(self, parallelism: int) -> Iterable[ReadTask]:
        for piece in self.slices():
            yield ReadTask(_TableSlice(piece), _meta(piece))

    def slices(self) -> list[pa.Table]:
        """The tables cut into about ``num_blocks`` blocks (zero-copy slices), in order."""
        total = sum(t.num_rows for t in self.tables)
        blocks = self.num_blocks or max(len(self.tables), default_num_blocks(total, max(1, self._row_bytes())))
        per_table = max(1, blocks // max(1, len(self.tables)))
        return [table.slice(start, stop - start) for table in self.tables for start, stop in _split(table.num_rows, per_table)]

    def _row_bytes(self) -> int:
        rows = sum(t.num_rows for t in self.tables)
        return sum(t.nbytes for t in self.tables) // rows if rows else 1

    def estimate_inmemory_data_size(self) -> int:
        return sum(t.nbytes for t in self.tables)

    def count_rows(self) -> int:
        return sum(t.num_rows for t in self.tables)

    def schema(self) -> pa.Schema | None:
        return self.tables[0].schema if self.tables else None

"""The connector contract: Datasource -> ReadTask (read side) and Datasink (write side).

A ``Datasource`` runs on the driver. It lists its inputs and hands out small, picklable
``ReadTask`` objects; the engine ships each one to a worker, which calls it and gets Arrow
tables back. A ``Datasink`` is the mirror image: ``write`` runs on workers, once per task, over
the blocks that task received; ``on_write_complete`` runs once on the driver when every write
task succeeded (the commit), ``on_write_failed`` when any failed (the cleanup).

Names and signatures follow Ray Data's ``ray.data.Datasource`` / ``ray.data.Datasink`` so custom
connectors port by changing an import.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

Block = pa.Table


@dataclass(frozen=True)
class BlockMetadata:
    """What is known about a block (or a read task's output) before reading it."""

    num_rows: int | None = None
    size_bytes: int | None = None
    input_files: tuple[str, ...] = ()
    schema: pa.Schema | None = None


class ReadTask:
    """A picklable unit of reading: calling it yields Arrow tables.

    ``read_fn`` must be a picklable zero-argument callable returning an iterable of
    ``pyarrow.Table`` (or ``RecordBatch``). ``metadata`` sizes the task for scheduling and
    answers ``count()`` without reading when ``num_rows`` is known.
    """

    __slots__ = ("metadata", "read_fn")

    def __init__(self, read_fn: Callable[[], Iterable[Any]], metadata: BlockMetadata) -> None:
        self.read_fn = read_fn
        self.metadata = metadata

    def __call__(self) -> Iterator[Block]:
        for block in self.read_fn():
            if isinstance(block, pa.RecordBatch):
                block = pa.Table.from_batches([block])
            if not isinstance(block, pa.Table):
                msg = f"a ReadTask must yield pyarrow Tables or RecordBatches, got {type(block).__name__}"
                raise TypeError(msg)
            yield block

    def __repr__(self) -> str:
        return f"ReadTask({self.metadata})"


class Datasource:
    """Base class for sources. Subclass and implement ``get_read_tasks``.

    Optional capabilities, used by the optimizer when a subclass provides them:

    * ``apply_projection(columns)`` -> a new Datasource reading only those columns;
    * ``apply_filter(expr)`` -> a new Datasource that applies a pyarrow compute expression
      while reading (row groups skipped from statistics, for Parquet);
    * ``count_rows()`` -> the exact row count without reading data (e.g. from footers), or None;
    * ``schema()`` -> the output schema if known without reading, or None.
    """

    sizes_own_tasks = False
    """True when ``get_read_tasks`` already sizes its tasks well (files grouped by bytes): the
    engine then runs each as it comes instead of bundling small ones together."""

    def get_name(self) -> str:
        """A short name for plans and stats (``ReadParquet``, ``ReadRange``...)."""
        name = type(self).__name__
        return name.removesuffix("Datasource") or name

    def get_read_tasks(self, parallelism: int) -> Iterable[ReadTask]:
        """The read tasks, ideally about ``parallelism`` of them; may be a lazy iterator."""
        raise NotImplementedError

    def estimate_inmemory_data_size(self) -> int | None:
        """Bytes of decoded data this source yields, or None when unknown."""
        return None

    def schema(self) -> pa.Schema | None:
        """The output schema if known without reading any data."""
        return None

    def count_rows(self) -> int | None:
        """The exact number of rows if known without reading data."""
        return None

    def apply_projection(self, columns: list[str]) -> Datasource | None:
        """A copy that reads only ``columns``, or None when projection is not supported."""
        return None

    def apply_filter(self, expr: Any) -> Datasource | None:
        """A copy that applies ``expr`` while reading, or None when not supported."""
        return None


@dataclass
class TaskContext:
    """What a write task knows about itself."""

    task_index: int
    attempt: int = 0
    kwargs: dict[str, Any] = field(default_factory=dict)
    unit: int | None = None
    """The input unit (read task) whose rows it writes, in a resumable write; else None."""

    @property
    def task_idx(self) -> int:
        """Ray Data's name for ``task_index``, which sinks written for Ray read."""
        return self.task_index


class Datasink:
    """Base class for sinks: ``write`` on workers, ``on_write_complete`` on the driver."""

    def get_name(self) -> str:
        """A short name for plans and stats."""
        name = type(self).__name__
        return name.removesuffix("Datasink") or name

    def on_write_start(self) -> None:
        """Called once on the driver before any write task runs."""

    def write(self, blocks: Iterable[Block], ctx: TaskContext) -> Any:
        """Write ``blocks`` (on a worker) and return a small picklable result."""
        raise NotImplementedError

    def on_write_complete(self, write_results: list[Any]) -> None:
        """Called once on the driver with every task's result, after all succeeded."""

    def on_write_failed(self, error: BaseException) -> None:
        """Called once on the driver when the job failed; remove partial output here."""

    @property
    def min_rows_per_write(self) -> int | None:
        """Blocks are combined until a write task has at least this many rows (None: no minimum)."""
        return None

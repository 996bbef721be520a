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

import contextlib
import contextvars
import inspect
from collections.abc import Callable, Iterable, Iterator
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Generic, TypeVar

import pyarrow as pa

Block = pa.Table


@dataclass(frozen=True)
class BlockMetadata:
    """What is known about a block (or a read task's output) before reading it."""

    num_rows: int | None = None
    size_bytes: int | None = None
    input_files: tuple[str, ...] = ()
    schema: pa.Schema | None = None
    _: KW_ONLY
    exec_stats: Any = None
    """Ray's execution statistics of a block already read: accepted (Ray requires it of every
    ``BlockMetadata``, so ported sources pass ``exec_stats=None``); dataflow keeps its own."""
    task_exec_stats: Any = None
    """As ``exec_stats``."""

    def __post_init__(self) -> None:  # Ray's sources pass input_files=None or a list
        object.__setattr__(self, "input_files", tuple(self.input_files or ()))


def as_table(block: Any, what: str) -> pa.Table:
    """``block`` (a pyarrow Table or RecordBatch, or a pandas DataFrame, as Ray takes) as a
    Table; a ``TypeError`` saying what ``what`` yielded otherwise."""
    if isinstance(block, pa.Table):
        return block
    if isinstance(block, pa.RecordBatch):
        return pa.Table.from_batches([block])
    if type(block).__module__.split(".")[0] == "pandas":
        from engine.block_format import frame_to_table

        return frame_to_table(block)
    raise TypeError(f"{what} must yield pyarrow Tables, RecordBatches or pandas DataFrames, got {type(block).__name__}")


_PLANNING: contextvars.ContextVar[dict[Any, Any] | None] = contextvars.ContextVar("dataflow_planning", default=None)


@contextlib.contextmanager
def planning() -> Iterator[None]:
    """The planning of one execution: what a source reads there about its files (a Parquet
    footer) goes in ``planning_cache`` and is read once, however many planning steps ask (the
    size of a small exchange's input, then the schema of its read tasks). The next execution
    reads it afresh: the files may have changed in between. Nested scopes share the outer one."""
    token = _PLANNING.set({}) if _PLANNING.get() is None else None
    try:
        yield
    finally:
        if token is not None:
            _PLANNING.reset(token)


def planning_cache() -> dict[Any, Any] | None:
    """The open planning scope's cache, or None outside one. Threads see it when they run in a
    copy of the planning thread's context (``connectors.filesystem.map_small_reads`` does)."""
    return _PLANNING.get()


class ReadTask:
    """A picklable unit of reading: calling it yields Arrow tables.

    ``read_fn`` must be a picklable zero-argument callable returning an iterable of
    ``pyarrow.Table`` (or ``RecordBatch``). ``metadata`` sizes the task for scheduling and
    answers ``count()`` without reading when ``num_rows`` is known.
    """

    __slots__ = ("metadata", "per_task_row_limit", "read_fn", "schema")

    def __init__(
        self,
        read_fn: Callable[[], Iterable[Any]],
        metadata: BlockMetadata,
        schema: pa.Schema | None = None,
        per_task_row_limit: int | None = None,
    ) -> None:
        self.read_fn = read_fn
        self.metadata = metadata
        self.schema = schema
        """The schema of the task's blocks, when known (Ray's ``ReadTask.schema``)."""
        self.per_task_row_limit = per_task_row_limit
        """At most this many rows come out of the task (Ray's limit pushed into a read)."""

    def __call__(self) -> Iterator[Block]:
        left = self.per_task_row_limit
        for item in self.read_fn():
            block = as_table(item, "a ReadTask")
            if left is not None:
                if left <= 0:
                    return
                block = block.slice(0, min(left, block.num_rows))  # clamped: a table without columns is not
                left -= block.num_rows
            yield block

    def __repr__(self) -> str:
        return f"ReadTask({self.metadata})"


class SharedSource:
    """A datasource that many read tasks call, pickled once: each task's spec carries the
    same bytes instead of pickling the source again (its filesystem, schema and options: ~30 us
    of the driver's CPU per task for Parquet), and each worker task unpickles its own copy, so
    no task sees state another left behind.

    A source whose own class says ``REUSED_BY_WORKERS = True`` (the built-in file formats, whose
    reads never change the source) is unpickled once per worker instead: the next task that
    carries the same bytes gets the same object (a small Parquet file's task: 69 -> 31 us of a
    worker's CPU to unpickle its spec). Tasks of one worker may then read through the same
    object, from threads too (``engine.task.ReadAll``), which such a source allows. The flag is
    read from the class itself, not inherited: a user's subclass may keep state between reads.

    The bytes are made on the first pickle: the source must not change after its read tasks
    are handed out (``get_read_tasks`` fixes what they need first)."""

    __slots__ = ("_data", "source")

    def __init__(self, source: Any) -> None:
        self.source = source
        self._data: bytes | None = None

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.source, method)(*args)

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        if self._data is None:
            from engine.serialization import dumps_for_worker

            self._data = dumps_for_worker(self.source)
        if type(self.source).__dict__.get("REUSED_BY_WORKERS", False):
            return (_reused_source_from_bytes, (self._data,))
        return (_shared_source_from_bytes, (self._data,))


def _shared_source_from_bytes(data: bytes) -> SharedSource:
    import pickle

    return SharedSource(pickle.loads(data))


_REUSED: dict[bytes, SharedSource] = {}
"""This process's unpickled reusable sources, by their bytes (the last few executions')."""
_REUSED_MAX = 8


def _reused_source_from_bytes(data: bytes) -> SharedSource:
    shared = _REUSED.get(data)
    if shared is None:
        shared = _shared_source_from_bytes(data)
        shared._data = data  # (pickled again as it came, should it travel on)
        while len(_REUSED) >= _REUSED_MAX:
            del _REUSED[next(iter(_REUSED))]
        _REUSED[data] = shared
    return shared


class Datasource:
    """Base class for sources. Subclass and implement ``get_read_tasks``.

    Optional capabilities, used by the optimizer when a subclass provides them:

    * ``apply_projection(columns)`` -> a new Datasource reading only those columns;
    * ``apply_filter(expr)`` -> a new Datasource that applies a pyarrow compute expression
      while reading (row groups skipped from statistics, for Parquet); one that also takes
      ``statistics=`` gets, for a dataflow expression, its form that statistics may prune with
      (``push_filter``);
    * ``count_rows()`` -> the exact row count without reading data (e.g. from footers), or None;
    * ``schema()`` -> the output schema if known without reading, or None.
    """

    sizes_own_tasks = False
    """True when ``get_read_tasks`` already sizes its tasks well (files grouped by bytes): the
    engine then runs each as it comes instead of bundling small ones together."""

    def get_name(self) -> str:
        """A short name for plans and stats (``ReadParquet``, ``ReadRange``...)."""
        name = type(self).__name__.lstrip("_")
        return name.removesuffix("Datasource") or name

    @property
    def supports_distributed_reads(self) -> bool:
        """Whether read tasks may run on any node (Ray's). A source that says False is refused on
        a multi-node Ray cluster, whose runner does not pin tasks to the driver's node."""
        return True

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


def push_filter(source: Any, expr: Any, statistics: Any = None) -> Any:
    """``source.apply_filter(expr)``, with ``statistics=`` when given and the source takes it
    (a source of a user's own may define ``apply_filter(expr)`` alone)."""
    if statistics is not None and "statistics" in inspect.signature(source.apply_filter).parameters:
        return source.apply_filter(expr, statistics=statistics)
    return source.apply_filter(expr)


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


WriteReturnType = TypeVar("WriteReturnType")


class WriteResult(list, Generic[WriteReturnType]):  # type: ignore[type-arg]
    """What ``Datasink.on_write_complete`` gets: Ray 2.60's ``WriteResult`` (``num_rows``,
    ``size_bytes``, and ``write_returns``, each write task's return value) that is also the list
    of those return values, as earlier Ray versions and dataflow's own sinks take it."""

    def __init__(self, write_returns: Iterable[WriteReturnType] = (), num_rows: int = 0, size_bytes: int = 0) -> None:
        super().__init__(write_returns)
        self.num_rows = num_rows
        self.size_bytes = size_bytes

    @property
    def write_returns(self) -> list[WriteReturnType]:
        return list(self)


class Datasink(Generic[WriteReturnType]):
    """Base class for sinks: ``write`` on workers, ``on_write_complete`` on the driver."""

    def get_name(self) -> str:
        """A short name for plans and stats."""
        name = type(self).__name__.lstrip("_")
        return name.removesuffix("Datasink") or name

    def on_write_start(self, schema: pa.Schema | None = None) -> None:
        """Called once on the driver before any write task runs, with the rows' schema when it
        is known without running anything (a sink whose method takes no argument gets none)."""

    def write(self, blocks: Iterable[Block], ctx: TaskContext) -> Any:
        """Write ``blocks`` (on a worker) and return a small picklable result."""
        raise NotImplementedError

    def on_write_complete(self, write_result: WriteResult[WriteReturnType]) -> None:
        """Called once on the driver after every task succeeded, with their results (a
        ``WriteResult``: a list of them, with ``num_rows`` and ``size_bytes`` written). If it
        raises, ``on_write_failed`` is called, as for a failed task."""

    @property
    def supports_distributed_writes(self) -> bool:
        """Whether write tasks may run on any node (Ray's; a local path on a multi-node
        cluster is refused before anything runs)."""
        return True

    @property
    def min_bytes_per_write(self) -> int | None:
        """Blocks are combined until a write task has at least this many bytes (None: no minimum)."""
        return None

    def on_write_failed(self, error: BaseException) -> None:
        """Called once on the driver when the job failed; remove partial output here."""

    @property
    def min_rows_per_write(self) -> int | None:
        """Blocks are combined until a write task has at least this many rows (None: no minimum)."""
        return None

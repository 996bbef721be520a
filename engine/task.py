"""What crosses the process boundary for one task, and the code that runs it anywhere.

A task reads its inputs (read tasks, or blocks from the store), runs its operator's fused
``BlockTransform`` and either puts the output blocks in the store, counts rows, or hands the
blocks to a ``Datasink``. ``run_task`` is the same in a worker process and in the driver's
inline slot, which is what keeps the two execution modes semantically identical.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import random
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from engine import row_errors
from engine.errors import safe_str
from engine.object_store import BlockRef, BlockSlice, BlockStore
from engine.tracebacks import Frame, format_frames, user_frames
from engine.transform import CONSTRUCTOR_RETRIES, TaskTransform, UDFFailure
from engine.units import common_unit

OUTPUT_BLOCKS = "blocks"
OUTPUT_COUNT = "count"
OUTPUT_WRITE = "write"
OUTPUT_PARTITIONS = "partitions"
"""An exchange's map side: each block is stored grouped by partition, with its counts."""


@dataclass
class TaskSpec:
    """One unit of work for a worker. ``inputs`` is a list of ReadTasks or of BlockRefs."""

    task_id: int
    op_key: str
    transform_digest: str
    inputs: list[Any]
    output: str = OUTPUT_BLOCKS
    sink: Any = None
    """For write tasks: the Datasink (pickled with the task; small)."""
    task_index: int = 0
    attempt: int = 0
    spill: bool = False
    shm_room: float | None = None
    """Bytes of output this task may write to shared memory; its outputs past them go to disk
    (None: no limit). The driver sets it from the store's free room when it sends the task: a
    task whose outputs far exceed what was expected (a flat_map that turns each row into
    hundreds) would otherwise fill shared memory many times past the store's capacity, since
    its outputs are counted only when it ends."""
    spare_files: tuple[tuple[str, int], ...] = ()
    """Freed block files (path, size) the worker may write its outputs over instead of new
    ones (``engine.spare_files``); those it leaves are the driver's again when the task ends."""
    params: Any = None
    """Plain data the transform needs for this task only (an exchange's row offset, the
    number of inputs from each side of a reduce)."""
    sampler: Any = None
    """For a task whose blocks feed a sort: called on each output block, its result rides on
    the block's ref (``BlockRef.sample``)."""
    read_pages: bool = False
    """Report the pages of spilled block files that hold only the rows of the slices this
    task reads (``TaskResult.read_pages``): an exchange's reduce task, whose slices nobody else
    reads, so the driver can give them back once it is done (``engine.row_pages``)."""


@dataclass
class TaskError:
    """A failure inside a task, as text plus (when it pickles) the original exception."""

    udf_name: str
    exc_type: str
    message: str
    traceback: str
    exception: bytes | None
    user_code: bool
    context: str = ""
    frames: list[Frame] = field(default_factory=list)
    """The user's frames (engine frames removed), for the driver to render (``rendered_traceback``)."""
    exception_text: str = ""
    """The last lines of the traceback: the exception's type and message."""
    input_files: tuple[str, ...] = ()
    """The files the task was reading when it failed, when it read files."""
    attempts: int = 1
    """How many times the task ran in its worker before this error (``ErrorRetries``)."""

    def rendered_traceback(self) -> str:
        """The traceback as this process prints it: a source line the worker could not read
        (a notebook cell's) is looked up here, and a notebook cell is named as IPython does."""
        if not self.frames:
            return self.traceback
        return format_frames(self.frames) + self.exception_text


@dataclass
class TaskResult:
    task_id: int
    refs: list[BlockRef] = field(default_factory=list)
    num_rows: int = 0
    size_bytes: int = 0
    value: Any = None
    wall_s: float = 0.0
    cpu_s: float = 0.0
    error: TaskError | None = None
    io: dict[str, int] = field(default_factory=dict)
    """What the task's readers and writers did (``connectors.io_stats`` deltas, non-zero only)."""
    rows_skipped: dict[str, int] = field(default_factory=dict)
    """Rows its ``on_error="skip"`` stages dropped, per exception type."""
    read_pages: dict[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    """With ``TaskSpec.read_pages``: by position in ``inputs``, the (offset, length) page
    ranges of a spilled slice's file that hold its rows alone."""


def _io_counters() -> dict[str, int]:
    """The connectors' I/O counters of this process, when a connector has loaded them.

    Looked up rather than imported: the engine knows connectors only through their base.
    """
    module = sys.modules.get("connectors.io_stats")
    return module.snapshot() if module is not None else {}


class ReadAll:
    """Several read tasks as one input item, read by up to ``threads`` threads at once and
    yielded in order: a task that is alone on the workers (a small exchange that reads its
    whole input) decodes on every core instead of one. Readers release the GIL while they
    decode; each one's failure names its own files."""

    __slots__ = ("metadata", "tasks", "threads")

    def __init__(self, tasks: list[Any], threads: int) -> None:
        self.tasks = tasks
        self.threads = max(1, threads)
        sizes = [getattr(getattr(t, "metadata", None), "size_bytes", None) for t in tasks]
        rows = [getattr(getattr(t, "metadata", None), "num_rows", None) for t in tasks]
        self.metadata = _Metadata(
            num_rows=sum(rows) if None not in rows else None,  # type: ignore[arg-type]
            size_bytes=sum(sizes) if None not in sizes else None,  # type: ignore[arg-type]
            input_files=tuple(f for t in tasks for f in _files_of(t)),
        )

    def __call__(self) -> Iterator[pa.Table]:
        if self.threads == 1 or len(self.tasks) < 2:
            for task in self.tasks:
                yield from _read(task)
            return
        pool = _read_pool(min(self.threads, len(self.tasks)))
        # each read in a copy of this thread's context: the task's configs (task_configs) hold there too
        futures = [pool.submit(contextvars.copy_context().run, lambda t=task: list(_read(t))) for task in self.tasks]
        try:
            for future in futures:
                yield from future.result()
        finally:
            for future in futures:
                future.cancel()


_READ_POOL: tuple[int, int, ThreadPoolExecutor] | None = None
"""The process's ``ReadAll`` pool: the pid that made it, its width, the pool."""
_READ_POOL_LOCK = threading.Lock()


def _read_pool(threads: int) -> ThreadPoolExecutor:
    """The process's pool of ``ReadAll`` threads, at least ``threads`` wide. Kept between tasks:
    starting a pool's threads for each task cost about 1 ms of a 20 ms task (a small sort). A
    process forked after the pool was made (a DataLoader worker of a local-mode job) makes its
    own: the inherited one has no threads there, and would never run a read."""
    global _READ_POOL
    pid = os.getpid()
    with _READ_POOL_LOCK:
        if _READ_POOL is None or _READ_POOL[0] != pid or _READ_POOL[1] < threads:
            if _READ_POOL is not None and _READ_POOL[0] == pid:
                _READ_POOL[2].shutdown(wait=False)  # its running reads finish; new ones go to the wider pool
            _READ_POOL = (pid, threads, ThreadPoolExecutor(threads, thread_name_prefix="read"))
        return _READ_POOL[2]


@dataclass(frozen=True)
class _Metadata:
    num_rows: int | None
    size_bytes: int | None
    input_files: tuple[str, ...]


def _files_of(item: Any) -> tuple[str, ...]:
    return tuple(getattr(getattr(item, "metadata", None), "input_files", ()) or ())


def _read(item: Any) -> Iterator[pa.Table]:
    """The tables of one read task; its failure as the step ``Read``'s, naming its files."""
    try:
        yield from item()
    except UDFFailure:
        raise
    except Exception as err:
        files = _files_of(item)
        where = f"(reading {', '.join(files[:3])}{'...' if len(files) > 3 else ''})" if files else ""
        raise UDFFailure("Read", err, where) from err


def _input_blocks(spec: TaskSpec, store: BlockStore, result: TaskResult | None = None) -> Iterator[pa.Table]:
    for position, item in enumerate(spec.inputs):
        if isinstance(item, BlockRef):
            yield store.get(item)
        elif isinstance(item, BlockSlice):
            if spec.read_pages and item.ref.spilled and result is not None:
                rows, pages = store.get_slice_pages(item)
                if pages:
                    result.read_pages[position] = pages
                yield rows
            else:
                yield store.get(item.ref).slice(item.offset, item.length)
        else:
            row_errors.note_input_files(_files_of(item))
            yield from _read(item)


_CONFIGS: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("dataflow_task_configs", default=None)


def task_configs() -> dict[str, Any] | None:
    """The key-value settings of the execution whose task runs in this thread
    (``TaskTransform.configs``, an empty dict when it has none), or None outside a task."""
    return _CONFIGS.get()


@contextlib.contextmanager
def configs_of(transform: TaskTransform) -> Iterator[None]:
    """``transform.configs`` are ``task_configs()`` in this thread within the block, and
    ``transform.init_retries`` the retries of the constructors it calls (``CONSTRUCTOR_RETRIES``)."""
    token = _CONFIGS.set(transform.configs or {})
    retries = CONSTRUCTOR_RETRIES.set(transform.init_retries)
    try:
        yield
    finally:
        CONSTRUCTOR_RETRIES.reset(retries)
        _CONFIGS.reset(token)


@dataclass(frozen=True)
class ErrorRetries:
    """Ray's ``retried_map_errors`` and ``max_map_retries``: a task whose user code raised an
    error that matches is run again from its first input, up to ``max_retries`` more times, in
    the same worker, after Ray's backoff (a random part of ``2 ** attempt`` seconds, at most
    ``MAX_BACKOFF_S``). ``patterns`` None: any error; else one of them is found in the error's
    ``"Type: message"`` as a substring, or as a regular expression. A write task is never run
    again (what it wrote before failing could be written twice)."""

    patterns: tuple[str, ...] | None
    max_retries: int

    MAX_BACKOFF_S = 32.0

    def matches(self, error: TaskError) -> bool:
        if not error.user_code:
            return False
        if self.patterns is None:
            return True
        text = f"{error.exc_type}: {error.message}"
        return any(pattern in text or _searches(pattern, text) for pattern in self.patterns)

    def backoff_s(self, attempt: int) -> float:
        """The wait before run number ``attempt + 1`` (``attempt`` >= 1), as Ray's."""
        return min(2.0 ** attempt, self.MAX_BACKOFF_S) * random.random()


def _searches(pattern: str, text: str) -> bool:
    try:
        return re.search(pattern, text) is not None
    except re.error:
        return False


def run_task(spec: TaskSpec, transform: TaskTransform, store: BlockStore) -> TaskResult:
    """Run ``spec`` to completion; failures come back as ``TaskResult.error``, never raised.
    A user error that ``transform.error_retries`` matches runs the task again (not a write)."""
    with configs_of(transform):
        result = _run_task(spec, transform, store)
        retries = transform.error_retries
        attempts = 1
        while (result.error is not None and retries is not None and spec.output != OUTPUT_WRITE
               and attempts <= retries.max_retries and retries.matches(result.error)):
            time.sleep(retries.backoff_s(attempts))
            attempts += 1
            result = _run_task(spec, transform, store)
        if result.error is not None:
            result.error.attempts = attempts
        return result


@dataclass
class TaskScope:
    """What a step may know of the task that runs it: the task's number within its operator
    (the same on every retry of it) and state the step keeps across the task's batches (a
    generated id's next value), started afresh by each attempt so a retry gives what the
    first attempt would have."""

    task_index: int
    state: dict[Any, Any] = field(default_factory=dict)


_SCOPE: contextvars.ContextVar[TaskScope | None] = contextvars.ContextVar("dataflow_task_scope", default=None)


def current_task() -> TaskScope | None:
    """The scope of the task running in this thread, or None outside a task."""
    return _SCOPE.get()


def _run_task(spec: TaskSpec, transform: TaskTransform, store: BlockStore) -> TaskResult:
    scope = _SCOPE.set(TaskScope(spec.task_index))
    try:
        return _run_task_in_scope(spec, transform, store)
    finally:
        _SCOPE.reset(scope)


def _spills(spec: TaskSpec, in_shm: int) -> bool:
    """Whether the task's next output goes to disk: all of them when the driver said so, the
    rest once the ``in_shm`` bytes it put in shared memory reach its ``shm_room`` (so it passes
    the room by at most one block)."""
    return spec.spill or (spec.shm_room is not None and in_shm >= spec.shm_room)


def _run_task_in_scope(spec: TaskSpec, transform: TaskTransform, store: BlockStore) -> TaskResult:
    start, cpu_start = time.perf_counter(), time.process_time()
    io_start = _io_counters()
    result = TaskResult(spec.task_id)
    written: list[BlockRef] = []
    in_shm = 0
    skips = row_errors.start(spec.task_index)
    try:
        if spec.output == OUTPUT_COUNT:
            result.num_rows = transform.count_rows(_input_blocks(spec, store))
        elif spec.output == OUTPUT_WRITE:
            from connectors.base import TaskContext

            counted = _counting(transform(_input_blocks(spec, store, result), spec.params), result)
            try:
                ctx = TaskContext(spec.task_index, spec.attempt, unit=common_unit(spec.inputs))
                result.value = spec.sink.write(counted, ctx)
            except UDFFailure:
                raise
            except Exception as err:  # the sink's own failure (a database's, a file's): the user's to see
                raise UDFFailure(spec.sink.get_name(), err) from err
        elif spec.output == OUTPUT_PARTITIONS:
            for block, counts in transform.partition(_input_blocks(spec, store), spec.params):  # type: ignore[attr-defined]
                ref = store.put(block, spill=_spills(spec, in_shm), sliced=True)
                ref = dataclasses.replace(ref, partitions=counts)
                in_shm += 0 if ref.spilled else ref.size_bytes
                written.append(ref)
                result.num_rows += ref.num_rows
                result.size_bytes += ref.size_bytes
            result.refs = written
        else:
            for block in transform(_input_blocks(spec, store, result), spec.params):
                ref = store.put(block, spill=_spills(spec, in_shm))
                in_shm += 0 if ref.spilled else ref.size_bytes
                if spec.sampler is not None:
                    ref = dataclasses.replace(ref, sample=_sample(spec.sampler, block))
                written.append(ref)
                result.num_rows += ref.num_rows
                result.size_bytes += ref.size_bytes
            result.refs = written
        skips.flush()
    except BaseException as err:  # everything is reported (SystemExit too); nothing escapes a task
        for ref in written:
            store.free(ref)
        result.refs = []
        result.read_pages = {}
        result.error = describe_error(err)
        result.error.input_files = skips.input_files
    row_errors.stop()
    result.rows_skipped = skips.counts
    result.wall_s = time.perf_counter() - start
    result.cpu_s = time.process_time() - cpu_start
    io_end = _io_counters()
    # process-wide counters: a listing thread's retries can land in an inline task's window,
    # and a reset makes a delta negative; both are dropped rather than misreported
    result.io = {k: v - io_start.get(k, 0) for k, v in io_end.items() if v > io_start.get(k, 0)}
    return result


def _sample(sampler: Callable[[pa.Table], Any], block: pa.Table) -> Any:
    """``sampler(block)``, or the exception it raised (a sort key the data does not have): the
    driver fails the execution with it, as when it sampled the block itself."""
    try:
        return sampler(block) if block.num_rows else None
    except Exception as err:
        return err


def _counting(blocks: Iterator[pa.Table], result: TaskResult) -> Iterator[pa.Table]:
    for block in blocks:
        result.num_rows += block.num_rows
        result.size_bytes += block.nbytes
        yield block


def trimmed_traceback(err: BaseException) -> str:
    """The traceback of ``err`` without engine and API frames: only the user's own code."""
    return format_frames(user_frames(err)) + "".join(traceback.format_exception_only(type(err), err))


def describe_error(err: BaseException) -> TaskError:
    """Turn an exception raised in a task into a picklable ``TaskError``."""
    from engine.serialization import dumps_exception

    if isinstance(err, UDFFailure):
        original, name, user = err.error, err.udf_name, True
        context = err.context
    else:
        original, name, user, context = err, "the engine", False, ""
    frames = user_frames(original) if user else []
    last = "".join(traceback.format_exception_only(type(original), original)) if user else ""
    tb = format_frames(frames) + last if user else "".join(traceback.format_exception(original))
    return TaskError(
        udf_name=name,
        exc_type=type(original).__name__,
        message=safe_str(original),
        traceback=tb,
        exception=dumps_exception(original),
        user_code=user,
        context=context,
        frames=frames,
        exception_text=last,
    )


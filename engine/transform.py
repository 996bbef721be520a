"""BlockTransform: the picklable, fused chain of per-row and per-batch functions a task runs.

``map``, ``filter``, ``flat_map`` and ``map_batches`` all become stages of one transform, so
adjacent maps run in one task with no block written in between. Consecutive row stages share
one row iterator (a block is turned into Python rows once). A transform is pickled once per
operator, cached by digest in each worker, and constructs callable classes once per worker:
that is what makes a map over a class an actor.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import functools
import inspect
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from engine import row_errors
from engine.block_format import concat_blocks, rows_of, rows_to_block, slice_rows, to_batch, to_block
from engine.errors import UDFOutputError

ROW_CHUNK = 16384
"""Rows turned into Python dicts at a time inside a row-stage chain (bounds their memory)."""


log = logging.getLogger(__name__)

CONSTRUCTOR_RETRIES: contextvars.ContextVar[int] = contextvars.ContextVar("dataflow_constructor_retries", default=0)
"""How many more times a callable class's constructor that raised is called where a task runs
(``TaskTransform.init_retries``, set for the task by ``engine.task.configs_of``; -1: no limit)."""

USER_ERRORS: tuple[type[BaseException], ...] = (BaseException,)
"""What a UDF may raise and have reported as its own error: anything (``KeyboardInterrupt``,
``SystemExit``, a ``BaseExceptionGroup``, a test framework's own ``BaseException``) reaches the
caller as itself, never as a dead worker or a bug of dataflow's. Where the guarded code yields,
``GeneratorExit`` is let through first: it is the generator being closed, not the UDF."""


class UDFFailure(Exception):
    """Internal: user code raised ``error`` inside stage ``udf_name`` (unwrapped by the worker)."""

    def __init__(self, udf_name: str, error: BaseException, context: str = "") -> None:
        super().__init__(udf_name, error)
        self.udf_name = udf_name
        self.error = error
        self.context = context


def udf_name(fn: Any) -> str:
    """A function's or class's name as Ray Data names its operators: ``f`` (``<lambda>``), a
    method's ``Class.f``, a partial's function's, a callable object's class's."""
    if inspect.ismethod(fn):
        return f"{type(fn.__self__).__name__}.{fn.__name__}"
    if isinstance(fn, functools.partial):
        return udf_name(fn.func)
    if inspect.isclass(fn) or inspect.isfunction(fn) or inspect.isbuiltin(fn):
        return str(fn.__name__)
    return type(fn).__name__


@dataclass
class Stage:
    """One user-visible step. ``kind`` is "rows" (row -> rows) or "batches" (table -> tables)."""

    name: str
    kind: str
    fn: Any
    fn_args: tuple[Any, ...] = ()
    fn_kwargs: dict[str, Any] = field(default_factory=dict)
    fn_constructor_args: tuple[Any, ...] = ()
    fn_constructor_kwargs: dict[str, Any] = field(default_factory=dict)
    row_mode: str = "map"
    """For row stages: "map" (one row out), "filter" (keep if true), "flat_map" (rows out)."""
    batch_size: int | None = None
    batch_format: str | None = "default"
    arrow_backed_pandas: bool = True
    """Pandas batches get ``pd.ArrowDtype`` columns (``DataContext.enable_arrow_backed_pandas_conversion``
    when the step was added), as Ray 2.60's do."""
    python_objects: bool | None = None
    """What to do with output values Arrow cannot hold (``DataContext.enable_fallback_to_arrow_object_ext_type``
    when the step was added): pickle them (None: with a warning, as Ray's default), or raise (False)."""
    user_code: bool = True
    """False for engine-provided steps (select_columns...), whose errors are not UDF errors."""
    zero_copy_batch: bool = True
    """False: every batch handed to the function is its own writable copy (numpy, pandas)."""
    max_retries: int | None = None
    """Ray's ``max_retries``: retries of a call raising one of ``retry_exceptions`` (-1: no
    limit), and of a task whose worker died; None: no retry of calls, the execution's
    ``max_task_attempts`` for dead workers."""
    retry_exceptions: bool | tuple[type[BaseException], ...] = False
    """Ray's ``retry_exceptions``: True (any exception) or the exception types whose calls are
    retried, on the same input, up to ``max_retries`` times."""
    env_vars: tuple[tuple[str, str], ...] = ()
    """Ray's ``runtime_env={"env_vars": ...}``: set in ``os.environ`` while the function runs."""
    on_error: str = "raise"
    """"raise": the first exception fails the task. "skip": the rows the function raises on are
    dropped, counted and sent to ``error_sink`` (a row stage skips each failing row; a batch
    stage splits a failing batch in halves until the failing rows are alone, so a batch
    function may see a row again: one with side effects must tolerate that)."""
    error_sink: row_errors.ErrorSink | None = None
    """Where the rows ``on_error="skip"`` dropped are written, with their errors; None: counted only."""
    _callable: Any = field(default=None, init=False, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_callable"] = None
        return state

    def prepare(self) -> Callable[..., Any]:
        """The callable to invoke: constructs a callable class once (per worker) and keeps it.
        A constructor that raises an ``Exception`` is called again, in the same process, up
        to ``CONSTRUCTOR_RETRIES`` more times (-1: until it succeeds), as Ray's
        ``DataContext.actor_init_retry_on_errors`` does.

        With ``retry_exceptions`` or ``env_vars`` it is wrapped to retry calls and to set the
        environment around each one (a generator's outputs are then produced inside the call).
        """
        if self._callable is None:
            if isinstance(self.fn, type):
                instance = self._construct(CONSTRUCTOR_RETRIES.get())
            else:
                instance = self.fn
            if _is_async(instance):
                instance = _run_to_completion(instance)
            retried = _retried_types(self.retry_exceptions)
            self._callable = _wrap_call(instance, self.env_vars, retried, self.max_retries) if retried or self.env_vars else instance
        return self._callable  # type: ignore[no-any-return]

    def _construct(self, init_retries: int) -> Any:
        attempt = 0
        while True:
            try:
                with _environment(self.env_vars):
                    return self.fn(*self.fn_constructor_args, **self.fn_constructor_kwargs)
            except Exception as err:
                if init_retries < 0 or attempt < init_retries:
                    attempt += 1
                    log.info("%s: the constructor of %s raised %r; calling it again (retry %d of %s)", self.name,
                             udf_name(self.fn), err, attempt, "unlimited" if init_retries < 0 else init_retries)
                    continue
                raise UDFFailure(f"{self.name} (constructor of {udf_name(self.fn)})", err) from err
            except USER_ERRORS as err:  # KeyboardInterrupt, SystemExit: never retried
                raise UDFFailure(f"{self.name} (constructor of {udf_name(self.fn)})", err) from err


def _retried_types(retry_exceptions: bool | tuple[type[BaseException], ...]) -> tuple[type[BaseException], ...]:
    if retry_exceptions is True:
        return (Exception,)
    return tuple(retry_exceptions or ())


@contextlib.contextmanager
def _environment(env_vars: tuple[tuple[str, str], ...]) -> Iterator[None]:
    """``env_vars`` set in ``os.environ`` inside the block, the previous values restored after."""
    if not env_vars:
        yield
        return
    saved = {name: os.environ.get(name) for name, _ in env_vars}
    os.environ.update(dict(env_vars))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _wrap_call(
    fn: Callable[..., Any],
    env_vars: tuple[tuple[str, str], ...],
    retried: tuple[type[BaseException], ...],
    max_retries: int | None,
) -> Callable[..., Any]:
    """``fn`` called with ``env_vars`` set, again on the same input (up to ``max_retries``
    times, -1: no limit) while it raises one of ``retried``. A generator's outputs are
    collected inside the call, so a retry never repeats outputs already handed on."""
    limit = 3 if max_retries is None else max_retries

    def call(*args: Any, **kwargs: Any) -> Any:
        attempt = 0
        while True:
            try:
                with _environment(env_vars):
                    result = fn(*args, **kwargs)
                    if inspect.isgenerator(result):
                        return _replay(list(result))
                    return result
            except retried:
                if 0 <= limit <= attempt:
                    raise
                attempt += 1

    return call


def _call_target(fn: Any) -> Any:
    """What calling ``fn`` runs: the function itself, or a callable instance's ``__call__``."""
    return fn if inspect.isfunction(fn) or inspect.ismethod(fn) else getattr(fn, "__call__", None)  # noqa: B004


def _is_async(fn: Any) -> bool:
    """An ``async def`` function, or a callable class whose ``__call__`` is one (a coroutine or
    an async generator), as Ray's ``map_batches`` takes."""
    call = _call_target(fn)
    return inspect.iscoroutinefunction(call) or inspect.isasyncgenfunction(call)


_loops = threading.local()


ASYNC_BATCHES = 4
ASYNC_ROWS = 16
"""Calls of an async row function (``map``, ``flat_map``, ``filter``) awaited at once in a task,
as Ray's default for row functions; outputs keep the rows' order."""
"""Batches of a task an async batch function works on at once (Ray 2.60's default for async
batch UDFs), their outputs handed on in the batches' order."""


class _AsyncCall:
    """An async ``fn`` as a plain call (``__call__``: its coroutine run to its result, or its
    async generator's outputs collected), on one event loop per thread that lives as long as the
    thread (a model's client made in ``__init__`` or at the first call stays bound to it); and,
    for a batch stage, ``outputs`` that overlaps up to ``ASYNC_BATCHES`` calls."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.generates = inspect.isasyncgenfunction(_call_target(fn))
        """An async generator: a call's outputs are several (else the one its coroutine returns)."""

    @staticmethod
    def loop() -> Any:
        loop = getattr(_loops, "loop", None)
        if loop is None:
            import asyncio  # (here: 16 ms that import dataflow would pay for every script)

            loop = _loops.loop = asyncio.new_event_loop()
        return loop

    async def _results(self, *args: Any, **kwargs: Any) -> list[Any]:
        """Every output of one call (an async generator's, or the one a coroutine returns)."""
        result = self.fn(*args, **kwargs)
        if inspect.isasyncgen(result):
            return [out async for out in result]
        return [await result] if inspect.isawaitable(result) else [result]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The coroutine's value (a row function's row), or a generator of an async
        generator's outputs (as a plain generator function's call gives them)."""
        outputs = self.loop().run_until_complete(self._results(*args, **kwargs))
        return _replay(outputs) if self.generates else outputs[0]

    def outputs(self, batches: Iterable[Any], failed: Callable[[BaseException], BaseException],
                *args: Any, **kwargs: Any) -> Iterator[Any]:
        """The outputs of a call per batch, in the batches' order, with up to ``ASYNC_BATCHES``
        calls awaited together (what an async function is for: a model server's or an API's
        latency overlaps); what a call raises is raised as ``failed(error)``, and cancels the
        calls still running."""
        for outputs in self.calls(batches, failed, ASYNC_BATCHES, *args, **kwargs):
            yield from outputs

    def calls(self, items: Iterable[Any], failed: Callable[[BaseException], BaseException], at_once: int,
              *args: Any, **kwargs: Any) -> Iterator[list[Any]]:
        """Each item's call's outputs (a list), in the items' order, with up to ``at_once``
        calls awaited together; see ``outputs``."""
        loop = self.loop()
        running: collections.deque[Any] = collections.deque()

        def finish(task: Any) -> list[Any]:
            try:
                return loop.run_until_complete(task)  # type: ignore[no-any-return]
            except USER_ERRORS as err:
                wrapped = failed(err)
                if wrapped is err:
                    raise
                raise wrapped from err

        try:
            for item in items:
                running.append(loop.create_task(self._results(item, *args, **kwargs)))
                if len(running) >= at_once:
                    yield finish(running.popleft())
            while running:
                yield finish(running.popleft())
        finally:
            for task in running:
                task.cancel()
            if running:
                import asyncio

                loop.run_until_complete(asyncio.gather(*running, return_exceptions=True))


def _run_to_completion(fn: Callable[..., Any]) -> _AsyncCall:
    return _AsyncCall(fn)


def _writable_array(values: Any) -> Any:
    if not isinstance(values, np.ndarray):
        return values
    if values.dtype != object:
        return np.array(values, copy=True)
    copied = np.empty(len(values), dtype=object)  # ragged cells are arrays of their own
    for i, cell in enumerate(values):
        copied[i] = np.array(cell, copy=True) if isinstance(cell, np.ndarray) else cell
    return copied


def _replay(outputs: list[Any]) -> Iterator[Any]:
    yield from outputs


def writable_batch(batch: Any) -> Any:
    """A copy of ``batch`` whose arrays the function may write into (``zero_copy_batch=False``)."""
    if isinstance(batch, dict):
        return {name: _writable_array(values) for name, values in batch.items()}
    if type(batch).__module__.split(".")[0] == "pandas":
        return batch.copy(deep=True)
    return batch  # Arrow tables and polars frames are immutable: nothing to write into


class TaskTransform:
    """What a task runs over its input blocks; pickled once per operator, cached by workers."""

    name: str = "Transform"
    max_retries: int | None = None
    """Retries of a task whose worker died (-1: no limit); None: the execution's ``max_task_attempts``."""
    configs: dict[str, Any] | None = None
    """The key-value settings of the driver's context (``DataContext.set_config``) as the
    execution started; its tasks see them (``engine.task.task_configs``)."""
    error_retries: Any = None
    """An ``engine.task.ErrorRetries``: which user errors run a task again, how many times."""
    init_retries: int = 0
    """How many more times a callable class's constructor that raised is called, in the same
    worker, before its error fails the task (-1: no limit); Ray's ``actor_init_retry_on_errors``
    and ``actor_init_max_retries``."""

    def prepare(self) -> None:
        """Construct what is costly once per worker (an actor's callable class)."""

    def __call__(self, blocks: Iterable[pa.Table], params: Any = None) -> Iterator[pa.Table]:
        raise NotImplementedError

    def count_rows(self, blocks: Iterable[pa.Table]) -> int:
        """Rows the transform would output (a ``count()`` whose last task runs it)."""
        return sum(table.num_rows for table in self(blocks))


class BlockTransform(TaskTransform):
    """Run a list of stages over a stream of blocks."""

    def __init__(self, stages: list[Stage], target_block_bytes: int = 128 << 20) -> None:
        self.stages = stages
        self.target_block_bytes = target_block_bytes

    @property
    def name(self) -> str:
        return "->".join(s.name for s in self.stages) or "Identity"

    @property
    def max_retries(self) -> int | None:  # type: ignore[override]
        """The most ``max_retries`` any stage asks for (-1, no limit, wins); None if none does."""
        asked = [s.max_retries for s in self.stages if s.max_retries is not None]
        if not asked:
            return None
        return -1 if -1 in asked else max(asked)

    def prepare(self) -> None:
        """Construct callable classes now (an actor's constructor runs before its first batch)."""
        for stage in self.stages:
            stage.prepare()

    def __call__(self, blocks: Iterable[pa.Table], params: Any = None) -> Iterator[pa.Table]:
        return _shape_output(self._run(iter(blocks), len(self.stages)), self.target_block_bytes)

    def count_rows(self, blocks: Iterable[pa.Table]) -> int:
        """Rows the transform would output; trailing row stages are counted, not turned into tables."""
        tail = len(self.stages)
        while tail > 0 and self.stages[tail - 1].kind == "rows":
            tail -= 1
        stream = self._run(iter(blocks), tail)
        if tail == len(self.stages):
            return sum(block.num_rows for block in stream)
        return sum(len(rows) for rows in _row_lists(self.stages[tail:], stream))

    def _run(self, stream: Iterator[pa.Table], end: int) -> Iterator[pa.Table]:
        """The blocks after the first ``end`` stages."""
        i = 0
        while i < end:
            stage = self.stages[i]
            if stage.kind == "rows":
                j = i
                while j < end and self.stages[j].kind == "rows":
                    j += 1
                stream = _run_row_stages(self.stages[i:j], stream)
                i = j
            else:
                stream = _run_batch_stage(stage, stream)
                i += 1
        return stream


def call_stage(stage: Stage, fn: Callable[..., Any], value: Any) -> Any:
    """``fn(value)`` with the stage's arguments; what it raises is reported as the stage's."""
    try:
        return fn(value, *stage.fn_args, **stage.fn_kwargs)
    except UDFFailure:
        raise
    except USER_ERRORS as err:
        if not stage.user_code:
            raise
        raise UDFFailure(stage.name, err) from err


def _row_lists(stages: list[Stage], blocks: Iterator[pa.Table]) -> Iterator[list[Any]]:
    """Rows of each block through every row stage, one list comprehension per stage."""
    fns = [(s, s.prepare(), _skip_failing_rows if s.on_error == "skip" else _apply_row_stage) for s in stages]
    last = stages[-1]
    for block in blocks:
        for start in range(0, block.num_rows, ROW_CHUNK):
            rows = rows_of(slice_rows(block, start, ROW_CHUNK))
            for stage, fn, apply in fns:
                rows = apply(stage, fn, rows)
                if not rows:
                    break
                if stage is not last and stage.row_mode != "filter":
                    rows = _as_next_stage_sees(stage, rows)
            if rows:
                if not all(type(r) is dict for r in rows) and not all(isinstance(r, Mapping) for r in rows):
                    bad = next(r for r in rows if not isinstance(r, Mapping))
                    err = UDFOutputError(f"a row function must return a dict, got {type(bad).__name__}")
                    raise UDFFailure(stages[-1].name, err)
                yield rows


_PLAIN = frozenset({int, float, str, bool, bytes, type(None)})


def _as_next_stage_sees(stage: Stage, rows: list[Any]) -> list[Any]:
    """A row function's output rows as the next fused row function should see them: as Ray
    gives them, through a block (a torch tensor becomes a numpy array, a numpy scalar a Python
    number, a tuple a list). Rows of plain values (and numeric arrays, which stay arrays) are
    passed on as they are; the others make the trip through Arrow."""
    for row in rows:
        if type(row) is not dict:
            return rows_of(_rows_block(stage, rows))
        for value in row.values():
            kind = type(value)
            if kind in _PLAIN or (kind is np.ndarray and value.ndim and value.dtype.kind in "biufc"):
                continue
            return rows_of(_rows_block(stage, rows))
    return rows


def _run_row_stages(stages: list[Stage], blocks: Iterator[pa.Table]) -> Iterator[pa.Table]:
    for rows in _row_lists(stages, blocks):
        yield _rows_block(stages[-1], rows)


def _rows_block(stage: Stage, rows: list[Any]) -> pa.Table:
    try:
        return rows_to_block(rows, stage.python_objects)
    except (TypeError, ValueError) as err:
        raise UDFFailure(stage.name, err, "(converting its output rows)") from err


def _apply_row_stage(stage: Stage, fn: Callable[..., Any], rows: list[Any]) -> list[Any]:
    args, kwargs = stage.fn_args, stage.fn_kwargs
    if isinstance(fn, _AsyncCall) and (stage.row_mode == "flat_map" or not fn.generates):
        return _apply_async_rows(stage, fn, rows)
    try:
        if stage.row_mode == "map":
            if args or kwargs:
                return [fn(r, *args, **kwargs) for r in rows]
            return [fn(r) for r in rows]
        if stage.row_mode == "filter":
            if args or kwargs:
                return [r for r in rows if fn(r, *args, **kwargs)]
            return [r for r in rows if fn(r)]
        if stage.row_mode == "flat_map":
            if args or kwargs:
                return [out for r in rows for out in _rows_out(fn(r, *args, **kwargs))]
            return [out for r in rows for out in _rows_out(fn(r))]
    except UDFFailure:
        raise
    except USER_ERRORS as err:
        if not stage.user_code:
            raise
        raise UDFFailure(stage.name, err) from err
    msg = f"unknown row mode {stage.row_mode!r}"
    raise ValueError(msg)


def _rows_out(out: Any) -> Any:
    """What one ``flat_map`` call returned, if it is rows: a list or another iterable, not one row
    (a dict, whose keys would be taken for rows), a string or None. Ray refuses these too."""
    if type(out) is list:  # (the common case, first: an ABC's isinstance costs ~0.2 us a row)
        return out
    if out is None or isinstance(out, (Mapping, str, bytes)) or not hasattr(out, "__iter__"):
        msg = f"a flat_map function must return a list (or another iterable) of rows, got {type(out).__name__}"
        raise UDFOutputError(msg)
    return out


def _apply_async_rows(stage: Stage, fn: _AsyncCall, rows: list[Any]) -> list[Any]:
    """``_apply_row_stage`` for an async function: up to ``ASYNC_ROWS`` calls awaited at once."""

    def failed(err: BaseException) -> BaseException:
        return UDFFailure(stage.name, err) if stage.user_code and not isinstance(err, UDFFailure) else err

    calls = fn.calls(rows, failed, ASYNC_ROWS, *stage.fn_args, **stage.fn_kwargs)
    try:
        if stage.row_mode == "map":
            return [outputs[0] for outputs in calls]
        if stage.row_mode == "filter":
            return [row for row, outputs in zip(rows, calls, strict=True) if outputs[0]]
        if fn.generates:  # an async generator's rows
            return [out for outputs in calls for out in outputs]
        try:  # a coroutine returning the rows
            return [out for outputs in calls for out in _rows_out(outputs[0])]
        except (TypeError, ValueError) as err:
            raise failed(err) from err
    finally:
        calls.close()


def _skip_failing_rows(stage: Stage, fn: Callable[..., Any], rows: list[Any]) -> list[Any]:
    """``_apply_row_stage`` for ``on_error="skip"``: a row the function raises on (or returns
    something other than a dict for) is dropped and reported; the others go on."""
    args, kwargs, mode = stage.fn_args, stage.fn_kwargs, stage.row_mode
    kept: list[Any] = []
    for row in rows:
        try:
            if mode == "filter":
                if fn(row, *args, **kwargs):
                    kept.append(row)
                continue
            out = [fn(row, *args, **kwargs)] if mode == "map" else list(_rows_out(fn(row, *args, **kwargs)))
            bad = next((r for r in out if not isinstance(r, Mapping)), None)
            if bad is not None:
                msg = f"a row function must return a dict, got {type(bad).__name__}"
                raise UDFOutputError(msg)
            kept.extend(out)
        except Exception as err:  # KeyboardInterrupt and SystemExit still end the task
            row_errors.skipped(stage.name, stage.error_sink, row, err)
    return kept


def _rebatch(blocks: Iterator[pa.Table], batch_size: int | None) -> Iterator[pa.Table]:
    """Tables of exactly ``batch_size`` rows (the last may be short); None: one per block."""
    if batch_size is None:
        for block in blocks:
            if block.num_rows:
                yield block
        return
    pending: list[pa.Table] = []
    have = 0
    for block in blocks:
        offset = 0
        while offset < block.num_rows:
            take = min(batch_size - have, block.num_rows - offset)
            pending.append(block.slice(offset, take))
            have += take
            offset += take
            if have == batch_size:
                yield concat_blocks(pending)
                pending, have = [], 0
    if have:
        yield concat_blocks(pending)


def _run_batch_stage(stage: Stage, blocks: Iterator[pa.Table]) -> Iterator[pa.Table]:
    fn = stage.prepare()
    if stage.on_error == "skip":
        for batch in _rebatch(blocks, stage.batch_size):
            yield from _skip_failing_batch_rows(stage, fn, batch)
        return
    if isinstance(fn, _AsyncCall):  # (not wrapped for retries or env_vars: those call it one at a time)
        yield from _run_async_batches(stage, fn, blocks)
        return
    for batch in _rebatch(blocks, stage.batch_size):
        formatted = to_batch(batch, stage.batch_format, stage.arrow_backed_pandas)
        if not stage.zero_copy_batch:
            formatted = writable_batch(formatted)
        result = call_stage(stage, fn, formatted)
        outputs = result if inspect.isgenerator(result) else (result,)
        try:
            for out in outputs:
                yield to_block(out, stage.python_objects)
        except (UDFFailure, GeneratorExit):
            raise
        except USER_ERRORS as err:
            if not stage.user_code:
                raise
            raise UDFFailure(stage.name, err) from err


def _run_async_batches(stage: Stage, fn: _AsyncCall, blocks: Iterator[pa.Table]) -> Iterator[pa.Table]:
    """An async batch function's outputs, up to ``ASYNC_BATCHES`` batches awaited together."""

    def formatted() -> Iterator[Any]:
        for batch in _rebatch(blocks, stage.batch_size):
            out = to_batch(batch, stage.batch_format, stage.arrow_backed_pandas)
            yield out if stage.zero_copy_batch else writable_batch(out)

    def failed(err: BaseException) -> BaseException:
        return UDFFailure(stage.name, err) if stage.user_code and not isinstance(err, UDFFailure) else err

    outputs = fn.outputs(formatted(), failed, *stage.fn_args, **stage.fn_kwargs)
    try:
        for out in outputs:
            try:
                block = to_block(out, stage.python_objects)
            except USER_ERRORS as err:  # (what the function returned does not make a block)
                wrapped = failed(err)
                if wrapped is err:
                    raise
                raise wrapped from err
            yield block
    finally:
        outputs.close()  # (a consumer that stops early cancels the calls still running)


def _skip_failing_batch_rows(stage: Stage, fn: Callable[..., Any], batch: pa.Table) -> Iterator[pa.Table]:
    """The outputs of ``fn`` over ``batch`` without the rows it raises on: a failing batch is
    split in halves, each tried again (in order), down to single rows, which are dropped and
    reported. One bad row in n costs about 2 log2(n) extra calls; outputs of a call are only
    handed on once the whole call succeeded."""
    pending = [batch]
    while pending:
        table = pending.pop()
        formatted = to_batch(table, stage.batch_format, stage.arrow_backed_pandas)
        if not stage.zero_copy_batch:
            formatted = writable_batch(formatted)
        try:
            result = fn(formatted, *stage.fn_args, **stage.fn_kwargs)
            objects = stage.python_objects
            outputs = ([to_block(out, objects) for out in result] if inspect.isgenerator(result)
                       else [to_block(result, objects)])
        except Exception as err:  # KeyboardInterrupt and SystemExit still end the task
            if table.num_rows > 1:
                half = table.num_rows // 2
                pending += [table.slice(half), table.slice(0, half)]
            else:
                row_errors.skipped(stage.name, stage.error_sink, rows_of(table)[0] if table.num_rows else None, err)
            continue
        yield from outputs


def _shape_output(blocks: Iterator[pa.Table], target_bytes: int) -> Iterator[pa.Table]:
    """Coalesce small outputs and split big ones so blocks are near ``target_bytes``."""
    pending: list[pa.Table] = []
    size = 0
    for block in blocks:
        if block.num_rows == 0 and block.num_columns == 0:
            continue
        nbytes = block.nbytes  # (once: pyarrow walks every column to compute it)
        if nbytes > target_bytes and block.num_rows > 1:
            yield from _flush(pending)
            pending, size = [], 0
            pieces = -(-nbytes // target_bytes)
            step = -(-block.num_rows // pieces)
            for start in range(0, block.num_rows, step):
                yield slice_rows(block, start, step)
            continue
        if pending and (size + nbytes > target_bytes or block.schema != pending[0].schema):
            yield from _flush(pending)
            pending, size = [], 0
        pending.append(block)
        size += nbytes
    yield from _flush(pending)


def _flush(pending: list[pa.Table]) -> Iterator[pa.Table]:
    if len(pending) == 1:
        yield pending[0]
    elif pending:
        yield concat_blocks(pending)

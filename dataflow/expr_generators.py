"""Expressions that make values rather than compute them from columns: Ray Data 2.60's
``random()``, ``uuid()``, ``monotonically_increasing_id()`` and ``download(column)``.

    ds.with_column("rand", random(seed=42))
    ds.with_column("uid", monotonically_increasing_id())
    ds.with_column("bytes", download("uri"))

They run on the data (a filter of one is never pushed into a read) and know the task that
evaluates them (``engine.task.current_task``): its number within its operator, the same on a
retry, and state kept across its batches.

* ``monotonically_increasing_id()``: the task's number in the upper 31 bits, the row's position
  among the task's rows in the lower 33, as Ray's. Unique in the dataset, increasing within a
  task, not consecutive across tasks.
* ``random(seed=None, reseed_after_execution=True)``: float64 in [0, 1). The generator of each
  batch is seeded from the seed, the task's number and the batch's position in the task, and,
  with ``reseed_after_execution``, the number of the execution in this process (any
  dataset's, as Ray's ``DataContext`` counts them): a retried task draws the same values; each
  epoch of a training loop, and the same dataset built again, new ones. Without a seed every execution draws new values. As in Ray, a rerun reproduces the
  draws where each task gets the same inputs (a read of the same files, blocks taken one per
  task); small blocks bundled into tasks as they arrive can be bundled differently.
* ``uuid()``: a random (version 4) UUID string for each row.
* ``download(uri_column, filesystem=None, on_error="null")``: the bytes at each row's URI
  (local paths, ``s3://``, any fsspec scheme), fetched on up to ``DOWNLOAD_THREADS`` threads
  with the connectors' retries. A null URI gives null. A URI that cannot be read gives null
  as in Ray, and a warning names it and the error (Ray logs it at debug level only);
  ``on_error="raise"`` fails the task with an error that names it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import pyarrow as pa

from dataflow.expressions import ColumnExpr, Expr, NotPushable, _check_columns, _Context

ID_TASK_SHIFT = 33
"""Bits of a generated id that count rows within a task (Ray's layout)."""
DOWNLOAD_THREADS = 16
"""Concurrent fetches of one ``download`` column in a task (Ray's ``URI_DOWNLOAD_MAX_WORKERS``)."""


class _Generated(Expr):
    """An expression whose values come from the task that evaluates it, not from columns."""

    def _arrow(self, ctx: _Context) -> Any:
        if ctx.table is None:
            raise NotPushable(f"{self!r} runs on the data: it has no pyarrow.compute.Expression form")
        return self._generate(ctx.table)

    def _generate(self, table: pa.Table) -> pa.Array:
        raise NotImplementedError

    def structurally_equals(self, other: Any) -> bool:
        return False  # two of them give different values


def _task_state() -> tuple[int, dict[Any, Any]]:
    """(the running task's number, its per-task state); outside a task (an ``evaluate`` call of
    the user's) number 0 and state that lasts for the call."""
    from engine.task import current_task

    scope = current_task()
    return (0, {}) if scope is None else (max(scope.task_index, 0), scope.state)


@dataclass(frozen=True, eq=False, repr=False)
class MonotonicallyIncreasingIdExpr(_Generated):
    """Ray's ``monotonically_increasing_id()``: unique, increasing within a task."""

    def _generate(self, table: pa.Table) -> pa.Array:
        task, state = _task_state()
        key = ("monotonically_increasing_id", id(self))
        start = state.get(key, 0)
        state[key] = start + table.num_rows
        base = (task << ID_TASK_SHIFT) + start
        return pa.array(np.arange(base, base + table.num_rows, dtype=np.int64))

    def __repr__(self) -> str:
        return "MONOTONICALLY_INCREASING_ID()"


@dataclass(frozen=True, eq=False, repr=False)
class RandomExpr(_Generated):
    """Ray's ``random(seed=None, reseed_after_execution=True)``: float64 in [0, 1) for each row."""

    seed: int | None = None
    reseed_after_execution: bool = True
    execution: int | None = None
    """Set in the copy bound to one execution (``for_execution``): the execution's number, or
    the entropy drawn for it when there is no seed."""

    def structurally_equals(self, other: Any) -> bool:
        return (isinstance(other, RandomExpr) and self.seed == other.seed
                and self.reseed_after_execution == other.reseed_after_execution)

    def for_execution(self) -> RandomExpr:
        """A copy for one execution of the plan: the execution's number (or fresh entropy)."""
        from dataflow.random_seed import execution_number

        number = execution_number()
        if self.seed is None:
            return replace(self, execution=int.from_bytes(os.urandom(8)) >> 1)
        return replace(self, execution=number if self.reseed_after_execution else 0)

    def _generate(self, table: pa.Table) -> pa.Array:
        task, state = _task_state()
        key = ("random", id(self))
        batch = state.get(key, 0)
        state[key] = batch + 1
        execution = self.execution
        if execution is None:  # not bound to an execution (evaluated by hand, or in a group)
            execution = int.from_bytes(os.urandom(8)) >> 1 if self.seed is None else 0
        entropy = [execution, task, batch] if self.seed is None else [int(self.seed) & (2**63 - 1), execution, task, batch]
        return pa.array(np.random.default_rng(entropy).random(table.num_rows))

    def __repr__(self) -> str:
        if self.seed is None:
            return "RANDOM()"
        return f"RANDOM(seed={self.seed}, reseed_after_execution={self.reseed_after_execution})"


@dataclass(frozen=True, eq=False, repr=False)
class UUIDExpr(_Generated):
    """Ray's ``uuid()``: a version 4 UUID string (``8-4-4-4-12`` hex digits) for each row."""

    def _generate(self, table: pa.Table) -> pa.Array:
        n = table.num_rows
        raw = np.frombuffer(os.urandom(16 * n), dtype=np.uint8).reshape(n, 16).copy()
        raw[:, 6] = (raw[:, 6] & 0x0F) | 0x40  # version 4
        raw[:, 8] = (raw[:, 8] & 0x3F) | 0x80  # RFC 4122 variant
        digits = np.frombuffer(raw.tobytes().hex().encode(), dtype=np.uint8).reshape(n, 32)
        text = np.full((n, 36), ord("-"), dtype=np.uint8)
        for start, stop, at in ((0, 8, 0), (8, 12, 9), (12, 16, 14), (16, 20, 19), (20, 32, 24)):  # 8-4-4-4-12
            text[:, at : at + stop - start] = digits[:, start:stop]
        offsets = np.arange(0, 36 * n + 1, 36, dtype=np.int32)
        return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(text))

    def structurally_equals(self, other: Any) -> bool:
        return isinstance(other, UUIDExpr)

    def __repr__(self) -> str:
        return "UUID()"


@dataclass(frozen=True, eq=False, repr=False)
class DownloadExpr(_Generated):
    """Ray's ``download(uri_column_name, filesystem=None)``: the bytes at each row's URI."""

    uri_column_name: str
    filesystem: Any = None
    on_error: str = "null"

    def _children(self) -> tuple[Expr, ...]:
        return (ColumnExpr(self.uri_column_name),)

    def structurally_equals(self, other: Any) -> bool:
        return isinstance(other, DownloadExpr) and self.uri_column_name == other.uri_column_name

    def _generate(self, table: pa.Table) -> pa.Array:
        from connectors.download import download_all

        _check_columns(table, self, f"download({self.uri_column_name!r})")
        uris = table.column(self.uri_column_name)
        if not (pa.types.is_string(uris.type) or pa.types.is_large_string(uris.type)):
            msg = f"download({self.uri_column_name!r}): the column holds {uris.type}, not URI strings"
            raise TypeError(msg)
        return download_all(uris.to_pylist(), self.filesystem, self.on_error, DOWNLOAD_THREADS)

    def __repr__(self) -> str:
        return f"DOWNLOAD({self.uri_column_name!r})"


def bind_for_execution(expr: Expr) -> Expr:
    """``expr`` with each ``RandomExpr`` in it bound to one execution (the tree is rebuilt only
    where one is found)."""
    if isinstance(expr, RandomExpr):
        return expr.for_execution()
    if not any(isinstance(node, RandomExpr) for node in expr._walk()):
        return expr
    changes = {}
    for f in fields(expr):  # type: ignore[arg-type]
        value = getattr(expr, f.name)
        if isinstance(value, Expr):
            changes[f.name] = bind_for_execution(value)
        elif isinstance(value, tuple):
            changes[f.name] = tuple(_bind_item(item) for item in value)
    return replace(expr, **changes)  # type: ignore[type-var]


def _bind_item(item: Any) -> Any:
    if isinstance(item, Expr):
        return bind_for_execution(item)
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], Expr):  # (keyword, expr)
        return (item[0], bind_for_execution(item[1]))
    return item


def monotonically_increasing_id() -> MonotonicallyIncreasingIdExpr:
    """Unique int64 ids: the task's number in the upper 31 bits, the row's position among the
    task's rows in the lower 33 (Ray's layout). Increasing within a task, not consecutive."""
    return MonotonicallyIncreasingIdExpr()


def random(*, seed: int | None = None, reseed_after_execution: bool = True) -> RandomExpr:
    """A float64 in [0, 1) for each row. With ``seed``, reproducible: a rerun draws the same
    values when ``reseed_after_execution=False``, and the same sequence of per-execution
    values when it is True (each execution of the dataset draws new ones)."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
        msg = f"random(seed=...) takes an int or None, got {seed!r}"
        raise TypeError(msg)
    return RandomExpr(seed=None if seed is None else int(seed), reseed_after_execution=bool(reseed_after_execution))


def uuid() -> UUIDExpr:
    """A random (version 4) UUID string for each row."""
    return UUIDExpr()


def download(uri_column_name: str, *, filesystem: Any = None, on_error: str = "null") -> DownloadExpr:
    """The bytes at the URI in column ``uri_column_name`` of each row (local, ``s3://``, or any
    fsspec scheme; ``filesystem``: a pyarrow or fsspec filesystem to read them with). A row whose
    URI is null, or cannot be read, gets null (a warning names the URIs that failed);
    ``on_error="raise"`` fails instead, naming the URI."""
    if not isinstance(uri_column_name, str) or not uri_column_name:
        msg = f"download() takes the name of a column of URIs, got {uri_column_name!r}"
        raise TypeError(msg)
    if on_error not in ("null", "raise"):
        msg = f"download(on_error=...) is 'null' or 'raise', got {on_error!r}"
        raise ValueError(msg)
    return DownloadExpr(uri_column_name, filesystem, on_error)

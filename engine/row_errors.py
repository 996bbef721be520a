"""Rows a UDF failed on under ``on_error="skip"``: counted, and recorded for the error sink.

A stage that skips a row reports it with ``skipped``. ``run_task`` opens a ``RowErrorLog``
for the task (``start``/``stop``, on the task's own thread): the counts travel back in the
task's result (per exception type, summed per operator in ``stats()``), and the rows of a
stage with an error sink are written by the task itself, as Parquet files of
``ROW_ERROR_SCHEMA`` (one per task, more when it skips more than ``FLUSH_ROWS`` rows).
A stage with no sink costs a count per skipped row: no traceback is formatted.
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

ON_ERROR = ("raise", "skip")
"""``on_error`` values: "raise" fails the job on the first error (the default), "skip" drops
the rows the UDF fails on (a batch is split until the failing rows are alone)."""

logger = logging.getLogger("dataflow.errors")

FLUSH_ROWS = 10_000
"""Skipped rows one task holds for its error sink before writing them out."""

ROW_ERROR_SCHEMA = pa.schema([
    ("operator", pa.string()),
    ("exception_type", pa.string()),
    ("message", pa.string()),
    ("traceback", pa.string()),
    ("row", pa.string()),
    ("input_file", pa.string()),
])
"""One skipped row in an error sink: the UDF's step (``Map(parse)``), what it raised, the
traceback (engine frames removed), the row's values as JSON text, and the file the task was
reading when the row failed (null when the rows did not come from files in this task)."""


class ErrorSink(Protocol):
    """Where the rows a stage skipped go (``connectors.error_sink.ParquetErrorSink``)."""

    path: str

    def write(self, table: pa.Table, task_index: int) -> None:
        """Store ``table`` (``ROW_ERROR_SCHEMA``) as a new file; never overwrites."""


@dataclass
class RowErrorLog:
    """What one task skipped."""

    task_index: int = 0
    input_files: tuple[str, ...] = ()
    """The files of the read task whose rows are flowing now (empty: not read in this task)."""
    counts: dict[str, int] = field(default_factory=dict)
    """Rows skipped per exception type."""
    _records: dict[int, tuple[ErrorSink, list[dict[str, Any]]]] = field(default_factory=dict)

    def skipped(self, operator: str, sink: ErrorSink | None, row: Any, err: BaseException) -> None:
        name = type(err).__name__
        self.counts[name] = self.counts.get(name, 0) + 1
        if sink is None:
            return
        from engine.task import trimmed_traceback

        _, records = self._records.setdefault(id(sink), (sink, []))
        records.append({
            "operator": operator,
            "exception_type": name,
            "message": str(err),
            "traceback": trimmed_traceback(err),
            "row": row_json(row),
            "input_file": ", ".join(self.input_files) or None,
        })
        if len(records) >= FLUSH_ROWS:
            self._write(sink, records)

    def flush(self) -> None:
        """Write every record still held to its sink."""
        for sink, records in list(self._records.values()):
            self._write(sink, records)

    def _write(self, sink: ErrorSink, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        from engine.transform import UDFFailure

        table = pa.Table.from_pylist(records, schema=ROW_ERROR_SCHEMA)
        records.clear()
        try:
            sink.write(table, self.task_index)
        except Exception as err:
            raise UDFFailure(f"the error sink {sink.path}", err, "(writing the rows on_error='skip' dropped)") from err


_local = threading.local()


def start(task_index: int) -> RowErrorLog:
    """Open the log of the task this thread runs now."""
    log = RowErrorLog(task_index)
    _local.log = log
    return log


def stop() -> None:
    """Close this thread's log (its task is over)."""
    _local.log = None


def current() -> RowErrorLog | None:
    return getattr(_local, "log", None)


def note_input_files(files: tuple[str, ...] | list[str]) -> None:
    """The rows that follow come from ``files`` (a read task of this task starts)."""
    log = current()
    if log is not None:
        log.input_files = tuple(files)


def skipped(operator: str, sink: ErrorSink | None, row: Any, err: BaseException) -> None:
    """Step ``operator`` dropped ``row`` because it raised ``err`` (outside a task: not counted)."""
    log = current()
    if log is not None:
        log.skipped(operator, sink, row, err)


def log_errored_block(operator: str, error: BaseException, used: int, limit: int) -> None:
    """A failed task of ``operator`` was let go under ``max_errored_blocks`` (its output dropped)."""
    left = "no limit" if limit < 0 else f"{limit - used} more may fail"
    logger.warning(
        "a task of %s failed; its output is dropped and the job goes on (DataContext.max_errored_blocks=%d, %s): %s",
        operator, limit, left, error,
    )


def row_json(row: Any) -> str:
    """A row's values as JSON text (arrays as lists, bytes as base64, times in ISO format)."""
    try:
        return json.dumps(row, default=_json_value, ensure_ascii=False)
    except (TypeError, ValueError):  # keys that are not strings, circular values...
        return json.dumps(repr(row))


def _json_value(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (bytes, bytearray, memoryview)):
        import base64  # rare: a bad row with binary values

        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    return str(value)

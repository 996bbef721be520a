"""JSON files: JSON Lines (one object per line) through ``pyarrow.json``, and JSON arrays.

A file whose first non-blank character is ``[`` is read as one array of objects (with the
standard library, then ``pa.Table.from_pylist``); anything else as JSON Lines, with pyarrow's
``read_options``/``parse_options`` passed through. A malformed line raises ``FileFormatError``
naming the file, the row (1-based) and, for a type change, the column.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json as stdlib_json
import re
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.json as pajson

from connectors.errors import FileFormatError
from connectors.file_datasink import FileDatasink
from connectors.file_datasource import FileDatasource, FilePiece
from connectors.filesystem import read_file_bytes
from connectors.retry import Retrier

_ROW = re.compile(r"in row (\d+)")
_COLUMN = re.compile(r"Column\(/?([^)]*)\)")


class JSONDatasource(FileDatasource):
    """Rows of ``.json``/``.jsonl`` files (JSON Lines or a top-level array of objects)."""

    FILE_EXTENSIONS = (".json", ".jsonl", ".ndjson")
    DEFAULT_PARTITIONING = "hive"

    def __init__(
        self,
        paths: Any,
        *,
        read_options: pajson.ReadOptions | None = None,
        parse_options: pajson.ParseOptions | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(paths, **kwargs)
        self._read_options = read_options or pajson.ReadOptions()
        self._parse_options = parse_options or pajson.ParseOptions()

    def _read_file(self, fs: Any, piece: FilePiece, display: str, retrier: Retrier) -> Iterator[pa.Table]:
        data = read_file_bytes(fs, piece.entry.path, retrier, display)
        yield parse_json(data, display, self._read_options, self._parse_options)


def parse_json(
    data: bytes, display: str, read_options: pajson.ReadOptions, parse_options: pajson.ParseOptions
) -> pa.Table:
    """``data`` as a table: a JSON array of objects, or JSON Lines."""
    if data.lstrip()[:1] == b"[":
        try:
            rows = stdlib_json.loads(data)
        except ValueError as exc:
            raise FileFormatError(f"invalid JSON: {exc}", path=display) from exc
        if not all(isinstance(row, dict) for row in rows):
            raise FileFormatError("a JSON array must hold objects (one per row)", path=display)
        try:
            return pa.Table.from_pylist(rows)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise FileFormatError(f"rows do not share column types: {exc}", path=display) from exc
    if not data.strip():
        return pa.table({})
    try:
        return pajson.read_json(pa.BufferReader(data), read_options, parse_options)
    except pa.ArrowInvalid as exc:
        message = str(exc)
        row = _ROW.search(message)
        column = _COLUMN.search(message)
        raise FileFormatError(
            f"could not parse as JSON Lines: {message}",
            path=display,
            row=int(row.group(1)) + 1 if row else None,
            column=column.group(1) if column and column.group(1) else None,
        ) from exc


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


class JSONDatasink(FileDatasink):
    """JSON Lines files (one object per row) under ``path``, staged and committed.

    Bytes are written as base64, dates and times as ISO 8601 strings, decimals as strings.
    """

    EXTENSION = ".json"

    def _encode(self, tables: list[pa.Table]) -> pa.Buffer:
        lines = [
            stdlib_json.dumps(row, default=_json_default, ensure_ascii=False)
            for table in tables
            for row in table.to_pylist()
        ]
        return pa.py_buffer(("\n".join(lines) + "\n").encode())

"""Avro object container files, read as a stream with ``fastavro`` (the optional ``avro`` extra).

Each record becomes a row, each top-level field a column. The Arrow types come from the file's
Avro schema, so every block of every file with that schema has the same types (a field that
is null in a whole block is not left typeless):

========================================  ===================================================
Avro                                      Arrow
========================================  ===================================================
``boolean``                               ``bool``
``int``, ``long``                         ``int64`` (as Ray Data, which infers Python ints)
``float``, ``double``                     ``float64`` (as Ray Data)
``string``, ``enum``, ``uuid``            ``string`` (a uuid's text)
``bytes``, ``fixed``                      ``binary``
``["null", T]``                           T's type, with nulls
``record``                                ``struct``
``array<T>``, ``map<T>``                  ``list<T>``, ``map<string, T>``
``date``; ``time-millis``/``-micros``     ``date32``; ``time32[ms]``/``time64[us]``
``timestamp-millis``/``-micros``          ``timestamp[us, tz=UTC]`` (``local-``: no zone)
``decimal(p, s)``                         ``decimal128(p, s)`` (``decimal256`` past 38 digits)
========================================  ===================================================

A schema with a union of several non-null types has no single Arrow type: its blocks are then
built from the values (Arrow's inference, as Ray Data does for every file). Codecs: ``null``,
``deflate`` and the others fastavro reads with their libraries installed.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from connectors.errors import FileFormatError
from connectors.file_datasource import FileDatasource, FilePiece
from connectors.filesystem import iter_stream
from connectors.retry import Retrier

ROWS_PER_TABLE = 8192
"""Records turned into one table at a time (the base coalesces them into blocks)."""

_PRIMITIVES: dict[str, pa.DataType] = {
    "null": pa.null(),
    "boolean": pa.bool_(),
    "int": pa.int64(),
    "long": pa.int64(),
    "float": pa.float64(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}
_LOGICAL: dict[tuple[str, str], pa.DataType] = {
    ("int", "date"): pa.date32(),
    ("int", "time-millis"): pa.time32("ms"),
    ("long", "time-micros"): pa.time64("us"),
    ("long", "timestamp-millis"): pa.timestamp("us", tz="UTC"),
    ("long", "timestamp-micros"): pa.timestamp("us", tz="UTC"),
    ("long", "local-timestamp-millis"): pa.timestamp("us"),
    ("long", "local-timestamp-micros"): pa.timestamp("us"),
}


class _NoArrowType(Exception):
    """A schema with no single Arrow type (a union of several non-null types)."""


def arrow_schema(avro: Any) -> pa.Schema | None:
    """The Arrow schema of records of ``avro`` (a parsed Avro schema), or None when some field
    has no single Arrow type. Raises ``ValueError`` when the records are not Avro records."""
    named: dict[str, pa.DataType] = {}
    top = avro
    if not (isinstance(top, dict) and top.get("type") in ("record", "error")):
        raise ValueError(f"the file's schema is {_describe(avro)}, not a record: its values cannot be rows")
    try:
        struct = _arrow_type(top, named)
    except _NoArrowType:
        return None
    return pa.schema(list(struct))


def _arrow_type(schema: Any, named: dict[str, pa.DataType]) -> pa.DataType:
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return _PRIMITIVES[schema]
        if schema in named:
            return named[schema]
        raise _NoArrowType(schema)
    if isinstance(schema, list):  # a union: nullable when it holds "null"
        branches = [b for b in schema if b != "null"]
        if len(branches) != 1:
            raise _NoArrowType(schema)
        return _arrow_type(branches[0], named)
    kind = schema.get("type")
    logical = schema.get("logicalType")
    if isinstance(kind, str) and (kind, logical) in _LOGICAL:
        return _LOGICAL[(kind, logical)]
    if logical == "decimal" and kind in ("bytes", "fixed"):
        precision, scale = int(schema["precision"]), int(schema.get("scale", 0))
        result: pa.DataType = pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)
    elif kind in ("record", "error"):
        fields = [pa.field(f["name"], _arrow_type(f["type"], named)) for f in schema["fields"]]
        result = pa.struct(fields)
    elif kind == "enum":
        result = pa.string()
    elif kind == "fixed":
        result = pa.binary()
    elif kind == "array":
        result = pa.list_(_arrow_type(schema["items"], named))
    elif kind == "map":
        result = pa.map_(pa.string(), _arrow_type(schema["values"], named))
    else:  # a primitive written as {"type": "long"}, or one whose logical type is not mapped
        result = _arrow_type(kind, named)
    if "name" in schema and kind in ("record", "error", "enum", "fixed"):
        named[schema["name"]] = result
        if "namespace" in schema:
            named[f"{schema['namespace']}.{schema['name']}"] = result
    return result


def _describe(schema: Any) -> str:
    if isinstance(schema, dict):
        return repr(schema.get("type"))
    return repr(schema)


def _strings_for_uuids(value: Any) -> Any:
    """``value`` (a record, or anything in one) with its ``uuid.UUID`` objects as strings."""
    if isinstance(value, dict):
        return {k: _strings_for_uuids(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_strings_for_uuids(v) for v in value]
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


def _has_uuid(schema: Any) -> bool:
    if isinstance(schema, list):
        return any(_has_uuid(s) for s in schema)
    if isinstance(schema, dict):
        return schema.get("logicalType") == "uuid" or any(_has_uuid(v) for v in schema.values())
    return False


def parse_avro_stream(stream: pa.NativeFile, *, display: str, rows_per_table: int = ROWS_PER_TABLE) -> Iterator[pa.Table]:
    """Tables of up to ``rows_per_table`` records from the Avro container file ``stream``."""
    import fastavro

    try:
        reader = fastavro.reader(stream)
    except OSError:  # the storage's error: retried by iter_stream, or raised as it is
        raise
    except Exception as err:  # not an Avro container (fastavro: KeyError 'avro.schema'), a bad header
        raise FileFormatError(f"not an Avro object container file ({type(err).__name__}: {err})", path=display) from err
    writer_schema = reader.writer_schema
    try:
        schema = arrow_schema(writer_schema)
    except ValueError as err:
        raise FileFormatError(str(err), path=display) from err
    uuids = _has_uuid(writer_schema)  # fastavro gives uuid.UUID objects: Arrow holds their text
    rows: list[dict[str, Any]] = []
    records, read = iter(reader), 0
    while True:
        try:
            record = next(records)
        except StopIteration:
            break
        except OSError:
            raise
        except Exception as err:  # a truncated or corrupt data block, a bad sync marker
            msg = f"a corrupt or truncated Avro data block after record {read} ({type(err).__name__}: {err})"
            raise FileFormatError(msg, path=display) from err
        read += 1
        rows.append(_strings_for_uuids(record) if uuids else record)
        if len(rows) >= rows_per_table:
            yield _table(rows, schema, display)
            rows = []
    if rows:
        yield _table(rows, schema, display)
    elif schema is not None:
        yield schema.empty_table()


def _table(rows: list[dict[str, Any]], schema: pa.Schema | None, display: str) -> pa.Table:
    try:
        if schema is not None:
            return pa.Table.from_pylist(rows, schema=schema)
        from engine.block_format import rows_to_block

        return rows_to_block(rows)
    except (pa.ArrowException, ValueError, TypeError) as err:
        raise FileFormatError(f"Avro records that do not convert to Arrow: {err}", path=display) from err


class AvroDatasource(FileDatasource):
    """Rows of Avro object container files (``.avro``); needs ``fastavro``."""

    FILE_EXTENSIONS = None  # a folder: every file but hidden ones, as Ray's read_avro

    def __init__(self, paths: Any, **kwargs: Any) -> None:
        try:
            import fastavro  # noqa: F401
        except ImportError as err:
            raise ImportError("read_avro needs fastavro: pip install 'dataflow[avro]' (or fastavro)") from err
        super().__init__(paths, **kwargs)

    def _read_file(self, fs: Any, piece: FilePiece, display: str, retrier: Retrier) -> Iterator[pa.Table]:
        parse = functools.partial(parse_avro_stream, display=display)
        yield from iter_stream(fs, piece.entry.path, retrier, display, parse, args=self._stream_args)

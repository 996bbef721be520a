"""JSON files: JSON Lines (one object per line) through ``pyarrow.json``, streamed, JSON arrays and
objects over several lines, streamed too.

A file whose first non-blank character is ``[`` is an array of objects: ``connectors.json_to_lines``
turns pieces of it into JSON Lines (an object a line), parsed as JSON Lines are, except that
strings stay strings where pyarrow would infer timestamps (Ray reads an array with Python's
``json``). A file whose first object does not end on its line (pretty-printed), and any file read
with ``newlines_in_values=True``, is cut into pieces that end where an object ends, each parsed
with ``newlines_in_values=True``; a file that is one such object alone becomes one row, read as
Ray reads it. ``lines=True`` (Ray's ``read_json(lines=True)``) says every file is JSON Lines:
arrays and pretty-printed objects are not looked for, and a file that is not JSON Lines fails
naming it. Anything else is JSON Lines, read as a stream (decompressed by extension as it goes)
in chunks of whole lines of about ``block_bytes`` (16 MiB), each parsed with
``pyarrow.json.read_json`` and pyarrow's ``read_options``/``parse_options``.

A JSON Lines file well over a read task's bytes (uncompressed, ``newlines_in_values=False``) is
read as byte ranges, one task each (``connectors.line_ranges``): the driver parses the file's
first chunk once while it plans the tasks, and every range parses with the types found there.

Types: the first chunk of a file is parsed on its own, so its types are inferred from all of its
rows (a column that is null at first and numbers later is a number column; ints and floats make a
float column). That schema then parses the chunks after it (and every range of a split file), so
later blocks have the same columns and types. A later value that does not fit (text in a number
column, a float in an int column, a value in a column that was all null) or a field that appears
only later raises ``FileFormatError`` naming the file, the column (and the row where pyarrow
says) and saying to pass ``explicit_schema``. A malformed line raises ``FileFormatError`` naming
the file and the row (1-based, counting rows, not blank lines; in a range of a split file too).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import functools
import itertools
import json as stdlib_json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from connectors import json_to_lines, line_ranges
from connectors.errors import FileFormatError
from connectors.file_datasink import FileDatasink
from connectors.file_datasource import FileDatasource, FilePiece, coalesce
from connectors.filesystem import STREAM_BLOCK_BYTES, FileEntry, iter_stream, open_stream, parsing
from connectors.retry import Retrier

LINES = "JSON Lines"
ARRAY = "a JSON array of objects"
OBJECTS = "JSON objects"
_ROW = re.compile(r"in row (\d+)")
_COLUMN = re.compile(r"Column\(/?([^)]*)\)")
_SCHEMA_HINT = "pass parse_options=pyarrow.json.ParseOptions(explicit_schema=...) with every field and its type"


class JSONDatasource(FileDatasource):
    """Rows of ``.json``/``.jsonl`` files (JSON Lines or a top-level array of objects).

    ``block_bytes``: about how many bytes of JSON Lines are parsed at a time (see the module docstring).
    """

    REUSED_BY_WORKERS = True  # its reads never change it (connectors.base.SharedSource)

    FILE_EXTENSIONS = (".json", ".jsonl", ".ndjson")
    DEFAULT_PARTITIONING = "hive"

    def __init__(
        self,
        paths: Any,
        *,
        read_options: pajson.ReadOptions | None = None,
        parse_options: pajson.ParseOptions | None = None,
        block_bytes: int = STREAM_BLOCK_BYTES,
        lines: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(paths, **kwargs)
        self._lines = lines
        self._read_options = read_options or pajson.ReadOptions()
        self._parse_options = parse_options or pajson.ParseOptions()
        self._block_bytes = block_bytes

    def _read_pieces(self, pieces: tuple[FilePiece, ...], part_schema: pa.Schema | None) -> Iterator[pa.Table]:
        retrier = self._retrier()
        yield from coalesce(self._iter_piece_tables(pieces, part_schema, retrier), self._block_bytes)

    def _split_files(self) -> bool | Callable[[FileEntry], Any]:
        """A big JSON Lines file is read as byte ranges, one task each: the predicate (run while
        the tasks are planned) returns the types of the file's first chunk, or False for a file
        that is not JSON Lines (an array, pretty-printed objects), compressed, or whose first
        chunk does not parse (its one read task then reports why, naming the row)."""
        if self._parse_options.newlines_in_values:
            return False
        return self._lines_head

    def _lines_head(self, entry: FileEntry) -> _LinesHead | bool:
        if not line_ranges.splittable(entry.path, self._stream_args):
            return False
        display = self._files.display(entry.path)

        def head() -> _LinesHead | bool:
            with open_stream(self._files.filesystem, entry.path, decompress=False) as stream:
                return lines_head(stream, display=display, read_options=self._read_options,
                                  parse_options=self._parse_options, chunk_bytes=self._block_bytes, lines=self._lines)

        try:
            return parsing(self._retrier()).call(head, path=display)
        except Exception:  # (a planning shortcut only: the file's one read task reads it and says what fails)
            return False
        finally:  # the driver parsed up to a chunk's worth of rows: its allocator gives the pages back
            pa.default_memory_pool().release_unused()

    def _read_file(self, fs: Any, piece: FilePiece, display: str, retrier: Retrier) -> Iterator[pa.Table]:
        if piece.count > 1:
            yield from read_json_piece(fs, piece, display, retrier, self._read_options, self._parse_options,
                                       chunk_bytes=self._block_bytes)
            return
        parse = functools.partial(
            parse_json_stream,
            display=display,
            read_options=self._read_options,
            parse_options=self._parse_options,
            chunk_bytes=self._block_bytes,
            lines=self._lines,
        )
        yield from iter_stream(fs, piece.entry.path, retrier, display, parse, args=self._stream_args)


def parse_json_stream(
    stream: pa.NativeFile,
    *,
    display: str,
    read_options: pajson.ReadOptions,
    parse_options: pajson.ParseOptions,
    chunk_bytes: int = STREAM_BLOCK_BYTES,
    lines: bool = False,
) -> Iterator[pa.Table]:
    """Tables read from ``stream``: a chunk of about ``chunk_bytes`` at a time, of JSON Lines,
    of a JSON array's objects, or of objects that span lines (one such object alone is one
    row); ``lines``: only JSON Lines (objects may span lines with ``newlines_in_values``)."""
    head = stream.read(chunk_bytes)
    while head and not head.strip():
        head = stream.read(chunk_bytes)
    if not head:
        yield pa.table({})
        return
    if not lines and head.lstrip()[:1] == b"[":
        yield from _array_tables(stream, head, display, read_options, parse_options, chunk_bytes)
        return
    pretty = not lines and _spans_lines(head)
    if parse_options.newlines_in_values or pretty:
        yield from _object_tables(stream, head, display, read_options, parse_options, chunk_bytes, pretty)
        return
    yield from _parsed(_line_chunks(stream, chunk_bytes, head), display, read_options, parse_options)


def _parsed(
    chunks: Iterable[bytes] | Iterable[bytearray],
    display: str,
    read_options: pajson.ReadOptions,
    parse_options: pajson.ParseOptions,
    what: str = LINES,
    first_types: Callable[[pa.Schema], pa.Schema] | None = None,
) -> Iterator[pa.Table]:
    """Each chunk as a table, parsed with the first chunk's types (as ``first_types`` makes
    them from those pyarrow inferred, when given: the first chunk is then parsed again)."""
    schema: pa.Schema | None = None
    rows = 0
    for chunk in chunks:
        table = _parse_lines(chunk, rows, schema, display, read_options, parse_options, what)
        if schema is None:
            wanted = first_types(table.schema) if first_types is not None else table.schema
            if not wanted.equals(table.schema):
                table = _parse_lines(chunk, rows, wanted, display, read_options, parse_options, what)
            schema = table.schema
        rows += table.num_rows
        yield table


def _object_tables(
    stream: pa.NativeFile,
    head: bytes,
    display: str,
    read_options: pajson.ReadOptions,
    parse_options: pajson.ParseOptions,
    chunk_bytes: int,
    pretty: bool,
) -> Iterator[pa.Table]:
    """Objects one after another, some over several lines, a table per piece of about
    ``chunk_bytes`` (``connectors.json_to_lines``), with the first piece's types. A ``pretty``
    file (its first object over several lines) that is that one object alone is one row, read
    as Ray reads it, with Python's ``json``."""
    pieces = json_to_lines.object_pieces(stream.read, head, chunk_bytes, display)
    first = next(pieces, None)
    if first is None:
        yield pa.table({})
        return
    taken = [first]
    if pretty and first[1] == 1:
        second = next(pieces, None)
        if second is None and _whole_document(first[0]) is not None:
            yield _parse_array(b"[" + first[0] + b"]", display)
            return
        taken += [second] if second is not None else []
    chunks = (piece for piece, _count in itertools.chain(taken, pieces))
    yield from _parsed(chunks, display, read_options, _spanning(parse_options), OBJECTS)


def _spanning(options: pajson.ParseOptions) -> pajson.ParseOptions:
    """``options`` with ``newlines_in_values=True``."""
    return pajson.ParseOptions(explicit_schema=options.explicit_schema, newlines_in_values=True,
                               unexpected_field_behavior=options.unexpected_field_behavior)


def _array_tables(
    stream: pa.NativeFile,
    head: bytes,
    display: str,
    read_options: pajson.ReadOptions,
    parse_options: pajson.ParseOptions,
    chunk_bytes: int,
) -> Iterator[pa.Table]:
    """The objects of a JSON array, a table per chunk of about ``chunk_bytes``, parsed as JSON
    Lines (``connectors.json_to_lines``) with the first chunk's types, as JSON Lines are; strings
    stay strings where pyarrow would infer timestamps, as Ray reads an array (with Python's
    ``json``, then ``Table.from_pylist``)."""
    chunks = json_to_lines.array_lines(stream.read, head, chunk_bytes, display)
    strings = functools.partial(_timestamps_as_strings, explicit=parse_options.explicit_schema)
    empty = True
    for table in _parsed(chunks, display, read_options, parse_options, ARRAY, strings):
        empty = False
        yield table
    if empty:  # []
        yield pa.table({})


def _timestamps_as_strings(schema: pa.Schema, explicit: pa.Schema | None) -> pa.Schema:
    """``schema`` with the timestamps pyarrow inferred (not those of ``explicit``) as strings."""
    given = set(explicit.names) if explicit is not None else set()
    return pa.schema([f if f.name in given else f.with_type(_strings_for(f.type)) for f in schema],
                     metadata=schema.metadata)


def _strings_for(typ: pa.DataType) -> pa.DataType:
    if pa.types.is_timestamp(typ):
        return pa.string()
    if pa.types.is_struct(typ):
        return pa.struct([typ.field(i).with_type(_strings_for(typ.field(i).type)) for i in range(typ.num_fields)])
    if pa.types.is_list(typ):
        return pa.list_(typ.value_field.with_type(_strings_for(typ.value_type)))
    return typ


@dataclass(frozen=True)
class _LinesHead:
    """What every range of a split JSON Lines file parses with: the first chunk's types."""

    schema: pa.Schema


def lines_head(
    stream: pa.NativeFile,
    *,
    display: str,
    read_options: pajson.ReadOptions,
    parse_options: pajson.ParseOptions,
    chunk_bytes: int,
    lines: bool,
) -> _LinesHead | bool:
    """The types of the first chunk of ``stream``, exactly as ``parse_json_stream`` infers them,
    or False when the file is not JSON Lines (as ``parse_json_stream`` decides) or is empty."""
    head = stream.read(chunk_bytes)
    while head and not head.strip():
        head = stream.read(chunk_bytes)
    if not head or (not lines and (head.lstrip()[:1] == b"[" or _spans_lines(head))):
        return False
    first = next(_line_chunks(stream, chunk_bytes, head), None)
    if first is None:
        return False
    return _LinesHead(_parse_lines(first, 0, None, display, read_options, parse_options).schema)


def read_json_piece(
    fs: Any,
    piece: FilePiece,
    display: str,
    retrier: Retrier,
    read_options: pajson.ReadOptions,
    parse_options: pajson.ParseOptions,
    *,
    chunk_bytes: int = STREAM_BLOCK_BYTES,
) -> Iterator[pa.Table]:
    """Tables of the lines of one byte range of a big JSON Lines file, parsed with the types of
    the file's first chunk (``piece.head``). An error names the row in the whole file: the rows
    before the range are counted then (only then: it reads the file up to the range)."""
    path, size = piece.entry.path, piece.entry.size or 0
    schema = piece.head.schema

    def parse(stream: pa.NativeFile) -> Iterator[pa.Table]:
        rows = 0
        for chunk in _line_chunks(stream, chunk_bytes, b""):
            try:
                table = _parse_lines(chunk, rows, schema, display, read_options, parse_options)
            except FileFormatError as exc:
                if piece.index == 0:
                    raise
                before = _rows_before(fs, path, line_ranges.range_start(fs, path, size, piece.index, piece.count))
                _parse_lines(chunk, before + rows, schema, display, read_options, parse_options)  # raises again
                raise exc from None  # (a parse that failed once fails again: never reached)
            rows += table.num_rows
            yield table
        if not rows:  # a range that holds no line (one long line spans it)
            yield schema.empty_table()

    def opener() -> pa.NativeFile:
        return line_ranges.open_lines(fs, path, size, piece.index, piece.count)

    yield from iter_stream(fs, path, retrier, display, parse, opener=opener)


_BLANK_LINE = re.compile(rb"(?m)^[ \t\r]*\n")


def _rows_before(fs: Any, path: str, end: int) -> int:
    """The rows (non-blank lines) of ``path`` before byte ``end`` (a line start)."""
    rows = 0
    with open_stream(fs, path, decompress=False) as stream:
        left = end
        carry = b""
        while left > 0:
            data = stream.read(min(left, STREAM_BLOCK_BYTES))
            if not data:
                break
            left -= len(data)
            data = carry + data
            cut = data.rfind(b"\n") + 1
            rows += data.count(b"\n", 0, cut) - len(_BLANK_LINE.findall(data, 0, cut))
            carry = data[cut:]
    return rows


def _spans_lines(head: bytes) -> bool:
    """The first object of ``head`` does not end on its first line (a pretty-printed file)."""
    first = head.lstrip().split(b"\n", 1)[0].strip()
    if first[:1] != b"{":
        return False
    try:
        stdlib_json.loads(first)
    except ValueError:
        return True
    return False


def _whole_document(data: bytes) -> bytes | None:
    """``data`` when it is one JSON object (Ray reads such a file as one row), else None."""
    try:
        parsed = stdlib_json.loads(data)
    except ValueError:
        return None
    return data if isinstance(parsed, dict) else None


def _parse_array(data: bytes, display: str) -> pa.Table:
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


def _line_chunks(stream: pa.NativeFile, chunk_bytes: int, head: bytes) -> Iterator[bytes]:
    """``line_ranges.whole_lines`` without chunks of blank lines only."""
    return (chunk for chunk in line_ranges.whole_lines(stream, chunk_bytes, head) if not chunk.isspace())


def _parse_lines(
    chunk: bytes,
    rows_before: int,
    schema: pa.Schema | None,
    display: str,
    read_options: pajson.ReadOptions,
    parse_options: pajson.ParseOptions,
    what: str = LINES,
) -> pa.Table:
    """``chunk`` (whole lines) as a table; after the first chunk, with the first chunk's ``schema``.

    A line longer than pyarrow's ``block_size`` ("straddling object straddles two block
    boundaries") is parsed again with the whole chunk as one block, as Ray's reader grows its
    block size: the chunk holds whole lines, so that always fits."""
    options = parse_options if schema is None else _with_schema(parse_options, schema)
    try:
        try:
            table = pajson.read_json(pa.py_buffer(chunk), read_options, options)
        except pa.ArrowInvalid as exc:
            if "straddl" not in str(exc) or read_options.block_size > len(chunk):
                raise
            read_options = pajson.ReadOptions(use_threads=read_options.use_threads, block_size=len(chunk) + 1)
            table = pajson.read_json(pa.py_buffer(chunk), read_options, options)
    except pa.ArrowInvalid as exc:
        raise _lines_error(exc, chunk, rows_before, schema, display, read_options, parse_options, what) from exc
    if schema is not None and not table.schema.equals(schema):
        _check_no_new_fields(table, schema, rows_before, display)
    return table


def _check_no_new_fields(table: pa.Table, schema: pa.Schema, rows_before: int, display: str) -> None:
    """Raise for a field (at the top, or inside an object) that the first chunk did not have."""
    new = [name for name in table.column_names if name not in schema.names]
    if new:
        first = pc.index(table.column(new[0]).is_valid(), True).as_py()
        msg = f"the field(s) {new} appear only after the first {rows_before} rows, which fixed the columns"
        row = rows_before + first + 1 if first >= 0 else None
        raise FileFormatError(f"{msg}; {_SCHEMA_HINT}", path=display, row=row, column=new[0])
    changed = [f.name for f in schema if table.schema.field(f.name) != f]
    if changed:
        msg = f"the objects in {changed} have fields that appear only after the first {rows_before} rows"
        raise FileFormatError(f"{msg}; {_SCHEMA_HINT}", path=display, column=changed[0])


def _with_schema(options: pajson.ParseOptions, schema: pa.Schema) -> pajson.ParseOptions:
    return pajson.ParseOptions(
        explicit_schema=schema,
        newlines_in_values=options.newlines_in_values,
        unexpected_field_behavior=options.unexpected_field_behavior,
    )


def _lines_error(
    exc: pa.ArrowInvalid,
    chunk: bytes,
    rows_before: int,
    schema: pa.Schema | None,
    display: str,
    read_options: pajson.ReadOptions,
    parse_options: pajson.ParseOptions,
    what: str = LINES,
) -> FileFormatError:
    """``exc`` restated naming the row in the file (not in pyarrow's block) and the column;
    ``what``: what the file was read as (JSON Lines, or a JSON array's objects, a row each)."""
    options = parse_options if schema is None else _with_schema(parse_options, schema)
    message = str(exc)
    if read_options.block_size < len(chunk):
        message = _one_block_error(chunk, options) or message
    row = _ROW.search(message)
    column = _COLUMN.search(message)
    name = column.group(1) if column and column.group(1) else None
    # pyarrow's "in row N" counts from 0 in its block: the row in the file is said once, by path
    said = _ROW.sub("", message).rstrip(" .") if row else message
    text = f"could not parse as {what}: {said}"
    misfits = _misfits(chunk, schema, read_options, parse_options) if schema is not None and name is None else []
    if schema is not None and (name is not None or misfits):
        name = name or misfits[0]
        text = (
            f"{text}; the column types were fixed by the first {rows_before} rows"
            f"{f', and column(s) {misfits} hold values that do not fit them' if misfits else ''}; {_SCHEMA_HINT}"
        )
    return FileFormatError(text, path=display, row=rows_before + int(row.group(1)) + 1 if row else None, column=name)


def _one_block_error(chunk: bytes, options: pajson.ParseOptions) -> str | None:
    """The error parsing ``chunk`` as one block gives: its row counts from the chunk's start."""
    single = pajson.ReadOptions(use_threads=False, block_size=len(chunk) + 1)
    try:
        pajson.read_json(pa.py_buffer(chunk), single, options)
    except pa.ArrowInvalid as exc:
        return str(exc)
    return None


def _misfits(
    chunk: bytes, schema: pa.Schema, read_options: pajson.ReadOptions, parse_options: pajson.ParseOptions
) -> list[str]:
    """Columns of ``chunk`` whose values do not convert to their type in ``schema``."""
    free = pajson.ParseOptions(newlines_in_values=parse_options.newlines_in_values)
    try:
        table = pajson.read_json(pa.py_buffer(chunk), read_options, free)
    except pa.ArrowInvalid:
        return []
    misfits = []
    for name in table.column_names:
        if name in schema.names and table.schema.field(name).type != schema.field(name).type:
            try:
                table.column(name).cast(schema.field(name).type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                misfits.append(name)
    return misfits


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


def _finite_floats(table: pa.Table) -> pa.Table:
    """``table`` with its float columns' NaNs and infinities as nulls (the table built once:
    a ``set_column`` per column copies the column list each time, quadratic in the width)."""
    if not any(pa.types.is_floating(field.type) for field in table.schema):
        return table
    columns = []
    for field, column in zip(table.schema, table.columns, strict=True):
        if pa.types.is_floating(field.type):
            column = pc.if_else(pc.is_finite(column), column, pa.scalar(None, field.type))
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=table.schema)


def _nested_tensors(table: pa.Table) -> pa.Table:
    """``table`` with its tensor columns as nested lists of their shape, as Ray writes them (a
    ``(2, 2)`` tensor is ``[[0, 1], [2, 3]]``, not its four values flat)."""
    from engine.ragged_tensors import is_ragged

    if not any(isinstance(f.type, pa.FixedShapeTensorType) or is_ragged(f.type) for f in table.schema):
        return table
    columns = []
    for field, column in zip(table.schema, table.columns, strict=True):
        if isinstance(field.type, pa.FixedShapeTensorType) or is_ragged(field.type):
            column = pa.chunked_array([_nested(chunk) for chunk in column.chunks]) if column.num_chunks else column
        columns.append(column)
    return pa.Table.from_arrays(columns, names=table.column_names)


def _nested(chunk: pa.Array) -> pa.Array:
    typ = chunk.type
    if isinstance(typ, pa.FixedShapeTensorType) and typ.shape and not typ.permutation:
        storage = chunk.storage
        size = storage.type.list_size
        values = storage.values.slice(storage.offset * size, len(storage) * size)
        for dim in reversed(typ.shape[1:]):
            values = pa.FixedSizeListArray.from_arrays(values, dim)
        mask = storage.is_null() if storage.null_count else None
        return pa.FixedSizeListArray.from_arrays(values, typ.shape[0], mask=mask)
    from engine.ragged_tensors import ragged_to_numpy

    cells = ragged_to_numpy(chunk) if not isinstance(typ, pa.FixedShapeTensorType) else chunk.to_numpy_ndarray()
    return pa.array([None if cell is None else cell.tolist() for cell in cells])


class JSONDatasink(FileDatasink):
    """JSON Lines files (one object per row) under ``path``, staged and committed.

    Bytes are written as base64, dates and times as ISO 8601 strings, durations as ``H:MM:SS``
    text, decimals as strings (the README lists how this differs from Ray's pandas writer). A NaN
    or infinite float is ``null`` (JSON has no NaN; Ray's pandas writer does the same), and the
    separators are compact, as Ray's.
    """

    EXTENSION = ".json"

    def __init__(
        self,
        path: str,
        *,
        pandas_json_args_fn: Callable[[], dict[str, Any]] | None = None,
        pandas_json_args: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(path, **kwargs)
        if pandas_json_args_fn is not None and not callable(pandas_json_args_fn):
            msg = f"pandas_json_args_fn must be a function returning a dict, got {type(pandas_json_args_fn).__name__}"
            raise TypeError(msg)
        self._pandas_args = dict(pandas_json_args or {})
        check_pandas_json_args("write_json()", self._pandas_args)
        self._pandas_args_fn = pandas_json_args_fn

    def on_write_start(self) -> None:
        """Check what ``pandas_json_args_fn`` returns (once, here) before any task runs it."""
        if self._pandas_args_fn is not None:
            check_pandas_json_args("pandas_json_args_fn()", dict(self._pandas_args_fn()))
        super().on_write_start()

    def _encode(self, tables: list[pa.Table]) -> pa.Buffer:
        if self._pandas_args or self._pandas_args_fn is not None:
            return self._encode_with_pandas(tables)
        lines = [
            stdlib_json.dumps(row, default=_json_default, ensure_ascii=False, separators=(",", ":"))
            for table in tables
            for row in _finite_floats(_nested_tensors(table)).to_pylist()
        ]
        return pa.py_buffer(("\n".join(lines) + "\n").encode())

    def _encode_with_pandas(self, tables: list[pa.Table]) -> pa.Buffer:
        """Ray's writer: ``DataFrame.to_json(orient="records", lines=True, **pandas_json_args)``,
        what ``pandas_json_args_fn()`` returns (called in the write task) over the named ones, as
        Ray resolves them."""
        args = dict(self._pandas_args)
        if self._pandas_args_fn is not None:
            args.update(check_pandas_json_args("pandas_json_args_fn()", dict(self._pandas_args_fn())))
        orient = args.pop("orient", "records")
        lines = args.pop("lines", True)
        frame = _nested_tensors(pa.concat_tables(tables, promote_options="permissive")).to_pandas()
        text = frame.to_json(orient=orient, lines=lines, **args)
        if lines and not text.endswith("\n"):
            text += "\n"
        return pa.py_buffer(text.encode())


@functools.cache
def _pandas_json_params() -> frozenset[str]:
    import inspect

    import pandas as pd

    return frozenset(inspect.signature(pd.DataFrame.to_json).parameters) - {"self", "path_or_buf"}


def check_pandas_json_args(where: str, args: dict[str, Any]) -> dict[str, Any]:
    """``args``, or a ``TypeError`` naming the first that ``pandas.DataFrame.to_json`` does not take."""
    unknown = sorted(name for name in args if name not in _pandas_json_params()) if args else []
    if unknown:
        msg = (f"{where} got an unexpected keyword argument {unknown[0]!r} (the JSON writer passes "
               "its extra arguments to pandas.DataFrame.to_json, as Ray's)")
        raise TypeError(msg)
    return args

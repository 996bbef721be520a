"""CSV files through ``pyarrow.csv``, streamed, with pyarrow's read/parse/convert options passed through.

Each file is read as a stream (decompressed by extension as it goes) with
``pyarrow.csv.open_csv``, ``read_options.block_size`` bytes at a time, and comes out in tables of
about ``block_bytes`` (16 MiB): a 10 GB file never needs more than a few such blocks in memory.

A file well over a read task's bytes (uncompressed, UTF-8, ``newlines_in_values=False``) is read
as byte ranges, one task each (``connectors.line_ranges``, ``read_csv_piece``): every range is
parsed with the header's column names and the types inferred from the start of the file.

Types: pyarrow infers each column's type from the first ``block_size`` bytes of the file. Until
the first table of a file is handed on (its first ``block_bytes``), a value that does not convert
(a column that looks numeric for thousands of rows, then holds ``"n/a"``) makes the file be read
again from the start with that column as ``string`` (not in a file read as byte ranges, whose
other ranges may already be read). Past that point the rows before it are
gone downstream, so such a value raises ``FileFormatError`` naming the file and the column, and
saying which ``column_types`` to pass. A row with the wrong number of fields raises
``FileFormatError`` naming the file and the line.
"""

from __future__ import annotations

import csv as stdlib_csv
import functools
import io
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv

from connectors import line_ranges
from connectors.errors import FileFormatError
from connectors.file_datasink import FileDatasink, combine
from connectors.file_datasource import FileDatasource, FilePiece, coalesce
from connectors.filesystem import (
    NO_STREAM_ARGS,
    STREAM_BLOCK_BYTES,
    FileEntry,
    StreamArgs,
    iter_stream,
    open_input_stream,
    open_stream,
    parsing,
)
from connectors.retry import Retrier

_CONVERSION = re.compile(r"In CSV column #(\d+): (?:Row #\d+: )?CSV conversion error to ([^:]+): invalid value '(.*)'")
_FIELDS = re.compile(r"Expected (\d+) columns, got (\d+)")


class CSVDatasource(FileDatasource):
    """Rows of CSV files; ``read_options``/``parse_options``/``convert_options`` are pyarrow's.

    ``block_bytes``: about how many bytes of table each block holds (see the module docstring).
    """

    REUSED_BY_WORKERS = True  # its reads never change it (connectors.base.SharedSource)

    FILE_EXTENSIONS = None  # a folder: every file but hidden ones, as Ray's read_csv
    DEFAULT_PARTITIONING = "hive"

    def __init__(
        self,
        paths: Any,
        *,
        read_options: pacsv.ReadOptions | None = None,
        parse_options: pacsv.ParseOptions | None = None,
        convert_options: pacsv.ConvertOptions | None = None,
        block_bytes: int = STREAM_BLOCK_BYTES,
        **kwargs: Any,
    ) -> None:
        super().__init__(paths, **kwargs)
        self._read_options = read_options or pacsv.ReadOptions()
        self._parse_options_kwargs = _parse_options_kwargs(parse_options or pacsv.ParseOptions())
        self._convert_options = convert_options or pacsv.ConvertOptions()
        self._block_bytes = block_bytes

    def _read_pieces(self, pieces: tuple[FilePiece, ...], part_schema: pa.Schema | None) -> Iterator[pa.Table]:
        retrier = self._retrier()
        yield from coalesce(self._iter_piece_tables(pieces, part_schema, retrier), self._block_bytes)

    def _split_files(self) -> bool | Callable[[FileEntry], Any]:
        """A big file is read as byte ranges, one task each, where a newline always ends a row
        (``connectors.line_ranges``): the predicate (run while the tasks are planned) returns
        the columns and types of the file's start, which every range parses with, or False for
        a file that cannot be cut (compressed, another encoding) or whose start does not parse
        (its one read task then reports why)."""
        if self._parse_options_kwargs["newlines_in_values"]:
            return False
        return self._csv_head

    def _csv_head(self, entry: FileEntry) -> _CsvHead | bool:
        if not line_ranges.splittable(entry.path, self._stream_args, self._read_options.encoding):
            return False
        fs, display, retrier = self._files.filesystem, self._files.display(entry.path), self._retrier()
        parse_options = pacsv.ParseOptions(**self._parse_options_kwargs)
        try:
            schema = _head_schema(fs, entry.path, display, retrier, self._read_options, parse_options, self._convert_options)
            names = _head_names(schema, self._convert_options, fs, entry.path, display, retrier, self._read_options,
                                parse_options)
        except Exception:  # (a planning shortcut only: the file's one read task reads it and says what fails)
            return False
        finally:  # the driver parsed the start of the file: its allocator gives the pages back
            pa.default_memory_pool().release_unused()
        return _CsvHead(schema, tuple(names))

    def _read_file(self, fs: Any, piece: FilePiece, display: str, retrier: Retrier) -> Iterator[pa.Table]:
        parse_options = pacsv.ParseOptions(**self._parse_options_kwargs)
        if piece.count > 1:
            yield from read_csv_piece(fs, piece, display, retrier, self._read_options, parse_options,
                                      self._convert_options, block_bytes=self._block_bytes)
            return
        yield from read_csv_stream(
            fs,
            piece.entry.path,
            display,
            retrier,
            self._read_options,
            parse_options,
            self._convert_options,
            block_bytes=self._block_bytes,
            stream_args=self._stream_args,
        )


def _parse_options_kwargs(options: pacsv.ParseOptions) -> dict[str, Any]:
    """``options`` as constructor arguments: an unpickled ParseOptions has a broken row handler
    (pyarrow calls a None ``invalid_row_handler``), so tasks carry the arguments and rebuild it."""
    kwargs = {
        name: getattr(options, name)
        for name in (
            "delimiter",
            "quote_char",
            "double_quote",
            "escape_char",
            "newlines_in_values",
            "ignore_empty_lines",
        )
    }
    if options.invalid_row_handler is not None:
        kwargs["invalid_row_handler"] = options.invalid_row_handler
    return kwargs


def read_csv_stream(
    fs: Any,
    path: str,
    display: str,
    retrier: Retrier,
    read_options: pacsv.ReadOptions,
    parse_options: pacsv.ParseOptions,
    convert_options: pacsv.ConvertOptions,
    *,
    block_bytes: int = STREAM_BLOCK_BYTES,
    stream_args: StreamArgs = NO_STREAM_ARGS,
) -> Iterator[pa.Table]:
    """Tables of about ``block_bytes`` parsed from the CSV file ``path`` as it streams in.

    Conversion failures in the first table fall back to string; bad rows name their line.
    """
    forced: dict[str, pa.DataType] = {}
    reading = read_options
    handed = _Handed()
    while True:
        options = _with_column_types(convert_options, forced) if forced else convert_options
        parse = functools.partial(_csv_items, read_options=reading, parse_options=parse_options, options=options)
        try:
            yield from handed.rest(_blocks(iter_stream(fs, path, retrier, display, parse, args=stream_args), block_bytes))
            return
        except pa.ArrowInvalid as exc:
            message = str(exc)
            bigger = _bigger_blocks(reading, message)
            if bigger is not None:  # a row longer than pyarrow's block: again with bigger blocks
                reading = bigger
                if handed.rows and handed.schema is not None:  # the rest keeps the types handed on
                    forced = {field.name: field.type for field in handed.schema}
                continue
            conversion = _CONVERSION.search(message)
            if conversion is not None:
                names = _column_names(fs, path, display, retrier, read_options, parse_options, stream_args)
                index = int(conversion.group(1))
                name = names[index] if index < len(names) else None
                if name is not None and name not in forced and handed.rows == 0:
                    forced[name] = pa.string()
                    continue
                if name is not None and name not in forced:
                    raise _misfit(conversion, name, f"a value after the first {handed.rows} rows", display) from exc
            raise _row_error(message, fs, path, display, retrier, reading, parse_options, stream_args) from exc


@dataclass(frozen=True)
class _CsvHead:
    """What every range of a split CSV file parses with, found once while its tasks are
    planned (each range read it again before: ~1 MiB read and parsed per range)."""

    schema: pa.Schema
    """The columns and types pyarrow infers from the start of the file."""
    names: tuple[str, ...]
    """Every column's name, in the file's order (``include_columns`` aside)."""


def read_csv_piece(
    fs: Any,
    piece: FilePiece,
    display: str,
    retrier: Retrier,
    read_options: pacsv.ReadOptions,
    parse_options: pacsv.ParseOptions,
    convert_options: pacsv.ConvertOptions,
    *,
    block_bytes: int = STREAM_BLOCK_BYTES,
) -> Iterator[pa.Table]:
    """Tables of the rows of one byte range of a big CSV file (``connectors.line_ranges``).

    Every piece parses with the column names and types pyarrow finds at the start of the file
    (its header and first ``read_options.block_size`` bytes), so the pieces agree; a later value
    that does not convert raises ``FileFormatError`` naming the column, as past the first table
    of a file read whole. The first piece reads the header (and ``skip_rows``...) as usual."""
    path = piece.entry.path
    size = piece.entry.size or 0
    head, names = piece.head.schema, list(piece.head.names)
    options = _with_column_types(convert_options, {field.name: field.type for field in head})
    file_options = read_options
    if piece.index > 0:  # the header is the first piece's: name the columns, skip nothing
        read_options = pacsv.ReadOptions(
            use_threads=read_options.use_threads, block_size=read_options.block_size, skip_rows=0,
            skip_rows_after_names=0, column_names=names, autogenerate_column_names=False,
            encoding=read_options.encoding,
        )

    def opener() -> pa.NativeFile:
        return line_ranges.open_lines(fs, path, size, piece.index, piece.count)

    handed = _Handed()
    while True:
        parse = functools.partial(_csv_items, read_options=read_options, parse_options=parse_options, options=options)
        try:
            yield from handed.rest(_blocks(iter_stream(fs, path, retrier, display, parse, opener=opener), block_bytes))
            return
        except pa.ArrowInvalid as exc:
            message = str(exc)
            bigger = _bigger_blocks(read_options, message)
            if bigger is not None:  # (the options that find a bad line grow with them)
                read_options, file_options = bigger, _bigger_blocks(file_options, message) or file_options
                continue
            if "Empty CSV file" in message and handed.schema is None:  # a range that holds no line
                yield head.empty_table()
                return
            conversion = _CONVERSION.search(message)
            if conversion is not None:
                index = int(conversion.group(1))
                if index < len(names):
                    raise _misfit(conversion, names[index], "a later value", display) from exc
            raise _row_error(message, fs, path, display, retrier, file_options, parse_options, NO_STREAM_ARGS) from exc


class _Handed:
    """The rows one read handed on so far, over its attempts: a read that starts again (with
    bigger blocks) skips them, so each row is handed on once."""

    def __init__(self) -> None:
        self.rows = 0
        self.schema: pa.Schema | None = None

    def rest(self, tables: Iterator[pa.Table]) -> Iterator[pa.Table]:
        """``tables`` (an attempt's, from the file's start) past the rows handed on already."""
        seen = 0
        for table in tables:
            n = table.num_rows
            if self.rows and seen + n <= self.rows:
                seen += n
                continue
            table = table.slice(self.rows - seen) if seen < self.rows else table
            seen += n
            self.rows += table.num_rows
            self.schema = table.schema
            yield table


MAX_BLOCK_SIZE = 1 << 30
"""The largest ``block_size`` a read grows pyarrow's to for a row longer than its block."""


def _bigger_blocks(options: pacsv.ReadOptions, message: str) -> pacsv.ReadOptions | None:
    """``options`` with a block 8 times bigger when pyarrow failed on a row longer than its
    block ("straddling object straddles two block boundaries"; Ray's reader fails there), else
    None (another error, or blocks already ``MAX_BLOCK_SIZE``)."""
    if "straddl" not in message or options.block_size >= MAX_BLOCK_SIZE:
        return None
    return pacsv.ReadOptions(
        use_threads=options.use_threads, block_size=min(MAX_BLOCK_SIZE, options.block_size * 8),
        skip_rows=options.skip_rows, skip_rows_after_names=options.skip_rows_after_names,
        column_names=options.column_names, autogenerate_column_names=options.autogenerate_column_names,
        encoding=options.encoding,
    )


def _misfit(conversion: re.Match[str], name: str, where: str, display: str) -> FileFormatError:
    """A value of column ``name`` that does not convert to the type inferred for it."""
    msg = (
        f"the column was read as {conversion.group(2)} (inferred from the start of the file), but {where} is "
        f"{conversion.group(3)!r}; pass convert_options=pyarrow.csv.ConvertOptions(column_types={{{name!r}: "
        "pyarrow.string()}})"
    )
    return FileFormatError(msg, path=display, column=name)


def _row_error(
    message: str,
    fs: Any,
    path: str,
    display: str,
    retrier: Retrier,
    read_options: pacsv.ReadOptions,
    parse_options: pacsv.ParseOptions,
    stream_args: StreamArgs,
) -> FileFormatError:
    """pyarrow's parse error ``message`` restated: a row with the wrong number of fields names
    its line (the first such in the file), anything else the file."""
    fields = _FIELDS.search(message)
    if fields is not None:
        line = _bad_line(fs, path, display, retrier, read_options, parse_options, int(fields.group(1)), stream_args)
        return FileFormatError(f"expected {fields.group(1)} fields, got {fields.group(2)}", path=display, row=line)
    return FileFormatError(f"could not parse as CSV: {message}", path=display)


def _head_schema(
    fs: Any,
    path: str,
    display: str,
    retrier: Retrier,
    read_options: pacsv.ReadOptions,
    parse_options: pacsv.ParseOptions,
    convert_options: pacsv.ConvertOptions,
) -> pa.Schema:
    """The columns and types pyarrow infers from the start of ``path`` (what reading the whole
    file as one stream would use); a read cut short is retried, a parse error is not."""

    def head(options: pacsv.ReadOptions) -> pa.Schema:
        with open_stream(fs, path, decompress=False) as stream:
            return pacsv.open_csv(stream, options, parse_options, convert_options).schema

    while True:
        try:
            return parsing(retrier).call(functools.partial(head, read_options), path=display)
        except pa.ArrowInvalid as exc:
            bigger = _bigger_blocks(read_options, str(exc))  # (as a read of the whole file grows them)
            if bigger is None:
                raise FileFormatError(f"could not parse as CSV: {exc}", path=display) from exc
            read_options = bigger


def _head_names(
    head: pa.Schema,
    convert_options: pacsv.ConvertOptions,
    fs: Any,
    path: str,
    display: str,
    retrier: Retrier,
    read_options: pacsv.ReadOptions,
    parse_options: pacsv.ParseOptions,
) -> list[str]:
    """Every column's name (``include_columns`` aside): ``column_names``, the head's own names
    when every column is read, else the header read once more."""
    if read_options.column_names:
        return list(read_options.column_names)
    if not convert_options.include_columns:
        return list(head.names)
    return parsing(retrier).call(
        lambda: _column_names(fs, path, display, retrier, read_options, parse_options, NO_STREAM_ARGS), path=display
    )


def _csv_items(
    stream: pa.NativeFile,
    *,
    read_options: pacsv.ReadOptions,
    parse_options: pacsv.ParseOptions,
    options: pacsv.ConvertOptions,
) -> Iterator[pa.Schema | pa.RecordBatch]:
    """The file's schema, then its record batches (one per ``read_options.block_size`` bytes)."""
    reader = pacsv.open_csv(stream, read_options, parse_options, options)
    try:
        reader.schema.names  # noqa: B018 - pyarrow decodes the header's names here
    except UnicodeDecodeError as exc:
        msg = (f"the header row is not {read_options.encoding} text (byte {exc.object[exc.start]:#x} at offset "
               f"{exc.start} of a column name); a compressed file whose name has no codec extension reads "
               "with arrow_open_stream_args={'compression': ...}")
        raise pa.ArrowInvalid(msg) from None
    yield reader.schema
    yield from reader


def _blocks(items: Iterator[pa.Schema | pa.RecordBatch], block_bytes: int) -> Iterator[pa.Table]:
    """Batches gathered into tables of at most about ``block_bytes`` (one table, maybe empty, at least)."""
    schema: pa.Schema | None = None
    pending: list[pa.RecordBatch] = []
    size = 0
    done = False
    for item in items:
        if isinstance(item, pa.Schema):
            schema = item
            continue
        if pending and size + item.nbytes > block_bytes:
            yield pa.Table.from_batches(pending, schema)
            pending, size, done = [], 0, True
        pending.append(item)
        size += item.nbytes
    if pending or not done:
        yield pa.Table.from_batches(pending, schema)


def _with_column_types(options: pacsv.ConvertOptions, forced: dict[str, pa.DataType]) -> pacsv.ConvertOptions:
    column_types = dict(options.column_types or {})
    column_types.update(forced)
    copy = pacsv.ConvertOptions(
        check_utf8=options.check_utf8,
        column_types=column_types,
        null_values=options.null_values,
        true_values=options.true_values,
        false_values=options.false_values,
        decimal_point=options.decimal_point,
        strings_can_be_null=options.strings_can_be_null,
        quoted_strings_can_be_null=options.quoted_strings_can_be_null,
        include_columns=options.include_columns,
        include_missing_columns=options.include_missing_columns,
        auto_dict_encode=options.auto_dict_encode,
        auto_dict_max_cardinality=options.auto_dict_max_cardinality,
        timestamp_parsers=options.timestamp_parsers,
    )
    return copy


def _column_names(
    fs: Any,
    path: str,
    display: str,
    retrier: Retrier,
    read_options: pacsv.ReadOptions,
    parse_options: pacsv.ParseOptions,
    stream_args: StreamArgs,
) -> list[str]:
    all_strings = pacsv.ConvertOptions(column_types={}, strings_can_be_null=False)
    with open_input_stream(fs, path, retrier, display, args=stream_args) as stream:
        reader = pacsv.open_csv(stream, read_options, parse_options, all_strings)
        return list(reader.schema.names)


def _bad_line(
    fs: Any,
    path: str,
    display: str,
    retrier: Retrier,
    read_options: pacsv.ReadOptions,
    parse_options: pacsv.ParseOptions,
    expected: int,
    stream_args: StreamArgs,
) -> int | None:
    """1-based line number (header included) of the first row without ``expected`` fields."""
    with open_input_stream(fs, path, retrier, display, args=stream_args) as stream:
        text = io.TextIOWrapper(stream, encoding=read_options.encoding, errors="replace", newline="")
        quotechar = parse_options.quote_char or '"'
        reader = stdlib_csv.reader(text, delimiter=parse_options.delimiter, quotechar=quotechar)
        skipped = read_options.skip_rows
        for row in reader:
            if skipped > 0:
                skipped -= 1
                continue
            if row and len(row) != expected:
                return reader.line_num
    return None


class CSVDatasink(FileDatasink):
    """CSV files (with a header) under ``path``, staged and committed like every file sink."""

    EXTENSION = ".csv"

    def __init__(
        self,
        path: str,
        *,
        write_options: pacsv.WriteOptions | None = None,
        arrow_csv_args_fn: Callable[[], dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(path, **kwargs)
        self._write_options = write_options
        if arrow_csv_args_fn is not None and not callable(arrow_csv_args_fn):
            msg = f"arrow_csv_args_fn must be a function returning a dict, got {type(arrow_csv_args_fn).__name__}"
            raise TypeError(msg)
        self._args_fn = arrow_csv_args_fn

    def on_write_start(self) -> None:
        """Check what ``arrow_csv_args_fn`` returns (once, here) before any task runs it."""
        if self._args_fn is not None:
            check_csv_write_args("arrow_csv_args_fn()", dict(self._args_fn()))
        super().on_write_start()

    def _encode_into(self, tables: list[pa.Table], out: pa.NativeFile) -> None:
        write_options = self._write_options
        if self._args_fn is not None:  # Ray's arrow_csv_args_fn: called in the write task, over write_options
            write_options = check_csv_write_args("arrow_csv_args_fn()", dict(self._args_fn())).get(
                "write_options", write_options)
        pacsv.write_csv(combine(tables), out, write_options)


CSV_WRITE_ARGS = ("write_options",)
"""What ``pyarrow.csv.write_csv`` takes besides the table and the file (Ray's ``**arrow_csv_args``;
its ``memory_pool`` is a process's own object and cannot travel to a write task)."""


def check_csv_write_args(where: str, args: dict[str, Any]) -> dict[str, Any]:
    """``args``, or a ``TypeError`` naming the first that ``pyarrow.csv.write_csv`` does not take."""
    unknown = sorted(name for name in args if name not in CSV_WRITE_ARGS)
    if unknown:
        msg = (f"{where} got an unexpected keyword argument {unknown[0]!r} (pyarrow.csv.write_csv takes "
               "write_options, a pyarrow.csv.WriteOptions)")
        raise TypeError(msg)
    return args

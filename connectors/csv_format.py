"""CSV files through ``pyarrow.csv``, with pyarrow's read/parse/convert options passed through.

Each file is read whole (decompressed by extension) and parsed with ``pyarrow.csv.read_csv``, which
infers a column's type from the whole file, so a column that looks numeric for a million rows and
then holds ``"n/a"`` becomes ``string`` instead of failing. If a conversion still fails (for
example with a small ``block_size``), the file is parsed again with that column as ``string``.
A row with the wrong number of fields raises ``FileFormatError`` naming the file and the line.
"""

from __future__ import annotations

import csv as stdlib_csv
import io
import re
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv

from connectors.errors import FileFormatError
from connectors.file_datasink import FileDatasink, combine
from connectors.file_datasource import FileDatasource, FilePiece
from connectors.filesystem import read_file_bytes
from connectors.retry import Retrier

_CONVERSION = re.compile(r"In CSV column #(\d+): CSV conversion error")
_FIELDS = re.compile(r"Expected (\d+) columns, got (\d+)")


class CSVDatasource(FileDatasource):
    """Rows of CSV files; ``read_options``/``parse_options``/``convert_options`` are pyarrow's."""

    FILE_EXTENSIONS = (".csv",)
    DEFAULT_PARTITIONING = "hive"

    def __init__(
        self,
        paths: Any,
        *,
        read_options: pacsv.ReadOptions | None = None,
        parse_options: pacsv.ParseOptions | None = None,
        convert_options: pacsv.ConvertOptions | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(paths, **kwargs)
        self._read_options = read_options or pacsv.ReadOptions()
        self._parse_options_kwargs = _parse_options_kwargs(parse_options or pacsv.ParseOptions())
        self._convert_options = convert_options or pacsv.ConvertOptions()

    def _read_file(self, fs: Any, piece: FilePiece, display: str, retrier: Retrier) -> Iterator[pa.Table]:
        data = read_file_bytes(fs, piece.entry.path, retrier, display)
        parse_options = pacsv.ParseOptions(**self._parse_options_kwargs)
        yield parse_csv(data, display, self._read_options, parse_options, self._convert_options)


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


def parse_csv(
    data: bytes,
    display: str,
    read_options: pacsv.ReadOptions,
    parse_options: pacsv.ParseOptions,
    convert_options: pacsv.ConvertOptions,
) -> pa.Table:
    """``data`` parsed as CSV; conversion failures fall back to string, bad rows name their line."""
    forced: dict[str, pa.DataType] = {}
    while True:
        options = convert_options
        if forced:
            options = _with_column_types(convert_options, forced)
        try:
            return pacsv.read_csv(pa.BufferReader(data), read_options, parse_options, options)
        except pa.ArrowInvalid as exc:
            message = str(exc)
            conversion = _CONVERSION.search(message)
            if conversion is not None:
                names = _column_names(data, read_options, parse_options)
                index = int(conversion.group(1))
                if index < len(names) and names[index] not in forced:
                    forced[names[index]] = pa.string()
                    continue
            fields = _FIELDS.search(message)
            if fields is not None:
                line = _bad_line(data, read_options, parse_options, int(fields.group(1)))
                msg = f"expected {fields.group(1)} fields, got {fields.group(2)}"
                raise FileFormatError(msg, path=display, row=line) from exc
            raise FileFormatError(f"could not parse as CSV: {message}", path=display) from exc


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
    data: bytes, read_options: pacsv.ReadOptions, parse_options: pacsv.ParseOptions
) -> list[str]:
    all_strings = pacsv.ConvertOptions(column_types={}, strings_can_be_null=False)
    reader = pacsv.open_csv(pa.BufferReader(data), read_options, parse_options, all_strings)
    return list(reader.schema.names)


def _bad_line(
    data: bytes, read_options: pacsv.ReadOptions, parse_options: pacsv.ParseOptions, expected: int
) -> int | None:
    """1-based line number (header included) of the first row without ``expected`` fields."""
    text = io.StringIO(data.decode(read_options.encoding, errors="replace"), newline="")
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

    def __init__(self, path: str, *, write_options: pacsv.WriteOptions | None = None, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self._write_options = write_options

    def _encode(self, tables: list[pa.Table]) -> pa.Buffer:
        out = pa.BufferOutputStream()
        pacsv.write_csv(combine(tables), out, self._write_options)
        return out.getvalue()

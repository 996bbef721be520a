"""ORC: read tasks by bytes and stripes, with the projection pushed into the reader.

Listing never opens a file: tasks are planned from file sizes (``FileDatasource``). Many small
files share a task; a file bigger than a task is split into ``count`` pieces, and piece ``i``
reads stripes ``[n * i // count, n * (i + 1) // count)`` of the file's ``n`` stripes, so every
stripe is read exactly once and no footer is read on the driver. A task reads one stripe at a
time (``pyarrow.orc.ORCFile.read_stripe``), only the projected columns: memory holds a block
(``DEFAULT_BLOCK_BYTES``, stripes are coalesced up to it) plus one stripe, whatever the file size.
Each file's stripes are retried as a unit (``Retrier.iterate``): a dropped connection reopens
the file and skips the stripes already yielded.

``count_rows()`` adds up the row counts of the footers (read in a thread pool) without reading any
data; ``schema()`` reads one footer.

``ORCDatasink`` writes ORC files (``pyarrow.orc.write_table``; its options, such as
``compression``, passed through as Ray's ``write_orc`` does), staged and committed by
``file_datasink`` as every file sink.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import pyarrow as pa

from connectors import io_stats
from connectors.errors import (
    AccessDeniedError,
    FileFormatError,
    PathNotFoundError,
    RetriesExhaustedError,
    SchemaMismatchError,
)
from connectors.file_datasink import FileDatasink, combine
from connectors.file_datasource import FileDatasource, FilePiece
from connectors.filesystem import FileEntry, map_small_reads, open_input_file
from connectors.retry import Retrier
from engine.errors import ColumnNotFoundError

ORC_EXTENSIONS = (".orc",)


def stripe_range(num_stripes: int, piece: FilePiece) -> range:
    """The stripes that ``piece`` (the ``index``-th of ``count`` pieces of a file) reads."""
    return range(num_stripes * piece.index // piece.count, num_stripes * (piece.index + 1) // piece.count)


class ORCDatasource(FileDatasource):
    """ORC files (a file, folder, glob, or list; local or ``s3://``).

    ``columns``: read only these (partition columns and ``path`` allowed), in this order.
    ``partitioning``: None (default, as Ray's ``read_orc``), ``"hive"`` or a schema of partition
    fields. ``include_paths``: add a ``path`` column.
    """

    REUSED_BY_WORKERS = True  # its reads never change it (connectors.base.SharedSource)

    READS_STREAMS = False  # opened for random access (footer first)

    FILE_EXTENSIONS = ORC_EXTENSIONS

    def __init__(self, paths: Any, *, columns: Sequence[str] | None = None, **kwargs: Any) -> None:
        super().__init__(paths, **kwargs)
        self._columns = list(columns) if columns is not None else None

    def get_name(self) -> str:
        """``ReadORC``."""
        return "ReadORC"

    def _split_files(self) -> bool:
        return True

    # ----- driver-side: schema, counts, pushdown -------------------------------------------

    def schema(self) -> pa.Schema | None:
        """The output schema (projected; partition and ``path`` columns included), from one footer."""
        first = next(self._files.iter_files(), None)
        if first is None:
            return None
        fields = list(_read_footer(self._files.filesystem, first, self._files.display(first.path), Retrier()).schema)
        part = self._partition_schema(first)
        if part is not None:
            known = {f.name for f in fields}
            fields += [f for f in part if f.name not in known]
        if self._include_paths:
            fields.append(pa.field("path", pa.string()))
        full = pa.schema(fields)
        if self._columns is None:
            return full
        missing = [c for c in self._columns if c not in full.names]
        if missing:
            raise ColumnNotFoundError(f"columns {missing} are not in the data; available: {full.names}")
        return pa.schema([full.field(c) for c in self._columns])

    def count_rows(self) -> int | None:
        """Rows in all files, from their footers."""
        fs = self._files.filesystem
        entries = list(self._files.iter_files())
        retrier = self._retrier()

        def rows(entry: FileEntry) -> int:
            return int(_read_footer(fs, entry, self._files.display(entry.path), retrier).nrows)

        return sum(map_small_reads(fs, rows, entries))

    def apply_projection(self, columns: list[str]) -> ORCDatasource:
        """A copy reading only ``columns``."""
        if self._columns is not None:
            extra = [c for c in columns if c not in self._columns]
            if extra:
                raise ValueError(f"columns {extra} were already projected away; available: {self._columns}")
        clone = copy.copy(self)
        clone._columns = list(columns)
        return clone

    # ----- worker-side: reading ----------------------------------------------------------

    def _iter_piece_tables(
        self, pieces: tuple[FilePiece, ...], part_schema: pa.Schema | None, retrier: Retrier
    ) -> Iterator[pa.Table]:
        tables = super()._iter_piece_tables(pieces, part_schema, retrier)
        if self._columns is None:
            yield from tables
            return
        for table in tables:
            yield table.select(self._columns)

    def _read_file(self, fs: Any, piece: FilePiece, display: str, retrier: Retrier) -> Iterator[pa.Table]:
        yield from retrier.iterate(functools.partial(self._open_stripes, fs, piece, display, retrier), path=display)

    def _open_stripes(self, fs: Any, piece: FilePiece, display: str, retrier: Retrier) -> Iterator[pa.Table]:
        import pyarrow.orc as orc

        with open_input_file(fs, piece.entry.path, retrier, display) as handle:
            reader = orc.ORCFile(handle)
            names = reader.schema.names
            wanted = None
            if self._columns is not None:
                wanted = [c for c in self._columns if c in names]
                self._check_projection(names, piece.entry, display)
            stripes = stripe_range(reader.nstripes, piece)
            io_stats.record(files_read=1)
            # no file column asked for (only partition or path columns): read the first for the row count
            reading = (wanted or names[:1]) if wanted is not None else None
            for index in stripes:
                table = pa.Table.from_batches([reader.read_stripe(index, columns=reading)])
                if wanted is not None:
                    table = table.select(wanted)  # the reader keeps the file's order
                io_stats.record(bytes_read=table.nbytes)
                yield table

    def _check_projection(self, names: list[str], entry: FileEntry, display: str) -> None:
        """Every projected column is in the file, or is a partition or ``path`` column."""
        assert self._columns is not None
        derived = {"path"} if self._include_paths else set()
        part = self._partition_schema(entry)
        if part is not None:
            derived.update(part.names)
        missing = [c for c in self._columns if c not in names and c not in derived]
        if missing:
            msg = f"the file has no column {missing[0]!r} (columns asked for: {self._columns}; the file has {names})"
            raise SchemaMismatchError(msg, path=display, column=missing[0])


class _Footer(NamedTuple):
    """What the driver wants from a footer, kept after the file is closed."""

    schema: pa.Schema
    nrows: int


def _read_footer(fs: Any, entry: FileEntry, display: str, retrier: Retrier) -> _Footer:
    import pyarrow.orc as orc

    def read() -> _Footer:
        with open_input_file(fs, entry.path, retrier, display) as handle:
            reader = orc.ORCFile(handle)
            return _Footer(reader.schema, reader.nrows)

    try:
        return retrier.call(read, path=display, action="read the footer")
    except (PathNotFoundError, AccessDeniedError, RetriesExhaustedError):
        raise
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise FileFormatError(f"not a readable ORC file ({type(exc).__name__}: {exc})", path=display) from exc


class ORCDatasink(FileDatasink):
    """ORC files under ``path`` (local or ``s3://``), committed atomically.

    ``arrow_orc_args`` go to ``pyarrow.orc.write_table`` (``compression``, ``stripe_size``...),
    with what ``arrow_orc_args_fn()`` returns, called on the worker for each file, over them (as
    Ray). ``partition_cols``, ``min_rows_per_file``, ``max_rows_per_file``, ``mode`` and
    ``filename_provider`` as for Parquet.
    """

    EXTENSION = ".orc"
    NUMBERS_EVERY_FILE = True

    def __init__(
        self,
        path: str,
        *,
        partition_cols: Sequence[str] | None = None,
        min_rows_per_file: int | None = None,
        max_rows_per_file: int | None = None,
        filesystem: Any = None,
        mode: Any = "append",
        filename_provider: Any = None,
        arrow_orc_args_fn: Callable[[], dict[str, Any]] | None = None,
        **arrow_orc_args: Any,
    ) -> None:
        super().__init__(
            path,
            partition_cols=partition_cols,
            min_rows_per_file=min_rows_per_file,
            max_rows_per_file=max_rows_per_file,
            filesystem=filesystem,
            mode=mode,
            filename_provider=filename_provider,
        )
        _check_orc_args(arrow_orc_args)
        self._orc_args = dict(arrow_orc_args)
        self._orc_args_fn = arrow_orc_args_fn

    def get_name(self) -> str:
        """``WriteORC``."""
        return "WriteORC"

    def _encode_into(self, tables: list[pa.Table], out: pa.NativeFile) -> None:
        import pyarrow.orc as orc

        args = dict(self._orc_args)
        if self._orc_args_fn is not None:  # as Ray: called where the file is written, its keys win
            args.update(_check_orc_args(self._orc_args_fn()))
        orc.write_table(combine(tables), out, **args)


def _check_orc_args(args: dict[str, Any]) -> dict[str, Any]:
    """``args``, if ``pyarrow.orc.write_table`` takes them all; TypeError naming the others."""
    import pyarrow.orc as orc

    accepted = set(inspect.signature(orc.write_table).parameters) - {"table", "where"}
    unknown = sorted(set(args) - accepted)
    if unknown:
        raise TypeError(f"write_orc: {unknown} are not options of pyarrow.orc.write_table; it takes {sorted(accepted)}")
    return args

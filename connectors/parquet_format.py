"""Parquet: read tasks by bytes and row groups, with columns and filters pushed into the reader.

Listing never opens a file: tasks are planned from file sizes (``FileDatasource``). Many small
files share a task; a file bigger than a task is split into byte ranges, and the task for range
``i`` reads the row groups that *start* in that range (as Hadoop splits do), so each row group is
read exactly once and no footer is read on the driver. Each task then, per file:

1. reads the footer and checks the file's schema against the dataset's (``SchemaMismatchError``
   naming the file and the column when they differ; a corrupt or truncated file raises
   ``FileFormatError`` naming it);
2. prunes row groups with the filter: ``ParquetFileFragment.subset(filter=...)`` compares the
   filter with each row group's min/max statistics and with the file's hive partition values, so
   a row group (or a whole partition folder) that cannot match is never read. The number read and
   skipped is added to ``connectors.io_stats`` (``row_groups_read``, ``row_groups_skipped``).
   Statistics leave NaN out: a filter on a float column prunes with the part of it that is
   false for NaN (``dataflow.expr_statistics``; for a pyarrow expression, none of it), and the
   rows read are then filtered with the whole filter;
3. reads the remaining row groups one at a time, only the projected columns, applying the filter
   to rows, with page CRCs verified. Each row group is retried as a unit (``Retrier.iterate``), so
   a dropped connection never duplicates or loses rows. Without a filter or partition
   columns, and when the file's columns are the dataset's, the row groups are read with
   ``ParquetFile`` rather than through a dataset fragment: the same checks and checksums at
   half the CPU per file, which is most of a small file's cost; a file of at most
   ``WHOLE_FILE_BYTES`` read by one task is fetched in one read and parsed from memory.

``count_rows()`` adds up ``num_rows`` from the footers (read in a thread pool) without reading any
data; with a filter it is None. ``schema()`` reads one footer.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import inspect
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from connectors import io_stats, row_hash, tensor_columns
from connectors.base import planning_cache
from connectors.errors import (
    AccessDeniedError,
    FileFormatError,
    PathNotFoundError,
    RetriesExhaustedError,
    SchemaMismatchError,
)
from connectors.file_datasink import FileDatasink, combine
from connectors.file_datasource import LOOKAHEAD, FileDatasource, FilePiece
from connectors.filesystem import STREAM_BLOCK_BYTES, FileEntry, map_small_reads, open_input_file
from connectors.partitioning import partition_expression
from connectors.retry import Retrier
from engine.errors import ColumnNotFoundError

if TYPE_CHECKING:
    import pyarrow.dataset as pads

PARQUET_EXTENSIONS = (".parquet", ".parq", ".pq")
WHOLE_FILE_BYTES = 4 << 20
"""A file this small, read whole by one task, is fetched in one read and parsed from memory:
half the CPU of a 17 KB file's footer and page reads (~190 against ~335 us on a local disk),
one request instead of three on S3."""


@contextlib.contextmanager
def _source(fs: Any, piece: FilePiece) -> Iterator[tuple[Any, bool]]:
    """What a file's row groups are read from, and whether to pre-buffer its reads: the whole
    file in memory when it is small and read whole (``WHOLE_FILE_BYTES``); a bigger file on the
    local disk mapped into memory, so its pages are decoded where the page cache holds them;
    else the file system's handle (pre-buffered reads). Each opens the file once.

    Reading a mapped file copies nothing before decoding: a 42 MB file's pages were read into a
    new 42 MB buffer first, and a worker's first pass over 32 such files (1.35 GB) took 1.9-2.6 s
    of CPU that way against 1.16-1.22 s mapped, since each buffer is fresh memory to fault in;
    later passes 1.14-1.45 s against 1.16-1.25 s (one 1.92). polars maps local Parquet files too.
    A file another program cuts shorter while a task decodes it can end that worker with SIGBUS;
    the task is then retried as after any worker's death."""
    whole = piece.count == 1 and piece.entry.size is not None and piece.entry.size <= WHOLE_FILE_BYTES
    if not whole and isinstance(fs, pafs.LocalFileSystem):
        with pa.memory_map(piece.entry.path) as mapped:
            yield mapped, False
        return
    with fs.open_input_file(piece.entry.path) as handle:
        if whole:
            yield pa.BufferReader(handle.read()), False  # one read, not one per footer and page
        else:
            yield handle, True


BATCHED_ROW_GROUP_BYTES = 256 << 20
"""A row group whose wanted columns decode to more than this is read in batches of about
``STREAM_BLOCK_BYTES`` (its compressed pages held, its decoded rows a batch at a time), not
decoded whole: a 1 GB row group would otherwise need 1 GB in the task at once."""


@functools.cache
def parquet_file_format() -> pads.ParquetFileFormat:
    """The reader settings of the fragment path: page checksums verified, I/O coalesced (one
    per process; it holds settings only).

    ``pyarrow.dataset`` is imported here, when a read needs a fragment, not with this module: it
    imports pandas (~0.25 s), which neither a driver that plans reads nor a plain read needs."""
    import pyarrow.dataset as pads

    scan_options = pads.ParquetFragmentScanOptions(page_checksum_verification=True, pre_buffer=True)
    return pads.ParquetFileFormat(default_fragment_scan_options=scan_options)


def row_group_start(row_group: pq.RowGroupMetaData) -> int:
    """Byte offset where a row group starts in its file (its first column chunk's first page)."""
    column = row_group.column(0)
    offsets = [column.data_page_offset]
    if column.has_dictionary_page and column.dictionary_page_offset:
        offsets.append(column.dictionary_page_offset)
    return min(o for o in offsets if o is not None)


class ParquetDatasource(FileDatasource):
    """Parquet files (a file, folder, glob, or list; local or ``s3://``).

    ``columns``: read only these (partition columns and ``path`` allowed). ``filter``: a
    ``pyarrow.compute`` / ``pyarrow.dataset`` expression applied while reading. ``partitioning``:
    ``"hive"`` (default), a schema of partition fields, or None. ``include_paths``: add a ``path``
    column. ``schema``: the files' schema (without partition columns); files are cast to it,
    which also reconciles files that differ. Otherwise the first 16 files' schemas, unified, are
    the dataset's (``_sampled_schema``).
    ``tensor_column_schema`` (Ray's): ``{column: (dtype, shape)}`` for binary columns whose
    values are raw C-ordered arrays; they come back as tensor columns.
    """

    REUSED_BY_WORKERS = True  # its reads never change it (connectors.base.SharedSource)

    READS_STREAMS = False  # opened for random access (footer first)

    FILE_EXTENSIONS = PARQUET_EXTENSIONS
    DEFAULT_PARTITIONING = "hive"

    def __init__(
        self,
        paths: Any,
        *,
        columns: Sequence[str] | None = None,
        filter: pc.Expression | None = None,
        filesystem: Any = None,
        partitioning: Any = "hive",
        include_paths: bool = False,
        schema: pa.Schema | None = None,
        tensor_column_schema: dict[str, Any] | None = None,
        include_row_hash: bool = False,
        **kwargs: Any,
    ) -> None:
        self._tensor_columns = tensor_columns.check(tensor_column_schema)
        self._include_row_hash = bool(include_row_hash)
        super().__init__(
            paths, filesystem=filesystem, partitioning=partitioning, include_paths=include_paths, **kwargs
        )
        if filter is not None and not isinstance(filter, pc.Expression):
            raise TypeError(f"filter must be a pyarrow.compute.Expression, got {type(filter).__name__}")
        self._columns = list(columns) if columns is not None else None
        if self._columns is not None and include_paths and "path" not in self._columns:
            self._columns.append("path")  # as Ray's: include_paths adds it to the columns asked for
        self._filter = filter
        self._filter_parts: tuple[tuple[pc.Expression, Callable[[frozenset[str]], Any] | None], ...] = (
            ((filter, None),) if filter is not None else ()
        )
        self._pruning: tuple[pa.Schema, pc.Expression | None, bool] | None = None
        """The last ``_statistics_filter`` answer, with the schema it was for (the same for every file)."""
        self._user_schema = schema
        self._file_schema_cache: pa.Schema | None = schema

    def get_name(self) -> str:
        """``ReadParquet``."""
        return "ReadParquet"

    def _split_files(self) -> bool:
        return True

    # ----- driver-side: schema, counts, pushdown -------------------------------------------

    def _first_file(self) -> FileEntry | None:
        return next(self._files.iter_files(), None)

    def _file_schema(self, first: FileEntry | None) -> pa.Schema | None:
        if self._file_schema_cache is None and first is not None:
            self._file_schema_cache = self._sampled_schema(first)
        return self._file_schema_cache

    def _sampled_schema(self, first: FileEntry) -> pa.Schema:
        """The files' schema when no ``schema=`` is given, made as Ray 2.60 makes it: the footers
        of the first ``SCHEMA_SAMPLE_FILES`` files, unified (a column some of them lack is
        included, types are promoted: int32 and int64 give int64, int64 and double give double).
        Files are then read as that schema: a column a file lacks is null, a narrower type is
        cast. Columns no file's type can be merged with raise here, naming the two files."""
        entries = [first, *itertools.islice((e for e in self._files.iter_files() if e.path != first.path),
                                            SCHEMA_SAMPLE_FILES - 1)]
        fs, retrier = self._files.filesystem, Retrier(self._retry_policy)
        schemas = map_small_reads(
            fs, lambda e: _read_footer(fs, e, self._display(e), retrier).schema.to_arrow_schema(), entries
        )
        if all(schema.equals(schemas[0]) for schema in schemas[1:]):
            return schemas[0]
        try:
            return pa.unify_schemas(schemas, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            unified = schemas[0]
            for entry, schema in zip(entries[1:], schemas[1:], strict=True):
                try:
                    unified = pa.unify_schemas([unified, schema], promote_options="permissive")
                except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
                    column = next((f.name for f in schema if f.name in unified.names
                                   and not _mergeable(unified.field(f.name), f)), None)
                    got = f"{schema.field(column).type} here but {unified.field(column).type}" if column else "different"
                    msg = (f"column {column!r} is {got} in the files before it ({self._display(first)}...): "
                           f"types that cannot be merged")
                    raise SchemaMismatchError(msg + _SCHEMA_HINT, path=self._display(entry), column=column) from exc
            raise

    def _display(self, entry: FileEntry) -> str:
        return self._files.display(entry.path)

    def _dataset_schema(self, first: FileEntry | None) -> pa.Schema | None:
        file_schema = self._file_schema(first)
        if file_schema is None:
            return None
        part = self._partition_schema(first)
        fields = list(file_schema)
        if part is not None:
            fields += [f for f in part if f.name not in file_schema.names]
        return pa.schema(fields, metadata=file_schema.metadata)

    def schema(self) -> pa.Schema | None:
        """The output schema (projected; partition and ``path`` columns included), from the
        first files' footers (``_sampled_schema``)."""
        full = self._dataset_schema(self._first_file())
        if full is None:
            return None
        if self._include_paths:
            full = full.append(pa.field("path", pa.string()))
        if self._include_row_hash:
            if row_hash.COLUMN in full.names:  # the file's own row_hash is replaced, as in Ray
                full = full.remove(full.get_field_index(row_hash.COLUMN))
            full = full.append(pa.field(row_hash.COLUMN, pa.uint64()))
        for name in self._tensor_columns:
            index = full.get_field_index(name)
            if index < 0:
                raise ValueError(f"tensor_column_schema names {name!r}, not a column; available: {full.names}")
            tensor_columns.check_stored_type(name, full.field(index).type)
            full = full.set(index, pa.field(name, tensor_columns.decoded_type(self._tensor_columns, name)))
        if self._columns is None:
            return full
        missing = [c for c in self._columns if c not in full.names]
        if missing:
            raise ColumnNotFoundError(f"columns {missing} are not in the data; available: {full.names}")
        return pa.schema([full.field(c) for c in self._columns], metadata=full.metadata)

    def count_rows(self) -> int | None:
        """Rows in all files, from their footers; None when a filter is set."""
        if self._filter is not None:
            return None
        fs = self._files.filesystem
        entries = list(self._files.iter_files())
        read = functools.partial(_footer_rows, fs, retrier=Retrier(self._retry_policy), display=self._display)
        return sum(map_small_reads(fs, read, entries))

    def estimate_inmemory_data_size(self) -> int | None:
        """On-disk bytes times the first file's decoded/encoded ratio; None for huge listings."""
        entries = []
        for entry in self._files.iter_files():
            entries.append(entry)
            if len(entries) > LOOKAHEAD:
                return None
        if not entries:
            return 0
        metadata = _read_footer(self._files.filesystem, entries[0], self._display(entries[0]), Retrier())
        encoded = sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
        ratio = max(1.0, encoded / max(1, entries[0].size or 1))
        return int(sum(e.size or 0 for e in entries) * ratio)

    def decoded_bytes_at_most(self, limit: int, guess_dictionaries: bool = False) -> int | None:
        """The bytes the rows take decoded, from the footers, when that can be told and is at
        most ``limit``; None otherwise (the caller then assumes "large").

        Unlike ``estimate_inmemory_data_size`` this never guesses low: a fixed-width column
        counts its rows times its width, a plain-encoded string or binary column its
        uncompressed bytes plus an offset per value, and a dictionary-encoded or nested column
        (a few encoded bytes can stand for gigabytes decoded) makes the answer None. With
        ``guess_dictionaries`` a dictionary-encoded string or binary column counts as a plain
        one would (its uncompressed bytes, which hold each distinct value once, plus an offset
        per value): a guess for "probably small", no longer a bound. Reads at most
        ``MAX_SIZED_FILES`` footers, in parallel, and none when the files alone are larger.
        """
        entries = []
        for entry in self._files.iter_files():
            entries.append(entry)
            if len(entries) > MAX_SIZED_FILES:
                return None
        if sum(e.size or 0 for e in entries) > limit:  # bigger on disk already: no footer needed
            return None
        if self._include_paths or self._include_row_hash or (entries and self._partition_schema(entries[0]) is not None):
            return None  # a path, hash or partition value on every row: not in the footers
        read = functools.partial(_read_footer, self._files.filesystem, retrier=Retrier(self._retry_policy))
        footers = map_small_reads(self._files.filesystem, lambda e: read(e, self._display(e)), entries)
        total = 0
        for metadata in footers:
            schema = metadata.schema.to_arrow_schema()
            wanted = {i for i, name in enumerate(schema.names) if self._columns is None or name in self._columns}
            for g in range(metadata.num_row_groups):
                group = metadata.row_group(g)
                if group.num_columns != len(schema):
                    return None  # nested columns: leaves do not map to fields one to one
                for i in wanted:
                    size = _decoded_column_bytes(schema.field(i).type, group.column(i), group.num_rows, guess_dictionaries)
                    if size is None:
                        return None
                    total += size
                if total > limit:
                    return None
        return total

    def apply_projection(self, columns: list[str]) -> ParquetDatasource:
        """A copy reading only ``columns``."""
        if self._columns is not None:
            extra = [c for c in columns if c not in self._columns]
            if extra:
                raise ValueError(f"columns {extra} were already projected away; available: {self._columns}")
        clone = copy.copy(self)
        clone._columns = list(columns)
        return clone

    def apply_filter(
        self, expr: Any, statistics: Callable[[frozenset[str]], Any] | None = None
    ) -> ParquetDatasource | None:
        """A copy applying ``expr`` (and any filter already set) while reading; None when
        ``expr`` does not evaluate on the columns read: one the projection dropped (Arrow's
        scanner would filter on it all the same, so ``select_columns(["a"]).filter(expr="b >
        5")`` would run on Parquet and fail naming ``b`` on any other source) or one the files
        lack (the scanner's error reads as a corrupt file). Left to the filter step, both fail
        with a ``ColumnNotFoundError`` naming the column, on every source.

        ``statistics`` (from a dataflow expression) gives, for the names of the float columns,
        the weaker filter that row-group statistics may prune with (``_statistics_filter``)."""
        if not isinstance(expr, pc.Expression):
            raise TypeError(f"filter must be a pyarrow.compute.Expression, got {type(expr).__name__}")
        if not self._filter_evaluates_on_read(expr):
            return None
        clone = copy.copy(self)
        clone._filter = expr if self._filter is None else (self._filter & expr)
        clone._filter_parts = (*self._filter_parts, (expr, statistics))
        clone._pruning = None
        return clone

    def _statistics_filter(self, schema: pa.Schema) -> tuple[pc.Expression | None, bool]:
        """The filter row groups are pruned with (None: none), and whether it is the whole
        filter. Statistics leave NaN out, so a part of the filter on a float column is replaced
        by its ``statistics`` form (``dataflow.expr_statistics``), or dropped when it has none
        (a pyarrow expression: its tree cannot be read). A part names a float column when the
        column's name is in its text; a false match only prunes less. Worked out once per schema."""
        cached = self._pruning
        if cached is not None and cached[0].equals(schema):
            return cached[1], cached[2]
        floats = frozenset(f.name for f in schema if pa.types.is_floating(f.type))
        kept: list[pc.Expression] = []
        exact = True
        for expr, statistics in self._filter_parts:
            text = str(expr)
            if not any(name in text for name in floats):
                kept.append(expr)
                continue
            exact = False
            weaker = statistics(floats) if statistics is not None else None
            if weaker is not None:
                kept.append(weaker)
        pruning = functools.reduce(lambda a, b: a & b, kept) if kept else None
        self._pruning = (schema, pruning, exact)
        return pruning, exact

    def _filter_evaluates_on_read(self, expr: pc.Expression) -> bool:
        """Whether ``expr`` evaluates on the columns read (tried on no rows). A filter on all the
        files' columns that fails for another reason (a partition column, a string, compared
        with a number) is still pushed: the read explains that error."""
        try:
            schema = self.schema()
        except Exception:  # no schema yet: the read reports its own error
            return True
        if schema is None:
            return True
        try:
            schema.empty_table().filter(expr)
        except KeyError:
            return False
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            return self._columns is None and "No match for FieldRef" not in str(exc)
        return True

    def get_read_tasks(self, parallelism: int) -> Iterator[Any]:
        """Read tasks, planned from the listing; the dataset schema comes from the first files' footers."""
        self._fix_schema()
        return super().get_read_tasks(parallelism)

    def _fix_schema(self) -> None:
        self._file_schema(self._first_file())  # fixed on the driver: every task checks against the same schema
        if self._columns is not None or self._tensor_columns:
            self.schema()  # a column the data lacks (or not bytes): a ValueError naming it, here, once

    def counted_read_tasks(self, parallelism: int) -> Iterator[Any] | None:
        """``get_read_tasks``' tasks, in the same order, each with its exact ``num_rows`` from the
        footers (read in parallel, on the first ``next``), so that the global position of every
        row is known before any task runs: a random shuffle or a round-robin repartition then
        partitions in the read tasks (``dataflow.compile._partitioned_read``). None where the
        rows cannot be told up front: a filter, a file order that changes with each execution,
        or more than ``COUNTED_MAX_FILES`` files."""
        if self._filter is not None or self.lists_anew_each_execution:
            return None
        if next(itertools.islice(self._files.iter_files(), COUNTED_MAX_FILES, None), None) is not None:
            return None
        return self._counted_read_tasks(parallelism)

    def _counted_read_tasks(self, parallelism: int) -> Iterator[Any]:
        self._fix_schema()
        planned = list(self._planned_tasks(parallelism))
        entries = list({p.entry.path: p.entry for group, _ in planned for p in group}.values())
        read = functools.partial(_read_footer, self._files.filesystem, retrier=Retrier(self._retry_policy))
        footers = dict(zip([e.path for e in entries],
                           map_small_reads(self._files.filesystem, lambda e: read(e, self._display(e)), entries),
                           strict=True))
        for group, task in planned:
            rows = 0
            for piece in group:
                footer = footers[piece.entry.path]
                rows += sum(footer.row_group(i).num_rows for i in _piece_row_groups(footer, piece))
            task.metadata = dataclasses.replace(task.metadata, num_rows=rows)
            yield task

    def _prune(self, entries: Iterator[FileEntry], part_schema: pa.Schema | None) -> Iterator[FileEntry]:
        """Without the files whose hive partition values rule the filter out (decided from the
        path, once per folder, as Arrow's datasets prune: ``year == '2024' and x > 5`` skips
        every other year's files unopened). A filter that cannot be decided from the values
        alone (one comparing a string partition with a number) keeps the file: its read then
        explains the error."""
        if self._filter is None or part_schema is None:
            yield from entries
            return
        fs = self._files.filesystem
        expected = self._file_schema_cache
        names = set(expected.names) if expected is not None else set()
        schema = pa.schema(list(expected or []) + [f for f in part_schema if f.name not in names])
        verdicts: dict[str, bool] = {}
        skipped = 0
        for entry in entries:
            folder = entry.path.rsplit("/", 1)[0]
            keep = verdicts.get(folder)
            if keep is None:
                keep = verdicts[folder] = self._partition_may_match(fs, entry, part_schema, schema)
            if keep:
                yield entry
            else:
                skipped += 1
        io_stats.record(files_skipped=skipped)

    def _partition_may_match(self, fs: Any, entry: FileEntry, part_schema: pa.Schema, schema: pa.Schema) -> bool:
        values = self._partition_values(part_schema, entry, self._display(entry))
        if not values:
            return True
        import pyarrow.dataset as pads

        fragment = parquet_file_format().make_fragment(entry.path, fs, partition_expression=partition_expression(values))
        dataset = pads.FileSystemDataset([fragment], schema=schema, format=parquet_file_format(), filesystem=fs)
        try:  # (Arrow simplifies the filter with the partition's values; nothing is read)
            return next(iter(dataset.get_fragments(filter=self._filter)), None) is not None
        except (pa.ArrowException, ValueError, TypeError):
            return True

    # ----- worker-side: reading ----------------------------------------------------------

    def _iter_piece_tables(
        self, pieces: tuple[FilePiece, ...], part_schema: pa.Schema | None, retrier: Retrier
    ) -> Iterator[pa.Table]:
        fs = self._files.filesystem
        for piece in pieces:
            display = self._display(piece.entry)
            values = self._partition_values(part_schema, piece.entry, display) if part_schema else {}
            seed = row_hash.piece_seed(display, piece.index, piece.count) if self._wants(row_hash.COLUMN) else None
            position = 0
            try:
                for table in retrier.iterate(
                    functools.partial(self._open_row_groups, fs, piece, display, part_schema, values),
                    path=display,
                ):
                    if self._include_paths and self._wants("path"):
                        table = table.append_column("path", pa.array([display] * table.num_rows, pa.string()))
                    if seed is not None:
                        table = row_hash.with_row_hash(table, seed, position)
                        position += table.num_rows
                    if self._tensor_columns:
                        table = tensor_columns.decode(table, self._tensor_columns, display)
                    yield table
            except (FileFormatError, OSError) as exc:
                if isinstance(exc, FileFormatError) or _is_data_error(exc):
                    raise _format_error(exc, display) from exc
                raise
            except pa.ArrowNotImplementedError as exc:
                if self._filter is None or "no kernel matching input types" not in str(exc):
                    raise _format_error(exc, display) from exc
                msg = (
                    f"the filter {self._filter} compares values of different types ({exc}); hive "
                    "partition columns are strings, as in Ray Data: compare them with strings, or pass "
                    "partitioning=pa.schema([...]) to type them"
                )
                raise TypeError(msg) from exc
            except (pa.ArrowException, ValueError) as exc:
                raise _format_error(exc, display) from exc

    def _open_row_groups(
        self,
        fs: Any,
        piece: FilePiece,
        display: str,
        part_schema: pa.Schema | None,
        values: dict[str, pa.Scalar],
    ) -> Iterator[pa.Table]:
        expected = self._file_schema_cache
        assert expected is not None, "get_read_tasks fixes the schema before tasks run"
        if self._filter is None:
            return self._read_plain(fs, piece, display, expected, part_schema, values)
        return self._read_fragment(fs, piece, display, expected, part_schema, values)

    def _wants(self, derived: str) -> bool:
        """Whether the output keeps column ``derived`` (``path``, ``row_hash``) after projection."""
        if derived == row_hash.COLUMN and not self._include_row_hash:
            return False
        return self._columns is None or derived in self._columns

    def _projected_file_columns(self) -> list[str] | None:
        """The projected columns the files hold (``path`` and ``row_hash`` are added after
        reading); None: all."""
        if self._columns is None:
            return None
        derived = {"path"} | ({row_hash.COLUMN} if self._include_row_hash else set())
        return [c for c in self._columns if c not in derived]

    def _read_fragment(
        self,
        fs: Any,
        piece: FilePiece,
        display: str,
        expected: pa.Schema,
        part_schema: pa.Schema | None,
        values: dict[str, pa.Scalar],
    ) -> Iterator[pa.Table]:
        """Through a dataset fragment: row groups pruned by the filter, rows filtered, partition
        values added, and each file cast to the dataset's schema."""
        fragment = parquet_file_format().make_fragment(
            piece.entry.path, fs, partition_expression=partition_expression(values)
        )
        metadata = fragment.metadata
        self._check_schema(fragment.physical_schema, expected, display)
        dataset_schema = expected
        if part_schema is not None:
            dataset_schema = pa.schema(
                list(expected) + [f for f in part_schema if f.name not in expected.names]
            )
        ids = _piece_row_groups(metadata, piece)
        kept = ids
        pruning, exact = self._statistics_filter(dataset_schema)
        if pruning is not None and ids:
            matching = fragment.subset(filter=pruning, schema=dataset_schema)
            matching_ids = {rg.id for rg in matching.row_groups}
            kept = [i for i in ids if i in matching_ids]
        io_stats.record(files_read=1, row_groups_read=len(kept), row_groups_skipped=len(ids) - len(kept))
        columns = self._projected_file_columns()
        for run, decoded, _big in _row_group_runs(metadata, kept, columns):
            # use_threads=False: a task is one thread of work (the engine runs one per CPU), and
            # with page checksums on the threaded scanner is ~3x slower on one row group
            part = fragment.subset(row_group_ids=run)
            if exact:
                table = part.to_table(schema=dataset_schema, columns=columns, filter=self._filter, use_threads=False)
            else:  # the scanner would prune with the whole filter again: filtered here instead
                # (with the columns the filter names: those whose names are in its text)
                text = str(self._filter)
                read = None if columns is None else [n for n in dataset_schema.names if n in columns or n in text]
                table = part.to_table(schema=dataset_schema, columns=read, use_threads=False).filter(self._filter)
                if columns is not None:
                    table = table.select(columns)
            io_stats.record(bytes_read=decoded)
            yield table

    def _read_plain(
        self,
        fs: Any,
        piece: FilePiece,
        display: str,
        expected: pa.Schema,
        part_schema: pa.Schema | None = None,
        values: dict[str, pa.Scalar] | None = None,
    ) -> Iterator[pa.Table]:
        """Without a filter: the row groups straight from ``ParquetFile``, which costs a quarter
        to a half of a dataset fragment's CPU per file (a 1,000-row file: ~200 against ~450 us),
        the same checks, checksums and results; hive partition values are added as constant
        columns, as the fragment's scanner adds them. A file whose columns differ from the
        dataset's (a ``schema=`` that reconciles files) takes the fragment's path, which casts."""
        with _source(fs, piece) as (source, pre_buffer):  # (retried with the row groups)
            parquet = pq.ParquetFile(source, pre_buffer=pre_buffer, page_checksum_verification=True)
            physical = parquet.schema_arrow
            columns = self._projected_file_columns()
            in_files = set(expected.names)  # (once: each .names builds a new list)
            wanted = [n for n in columns if n in in_files] if columns is not None else expected.names
            # the same schema as the dataset's (most files): nothing to check (13 us a file)
            if not physical.equals(expected):
                self._check_schema(physical, expected, display)
                present = set(physical.names)
                if [physical.field(n) for n in wanted if n in present] != [expected.field(n) for n in wanted]:
                    yield from self._read_fragment(fs, piece, display, expected, part_schema, values or {})
                    return
            metadata = parquet.metadata
            ids = _piece_row_groups(metadata, piece)
            io_stats.record(files_read=1, row_groups_read=len(ids), row_groups_skipped=0)
            for run, decoded, big in _row_group_runs(metadata, ids, wanted if columns is not None else None):
                if wanted and big:
                    rows = max(1, metadata.row_group(run[0]).num_rows * STREAM_BLOCK_BYTES // decoded)
                    batches = parquet.iter_batches(batch_size=rows, row_groups=run, columns=wanted, use_threads=False)
                    for batch in batches:
                        table = pa.Table.from_batches([batch]).replace_schema_metadata(expected.metadata)
                        yield _with_partition_values(table, values, columns)
                    io_stats.record(bytes_read=decoded)
                    continue
                table = parquet.read_row_groups(run, columns=wanted, use_threads=False)
                io_stats.record(bytes_read=decoded)
                # (a table of no columns, when only path or row_hash is wanted, keeps its row
                # count only as it is: pyarrow rebuilds it with 0 rows on any schema change)
                if table.num_columns:
                    table = table.replace_schema_metadata(expected.metadata)
                yield _with_partition_values(table, values, columns)

    def _check_schema(self, physical: pa.Schema, expected: pa.Schema, display: str) -> None:
        """A file whose schema differs from the dataset's: a column it lacks is read as nulls
        and a type that casts is cast (as Ray's), by the fragment's read. Raised here: a type
        no cast turns into the dataset's, and, without ``schema=`` or ``columns=``, columns
        the dataset's schema does not have, which Ray drops without a word."""
        # name -> type, once: each .names builds a new list, and a file of 5,000 columns spent
        # 10 s here looking names up in them
        wants = {field.name: field.type for field in expected}
        gots = {field.name: field.type for field in physical}
        names = self._columns if self._columns is not None else list(wants)
        for name in names:
            if name not in wants or name not in gots:
                continue  # a partition or path column; a column the file lacks
            got, want = gots[name], wants[name]
            if got != want and not _casts(got, want):
                given = self._user_schema is not None
                where, hint = ("the schema given", "") if given else ("the dataset's schema", _SCHEMA_HINT)
                msg = f"column {name!r} is {got} here, which does not cast to {want} in {where}{hint}"
                raise SchemaMismatchError(msg, path=display, column=name)
        if self._columns is None and self._user_schema is None:
            extra = [n for n in gots if n not in wants]
            if extra:
                msg = (f"the file has columns {extra} that the dataset's schema (from the first "
                       f"{SCHEMA_SAMPLE_FILES} files' footers) does not; columns=[...] leaves them out")
                raise SchemaMismatchError(msg + _SCHEMA_HINT, path=display, column=extra[0])


SCHEMA_SAMPLE_FILES = 16
"""Files whose footers make a Parquet dataset's schema when no ``schema=`` is given (Ray 2.60
reads as many)."""

_SCHEMA_HINT = "; pass schema=... to read files with different schemas as one"


def _casts(got: pa.DataType, want: pa.DataType) -> bool:
    """Whether Arrow casts ``got`` to ``want`` (values may still fail it: an overflow)."""
    try:
        pa.array([], type=got).cast(want)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return False
    return True


def _mergeable(a: pa.Field, b: pa.Field) -> bool:
    try:
        pa.unify_schemas([pa.schema([a]), pa.schema([b])], promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return False
    return True


def _with_partition_values(
    table: pa.Table, values: dict[str, pa.Scalar] | None, columns: list[str] | None
) -> pa.Table:
    """``table`` with a constant column per hive partition value it does not hold (those the
    projection ``columns`` keeps, in its order), as the dataset scanner adds them; built in one
    step, so a table of no columns keeps its rows."""
    add = {name: value for name, value in (values or {}).items()
           if name not in table.schema.names and (columns is None or name in columns)}
    if not add:
        return table
    rows = table.num_rows
    fields = [*table.schema, *(pa.field(name, value.type) for name, value in add.items())]
    arrays = [*table.columns, *(pa.repeat(value, rows) for value in add.values())]
    out = pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=table.schema.metadata))
    return out.select([c for c in columns if c in out.schema.names]) if columns is not None else out


def _piece_row_groups(metadata: pq.FileMetaData, piece: FilePiece) -> list[int]:
    """The row groups a piece reads: all of them, or for range ``i`` of a split file those that
    start in it (each row group read exactly once, as Hadoop splits do)."""
    ids = list(range(metadata.num_row_groups))
    if piece.count > 1:
        size = piece.entry.size or 0
        lo, hi = size * piece.index // piece.count, size * (piece.index + 1) // piece.count
        ids = [i for i in ids if lo <= row_group_start(metadata.row_group(i)) < hi]
    return ids


def _row_group_runs(
    metadata: pq.FileMetaData, ids: list[int], columns: list[str] | None
) -> Iterator[tuple[list[int], int, bool]]:
    """``ids`` as runs read in one call each, with their decoded bytes: consecutive small row
    groups together up to ``STREAM_BLOCK_BYTES`` (a file of 10,000 row groups of 100 rows read
    one call each took 1.9-2.6 s, against 0.68 s for ``pq.read_table``), and a row group past
    ``BATCHED_ROW_GROUP_BYTES`` alone, flagged to be read a batch at a time."""
    run: list[int] = []
    run_bytes = 0
    for rg_id in ids:
        group = metadata.row_group(rg_id)
        decoded = _group_bytes(group, columns)
        if decoded > BATCHED_ROW_GROUP_BYTES and group.num_rows > 1:
            if run:
                yield run, run_bytes, False
                run, run_bytes = [], 0
            yield [rg_id], decoded, True
            continue
        run.append(rg_id)
        run_bytes += decoded
        if run_bytes >= STREAM_BLOCK_BYTES:
            yield run, run_bytes, False
            run, run_bytes = [], 0
    if run:
        yield run, run_bytes, False


def _group_bytes(group: pq.RowGroupMetaData, columns: list[str] | None) -> int:
    """A row group's uncompressed bytes; of the projected columns only, when projected."""
    if columns is None:
        return int(group.total_byte_size)
    wanted = set(columns)
    return sum(int(group.column(i).total_uncompressed_size) for i in range(group.num_columns)
               if group.column(i).path_in_schema.split(".")[0] in wanted)


COUNTED_MAX_FILES = 1024
"""``counted_read_tasks`` reads at most this many footers before the first task starts (tens of
microseconds each on a local disk; on object storage a request each, in parallel)."""

MAX_SIZED_FILES = 64
"""Footers ``decoded_bytes_at_most`` reads at most (a small input has few files)."""


def _decoded_column_bytes(typ: pa.DataType, column: Any, num_rows: int, guess_dictionaries: bool = False) -> int | None:
    """One column chunk's decoded bytes, or None when the footer cannot tell (a dictionary-encoded
    string column can tell a guess: see ``decoded_bytes_at_most``)."""
    width = _fixed_width(typ)
    if width is not None:
        return num_rows * width + (num_rows + 7) // 8  # values, and a validity bitmap
    plain_bytes = pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_binary(typ) or pa.types.is_large_binary(typ)
    if plain_bytes and (guess_dictionaries or not column.has_dictionary_page):
        return int(column.total_uncompressed_size) + 8 * num_rows
    return None


def _fixed_width(typ: pa.DataType) -> int | None:
    if pa.types.is_boolean(typ):
        return 1
    if pa.types.is_fixed_size_list(typ):
        inner = _fixed_width(typ.value_type)
        return None if inner is None else inner * typ.list_size
    try:
        bits = typ.bit_width
    except ValueError:  # not fixed width
        return None
    return max(1, bits // 8)


def _is_data_error(exc: BaseException) -> bool:
    """An OSError from decoding (corrupt pages, bad CRC), not from storage."""
    if isinstance(exc, PathNotFoundError | AccessDeniedError | RetriesExhaustedError):
        return False
    text = str(exc).lower()
    return any(
        m in text for m in ("corrupt", "checksum", "page integrity", "decompress", "magic bytes", "thrift")
    )


def _format_error(exc: BaseException, display: str) -> FileFormatError:
    if isinstance(exc, FileFormatError):
        return exc
    return FileFormatError(f"not a readable Parquet file ({type(exc).__name__}: {exc})", path=display)


def _read_footer(fs: Any, entry: FileEntry, display: str, retrier: Retrier) -> pq.FileMetaData:
    """The file's footer; read once per planning scope (``connectors.base.planning``)."""
    cache = planning_cache()
    key = ("parquet footer", id(fs), entry.path, entry.size)
    if cache is not None and key in cache:
        return cache[key]
    metadata = _read_footer_now(fs, entry, display, retrier)
    if cache is not None:
        cache[key] = metadata
    return metadata


def _read_footer_now(fs: Any, entry: FileEntry, display: str, retrier: Retrier) -> pq.FileMetaData:
    def read() -> pq.FileMetaData:
        with open_input_file(fs, entry.path, retrier, display) as handle:
            return pq.read_metadata(handle)

    try:
        return retrier.call(read, path=display, action="read the footer")
    except (pa.ArrowInvalid, OSError) as exc:
        if isinstance(exc, pa.ArrowInvalid) or _is_data_error(exc):
            raise _format_error(exc, display) from exc
        raise


def _footer_rows(fs: Any, entry: FileEntry, *, retrier: Retrier, display: Any) -> int:
    return _read_footer(fs, entry, display(entry), retrier).num_rows


class ParquetDatasink(FileDatasink):
    """Parquet files under ``path`` (local or ``s3://``), committed atomically on success.

    Pages carry CRC checksums (``write_page_checksum=True``) that readers here verify.
    ``partition_cols`` writes hive folders; ``min_rows_per_file`` makes the engine bundle blocks;
    ``max_rows_per_file`` caps each file. ``arrow_parquet_args`` (Ray's ``**arrow_parquet_args``)
    and what ``arrow_parquet_args_fn()`` returns (called on the worker, for each file; its keys
    win) are passed to ``pyarrow.parquet.write_table``. Other arguments: ``FileDatasink``'s.
    """

    EXTENSION = ".parquet"
    NUMBERS_EVERY_FILE = True

    def __init__(
        self,
        path: str,
        *,
        partition_cols: Sequence[str] | None = None,
        min_rows_per_file: int | None = None,
        max_rows_per_file: int | None = None,
        filesystem: Any = None,
        compression: str = "snappy",
        row_group_size: int | None = None,
        arrow_parquet_args: dict[str, Any] | None = None,
        arrow_parquet_args_fn: Callable[[], dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            path,
            partition_cols=partition_cols,
            min_rows_per_file=min_rows_per_file,
            max_rows_per_file=max_rows_per_file,
            filesystem=filesystem,
            **kwargs,
        )
        self._compression = compression
        self._row_group_size = row_group_size
        self._arrow_parquet_args = _check_writer_args(dict(arrow_parquet_args or {}), "arrow_parquet_args")
        if arrow_parquet_args_fn is not None and not callable(arrow_parquet_args_fn):
            raise TypeError(f"arrow_parquet_args_fn must be a function returning a dict, got {type(arrow_parquet_args_fn).__name__}")
        self._arrow_parquet_args_fn = arrow_parquet_args_fn

    def get_name(self) -> str:
        """``WriteParquet``."""
        return "WriteParquet"

    def on_write_start(self) -> None:
        """Check what ``arrow_parquet_args_fn`` returns (once, here) before any task runs it."""
        if self._arrow_parquet_args_fn is not None:
            _check_writer_args(dict(self._arrow_parquet_args_fn()), "arrow_parquet_args_fn()")
        super().on_write_start()

    def _encode_into(self, tables: list[pa.Table], out: pa.NativeFile) -> None:
        table = combine(tables)
        options: dict[str, Any] = {
            "compression": self._compression,
            "row_group_size": self._row_group_size,
            "write_page_checksum": True,
            **self._arrow_parquet_args,
        }
        if self._arrow_parquet_args_fn is not None:
            options.update(_check_writer_args(dict(self._arrow_parquet_args_fn()), "arrow_parquet_args_fn()"))
        pq.write_table(table, out, **options)


_WRITER_ARGS = frozenset(inspect.signature(pq.write_table).parameters) - {"table", "where", "filesystem", "kwargs"}


def _check_writer_args(args: dict[str, Any], where: str) -> dict[str, Any]:
    """``args`` if every key is an argument of ``pyarrow.parquet.write_table``, else ``TypeError``."""
    unknown = sorted(set(args) - _WRITER_ARGS)
    if unknown:
        raise TypeError(
            f"write_parquet() got an unexpected keyword argument {unknown[0]!r} ({where}: not an argument "
            "of pyarrow.parquet.write_table either)"
        )
    return args

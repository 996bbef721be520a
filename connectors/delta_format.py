"""Delta Lake tables (``deltalake``, delta-rs): read a version's files, write as one commit.

Reading (``DeltaDatasource``): the driver opens the table's log at ``version`` (the latest by
default) and takes its active files from it (``get_add_actions``) with their sizes, row counts,
min/max statistics and partition values; the table folder is never listed. The files are then read
by the Parquet reader (``ParquetDatasource``: tasks by bytes, big files split by row groups,
columns and filters pushed into the reader), with the partition values from the log as typed
columns and the table's schema as the dataset's: files are cast to it, and a file written before
a column was added reads that column as nulls. With a filter, files whose partition values or
integer/date min/max statistics rule it out are dropped on the driver (``io_stats.files_skipped``)
before any task runs; the tasks then skip row groups by their own statistics. ``count()`` adds up
the log's row counts. Tables that need a reader feature this does not implement (deletion
vectors, column mapping) are refused with ``NotImplementedError``.

Writing (``DeltaDatasink``): write tasks write Parquet files exactly as ``write_parquet`` does
(staged in a hidden folder of the table, hive ``key=value`` folders for ``partition_by``) and
read back their footers for the log's statistics (row count, null counts, min/max); the driver
moves the staged files into the table folder and commits them all as one Delta transaction
(``deltalake``'s ``create_table_with_add_actions`` for a new table, ``create_write_transaction``
otherwise), checked against the version seen when the job started, so a concurrent overwrite
makes the commit fail instead of losing data. No row passes through the driver: it only handles
file names and statistics. A job that fails, or whose commit fails, leaves the table as it was:
no new version, and the job's files are removed (files not in the log are invisible to readers
in any case).

``mode``: ``"append"`` (Ray's default; creates the table when missing), ``"overwrite"`` (a new
version holding only this job's rows, with this job's schema; older versions stay readable),
``"error"`` (the table must not exist) or ``"ignore"`` (write nothing when it exists). Appended
rows must have the table's columns; they are cast to its types. A column the table lacks is, with
``schema_mode="merge"`` (Ray's default), added to the table (nullable: earlier rows read it as
null) in a commit of its own just before the append's, as ``ALTER TABLE ... ADD COLUMN``; with
``schema_mode="error"`` it is a ``ValueError`` and the table is left as it was. A column whose
type cannot be cast to the table's is a ``ValueError`` either way.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from connectors import io_stats
from connectors.base import Block, TaskContext
from connectors.errors import PathNotFoundError
from connectors.file_datasink import WriteResult
from connectors.file_selection import FileShuffleConfig, check_shuffle, shuffled
from connectors.filesystem import METADATA_THREADS, FileEntry, FileSet, resolve_filesystem
from connectors.parquet_format import ParquetDatasink, ParquetDatasource
from connectors.partitioning import parse_hive
from connectors.tables import conform, import_extra

DELTA_MODES = ("append", "overwrite", "error", "ignore")
UNSUPPORTED_READER_FEATURES = frozenset({"deletionVectors", "columnMapping"})
_APPEND_HINT = "; write with mode='overwrite' to replace the table and its schema"


# ----- reading --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DeltaFileEntry(FileEntry):
    """An active file of a Delta version, with what the log says about it."""

    partition_values: tuple[tuple[str, str | None], ...] = ()
    num_records: int | None = None


@dataclasses.dataclass(frozen=True)
class DeltaFileSet(FileSet):
    """The active files of one Delta version, from its log (no listing; ``check`` has nothing to do).

    Pickled without the file list (read tasks carry their own files; a copy that needs the list,
    in another process, reads the log again at the same version).
    """

    table_uri: str = ""
    version: int = 0
    storage_options: tuple[tuple[str, str], ...] = ()
    actions: pa.Table | None = None
    shuffle: str | FileShuffleConfig | None = None
    """Ray's ``shuffle=``: the files in a random order (``connectors.file_selection``)."""
    _executions: list[int] = dataclasses.field(default_factory=lambda: [-1], compare=False, hash=False, repr=False)

    def next_execution(self) -> None:
        """An execution starts listing: a shuffle takes its next order."""
        self._executions[0] += 1

    def iter_files(self) -> Iterator[DeltaFileEntry]:
        """The version's files, in the log's order (or as ``shuffle`` orders them)."""
        actions = self.actions if self.actions is not None else self.load_actions()
        if self.shuffle is None:
            yield from _entries(actions, self.roots[0])
        else:
            yield from shuffled(list(_entries(actions, self.roots[0])), self.shuffle, self._executions[0])  # type: ignore[misc]

    def check(self, retrier: Any = None) -> None:
        """Nothing to check: the log names the files."""

    def load_actions(self) -> pa.Table:
        """The version's add actions (one row per active file), read from the log."""
        return _add_actions(_open_table(self.table_uri, self.version, dict(self.storage_options) or None))

    def __reduce__(self) -> tuple[Any, ...]:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "actions"}
        return (_rebuild_file_set, (fields,))


def _rebuild_file_set(fields: dict[str, Any]) -> DeltaFileSet:
    return DeltaFileSet(**fields)


def _open_table(uri: str, version: int | None, storage_options: dict[str, str] | None) -> Any:
    deltalake = import_extra("deltalake", "read_delta")
    from deltalake.exceptions import TableNotFoundError

    try:
        return deltalake.DeltaTable(uri, version=version, storage_options=storage_options)
    except TableNotFoundError as exc:
        where = f" at version {version}" if version is not None else ""
        raise PathNotFoundError(f"no Delta table here{where} ({exc})", path=uri) from exc


def _add_actions(table: Any) -> pa.Table:
    return pa.table(table.get_add_actions(flatten=True))


def _entries(actions: pa.Table, root: str) -> Iterator[DeltaFileEntry]:
    part_columns = [name for name in actions.column_names if name.startswith("partition.")]
    rows = actions.select(["path", "size_bytes", "num_records", *part_columns]).to_pylist()
    for row in rows:
        path = row["path"]
        if "://" in path:  # an absolute URI (a shallow clone, or files outside the table folder)
            path = unquote(path.split("://", 1)[1])
            if not path.startswith("/"):
                path = "/" + path if root.startswith("/") else path
        else:
            path = f"{root}/{unquote(path)}"
        values = tuple((name.removeprefix("partition."), _partition_text(row[name])) for name in part_columns)
        yield DeltaFileEntry(path, row["size_bytes"], root, values, row["num_records"])


def _partition_text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _check_readable(table: Any, uri: str) -> None:
    protocol = table.protocol()
    features = set(protocol.reader_features or ())
    mapping = (table.metadata().configuration or {}).get("delta.columnMapping.mode", "none")
    unsupported = sorted(features & UNSUPPORTED_READER_FEATURES)
    if mapping not in ("none", None) and "columnMapping" not in unsupported:
        unsupported.append("columnMapping")
    if unsupported:
        msg = (
            f"the Delta table at {uri} uses {', '.join(unsupported)}, which read_delta does not implement; "
            "read it with deltalake (DeltaTable(...).to_pyarrow_dataset()) and pass the result to "
            "dataflow.from_arrow, or rewrite the table without them"
        )
        raise NotImplementedError(msg)


class DeltaDatasource(ParquetDatasource):
    """A Delta table at ``path`` (local or ``s3://``), at ``version`` (default: the latest).

    ``columns`` and ``filter`` (a ``pyarrow.compute`` expression) are pushed down as for
    ``read_parquet``; partition columns may be used in both. ``filesystem`` reads the data files;
    ``storage_options`` go to ``deltalake`` for reading the log.
    """

    def __init__(
        self,
        path: str,
        version: int | None = None,
        *,
        columns: Sequence[str] | None = None,
        filter: pc.Expression | None = None,
        filesystem: Any = None,
        storage_options: dict[str, str] | None = None,
        include_paths: bool = False,
        shuffle: str | FileShuffleConfig | None = None,
        **kwargs: Any,
    ) -> None:
        check_shuffle(shuffle)
        uri = str(path)
        table = _open_table(uri, version, storage_options)
        _check_readable(table, uri)
        schema = pa.schema(table.schema().to_arrow())
        part_names = list(table.metadata().partition_columns)
        part_schema = pa.schema([schema.field(name) for name in part_names]) if part_names else None
        file_schema = pa.schema([f for f in schema if f.name not in part_names], metadata=schema.metadata)
        fs, roots, prefix = resolve_filesystem([uri], filesystem)
        files = DeltaFileSet(
            fs,
            (roots[0].rstrip("/"),),
            prefix,
            None,
            table_uri=uri,
            version=table.version(),
            storage_options=tuple(sorted((storage_options or {}).items())),
            actions=_add_actions(table),
            shuffle=shuffle,
        )
        super().__init__(
            files,
            columns=columns,
            filter=filter,
            partitioning=part_schema,
            include_paths=include_paths,
            schema=file_schema,
            **kwargs,
        )
        self._files: DeltaFileSet = files

    @property
    def version(self) -> int:
        """The table version this source reads."""
        return self._files.version

    def get_name(self) -> str:
        """``ReadDelta``."""
        return "ReadDelta"

    def _partition_values(self, part_schema: pa.Schema, entry: FileEntry, display: str) -> dict[str, pa.Scalar]:
        assert isinstance(entry, DeltaFileEntry), "Delta reads only the log's files"
        raw = dict(entry.partition_values)
        return {f.name: _typed(raw.get(f.name), f.type) for f in part_schema}

    def _check_schema(self, physical: pa.Schema, expected: pa.Schema, display: str) -> None:
        """Nothing to check: the table's schema is the dataset's; columns a file lacks (added to the
        table after it was written) read as nulls, and the others are cast to the table's types."""

    def count_rows(self) -> int | None:
        """Rows of the version, from the log's statistics (footers for files without them); None with a filter."""
        if self._filter is not None:
            return None
        entries = list(self._files.iter_files())
        if all(e.num_records is not None for e in entries):
            return sum(e.num_records or 0 for e in entries)
        return super().count_rows()

    def get_read_tasks(self, parallelism: int) -> Iterator[Any]:
        """Read tasks for the files the filter may match (all files without a filter)."""
        if self._filter is None:
            return super().get_read_tasks(parallelism)
        actions = self._files.actions if self._files.actions is not None else self._files.load_actions()
        keep = self._files_matching(actions)
        io_stats.record(files_skipped=actions.num_rows - len(keep))
        clone = copy.copy(self)
        clone._files = dataclasses.replace(self._files, actions=actions.take(keep))
        return ParquetDatasource.get_read_tasks(clone, parallelism)

    def _files_matching(self, actions: pa.Table) -> list[int]:
        """Indices of the files whose partition values and statistics do not rule the filter out.

        Each file gets a pyarrow "partition expression" that holds for all its rows (``p == 'x'``,
        ``a >= 3 and a <= 9 or a is null``); pyarrow's dataset then drops the files whose
        expression contradicts the filter, without opening any.
        """
        schema = self._dataset_schema(None)
        assert schema is not None, "a Delta source always knows its schema"
        entries = list(_entries(actions, self._files.roots[0]))
        stats_columns = [
            f.name for f in schema
            if (pa.types.is_integer(f.type) or pa.types.is_date(f.type))
            and f"min.{f.name}" in actions.column_names and f"max.{f.name}" in actions.column_names
        ]
        columns = {name: actions.column(name).to_pylist() for name in actions.column_names
                   if name.split(".", 1)[-1] in stats_columns and name.split(".", 1)[0] in ("min", "max", "null_count")}
        guarantees = []
        for index, entry in enumerate(entries):
            guarantee = pc.scalar(True)
            if self._partitioning is not None:
                for name, value in self._partition_values(self._partitioning, entry, "").items():
                    term = pads.field(name).is_null() if not value.is_valid else pads.field(name) == value
                    guarantee = guarantee & term
            for name in stats_columns:
                low, high = columns[f"min.{name}"][index], columns[f"max.{name}"][index]
                if low is None or high is None:
                    continue
                kind = schema.field(name).type
                term = (pads.field(name) >= pa.scalar(low, kind)) & (pads.field(name) <= pa.scalar(high, kind))
                nulls = columns.get(f"null_count.{name}", [None] * len(entries))[index]
                guarantee = guarantee & (term if nulls == 0 else term | pads.field(name).is_null())
            guarantees.append(guarantee)
        paths = [entry.path for entry in entries]
        dataset = pads.FileSystemDataset.from_paths(
            paths, schema=schema, format=pads.ParquetFileFormat(), filesystem=self._files.filesystem,
            partitions=guarantees,
        )
        kept = {fragment.path for fragment in dataset.get_fragments(filter=self._filter)}
        return [index for index, path in enumerate(paths) if path in kept]


def _typed(value: str | None, kind: pa.DataType) -> pa.Scalar:
    """A partition value as the log writes it (text, or null) converted to the column's type."""
    if value is None:
        return pa.scalar(None, kind)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return pa.scalar(value, kind)
    if pa.types.is_boolean(kind):
        return pa.scalar(value.lower() == "true", kind)
    return pc.cast(pa.array([value]), kind)[0]


# ----- writing --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DeltaFile:
    """One file a write task wrote, as the log records it."""

    path: str
    size: int
    partition_values: tuple[tuple[str, str | None], ...]
    stats: str


@dataclasses.dataclass(frozen=True)
class DeltaWriteResult(WriteResult):
    """``WriteResult`` plus what the log needs about each file, and the rows' schema."""

    delta_files: tuple[DeltaFile, ...] = ()
    schema: pa.Schema | None = None


class DeltaDatasink(ParquetDatasink):
    """A Delta table at ``path``: tasks write Parquet files, the driver commits them in one transaction.

    See the module docstring for ``mode``. ``partition_by`` partitions a new table (an existing
    table keeps its own partitioning; a different one is refused). ``storage_options`` go to
    ``deltalake``; ``filesystem`` writes the data files. ``name``, ``description`` and
    ``configuration`` describe a new table.
    """

    def __init__(
        self,
        path: str,
        *,
        mode: Any = "append",
        partition_by: Sequence[str] | None = None,
        storage_options: dict[str, str] | None = None,
        filesystem: Any = None,
        name: str | None = None,
        description: str | None = None,
        configuration: dict[str, str | None] | None = None,
        min_rows_per_file: int | None = None,
        max_rows_per_file: int | None = None,
        compression: str = "snappy",
        schema_mode: str = "merge",
    ) -> None:
        import_extra("deltalake", "write_delta")
        mode = str(getattr(mode, "value", mode)).lower()
        if mode not in DELTA_MODES:
            raise ValueError(f"mode must be one of {DELTA_MODES} (or a SaveMode of them), got {mode!r}")
        if schema_mode not in ("merge", "error"):
            raise ValueError(f"schema_mode must be 'merge' or 'error', got {schema_mode!r}")
        self._schema_mode = schema_mode
        super().__init__(
            path,
            partition_cols=partition_by,
            min_rows_per_file=min_rows_per_file,
            max_rows_per_file=max_rows_per_file,
            filesystem=filesystem,
            compression=compression,
        )
        self.write_success_marker = False  # the Delta log says what the table holds
        self._uri = str(path)
        self._mode = mode
        self._storage_options = dict(storage_options) if storage_options else None
        self._table_info = {"name": name, "description": description, "configuration": configuration}
        self._start_version: int | None = None
        self._table_schema: pa.Schema | None = None
        self.committed_version: int | None = None
        """The table version this job's commit made (None before it, or when nothing was written)."""
        self.skip_write = False
        """Set by ``on_write_start`` with ``mode="ignore"`` when the table exists: nothing is written."""

    def get_name(self) -> str:
        """``WriteDelta``."""
        return "WriteDelta"

    def _existing_table(self) -> Any:
        import deltalake

        if not deltalake.DeltaTable.is_deltatable(self._uri, storage_options=self._storage_options):
            return None
        return deltalake.DeltaTable(self._uri, storage_options=self._storage_options)

    def on_write_start(self) -> None:
        """Check ``mode`` against the table, note its version and schema, then stage as file sinks do."""
        table = self._existing_table()
        if table is not None:
            if self._mode == "ignore":
                self.skip_write = True
                return
            if self._mode == "error":
                raise ValueError(f"a Delta table exists at {self._uri}: pass mode='append', 'overwrite' or 'ignore'")
            self._start_version = table.version()
            existing = list(table.metadata().partition_columns)
            if self._partition_cols and self._partition_cols != existing and self._mode == "append":
                msg = f"the Delta table at {self._uri} is partitioned by {existing}, not {self._partition_cols}"
                raise ValueError(msg)
            self._partition_cols = self._partition_cols or existing
            if self._mode == "append":
                self._table_schema = pa.schema(table.schema().to_arrow())
        super().on_write_start()

    def write(self, blocks: Iterable[Block], ctx: TaskContext) -> DeltaWriteResult:
        """Write ``blocks`` as staged Parquet files; returns them with the log's statistics."""
        if self.skip_write:
            return DeltaWriteResult((), 0, 0)
        schema: list[pa.Schema] = []

        def conformed() -> Iterator[Block]:
            for block in blocks:
                if isinstance(block, pa.RecordBatch):
                    block = pa.Table.from_batches([block])
                if self._table_schema is not None:
                    target = self._table_schema
                    if self._schema_mode == "merge":  # columns the table lacks go along, to be added
                        target = _with_new_columns(target, block.schema)
                    block = conform(block, target, f"the Delta table at {self._uri}", _APPEND_HINT)
                if not schema:
                    schema.append(block.schema)
                yield block

        staged = super().write(conformed(), ctx)
        with ThreadPoolExecutor(max(1, min(METADATA_THREADS, len(staged.files))), thread_name_prefix="delta-stats") as pool:
            files = tuple(pool.map(self._describe, staged.files))
        return DeltaWriteResult(staged.files, staged.num_rows, staged.num_bytes, files, schema[0] if schema else None)

    def _describe(self, relative: str) -> DeltaFile:
        """A staged file as the log will name it: path, size, partition values and statistics."""
        source = f"{self.staging_dir}/{relative}"
        with self._fs.open_input_file(source) as handle:
            size = handle.size()
            metadata = pq.read_metadata(handle)
        values = parse_hive(f"r/{relative}", "r")
        return DeltaFile(
            path=relative,  # as on disk: deltalake percent-encodes it for the log
            size=size,
            partition_values=tuple((k, _partition_text(_bool_text(v))) for k, v in values.items()),
            stats=json.dumps(_file_stats(metadata)),
        )

    def on_write_complete(self, write_results: list[Any]) -> None:
        """Put the staged files in place, then commit them as one Delta transaction.

        If the commit fails, the files are removed again and the table is as it was.
        """
        if self.skip_write:
            return
        super().on_write_complete(write_results)  # the files are in place, not yet in the log
        try:
            self._commit(write_results)
        except BaseException:
            self._remove_placed(write_results)
            raise

    def _commit(self, write_results: list[Any]) -> None:
        import deltalake
        from deltalake.transaction import AddAction, create_table_with_add_actions

        now = int(time.time() * 1000)
        actions = [
            AddAction(f.path, f.size, dict(f.partition_values), now, True, f.stats)
            for result in write_results
            for f in result.delta_files
        ]
        schema = self._table_schema or next((r.schema for r in write_results if r.schema is not None), None)
        if self._table_schema is not None and self._schema_mode == "merge":
            for result in write_results:
                if result.schema is not None:
                    schema = _with_new_columns(schema, result.schema)
        if self._start_version is None:
            if schema is None:
                return  # no rows and no table: nothing to create
            create_table_with_add_actions(
                self._uri,
                deltalake.Schema.from_arrow(schema),
                actions,
                mode="ignore" if self._mode == "ignore" else "error",  # someone may have created it meanwhile
                partition_by=self._partition_cols or None,
                storage_options=self._storage_options,
                **self._table_info,
            )
        else:
            if not actions and self._mode == "append":
                return
            table = deltalake.DeltaTable(self._uri, version=self._start_version, storage_options=self._storage_options)
            if schema is None:
                schema = pa.schema(table.schema().to_arrow())
            added = [f for f in schema if self._table_schema is not None and f.name not in self._table_schema.names]
            if added and self._mode == "append":  # schema_mode="merge": ALTER TABLE ... ADD COLUMN first
                table.alter.add_columns(list(deltalake.Schema.from_arrow(pa.schema(added)).fields))
            table.create_write_transaction(
                actions, mode="overwrite" if self._mode == "overwrite" else "append", schema=schema,
                partition_by=self._partition_cols or None,
            )
        self.committed_version = deltalake.DeltaTable(self._uri, storage_options=self._storage_options).version()

    def on_write_failed(self, error: BaseException) -> None:
        """Remove the staged files (nothing was staged when the write was skipped)."""
        if not self.skip_write:
            super().on_write_failed(error)

    def _remove_placed(self, write_results: list[Any]) -> None:
        for result in write_results:
            for relative in result.files:
                try:
                    self._fs.delete_file(f"{self._root}/{relative}")
                except OSError:
                    pass  # not in the log, so never read; best effort


def _with_new_columns(table_schema: pa.Schema, rows: pa.Schema) -> pa.Schema:
    """``table_schema`` and, after its columns, those of ``rows`` it lacks, nullable."""
    extra = [f.with_nullable(True) for f in rows if f.name not in table_schema.names]
    return pa.schema([*table_schema, *extra], metadata=table_schema.metadata) if extra else table_schema


def _bool_text(value: str | None) -> str | None:
    return value.lower() if value in ("True", "False") else value


def _file_stats(metadata: pq.FileMetaData) -> dict[str, Any]:
    """Delta's per-file statistics from a Parquet footer: rows, and per top-level column nulls and min/max."""
    stats: dict[str, Any] = {"numRecords": metadata.num_rows, "minValues": {}, "maxValues": {}, "nullCount": {}}
    schema = metadata.schema.to_arrow_schema()
    for index in range(metadata.num_columns):
        name = metadata.schema.column(index).path
        if "." in name or name not in schema.names:
            continue  # nested: no statistics recorded
        kind = schema.field(name).type
        lows, highs, nulls = [], [], 0
        for rg in range(metadata.num_row_groups):
            column = metadata.row_group(rg).column(index).statistics
            if column is None:
                nulls = None
                break
            if nulls is not None and column.has_null_count:
                nulls += column.null_count
            if column.has_min_max:
                lows.append(column.min)
                highs.append(column.max)
        if nulls is not None:
            stats["nullCount"][name] = nulls
        if lows and _has_json_stats(kind) and len(lows) == metadata.num_row_groups:
            low, high = min(lows), max(highs)
            if _finite(low) and _finite(high):
                stats["minValues"][name] = _json_value(low)
                stats["maxValues"][name] = _json_value(high)
    return stats


def _has_json_stats(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_date(kind) or pa.types.is_string(kind)


def _finite(value: Any) -> bool:
    return not (isinstance(value, float) and not math.isfinite(value))


def _json_value(value: Any) -> Any:
    return value.isoformat() if isinstance(value, date) else value

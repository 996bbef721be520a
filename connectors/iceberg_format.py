"""Apache Iceberg tables (``pyiceberg``): read planned file tasks, write data files in one commit.

Reading (``IcebergDatasource``): the driver loads the table from its catalog
(``catalog_kwargs``: ``name`` plus the catalog's properties, as ``pyiceberg.catalog.load_catalog``
takes them), pins the snapshot (``snapshot_id``, or the current one) and plans the scan with
the ``row_filter`` and ``selected_fields``: pyiceberg prunes manifests and data files by their
partition values and column statistics, so only files that may match become file tasks. Read
tasks get runs of file tasks balanced by bytes (about ``parallelism`` of them); each reads its
files with pyiceberg's ``ArrowScan`` (Parquet through pyarrow, only the selected columns, the
row filter applied, position and equality deletes applied, columns renamed or added by schema
evolution resolved by field id) and yields blocks of at most ``DEFAULT_BLOCK_BYTES``. A
projection after the read (``select_columns``) narrows ``selected_fields``. ``Dataset.filter``
expressions are not translated into Iceberg expressions: pass ``row_filter=`` for pruning.

Writing (``IcebergDatasink``, Ray's ``write_iceberg``): the table must exist. Each write task
checks its rows against the table's schema and writes them as data files with pyiceberg's own
writer (``_dataframe_to_data_files``: partitioned by the table's spec, statistics and field ids
included), returning their metadata; the driver commits them in one transaction (a fast append;
with ``mode="overwrite"``, a delete of the rows matching ``overwrite_filter``, all rows by default,
in the same transaction; with ``mode="upsert"``, a delete of the rows whose ``join_cols`` match
a written row, from the distinct keys each task returns). No row passes through the driver,
only an upsert's keys. A job that fails commits nothing and
the table is unchanged; data files its tasks had written stay unreferenced in the table's data
folder (Iceberg's orphan-file maintenance removes them).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from connectors import io_stats
from connectors.base import Block, BlockMetadata, Datasink, Datasource, ReadTask, TaskContext
from connectors.file_datasource import DEFAULT_BLOCK_BYTES, balanced_runs, coalesce
from connectors.tables import import_extra

ICEBERG_WRITE_MODES = ("append", "overwrite", "upsert")
UPSERT_ARGS = ("join_cols", "case_sensitive", "branch")
"""Ray's ``upsert_kwargs``."""
OVERWRITE_ARGS = ("case_sensitive", "branch")
"""Ray's ``overwrite_kwargs`` (pyiceberg's ``overwrite`` arguments)."""


def load_table(table_identifier: str, catalog_kwargs: dict[str, Any] | None, feature: str) -> Any:
    """The pyiceberg ``Table``: ``catalog_kwargs["name"]`` (default ``"default"``) names the catalog."""
    catalog_module = import_extra("pyiceberg.catalog", feature)
    kwargs = dict(catalog_kwargs or {})
    name = kwargs.pop("name", "default")
    catalog = catalog_module.load_catalog(name, **kwargs)
    return catalog.load_table(table_identifier)


class IcebergDatasource(Datasource):
    """An Iceberg table, read at one snapshot through pyiceberg (see the module docstring)."""

    def __init__(
        self,
        table_identifier: str,
        *,
        row_filter: Any = None,
        selected_fields: tuple[str, ...] = ("*",),
        snapshot_id: int | None = None,
        catalog_kwargs: dict[str, Any] | None = None,
        scan_kwargs: dict[str, Any] | None = None,
    ) -> None:
        expressions = import_extra("pyiceberg.expressions", "read_iceberg")
        self._identifier = table_identifier
        self._catalog_kwargs = dict(catalog_kwargs or {})
        self._scan_kwargs = dict(scan_kwargs or {})
        reserved = {"row_filter", "selected_fields", "snapshot_id"} & set(self._scan_kwargs)
        if reserved:
            raise ValueError(f"scan_kwargs may not set {sorted(reserved)}: pass them as read_iceberg arguments")
        self._row_filter = expressions.AlwaysTrue() if row_filter is None else row_filter
        self._selected_fields = tuple(selected_fields)
        table = load_table(table_identifier, self._catalog_kwargs, "read_iceberg")
        self._metadata = table.metadata
        self._io = table.io
        if snapshot_id is None and table.metadata.current_snapshot_id is not None:
            snapshot_id = table.metadata.current_snapshot_id  # tasks read this snapshot, even if the table moves on
        self._snapshot_id = snapshot_id
        self._scan()  # a bad filter, field or snapshot fails here, not in a task

    def get_name(self) -> str:
        """``ReadIceberg``."""
        return "ReadIceberg"

    def _scan(self) -> Any:
        from pyiceberg.table import DataScan

        return DataScan(
            table_metadata=self._metadata,
            io=self._io,
            row_filter=self._row_filter,
            selected_fields=self._selected_fields,
            snapshot_id=self._snapshot_id,
            **self._scan_kwargs,
        )

    def _filters_rows(self) -> bool:
        from pyiceberg.expressions import AlwaysTrue

        return not isinstance(self._scan().row_filter, AlwaysTrue) or self._scan_kwargs.get("limit") is not None

    def schema(self) -> pa.Schema:
        """The projected schema, as the read tasks yield it."""
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        schema = schema_to_pyarrow(self._scan().projection(), include_field_ids=False)
        # ArrowScan yields pyarrow's default types when it reads files (``string``, not ``large_string``)
        schema = pa.schema([f.with_type(_small(f.type)) for f in schema], metadata=schema.metadata)
        return self._order(schema.empty_table()).schema

    def count_rows(self) -> int | None:
        """Rows of the snapshot from the manifests; None with a row filter, a limit or delete files."""
        if self._filters_rows():
            return None
        tasks = list(self._scan().plan_files())
        if any(task.delete_files for task in tasks):
            return None
        return sum(task.file.record_count for task in tasks)

    def apply_projection(self, columns: list[str]) -> IcebergDatasource:
        """A copy reading only ``columns`` (their order kept)."""
        if self._selected_fields != ("*",):
            extra = [c for c in columns if c not in self._selected_fields]
            if extra:
                raise ValueError(f"columns {extra} were already projected away; available: {list(self._selected_fields)}")
        clone = copy.copy(self)
        clone._selected_fields = tuple(columns)
        clone._scan()
        return clone

    def _order(self, table: pa.Table) -> pa.Table:
        if self._selected_fields == ("*",) or table.column_names == list(self._selected_fields):
            return table
        return table.select(list(self._selected_fields))

    def get_read_tasks(self, parallelism: int) -> list[ReadTask]:
        """The scan's file tasks, in runs of about equal bytes: about ``parallelism`` read tasks."""
        scan = self._scan()
        file_tasks = list(scan.plan_files())
        exact = not self._filters_rows()
        read = functools.partial(
            _read_file_tasks, self._metadata, self._io, scan.projection(), scan.row_filter,
            scan.case_sensitive, scan.limit, self._selected_fields,
        )
        tasks = []
        for run in balanced_runs([t.file.file_size_in_bytes for t in file_tasks], parallelism):
            group = tuple(file_tasks[i] for i in run)
            metadata = BlockMetadata(
                num_rows=sum(t.file.record_count for t in group) if exact and not any(t.delete_files for t in group) else None,
                size_bytes=sum(t.file.file_size_in_bytes for t in group),
                input_files=tuple(t.file.file_path for t in group),
            )
            tasks.append(ReadTask(functools.partial(read, group), metadata))
        return tasks


def _small(kind: pa.DataType) -> pa.DataType:
    """``kind`` with 32-bit offsets where it has 64-bit ones (at any depth)."""
    if pa.types.is_large_string(kind):
        return pa.string()
    if pa.types.is_large_binary(kind):
        return pa.binary()
    if pa.types.is_large_list(kind) or pa.types.is_list(kind):
        return pa.list_(kind.value_field.with_type(_small(kind.value_type)))
    if pa.types.is_struct(kind):
        return pa.struct([kind.field(i).with_type(_small(kind.field(i).type)) for i in range(kind.num_fields)])
    if pa.types.is_map(kind):
        return pa.map_(kind.key_field.with_type(_small(kind.key_type)), kind.item_field.with_type(_small(kind.item_type)))
    return kind


def _read_file_tasks(
    metadata: Any,
    io: Any,
    projection: Any,
    row_filter: Any,
    case_sensitive: bool,
    limit: int | None,
    selected_fields: tuple[str, ...],
    file_tasks: tuple[Any, ...],
) -> Iterator[pa.Table]:
    """Blocks of ``file_tasks`` read by pyiceberg's ArrowScan (deletes and schema evolution applied)."""
    from pyiceberg.io.pyarrow import ArrowScan

    scan = ArrowScan(metadata, io, projection, row_filter, case_sensitive, limit)
    io_stats.record(files_read=len(file_tasks), bytes_read=sum(t.file.file_size_in_bytes for t in file_tasks))
    tables = (pa.Table.from_batches([batch]) for batch in scan.to_record_batches(file_tasks))
    for block in coalesce(tables, DEFAULT_BLOCK_BYTES):
        if selected_fields != ("*",) and block.column_names != list(selected_fields):
            block = block.select(list(selected_fields))
        yield block


class IcebergDatasink(Datasink):
    """An existing Iceberg table: tasks write data files, the driver commits them in one transaction.

    ``mode``: ``"append"`` (default), ``"overwrite"`` (rows matching ``overwrite_filter`` are
    deleted in the same commit; all rows when it is None) or ``"upsert"`` (Ray's copy-on-write
    upsert: rows whose ``upsert_kwargs["join_cols"]`` match a written row are deleted and every
    written row is added, in one transaction; each task returns the distinct keys it wrote, and
    a key written twice is a ``ValueError``). ``case_sensitive`` and ``branch`` come from
    ``upsert_kwargs`` / ``overwrite_kwargs``. ``snapshot_properties`` go into the new
    snapshot's summary.
    """

    def __init__(
        self,
        table_identifier: str,
        *,
        catalog_kwargs: dict[str, Any] | None = None,
        snapshot_properties: dict[str, str] | None = None,
        mode: Any = "append",
        overwrite_filter: Any = None,
        upsert_kwargs: dict[str, Any] | None = None,
        overwrite_kwargs: dict[str, Any] | None = None,
    ) -> None:
        import_extra("pyiceberg", "write_iceberg")
        mode = str(getattr(mode, "value", mode)).lower()
        if mode not in ICEBERG_WRITE_MODES:
            raise ValueError(f"mode must be one of {ICEBERG_WRITE_MODES} for write_iceberg, got {mode!r}")
        if overwrite_filter is not None and mode != "overwrite":
            raise ValueError("overwrite_filter is for mode='overwrite'")
        upsert = _checked_args(upsert_kwargs, UPSERT_ARGS, "upsert_kwargs")
        overwrite = _checked_args(overwrite_kwargs, OVERWRITE_ARGS, "overwrite_kwargs")
        if upsert and mode != "upsert":
            raise ValueError("upsert_kwargs is for mode='upsert'")
        if overwrite and mode != "overwrite":
            raise ValueError("overwrite_kwargs is for mode='overwrite'")
        join_cols = upsert.get("join_cols")
        if mode == "upsert" and (not join_cols or isinstance(join_cols, str)
                                 or not all(isinstance(c, str) for c in join_cols)):
            raise ValueError("mode='upsert' needs upsert_kwargs={'join_cols': [column, ...]}: the columns that "
                             "say which rows of the table a written row replaces")
        self._join_cols: list[str] = list(join_cols or [])
        options = upsert if mode == "upsert" else overwrite
        self._case_sensitive = bool(options.get("case_sensitive", True))
        self._branch: str | None = options.get("branch", "main")
        self._identifier = table_identifier
        self._catalog_kwargs = dict(catalog_kwargs or {})
        self._snapshot_properties = dict(snapshot_properties or {})
        self._mode = mode
        self._overwrite_filter = overwrite_filter
        self._table: Any = None
        self._metadata: Any = None
        self._io: Any = None
        self.committed_snapshot_id: int | None = None
        """The snapshot this job's commit made (None before it)."""

    def get_name(self) -> str:
        """``WriteIceberg``."""
        return "WriteIceberg"

    def on_write_start(self) -> None:
        """Load the table (it must exist): tasks write against its schema and partition spec."""
        self._table = load_table(self._identifier, self._catalog_kwargs, "write_iceberg")
        self._metadata = self._table.metadata
        self._io = self._table.io
        missing = [c for c in self._join_cols if c not in self._metadata.schema().column_names]
        if missing:
            raise ValueError(f"upsert_kwargs join_cols {missing} are not columns of {self._identifier} "
                             f"({self._metadata.schema().column_names})")

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_table"] = None  # holds the catalog's connection; tasks need only its metadata and io
        return state

    def write(self, blocks: Iterable[Block], ctx: TaskContext) -> tuple[Any, ...]:
        """Write ``blocks`` as data files of the table (not committed); returns their metadata
        (an upsert's task also returns, first, the distinct keys it wrote and its row count)."""
        from pyiceberg.io.pyarrow import _check_pyarrow_schema_compatible, _dataframe_to_data_files

        it = (pa.Table.from_batches([b]) if isinstance(b, pa.RecordBatch) else b for b in blocks)
        first = next((b for b in it if b.num_rows), None)
        if first is None:
            return ()
        keys: list[pa.Table] = []
        if self._join_cols:
            it = _noting_keys(it, self._join_cols, keys)
        _check_pyarrow_schema_compatible(
            self._metadata.schema(), provided_schema=first.schema, format_version=self._metadata.format_version
        )
        rows = [0]

        def batches() -> Iterator[pa.RecordBatch]:
            for block in itertools.chain((first,), it):
                rows[0] += block.num_rows
                yield from block.cast(first.schema).to_batches()

        reader = pa.RecordBatchReader.from_batches(first.schema, batches())
        files = tuple(_dataframe_to_data_files(self._metadata, reader, self._io, write_uuid=uuid.uuid4()))
        io_stats.record(files_written=len(files), rows_written=rows[0])
        if self._join_cols:
            written = pa.concat_tables([first.select(self._join_cols), *keys])
            return (_UpsertKeys(_distinct(written), written.num_rows), *files)
        return files

    def on_write_complete(self, write_results: list[Any]) -> None:
        """Commit every task's data files in one transaction (one or, with a delete, two snapshots)."""
        from pyiceberg.expressions import AlwaysTrue

        # the table as the job saw it at the start: if another writer committed since, the commit
        # fails (pyiceberg checks the snapshot it builds on) instead of deleting rows this job never saw
        table = self._table
        files = [f for result in write_results for f in result if not isinstance(f, _UpsertKeys)]
        delete_filter = (self._overwrite_filter or AlwaysTrue()) if self._mode == "overwrite" else None
        if self._mode == "upsert":
            delete_filter = self._upsert_filter([f for result in write_results for f in result
                                                 if isinstance(f, _UpsertKeys)])
        with table.transaction() as txn:
            if delete_filter is not None:
                txn.delete(delete_filter, snapshot_properties=self._snapshot_properties,
                           case_sensitive=self._case_sensitive, branch=self._branch)
            if files:
                update = txn.update_snapshot(snapshot_properties=self._snapshot_properties, branch=self._branch)
                with update.fast_append() as append:
                    for data_file in files:
                        append.append_data_file(data_file)
        self.committed_snapshot_id = table.refresh().metadata.current_snapshot_id

    def _upsert_filter(self, parts: list[_UpsertKeys]) -> Any:
        """The rows of the table a written row replaces (None: nothing written, nothing to delete)."""
        from pyiceberg.table.upsert_util import create_match_filter

        if not parts:
            return None
        keys = pa.concat_tables([p.keys for p in parts], promote_options="permissive")
        distinct = _distinct(keys)
        if distinct.num_rows != sum(p.rows for p in parts):
            raise ValueError(f"mode='upsert': the rows written hold a key of {self._join_cols} more than once; "
                             "each key must be written once, as the row that replaces the table's")
        return create_match_filter(distinct, self._join_cols)


@dataclasses.dataclass(frozen=True)
class _UpsertKeys:
    """What an upsert task wrote: its distinct keys, and its row count (fewer keys: a duplicate)."""

    keys: pa.Table
    rows: int


def _distinct(keys: pa.Table) -> pa.Table:
    return keys.group_by(keys.column_names).aggregate([]) if keys.num_rows else keys


def _noting_keys(blocks: Iterator[pa.Table], join_cols: list[str], keys: list[pa.Table]) -> Iterator[pa.Table]:
    """``blocks`` as they are, their key columns noted in ``keys`` as they pass."""
    for block in blocks:
        keys.append(block.select(join_cols))
        yield block


def _checked_args(args: dict[str, Any] | None, allowed: tuple[str, ...], what: str) -> dict[str, Any]:
    if args is None:
        return {}
    if not isinstance(args, dict):
        raise TypeError(f"{what} must be a dict, got {type(args).__name__}")
    unknown = sorted(set(args) - set(allowed))
    if unknown:
        raise TypeError(f"{what}: {unknown[0]!r} is not supported (only {', '.join(allowed)})")
    return dict(args)

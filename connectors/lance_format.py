"""Lance datasets (``pylance``, imported as ``lance``): read by fragments, write as one commit.

Reading: the driver opens the dataset once, pins its version (the latest, or ``version=``) and
hands out read tasks of whole fragments, about ``parallelism`` of them balanced by row count.
A task reopens the dataset at that version and streams its fragments through one Lance scanner
with the columns and the filter pushed down (a SQL string such as ``"a > 3 AND b IS NOT NULL"``,
or a ``pyarrow.compute`` expression), so Lance skips what the filter and its statistics rule
out and never decodes an unused column. Batches are coalesced into blocks of at most
``DEFAULT_BLOCK_BYTES``; a task never holds a whole fragment. ``count_rows()`` comes from the
manifest. The bytes Lance read are added to ``io_stats`` (``bytes_read``; ``files_read`` counts
fragments).

Writing: each write task writes its rows as new fragments (``lance.fragment.write_fragments``:
data files under the dataset's ``data/`` folder, referenced by no version yet) and returns their
metadata; the driver commits every task's fragments in one transaction at the end
(``LanceOperation.Append``, or ``Overwrite`` for ``mode="create"``/``"overwrite"``), against the
version it saw before the job started, as Ray Data does. A job that fails commits nothing: the
dataset keeps its versions and rows, and the files its tasks had written stay unreferenced
(readers never see them; Lance's cleanup removes them).
"""

from __future__ import annotations

import copy
import functools
import itertools
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from connectors import io_stats
from connectors.base import Block, BlockMetadata, Datasink, Datasource, ReadTask, TaskContext
from connectors.errors import PathNotFoundError
from connectors.file_datasource import DEFAULT_BLOCK_BYTES, balanced_runs, coalesce
from connectors.tables import conform, import_extra

LANCE_MODES = ("create", "append", "overwrite")
DEFAULT_MIN_ROWS_PER_FILE = 1024 * 1024
DEFAULT_MAX_ROWS_PER_FILE = 64 * 1024 * 1024


def _open(uri: str, version: int | str | None, storage_options: dict[str, str] | None, feature: str) -> Any:
    lance = import_extra("lance", feature)
    try:
        return lance.dataset(uri, version=version, storage_options=storage_options)
    except ValueError as exc:
        if "not found" in str(exc).lower():
            raise PathNotFoundError("no Lance dataset here" + (f" (version {version})" if version is not None else ""),
                                    path=uri) from exc
        raise


def _check_filter(filter: Any) -> None:
    if filter is not None and not isinstance(filter, str | pc.Expression):
        msg = f"filter must be a SQL string such as \"a > 3\" or a pyarrow.compute.Expression, got {type(filter).__name__}"
        raise TypeError(msg)


class LanceDatasource(Datasource):
    """A Lance dataset at ``uri`` (local or an object store Lance supports), at ``version``.

    ``columns``: read only these. ``filter``: a SQL string or a ``pyarrow.compute`` expression,
    evaluated by Lance while scanning. ``storage_options``: Lance's object store settings.
    ``scanner_options``: more arguments for ``LanceDataset.scanner`` (``batch_size``...).
    """

    sizes_own_tasks = True

    def __init__(
        self,
        uri: str,
        *,
        version: int | str | None = None,
        columns: Sequence[str] | None = None,
        filter: str | pc.Expression | None = None,
        storage_options: dict[str, str] | None = None,
        scanner_options: dict[str, Any] | None = None,
    ) -> None:
        _check_filter(filter)
        self._uri = str(uri)
        self._storage_options = dict(storage_options) if storage_options else None
        self._scanner_options = dict(scanner_options or {})
        reserved = {"columns", "filter", "fragments"} & set(self._scanner_options)
        if reserved:
            raise ValueError(f"scanner_options may not set {sorted(reserved)}: pass them as read_lance arguments")
        dataset = _open(self._uri, version, self._storage_options, "read_lance")
        self._version: int = dataset.version  # tasks read exactly this version, even if the dataset moves on
        self._schema: pa.Schema = dataset.schema
        self._columns = list(columns) if columns is not None else None
        if self._columns is not None:
            self._check_columns(self._columns)
        self._filter = filter

    def get_name(self) -> str:
        """``ReadLance``."""
        return "ReadLance"

    def _dataset(self) -> Any:
        return _open(self._uri, self._version, self._storage_options, "read_lance")

    def _check_columns(self, columns: list[str]) -> None:
        missing = [c for c in columns if c not in self._schema.names]
        if missing:
            raise ValueError(f"columns {missing} are not in the Lance dataset {self._uri}; available: {self._schema.names}")

    def schema(self) -> pa.Schema:
        """The dataset's schema, projected to ``columns``."""
        if self._columns is None:
            return self._schema
        return pa.schema([self._schema.field(c) for c in self._columns], metadata=self._schema.metadata)

    def count_rows(self) -> int | None:
        """Rows of the pinned version, from its manifest; None when a filter is set."""
        if self._filter is not None:
            return None
        return int(self._dataset().count_rows())

    def apply_projection(self, columns: list[str]) -> LanceDatasource:
        """A copy reading only ``columns``."""
        self._check_columns(columns)
        if self._columns is not None:
            extra = [c for c in columns if c not in self._columns]
            if extra:
                raise ValueError(f"columns {extra} were already projected away; available: {self._columns}")
        clone = copy.copy(self)
        clone._columns = list(columns)
        return clone

    def apply_filter(self, expr: Any) -> LanceDatasource | None:
        """A copy that has Lance apply ``expr`` too; None when it cannot join the filter already set
        (a SQL string and a pyarrow expression do not combine; the engine then filters the rows)."""
        _check_filter(expr)
        if self._filter is None:
            combined = expr
        elif isinstance(self._filter, str) and isinstance(expr, str):
            combined = f"({self._filter}) AND ({expr})"
        elif isinstance(self._filter, pc.Expression) and isinstance(expr, pc.Expression):
            combined = self._filter & expr
        else:
            return None
        clone = copy.copy(self)
        clone._filter = combined
        return clone

    def get_read_tasks(self, parallelism: int) -> list[ReadTask]:
        """One task per group of whole fragments, about ``parallelism`` groups balanced by rows."""
        fragments = [(f.fragment_id, f.count_rows()) for f in self._dataset().get_fragments()]
        tasks = []
        for run in balanced_runs([rows for _, rows in fragments], parallelism):
            ids = tuple(fragments[i][0] for i in run)
            rows = sum(fragments[i][1] for i in run)
            metadata = BlockMetadata(
                num_rows=rows if self._filter is None else None,
                size_bytes=None,
                input_files=tuple(f"{self._uri}#fragment={fid}" for fid in ids),
                schema=self.schema(),
            )
            tasks.append(ReadTask(functools.partial(self._read_fragments, ids), metadata))
        return tasks

    def _read_fragments(self, fragment_ids: tuple[int, ...]) -> Iterator[pa.Table]:
        dataset = self._dataset()
        scans: list[Any] = []
        scanner = dataset.scanner(
            columns=self._columns,
            filter=self._filter,
            fragments=[dataset.get_fragment(fid) for fid in fragment_ids],
            scan_stats_callback=scans.append,
            **self._scanner_options,
        )
        io_stats.record(files_read=len(fragment_ids))
        batches = (pa.Table.from_batches([batch]) for batch in scanner.to_reader())
        yield from coalesce(batches, DEFAULT_BLOCK_BYTES)
        io_stats.record(bytes_read=sum(scan.bytes_read for scan in scans))


@dataclass(frozen=True)
class LanceWriteResult:
    """What one write task wrote: fragments not committed yet, and the schema of its rows."""

    fragments: tuple[Any, ...] = ()
    schema: pa.Schema | None = None
    num_rows: int = 0


@dataclass
class LanceDatasink(Datasink):
    """A Lance dataset at ``path``: tasks write fragments, the driver commits them all at once.

    ``mode``: ``"create"`` (the dataset must not exist), ``"append"`` (created when missing) or
    ``"overwrite"`` (a new version holding only this job's rows; older versions stay readable).
    ``schema``: the rows' schema (default: the first block's; appends use the dataset's).
    ``min_rows_per_file`` makes the engine gather blocks until a task has that many rows;
    ``max_rows_per_file`` caps each data file.
    """

    path: str
    schema: pa.Schema | None = None
    mode: str = "create"
    min_rows_per_file: int = DEFAULT_MIN_ROWS_PER_FILE
    max_rows_per_file: int = DEFAULT_MAX_ROWS_PER_FILE
    data_storage_version: str | None = None
    storage_options: dict[str, str] | None = None
    table_id: list[str] | None = None
    namespace_impl: str | None = None
    namespace_properties: dict[str, str] | None = None
    _read_version: int | None = field(default=None, init=False)
    _exists: bool = field(default=False, init=False)
    committed_version: int | None = field(default=None, init=False)
    """The dataset version this job's commit made (None before the commit, or when nothing was written)."""

    def __post_init__(self) -> None:
        self.path = str(self.path)
        self.mode = str(getattr(self.mode, "value", self.mode)).lower()
        if self.mode not in LANCE_MODES:
            raise ValueError(f"mode must be one of {LANCE_MODES}, got {self.mode!r}")
        if self.min_rows_per_file < 1 or self.max_rows_per_file < 1:
            raise ValueError("min_rows_per_file and max_rows_per_file must be at least 1")
        if self.min_rows_per_file > self.max_rows_per_file:
            raise ValueError(f"min_rows_per_file ({self.min_rows_per_file}) > max_rows_per_file ({self.max_rows_per_file})")
        import_extra("lance", "write_lance")
        if self.namespace_impl is not None or self.table_id is not None:
            self._declare_in_namespace()

    def _declare_in_namespace(self) -> None:
        """Ray's namespace write: the table ``table_id`` is declared in the Lance namespace
        (``lance_namespace.connect(namespace_impl, namespace_properties)``), which gives its
        location (``path`` is then ignored, with a warning as in Ray) and maybe storage options."""
        if self.namespace_impl is None or not self.table_id:
            raise ValueError("write_lance: table_id and namespace_impl go together (the table's id in "
                             "the namespace namespace_impl connects to); pass both, or neither and a path")
        if self.mode != "create":
            raise ValueError("Namespace writes currently only support mode='create'. Use mode='create' for now.")
        namespaces = import_extra("lance_namespace", "write_lance(namespace_impl=...)")
        namespace = namespaces.connect(self.namespace_impl, dict(self.namespace_properties or {}))
        warnings.warn("The 'uri' argument is ignored when namespace parameters are provided. The resolved "
                      "namespace location will be used instead.", UserWarning, stacklevel=4)
        try:
            response = namespace.declare_table(namespaces.DeclareTableRequest(id=list(self.table_id), location=None))
        except (AttributeError, NotImplementedError):  # an implementation older than declare_table
            response = namespace.create_empty_table(namespaces.CreateEmptyTableRequest(id=list(self.table_id)))
        self.path = str(response.location)
        if response.storage_options:
            self.storage_options = {**(self.storage_options or {}), **response.storage_options}

    def get_name(self) -> str:
        """``WriteLance``."""
        return "WriteLance"

    @property
    def min_rows_per_write(self) -> int | None:
        """The engine bundles blocks until a write task has this many rows."""
        return self.min_rows_per_file

    def on_write_start(self) -> None:
        """Check ``mode`` against what exists, and note the version the commit builds on."""
        try:
            existing = _open(self.path, None, self.storage_options, "write_lance")
        except PathNotFoundError:
            existing = None
        self._exists = existing is not None
        if existing is None:
            return
        if self.mode == "create":
            raise ValueError(f"a Lance dataset exists at {self.path}: pass mode='append' or mode='overwrite'")
        self._read_version = existing.version
        if self.mode == "append" and self.schema is None:
            self.schema = existing.schema  # appended rows take the dataset's types

    def write(self, blocks: Iterable[Block], ctx: TaskContext) -> LanceWriteResult:
        """Write ``blocks`` as fragments (not committed); returns their metadata."""
        from lance.fragment import write_fragments

        it = iter(blocks)
        first = next((b for b in it if b.num_rows), None)
        if first is None:
            return LanceWriteResult()
        schema = self.schema or first.schema
        rows = [0]
        failed: list[BaseException] = []

        def batches() -> Iterator[pa.RecordBatch]:
            try:
                for block in itertools.chain((first,), it):
                    rows[0] += block.num_rows
                    yield from conform(block, schema, f"the Lance dataset at {self.path}").to_batches()
            except BaseException as exc:
                failed.append(exc)
                raise

        reader = pa.RecordBatchReader.from_batches(schema, batches())
        try:
            fragments = write_fragments(
                reader,
                self.path,
                schema=schema,
                max_rows_per_file=self.max_rows_per_file,
                data_storage_version=self.data_storage_version,
                storage_options=self.storage_options,
            )
        except Exception:
            if failed:  # Lance wraps an error of the rows' producer in an OSError: raise it as it was
                raise failed[0] from None
            raise
        io_stats.record(files_written=len(fragments), rows_written=rows[0])
        return LanceWriteResult(tuple(fragments), schema, rows[0])

    def on_write_complete(self, write_results: list[Any]) -> None:
        """Commit every task's fragments in one transaction (one new version)."""
        import lance

        fragments = [f for result in write_results for f in result.fragments]
        schema = self.schema or next((r.schema for r in write_results if r.schema is not None), None)
        if self.mode == "append" and self._exists:
            if not fragments:
                return
            operation = lance.LanceOperation.Append(fragments)
        else:
            if schema is None:
                return  # no rows and no schema: nothing to create
            operation = lance.LanceOperation.Overwrite(schema, fragments)
        dataset = lance.LanceDataset.commit(
            self.path, operation, read_version=self._read_version, storage_options=self.storage_options
        )
        self.committed_version = dataset.version

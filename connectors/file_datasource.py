"""The shared half of every file format: list (driver), group into tasks, read (workers).

``FileDatasource`` lists through a ``FileSet`` and packs files into ``ReadTask``s by bytes while
the listing streams (``plan_pieces``): the first ``LOOKAHEAD`` files fix the task size (about
``parallelism`` tasks for small inputs, never more than ``target_task_bytes`` or
``max_files_per_task`` per task), the rest follow with the same size. Files larger than a task
can be split into byte ranges (``FilePiece``) by formats that can read a range on their own
(Parquet, by row groups). A format subclass implements only ``_read_file``; the base adds
partition and path columns, coalesces small outputs into blocks, and names the file in errors.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from connectors.base import BlockMetadata, Datasource, ReadTask, SharedSource
from connectors.errors import AccessDeniedError, FileFormatError, PathNotFoundError, RetriesExhaustedError
from connectors.file_selection import FileShuffleConfig, SelectedFiles
from connectors.filesystem import FileEntry, FileSet, PathArg, StreamArgs, resolve_files
from connectors.partitioning import (
    Partitioning,
    PathPartitionFilter,
    append_partition_columns,
    check_partitioning,
    partition_schema,
    typed_values,
)
from connectors.retry import Retrier, RetryPolicy, default_retry_policy, limiter_for
from engine.block_format import concat_blocks

MiB = 1 << 20
DEFAULT_TASK_BYTES = 128 * MiB
MIN_TASK_BYTES = 32 * MiB
"""Below this, a task's fixed costs (opening files, one round trip) start to show."""
DEFAULT_BLOCK_BYTES = 64 * MiB
LOOKAHEAD = 4096
MAX_FILES_PER_TASK = 1024
FIRST_TASK_FILES = 16


@dataclass(frozen=True)
class FilePiece:
    """A file, or the ``index``-th of ``count`` equal byte ranges of it."""

    entry: FileEntry
    index: int = 0
    count: int = 1
    head: Any = field(default=None, compare=False)
    """What the format's split predicate learned of the whole file, once, while planning (the
    column types of a JSON Lines file), for every range of it; None otherwise."""

    @property
    def size(self) -> int:
        """Bytes of the file this piece covers (an estimate for ranges)."""
        return (self.entry.size or 0) // self.count


def plan_pieces(
    files: Iterable[FileEntry],
    parallelism: int,
    *,
    target_task_bytes: int = DEFAULT_TASK_BYTES,
    min_task_bytes: int = 0,
    max_files_per_task: int = MAX_FILES_PER_TASK,
    split_files: bool | Callable[[FileEntry], Any] = False,
    lookahead: int = LOOKAHEAD,
) -> Iterator[list[FilePiece]]:
    """Groups of pieces, one group per read task, produced while ``files`` is still being listed.
    ``split_files``: a file well over a task's bytes is cut into byte ranges, one task each (for
    every file, or those the predicate accepts: what it returns, when not simply True, is every
    range's ``head``)."""
    it = iter(files)
    head: list[FileEntry] = []
    for entry in it:
        head.append(entry)
        if len(head) >= lookahead:
            break
    if not head:
        return
    total = sum(e.size or 0 for e in head)
    per_task = max(1, min(min_task_bytes, target_task_bytes), min(target_task_bytes, math.ceil(total / max(1, parallelism))))
    files_cap = max(1, min(max_files_per_task, math.ceil(len(head) / max(1, parallelism))))
    if len(head) >= lookahead:
        files_cap = max_files_per_task
    group: list[FilePiece] = []
    group_bytes = 0
    # the first tasks are small and grow (16, 32, 64... files) so the first rows come quickly
    # out of a folder of many small files, and later tasks amortize their fixed costs
    ramp = FIRST_TASK_FILES
    for entry in _chain(head, it):
        size = entry.size or 0
        split = split_files and size > per_task * 1.5 and (split_files is True or split_files(entry))
        if split:
            if group:
                yield group
                group, group_bytes = [], 0
            count = math.ceil(size / per_task)
            head = None if split is True else split
            for index in range(count):
                yield [FilePiece(entry, index, count, head)]
            continue
        group.append(FilePiece(entry))
        group_bytes += size
        if group_bytes >= per_task or len(group) >= min(files_cap, ramp):
            yield group
            group, group_bytes = [], 0
            ramp *= 2
    if group:
        yield group


def _chain(head: list[FileEntry], rest: Iterator[FileEntry]) -> Iterator[FileEntry]:
    yield from head
    yield from rest


def balanced_runs(weights: Sequence[int], count: int) -> list[list[int]]:
    """The indices of ``weights`` cut, in order, into at most ``count`` runs of about equal weight.

    For sources whose units are fixed by a table's metadata (Lance fragments, Iceberg data files).
    """
    per_run = max(1, -(-sum(weights) // max(1, count)))
    runs: list[list[int]] = []
    weight = per_run
    for index, w in enumerate(weights):
        if not runs or (weight >= per_run and len(runs) < count):
            runs.append([])
            weight = 0
        runs[-1].append(index)
        weight += w
    return runs


def split_table(table: pa.Table, max_bytes: int, nbytes: int | None = None) -> Iterator[pa.Table]:
    """``table`` cut into row slices of at most about ``max_bytes`` each (``nbytes``: its
    ``nbytes``, when the caller has it: pyarrow walks every column to compute it)."""
    nbytes = table.nbytes if nbytes is None else nbytes
    if table.num_rows == 0 or nbytes <= max_bytes:
        yield table
        return
    rows = max(1, int(table.num_rows * max_bytes / nbytes))
    for start in range(0, table.num_rows, rows):
        yield table.slice(start, rows)


def coalesce(tables: Iterable[pa.Table], max_bytes: int) -> Iterator[pa.Table]:
    """Small tables concatenated into blocks of up to ``max_bytes``; big ones cut to size."""
    pending: list[pa.Table] = []
    pending_bytes = 0
    for table in tables:
        # its buffers' size (1-2 us) where that is small, else what its rows use (nbytes: 6-8 us
        # for two columns, but right for a slice of a bigger table, whose buffers are shared)
        nbytes = table.get_total_buffer_size()
        if nbytes >= max_bytes:
            nbytes = table.nbytes
        if pending and (pending_bytes + nbytes > max_bytes or not pending[0].schema.equals(table.schema)):
            yield concat_blocks(pending)
            pending, pending_bytes = [], 0
        if nbytes >= max_bytes:
            yield from split_table(table, max_bytes, nbytes)
            continue
        pending.append(table)
        pending_bytes += nbytes
    if pending:
        yield concat_blocks(pending)


class FileDatasource(Datasource):
    """Base class for sources that read whole files; subclasses implement ``_read_file``.

    ``paths``: a file, folder, glob, or list of them (local or ``s3://``), or a ``FileSet``. ``filesystem``: a
    pyarrow or fsspec filesystem to use instead of the one the paths imply. ``file_extensions``:
    which files of a folder to read (None: all). ``include_paths``: add a ``path`` column.
    ``partitioning``: ``"hive"``, a schema of partition fields, or None. ``partition_filter``
    (a ``PathPartitionFilter``) and ``shuffle`` (``"files"`` or a ``FileShuffleConfig``) pick
    and order the files (``connectors.file_selection``). ``arrow_open_stream_args`` (Ray's):
    ``compression`` (every file's codec, instead of its extension's) and ``buffer_size``, for the
    formats read as streams (``READS_STREAMS``). ``ignore_missing_paths``: skip a path
    that is not there, as long as another holds files (Ray's). ``skip_paths`` (Ray's): files
    to leave out of the listing, named as they would be passed to the read.
    """

    sizes_own_tasks = True

    READS_STREAMS = True
    """Files are read front to back (``arrow_open_stream_args`` applies); False for formats
    opened for random access (Parquet, ORC)."""
    FILE_EXTENSIONS: tuple[str, ...] | None = None
    DEFAULT_PARTITIONING: Partitioning | str | None = None

    def __init__(
        self,
        paths: PathArg,
        *,
        filesystem: Any = None,
        file_extensions: Sequence[str] | str | None = "default",
        include_paths: bool = False,
        partitioning: Partitioning | str = "default",
        target_task_bytes: int = DEFAULT_TASK_BYTES,
        partition_filter: PathPartitionFilter | None = None,
        shuffle: str | FileShuffleConfig | None = None,
        ignore_missing_paths: bool = False,
        arrow_open_stream_args: dict[str, Any] | None = None,
        skip_paths: str | Sequence[str] | None = None,
    ) -> None:
        if arrow_open_stream_args is not None and not self.READS_STREAMS:
            raise TypeError(f"arrow_open_stream_args: {self.get_name()} opens its files for random access, "
                            "not as streams (Ray takes it only for the formats read as streams)")
        self._stream_args = StreamArgs.of(arrow_open_stream_args)
        extensions = self.FILE_EXTENSIONS if file_extensions == "default" else file_extensions
        self._partitioning = self.DEFAULT_PARTITIONING if partitioning == "default" else partitioning
        check_partitioning(self._partitioning)
        # a FileSet already resolved (a table format's files, listed from its log) is taken as it is
        self._files: FileSet = (
            paths if isinstance(paths, FileSet)
            else resolve_files(paths, filesystem=filesystem, extensions=extensions,  # type: ignore[arg-type]
                               ignore_missing=ignore_missing_paths)
        )
        self._include_paths = include_paths
        self._target_task_bytes = target_task_bytes
        self._retry_policy: RetryPolicy = default_retry_policy()
        # Ray's partition_filter, shuffle and skip_paths
        self._files = SelectedFiles.of(self._files, partition_filter, shuffle, skip_paths)

    @property
    def file_set(self) -> FileSet:
        """The resolved filesystem and roots."""
        return self._files

    def _split_files(self) -> bool | Callable[[FileEntry], Any]:
        """Whether a big file is read as byte ranges, one task each (all, none, or those a
        predicate accepts; a predicate may return what every range needs to know of the file,
        which each piece carries as its ``head``)."""
        return False

    def _partition_schema(self, first: FileEntry | None) -> pa.Schema | None:
        if first is None:
            return partition_schema(self._partitioning, None)
        return partition_schema(self._partitioning, first.path)

    @property
    def lists_anew_each_execution(self) -> bool:
        """Each execution lists the files in a new order (``shuffle="files"``): asking for read
        tasks twice in one execution would advance that order twice."""
        return getattr(self._files, "shuffle", None) is not None

    def get_read_tasks(self, parallelism: int) -> Iterator[ReadTask]:
        """Read tasks, yielded while the listing is still running."""
        for _, task in self._planned_tasks(parallelism):
            yield task

    def _planned_tasks(self, parallelism: int) -> Iterator[tuple[list[FilePiece], ReadTask]]:
        """``get_read_tasks``' tasks, each with the pieces it reads."""
        next_execution = getattr(self._files, "next_execution", None)
        if next_execution is not None:  # (a shuffled listing takes its next order)
            next_execution()
        files = self._files.iter_files()
        first = next(files, None)
        if first is None:
            return
        part_schema = self._partition_schema(first)
        shared = SharedSource(self)
        for group in plan_pieces(
            self._prune(_chain([first], files), part_schema),
            parallelism,
            target_task_bytes=self._target_task_bytes,
            min_task_bytes=MIN_TASK_BYTES,
            split_files=self._split_files(),
        ):
            metadata = self._task_metadata(group)
            yield group, ReadTask(functools.partial(shared.call, "_read_pieces", tuple(group), part_schema), metadata)

    def _prune(self, entries: Iterator[FileEntry], part_schema: pa.Schema | None) -> Iterator[FileEntry]:
        """The listed files worth reading (a format with a filter drops those whose partition
        values rule it out); all of them here."""
        return entries

    def _task_metadata(self, group: Sequence[FilePiece]) -> BlockMetadata:
        """What is known of a read task's output before it runs: its files and their bytes."""
        displays = tuple(self._files.display(p.entry.path) for p in group)
        return BlockMetadata(
            num_rows=None,
            size_bytes=sum(p.size for p in group),
            input_files=tuple(dict.fromkeys(displays)),
            schema=None,
        )

    def _retrier(self) -> Retrier:
        """A retrier for this source's files (no request cap for local ones)."""
        return Retrier(self._retry_policy, limiter_for(self._files.filesystem))

    def _read_pieces(
        self, pieces: tuple[FilePiece, ...], part_schema: pa.Schema | None
    ) -> Iterator[pa.Table]:
        retrier = self._retrier()
        yield from coalesce(self._iter_piece_tables(pieces, part_schema, retrier), DEFAULT_BLOCK_BYTES)

    def _iter_piece_tables(
        self, pieces: tuple[FilePiece, ...], part_schema: pa.Schema | None, retrier: Retrier
    ) -> Iterator[pa.Table]:
        fs = self._files.filesystem
        for piece in pieces:
            entry = piece.entry
            display = self._files.display(entry.path)
            values = self._partition_values(part_schema, entry, display) if part_schema else {}
            for table in self._read_file_checked(fs, piece, display, retrier):
                if values:
                    table = append_partition_columns(table, values)
                if self._include_paths:
                    table = table.append_column("path", pa.array([display] * table.num_rows, pa.string()))
                yield table

    def _partition_values(self, part_schema: pa.Schema, entry: FileEntry, display: str) -> dict[str, pa.Scalar]:
        """The partition columns' values for this file: from its hive folders (table formats: from their log)."""
        return typed_values(part_schema, entry.path, display, self._partitioning)

    def _read_file_checked(
        self, fs: Any, piece: FilePiece, display: str, retrier: Retrier
    ) -> Iterator[pa.Table]:
        try:
            yield from self._read_file(fs, piece, display, retrier)
        except (FileFormatError, PathNotFoundError, AccessDeniedError, RetriesExhaustedError):
            raise
        except (pa.ArrowException, ValueError, UnicodeDecodeError, OSError) as exc:
            raise FileFormatError(f"could not read as {self.get_name()}: {exc}", path=display) from exc

    def _read_file(self, fs: Any, piece: FilePiece, display: str, retrier: Retrier) -> Iterator[pa.Table]:
        """Tables read from one file (or piece); implemented by each format."""
        raise NotImplementedError

    def estimate_inmemory_data_size(self) -> int | None:
        """On-disk bytes of the files when there are at most ``LOOKAHEAD`` of them, else None.

        A lower bound for formats that decode larger (CSV, JSON, compressed files); the engine
        uses it to spread a small input over the workers instead of bundling it into one task.
        A listing longer than ``LOOKAHEAD`` stops early: the answer is None, and big inputs need
        no spreading.
        """
        total = 0
        for count, entry in enumerate(self._files.iter_files()):
            if count >= LOOKAHEAD:
                return None
            total += entry.size or 0
        return total


class ProjectingFileDatasource(FileDatasource):
    """A ``FileDatasource`` that can keep only some columns (``apply_projection``).

    Rows come out with ``self._columns`` in that order (``path`` and partition columns allowed);
    a column a block does not have comes out as nulls. A format reads ``self._columns`` to leave
    out what nobody asked for before decoding it.
    """

    _columns: list[str] | None = None

    def apply_projection(self, columns: list[str]) -> ProjectingFileDatasource:
        """A copy keeping only ``columns``."""
        clone = copy.copy(self)
        clone._columns = list(columns)
        return clone

    def _iter_piece_tables(
        self, pieces: tuple[FilePiece, ...], part_schema: pa.Schema | None, retrier: Retrier
    ) -> Iterator[pa.Table]:
        tables = super()._iter_piece_tables(pieces, part_schema, retrier)
        if self._columns is None:
            yield from tables
            return
        names = self._columns
        for table in tables:
            present = set(table.column_names)
            arrays = [table[c] if c in present else pa.nulls(table.num_rows) for c in names]
            yield pa.Table.from_arrays(arrays, names=names)

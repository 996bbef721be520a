"""The shared half of every file sink: stage on workers, commit on the driver, clean up on failure.

``on_write_start`` creates ``<dest>/_staging-<write id>/`` (hidden from readers: ``_``-prefixed).
Each ``write`` task encodes its blocks into files in memory, rolling over at ``max_rows_per_file``
rows (or ``MAX_FILE_BYTES``), one set per partition when ``partition_cols`` is given (hive
``key=value`` folders, partition columns left out of the files), and uploads each file into the
staging folder as one retried request. File names carry the write id, task index and attempt, so
a retried task never overwrites another task's file. ``on_write_complete`` moves the files named
by the successful tasks' results into place and removes the staging folder (with any leftovers of
failed attempts); ``on_write_failed`` removes the staging folder, so a failed job leaves no
partial files. A format subclass implements ``_encode``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from connectors import io_stats
from connectors.base import Block, Datasink, TaskContext
from connectors.filesystem import resolve_filesystem
from connectors.partitioning import folder_name
from connectors.retry import Retrier, RetryPolicy, default_retry_policy

MAX_FILE_BYTES = 512 << 20


@dataclass(frozen=True)
class WriteResult:
    """What one write task staged: file paths relative to the destination, rows and bytes."""

    files: tuple[str, ...]
    num_rows: int
    num_bytes: int


class FileDatasink(Datasink):
    """Base class for sinks that write files into one destination folder."""

    EXTENSION = ""

    def __init__(
        self,
        path: str,
        *,
        partition_cols: Sequence[str] | None = None,
        min_rows_per_file: int | None = None,
        max_rows_per_file: int | None = None,
        filesystem: Any = None,
    ) -> None:
        if min_rows_per_file is not None and min_rows_per_file < 1:
            raise ValueError(f"min_rows_per_file must be at least 1, got {min_rows_per_file}")
        if max_rows_per_file is not None and max_rows_per_file < 1:
            raise ValueError(f"max_rows_per_file must be at least 1, got {max_rows_per_file}")
        if min_rows_per_file and max_rows_per_file and min_rows_per_file > max_rows_per_file:
            raise ValueError(
                f"min_rows_per_file ({min_rows_per_file}) > max_rows_per_file ({max_rows_per_file})"
            )
        fs, roots, prefix = resolve_filesystem([str(path)], filesystem)
        self._fs: pafs.FileSystem = fs
        self._root = roots[0].rstrip("/")
        self._prefix = prefix
        self._partition_cols = list(partition_cols or [])
        self._min_rows = min_rows_per_file
        self._max_rows = max_rows_per_file
        self._write_id = uuid.uuid4().hex[:16]
        self._retry_policy: RetryPolicy = default_retry_policy()
        self.written_files: list[str] = []

    @property
    def staging_dir(self) -> str:
        """Where tasks write before the commit (inside the destination, hidden from readers)."""
        return f"{self._root}/_staging-{self._write_id}"

    @property
    def min_rows_per_write(self) -> int | None:
        """The engine bundles blocks until a write task has this many rows."""
        return self._min_rows

    def _display(self, path: str) -> str:
        return self._prefix + path

    def on_write_start(self) -> None:
        """Create the destination and the staging folder."""
        retrier = Retrier(self._retry_policy)
        retrier.call(
            lambda: self._fs.create_dir(self.staging_dir, recursive=True),
            path=self._display(self.staging_dir),
            action="create",
        )

    def write(self, blocks: Iterable[Block], ctx: TaskContext) -> WriteResult:
        """Encode ``blocks`` into staged files; returns what was staged."""
        retrier = Retrier(self._retry_policy)
        files: list[str] = []
        rows = 0
        size = 0
        writers: dict[str, _RollingFile] = {}
        for block in blocks:
            if isinstance(block, pa.RecordBatch):
                block = pa.Table.from_batches([block])
            rows += block.num_rows
            for folder, part in self._split_by_partition(block):
                writer = writers.get(folder)
                if writer is None:
                    writer = writers[folder] = _RollingFile(self, folder, ctx)
                for finished in writer.add(part):
                    size += self._upload(finished, retrier, files)
        for writer in writers.values():
            for finished in writer.finish():
                size += self._upload(finished, retrier, files)
        io_stats.record(files_written=len(files), rows_written=rows)
        return WriteResult(tuple(files), rows, size)

    def on_write_complete(self, write_results: list[Any]) -> None:
        """Move every staged file of every successful task into place, then drop the staging folder."""
        retrier = Retrier(self._retry_policy)
        made: set[str] = set()
        for result in write_results:
            for relative in result.files:
                source, target = f"{self.staging_dir}/{relative}", f"{self._root}/{relative}"
                parent = target.rsplit("/", 1)[0]
                if parent not in made:
                    retrier.call(
                        lambda p=parent: self._fs.create_dir(p, recursive=True),
                        path=self._display(parent),
                        action="create",
                    )
                    made.add(parent)
                retrier.call(
                    lambda s=source, t=target: self._fs.move(s, t),
                    path=self._display(target),
                    action="commit",
                )
                self.written_files.append(self._display(target))
        self._remove_staging()

    def on_write_failed(self, error: BaseException) -> None:
        """Remove the staging folder: a failed job leaves nothing behind."""
        self._remove_staging()

    def _remove_staging(self) -> None:
        def remove() -> None:
            if self._fs.get_file_info(self.staging_dir).type != pafs.FileType.NotFound:
                self._fs.delete_dir(self.staging_dir)

        Retrier(self._retry_policy).call(remove, path=self._display(self.staging_dir), action="remove")

    def _split_by_partition(self, table: pa.Table) -> Iterator[tuple[str, pa.Table]]:
        if not self._partition_cols:
            yield "", table
            return
        missing = [c for c in self._partition_cols if c not in table.column_names]
        if missing:
            raise ValueError(f"partition_cols {missing} are not columns of the data: {table.column_names}")
        keys = table.select(self._partition_cols).group_by(self._partition_cols).aggregate([]).to_pylist()
        data_columns = [c for c in table.column_names if c not in self._partition_cols]
        for key in keys:
            mask = None
            for name, value in key.items():
                term = (
                    pc.is_null(table[name])
                    if value is None
                    else pc.equal(table[name], pa.scalar(value, table.schema.field(name).type))
                )
                mask = term if mask is None else pc.and_(mask, term)
            folder = "/".join(folder_name(name, key[name]) for name in self._partition_cols)
            yield folder, table.filter(mask).select(data_columns)

    def _upload(self, finished: tuple[str, pa.Buffer], retrier: Retrier, files: list[str]) -> int:
        relative, data = finished
        target = f"{self.staging_dir}/{relative}"
        parent = target.rsplit("/", 1)[0]

        def put() -> None:
            self._fs.create_dir(parent, recursive=True)
            with self._fs.open_output_stream(target) as out:
                out.write(data)

        retrier.call(put, path=self._display(target), action="write")
        files.append(relative)
        return data.size

    def _encode(self, tables: list[pa.Table]) -> pa.Buffer:
        """The bytes of one file holding ``tables`` (all with one schema); per format."""
        raise NotImplementedError


class _RollingFile:
    """Tables for one partition folder, cut into files of at most ``max_rows_per_file`` rows."""

    def __init__(self, sink: FileDatasink, folder: str, ctx: TaskContext) -> None:
        self._sink = sink
        self._folder = folder
        self._ctx = ctx
        self._pending: list[pa.Table] = []
        self._rows = 0
        self._bytes = 0
        self._sequence = 0

    def add(self, table: pa.Table) -> Iterator[tuple[str, pa.Buffer]]:
        limit = self._sink._max_rows
        while table.num_rows:
            take = table.num_rows if limit is None else min(table.num_rows, limit - self._rows)
            head, table = table.slice(0, take), table.slice(take)
            self._pending.append(head)
            self._rows += head.num_rows
            self._bytes += head.nbytes
            if (limit is not None and self._rows >= limit) or self._bytes >= MAX_FILE_BYTES:
                yield self._flush()

    def finish(self) -> Iterator[tuple[str, pa.Buffer]]:
        if self._rows:
            yield self._flush()

    def _flush(self) -> tuple[str, pa.Buffer]:
        sink, ctx = self._sink, self._ctx
        name = f"{sink._write_id}_{ctx.task_index:06d}_{ctx.attempt}_{self._sequence:04d}{sink.EXTENSION}"
        self._sequence += 1
        data = sink._encode(self._pending)
        self._pending, self._rows, self._bytes = [], 0, 0
        return (f"{self._folder}/{name}" if self._folder else name), data


def combine(tables: list[pa.Table]) -> pa.Table:
    """One table from ``tables``, promoting types that differ compatibly (null -> int, int32 -> int64)."""
    if len(tables) == 1:
        return tables[0]
    return pa.concat_tables(tables, promote_options="permissive")

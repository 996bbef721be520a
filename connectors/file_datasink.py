"""The shared half of every file sink: stage on workers, commit on the driver, clean up on failure.

``on_write_start`` creates ``<dest>/_staging-<write id>/`` (hidden from readers: ``_``-prefixed).
Each ``write`` task cuts its blocks into files, rolling over at ``max_rows_per_file`` rows (or
``MAX_FILE_BYTES``), one set per partition when ``partition_cols`` is given (hive ``key=value``
folders, partition columns left out of the files), and writes each file into the staging folder
as one retried call: encoded straight into the staged file where the format's writer streams
(``_encode_into``: Parquet, CSV, ORC), else as the bytes ``_encode`` makes. File names start
with the write id and carry the task index and attempt, so a retried task never overwrites
another task's file. A format subclass implements ``_encode_into`` when its writer streams, else
``_encode``.

The commit (``on_write_complete``, on the driver, once every task succeeded) runs in this order:

1. remove a ``_SUCCESS`` left by an earlier job in the same folder (the folder is about to change);
2. put the staged files named by the successful tasks' results into place, ``COMMIT_THREADS`` at
   a time on object stores (S3: one server-side copy each, the staged copies are deleted with the
   staging folder in bulk afterwards) and ``LOCAL_COMMIT_THREADS`` at a time elsewhere (a rename
   each);
3. remove the staging folder, with the leftovers of failed task attempts;
4. write an empty ``_SUCCESS`` in the destination (Spark/Hadoop's marker), unless the sink was
   made with ``write_success_marker=False``.

What a reader of the destination sees (listings skip names starting with ``_`` or ``.``, so the
staging folder and the marker are never read as data):

* while tasks write, or if the job dies then: nothing new, whatever happened; a job that failed
  with an error also removes its staging folder (``on_write_failed``), and the destination
  folder if the job created it and it is empty; a killed driver leaves them;
* during steps 1 to 3, or if the driver is killed then: some or all of the job's files (all named
  ``<write id>_...``), no ``_SUCCESS``, and the staging folder with the staged files not yet
  removed (on object stores every staged file stays there until step 3);
* after step 4: every file of the job and ``_SUCCESS``, and no staging folder.

A job that wrote no rows into a destination that did not exist leaves no destination (Ray's
behaviour): the commit removes the staging folder and the folder it created, and writes no marker.

A commit that fails with an error (a file that cannot be moved, the marker that cannot be
written) stops placing files, removes again every file it had put in place, removes the staging
folder and raises ``CommitError`` naming the files that failed: the destination holds nothing of
the job and no ``_SUCCESS``. Removal is best effort; files it could not remove are named in the
error. Partition folders created for the job may remain, empty.

``mode`` (Ray's ``SaveMode``) says what to do when the destination exists already, checked
before anything runs: ``APPEND`` (the default, as Ray) adds the job's files; ``ERROR`` and
``CREATE`` raise ``ValueError``; ``IGNORE`` writes nothing (``skip_write``); ``OVERWRITE``
removes what was there, at the commit, just before the new files are put in place (step 1), so
a job that fails leaves the old data as it was. A ``filename_provider`` (Ray's
``FilenameProvider``) names each task's files instead of the write id: a name with ``{i}`` gets
the file's number in the task there; other names get ``-<i>`` before the extension, on every
file for Parquet and ORC, past a task's first file for the other sinks (Ray's naming).

``mode="resume"`` (dataflow's own ``SaveMode.RESUME``) changes the protocol: each write task
writes one input unit and commits it itself, and the driver's commit only writes ``_SUCCESS``
(see ``connectors.resumable_write``).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import posixpath
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from connectors import io_stats
from connectors.base import Block, Datasink, TaskContext
from connectors.filesystem import resolve_filesystem
from connectors.partitioning import folder_name
from connectors.resumable_write import ResumeManifest, ResumeState
from connectors.retry import Retrier, RetryPolicy, default_retry_policy
from engine.exchange import grouped_rows
from engine.object_store import DISK_WRITE_BYTES

logger = logging.getLogger("dataflow.write")

MAX_FILE_BYTES = 512 << 20
PARTITIONED_WRITE_BYTES = 128 << 20
"""In-memory bytes a partitioned write's task takes at least (``write_task_bytes``)."""
COMMIT_THREADS = 16
"""Files put in place at once by the commit on object stores, where each is a copy request."""
LOCAL_COMMIT_THREADS = 4
"""Files put in place at once on local and other filesystems, where each is a rename."""
SUCCESS_MARKER = "_SUCCESS"
_OBJECT_STORE_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl", "oss"})
_NATIVE_OBJECT_STORES = tuple(
    getattr(pafs, name) for name in ("S3FileSystem", "GcsFileSystem", "AzureFileSystem") if hasattr(pafs, name)
)


class SaveMode(enum.StrEnum):
    """Ray Data's ``SaveMode``: what a write does when its destination exists already."""

    CREATE = "create"
    """Write only into a new destination: raise ``ValueError`` if it exists."""
    APPEND = "append"
    """Add the job's files next to what is there (the default)."""
    OVERWRITE = "overwrite"
    """Replace what is there (removed at the commit, once every task succeeded)."""
    IGNORE = "ignore"
    """Write nothing if the destination exists."""
    ERROR = "error"
    """As ``CREATE``."""
    UPSERT = "upsert"
    """Ray's table-format mode; refused by file sinks (files have no keys to match)."""
    RESUME = "resume"
    """dataflow's own: continue an interrupted write where it stopped, skipping the input units
    already committed (``connectors.resumable_write``); on a new destination, a write that can
    be resumed."""


class FilenameProvider:
    """Ray Data's ``FilenameProvider``: names the files of a write task.

    Override ``get_filename_for_task``; the name must be unique per ``(write_uuid, task_index)``
    (two tasks given the same name fail the commit). ``{i}`` in it is replaced by the number of
    the file in the task (a task writes several when ``max_rows_per_file`` or partitions split
    its rows); without ``{i}``, ``-<i>`` goes before the extension.
    """

    def __init__(self, dataset_uuid: str | None = None, file_format: str | None = None) -> None:
        self.dataset_uuid = dataset_uuid
        self.file_format = file_format

    def get_filename_for_task(self, write_uuid: str, task_index: int) -> str:
        """``[<dataset_uuid>_]<write_uuid>_<task_index>[.<file_format>]``, as Ray's default."""
        name = f"{self.dataset_uuid}_" if self.dataset_uuid is not None else ""
        name += f"{write_uuid}_{task_index:06}"
        return name + (f".{self.file_format}" if self.file_format is not None else "")


def _numbered(name: str, extension: str, number: int, *, always: bool) -> str:
    """File ``number`` of a write task whose ``filename_provider`` name is ``name``.

    Ray's rules: a name with ``{i}`` gets the number there; Parquet (``always``) puts ``-<i>``
    before the extension of every file; the other sinks write one file per task under the name as
    it is, and a task that writes more than one file (``max_rows_per_file``) numbers the later ones.
    """
    if "{i}" in name:
        return name.replace("{i}", str(number))
    if not always and number == 0:
        return name
    stem, ext = posixpath.splitext(name)
    return f"{stem}-{number}{ext or extension}"


def rows_per_file(num_rows_per_file: int | None, min_rows_per_file: int | None) -> int | None:
    """``min_rows_per_file``, or Ray's deprecated ``num_rows_per_file`` that means the same."""
    if num_rows_per_file is None:
        return min_rows_per_file
    warnings.warn(
        "`num_rows_per_file` is deprecated and will be removed in a future release. Use `min_rows_per_file` instead.",
        DeprecationWarning,
        stacklevel=3,
    )
    if min_rows_per_file is not None:
        raise ValueError(
            "Cannot specify both `num_rows_per_file` and `min_rows_per_file`. "
            "Use `min_rows_per_file` as `num_rows_per_file` is deprecated."
        )
    return num_rows_per_file


class CommitError(OSError):
    """The commit could not put the job's files in place; those it had placed were removed again.

    ``failures`` lists ``(path, exception)`` for every step that failed; ``remaining`` the paths
    of this job that could not be removed again (empty when the destination is as it was).
    """

    def __init__(
        self,
        message: str,
        failures: Sequence[tuple[str, BaseException]] = (),
        remaining: Sequence[str] = (),
    ) -> None:
        super().__init__(message)
        self.failures = list(failures)
        self.remaining = list(remaining)

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class WriteResult:
    """What one write task staged: file paths relative to the destination, rows and bytes."""

    files: tuple[str, ...]
    num_rows: int
    num_bytes: int


class FileDatasink(Datasink):
    """Base class for sinks that write files into one destination folder."""

    EXTENSION = ""
    NUMBERS_EVERY_FILE = False
    """Whether a ``filename_provider`` name gets ``-<i>`` on every file (Parquet) or only past the first."""

    @property
    def writes_local_files(self) -> bool:
        """True when the destination is this machine's file system (not shared with other nodes)."""
        return isinstance(self._fs, pafs.LocalFileSystem)

    @property
    def local_root(self) -> str:
        """The destination folder on this machine's file system (meaningful when ``writes_local_files``)."""
        return self._root

    def __init__(
        self,
        path: str,
        *,
        partition_cols: Sequence[str] | None = None,
        min_rows_per_file: int | None = None,
        max_rows_per_file: int | None = None,
        filesystem: Any = None,
        write_success_marker: bool = True,
        mode: SaveMode | str = SaveMode.APPEND,
        filename_provider: FilenameProvider | None = None,
        min_bytes_per_file: int | None = None,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)):  # (an int was written as a folder named "5")
            raise ValueError(f"the path to write to must be a str or os.PathLike, got {type(path).__name__}: {path!r}")
        if min_rows_per_file is not None and min_rows_per_file < 1:
            raise ValueError(f"min_rows_per_file must be at least 1, got {min_rows_per_file}")
        if min_bytes_per_file is not None and (not isinstance(min_bytes_per_file, int) or min_bytes_per_file <= 0):
            raise ValueError("min_bytes_per_file must be a positive integer")
        if min_bytes_per_file is not None and (min_rows_per_file is not None or max_rows_per_file is not None):
            raise ValueError("min_bytes_per_file cannot be used with min_rows_per_file, max_rows_per_file, or num_rows_per_file")
        try:
            self.mode = SaveMode(mode)
        except ValueError:
            raise ValueError(f"mode must be one of {[m.value for m in SaveMode]}, got {mode!r}") from None
        if self.mode is SaveMode.UPSERT:
            raise ValueError("mode=SaveMode.UPSERT is for table formats with keys; file sinks support "
                             "APPEND, OVERWRITE, IGNORE, ERROR and CREATE")
        if self.mode is SaveMode.RESUME and (min_rows_per_file is not None or min_bytes_per_file is not None):
            raise ValueError("mode='resume' writes each input unit (read task) into files of its own, so "
                             "min_rows_per_file and min_bytes_per_file cannot group rows across units; use "
                             "max_rows_per_file, or fewer, larger read tasks (override_num_blocks)")
        if filename_provider is not None and not callable(getattr(filename_provider, "get_filename_for_task", None)):
            raise TypeError(f"filename_provider must have a get_filename_for_task method, got {type(filename_provider).__name__}")
        self._filename_provider = filename_provider
        self._min_bytes = min_bytes_per_file
        self._in_given_tasks = False
        self.skip_write = False
        """Set by ``on_write_start`` under ``SaveMode.IGNORE`` when the destination exists: write nothing."""
        self._replace_existing = False
        if max_rows_per_file is not None and max_rows_per_file < 1:
            raise ValueError(f"max_rows_per_file must be at least 1, got {max_rows_per_file}")
        if min_rows_per_file and max_rows_per_file and min_rows_per_file > max_rows_per_file:
            raise ValueError(f"min_rows_per_file ({min_rows_per_file}) > max_rows_per_file ({max_rows_per_file})")
        fs, roots, prefix = resolve_filesystem([str(path)], filesystem)
        self._fs: pafs.FileSystem = fs
        self._root = roots[0].rstrip("/")
        self._prefix = prefix
        self._partition_cols = list(partition_cols or [])
        self._min_rows = min_rows_per_file
        self._max_rows = max_rows_per_file
        self._write_id = uuid.uuid4().hex[:16]
        self._retry_policy: RetryPolicy = default_retry_policy()
        self.write_success_marker = write_success_marker
        """Write an empty ``_SUCCESS`` in the destination once every file is in place."""
        self.written_files: list[str] = []
        self._resume: ResumeState | None = None
        self._try_create_dir = True
        self._open_args: dict[str, Any] = {}
        self._created_root = False

    def set_output_options(self, try_create_dir: bool = True, arrow_open_stream_args: dict[str, Any] | None = None) -> None:
        """Ray's ``try_create_dir`` (False: a local destination must exist already) and
        ``arrow_open_stream_args`` (passed to ``open_output_stream`` for each data file: its
        ``compression``, an object store's ``metadata``)."""
        if arrow_open_stream_args is not None and not isinstance(arrow_open_stream_args, dict):
            raise TypeError(f"arrow_open_stream_args must be a dict, got {type(arrow_open_stream_args).__name__}")
        unknown = sorted(set(arrow_open_stream_args or ()) - {"compression", "buffer_size", "metadata"})
        if unknown:
            raise TypeError(f"arrow_open_stream_args: {unknown[0]!r} is not an argument of "
                            "pyarrow.fs.FileSystem.open_output_stream (compression, buffer_size, metadata)")
        self._try_create_dir = bool(try_create_dir)
        self._open_args = dict(arrow_open_stream_args or {})

    @property
    def resumes(self) -> bool:
        """A resumable write (``mode="resume"``): each task writes and commits one input unit."""
        return self.mode is SaveMode.RESUME

    @property
    def staging_dir(self) -> str:
        """Where tasks write before the commit (inside the destination, hidden from readers)."""
        return f"{self._root}/_staging-{self._write_id}"

    @property
    def min_rows_per_write(self) -> int | None:
        """The engine bundles blocks until a write task has this many rows."""
        return self._min_rows

    @property
    def min_bytes_per_write(self) -> int | None:
        """The engine bundles blocks until a write task has this many bytes (in memory), in a
        write operator of its own (never fused with the step before it).

        (``write_task_bytes``, what the engine uses, adds a default for partitioned writes.)"""
        return self._min_bytes

    @property
    def write_task_bytes(self) -> int | None:
        """Bytes (in memory) the engine gathers into each write task, in a write operator of its
        own: ``min_bytes_per_file``, or for a partitioned write with no minimum of its own
        ``PARTITIONED_WRITE_BYTES``: each task writes a file into every folder its rows reach,
        so one task per small input file (32 files of 4M rows into 1,000 folders: 32,000 files
        of ~125 rows) makes as many tiny files as folders times tasks. None after
        ``write_in_given_tasks`` (the writes then run where the caller put them)."""
        if self._min_bytes is None and self._partition_cols and self._min_rows is None and not self.resumes:
            return None if self._in_given_tasks else PARTITIONED_WRITE_BYTES
        return self._min_bytes

    def write_in_given_tasks(self) -> None:
        """Write in the tasks of the step before the write, with no default grouping
        (``write_*(concurrency=..., ray_remote_args=...)``: those tasks have the resources)."""
        self._in_given_tasks = True

    def _display(self, path: str) -> str:
        return self._prefix + path

    def on_write_start(self) -> None:
        """Apply ``mode`` to an existing destination; create the destination and the staging folder."""
        retrier = Retrier(self._retry_policy)
        if self.mode is SaveMode.RESUME:
            self._start_resume()
            return
        self._check_appended_names()
        exists = retrier.call(
            lambda: self._fs.get_file_info(self._root).type != pafs.FileType.NotFound,
            path=self._display(self._root),
            action="check",
        )
        if exists and self.mode in (SaveMode.ERROR, SaveMode.CREATE):
            raise ValueError(
                f"Path {self._display(self._root)} already exists. If this is unexpected, use "
                "mode='ignore' to ignore those files"
            )
        if exists and self.mode is SaveMode.IGNORE:
            self.skip_write = True
            return
        if not exists and not self._try_create_dir and self.writes_local_files:  # object stores have no folders
            raise FileNotFoundError(
                f"{self._display(self._root)} does not exist and try_create_dir=False: create it first, "
                "or leave try_create_dir at True"
            )
        self._replace_existing = exists and self.mode is SaveMode.OVERWRITE
        self._created_root = not exists
        retrier.call(
            lambda: self._fs.create_dir(self.staging_dir, recursive=True),
            path=self._display(self.staging_dir),
            action="create",
        )

    def _check_appended_names(self) -> None:
        """In append mode, a ``filename_provider`` whose names do not change from one write to
        the next would replace the earlier write's files: refused for every format (Ray's
        Parquet sink refuses it; its other sinks reuse the names)."""
        if self.mode is not SaveMode.APPEND or self._filename_provider is None:
            return
        name = str(self._filename_provider.get_filename_for_task(self._write_id, 0))
        if self._write_id not in name:
            raise ValueError(
                f"Write UUID '{self._write_id}' missing from filename template '{name}'. This could result "
                "in files being overwritten. Modify your FileNameProvider implementation to include the "
                "`write_uuid` into the filename template or change your write mode to SaveMode.OVERWRITE."
            )

    def write(self, blocks: Iterable[Block], ctx: TaskContext) -> WriteResult:
        """Encode ``blocks`` into staged files; returns what was staged. A resumable write's
        task also puts its unit's files in place and records the unit as committed."""
        retrier = Retrier(self._retry_policy)
        if self.resumes and ctx.unit is None:
            raise RuntimeError("a resumable write task was given the rows of several input units or none")
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
                    size += self._upload(finished, retrier, files, ctx)
        for writer in writers.values():
            for finished in writer.finish():
                size += self._upload(finished, retrier, files, ctx)
        io_stats.record(files_written=len(files), rows_written=rows)
        if self.resumes:
            assert ctx.unit is not None
            place = self._placer(retrier)
            self._manifest(retrier).commit_unit(ctx.unit, self._task_staging(ctx), files, rows, size, place)
        return WriteResult(tuple(files), rows, size)

    def on_write_complete(self, write_results: list[Any]) -> None:
        """Put every staged file of every successful task in place, in parallel, then ``_SUCCESS``.

        Raises ``CommitError`` (after removing what it had placed) if any step fails.
        """
        retrier = Retrier(self._retry_policy)
        if self.resumes:
            self._finish_resume(write_results, retrier)
            return
        relatives = [relative for result in write_results for relative in result.files]
        marker = f"{self._root}/{SUCCESS_MARKER}"
        placed: list[str] = []  # every target this commit may have created, even by a failed call
        failures: list[tuple[str, BaseException]] = []
        duplicated = sorted({r for r in relatives if relatives.count(r) > 1}) if self._filename_provider else []
        if duplicated:
            with contextlib.suppress(Exception):
                self._remove_staging()
            raise ValueError(
                f"filename_provider gave two write tasks the same file name ({duplicated[0]}); its "
                "get_filename_for_task must make a unique name from write_uuid and task_index"
            )
        if not relatives and self._created_root:
            # no rows: as Ray, a destination this job would have created is not left behind
            self._remove_staging()
            self._remove_root_if_empty(retrier)
            return
        if self.write_success_marker:
            failures = self._step(marker, lambda: self._remove_marker(marker, retrier))
        if not failures and self._replace_existing:
            failures = self._step(self._root, lambda: self._remove_existing(retrier))
        if not failures:
            failures = self._place_all(relatives, retrier, placed)
        if not failures:
            failures = self._step(self.staging_dir, self._remove_staging)
        if not failures and self.write_success_marker:
            placed.append(marker)
            failures = self._step(marker, lambda: self._write_marker(marker, retrier))
        if failures:
            self._abort_commit(len(relatives), placed, failures)
        self.written_files.extend(self._display(f"{self._root}/{relative}") for relative in relatives)

    def _remove_root_if_empty(self, retrier: Retrier) -> None:
        def remove() -> None:
            info = self._fs.get_file_info(self._root)
            if info.type != pafs.FileType.Directory:
                return
            if not self._fs.get_file_info(pafs.FileSelector(self._root, recursive=False)):
                self._fs.delete_dir(self._root)

        retrier.call(remove, path=self._display(self._root), action="remove")

    def on_write_failed(self, error: BaseException) -> None:
        """Remove the staging folder, and the destination folder when this job created it and
        it is empty: a failed job leaves nothing behind (a resumable write keeps the units it
        committed, for the next run)."""
        self._remove_staging()
        if self._created_root and not self.resumes:
            with contextlib.suppress(Exception):  # best effort: the job's own error is what the caller gets
                self._remove_root_if_empty(Retrier(self._retry_policy))

    # resumable writes (mode="resume"; see connectors.resumable_write) -----------------------
    def _manifest(self, retrier: Retrier | None = None) -> ResumeManifest:
        return ResumeManifest(self._fs, self._root, retrier or Retrier(self._retry_policy), self._display)

    def _start_resume(self) -> None:
        """Read the manifest; undo what a killed run left half done."""
        manifest = self._manifest()
        self._resume = manifest.load()
        if self._resume.fingerprint is not None:
            self._write_id = self._resume.fingerprint[:16]
            removed = manifest.recover(self.staging_dir)
            if removed:
                logger.info("resuming %s: removed %d files of units a killed run had not committed",
                            self._display(self._root), len(removed))

    @property
    def resume_parallelism(self) -> int | None:
        """The read parallelism of the job being resumed (its units depend on it)."""
        return self._resume.parallelism if self._resume is not None else None

    def resume_options(self) -> dict[str, Any]:
        """What of this sink decides the files a unit becomes (part of the job's fingerprint)."""
        provider = self._filename_provider
        return {"sink": type(self).__name__, "partition_cols": self._partition_cols, "max_rows": self._max_rows,
                "extension": self.EXTENSION, "filename_provider": type(provider).__name__ if provider else None}

    def begin_resume(self, fingerprint: str, parallelism: int, num_units: int) -> set[int]:
        """Start (or check that this run is) the job the manifest records; the units committed."""
        assert self._resume is not None, "on_write_start comes first"
        self._manifest().start_job(self._resume, fingerprint, parallelism, num_units)
        self._write_id = fingerprint[:16]
        Retrier(self._retry_policy).call(lambda: self._fs.create_dir(self.staging_dir, recursive=True),
                                         path=self._display(self.staging_dir), action="create")
        return set(self._resume.committed)

    def _finish_resume(self, write_results: list[Any], retrier: Retrier) -> None:
        """Every unit is committed: remove the staging folder, write ``_SUCCESS``, mark the job done."""
        assert self._resume is not None
        self._remove_staging()
        if self.write_success_marker:
            self._write_marker(f"{self._root}/{SUCCESS_MARKER}", retrier)
        self._manifest(retrier).finish_job(self._resume)
        earlier = [relative for record in self._resume.committed.values() for relative in record["files"]]
        relatives = earlier + [relative for result in write_results for relative in result.files]
        self.written_files.extend(self._display(f"{self._root}/{relative}") for relative in relatives)

    def _task_staging(self, ctx: TaskContext) -> str:
        """A resumable write task's own staging folder (its attempt's: retries never meet)."""
        return f"{self.staging_dir}/{ctx.unit:06d}-{ctx.attempt}"

    def _placer(self, retrier: Retrier) -> Callable[[str, str], None]:
        """Put one staged file in place (replacing a file of the same name): a copy on object
        stores, a rename elsewhere."""
        copy = _is_object_store(self._fs)

        def place(source: str, target: str) -> None:
            def run() -> None:
                self._fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
                if copy:
                    self._copy(source, target)
                else:
                    self._fs.move(source, target)

            retrier.call(run, path=self._display(target), action="commit")

        return place

    def _remove_existing(self, retrier: Retrier) -> None:
        """``SaveMode.OVERWRITE``: remove everything in the destination but this job's staging folder."""
        staging = self.staging_dir.rsplit("/", 1)[-1]
        selector = pafs.FileSelector(self._root, recursive=False)
        entries = retrier.call(lambda: self._fs.get_file_info(selector), path=self._display(self._root), action="list")
        for entry in entries:
            if entry.base_name == staging:
                continue
            if entry.type == pafs.FileType.Directory:
                retrier.call(lambda p=entry.path: self._fs.delete_dir(p), path=self._display(entry.path), action="remove")
            else:
                retrier.call(lambda p=entry.path: self._fs.delete_file(p), path=self._display(entry.path), action="remove")

    def _remove_staging(self) -> None:
        def remove() -> None:
            if self._fs.get_file_info(self.staging_dir).type != pafs.FileType.NotFound:
                self._fs.delete_dir(self.staging_dir)

        Retrier(self._retry_policy).call(remove, path=self._display(self.staging_dir), action="remove")

    def _commit_threads(self, count: int) -> int:
        threads = COMMIT_THREADS if _is_object_store(self._fs) else LOCAL_COMMIT_THREADS
        return max(1, min(threads, count))

    def _place_all(self, relatives: list[str], retrier: Retrier, placed: list[str]) -> list[tuple[str, BaseException]]:
        """Every staged file moved (or copied, on object stores) into place; the failures."""
        if not relatives:
            return []
        copy = _is_object_store(self._fs)
        targets = [f"{self._root}/{relative}" for relative in relatives]
        parents = sorted({target.rsplit("/", 1)[0] for target in targets} - {self._root})

        def create(parent: str) -> Callable[[], None]:
            return lambda: retrier.call(
                lambda: self._fs.create_dir(parent, recursive=True), path=self._display(parent), action="create"
            )

        def place(source: str, target: str) -> Callable[[], None]:
            def run() -> None:
                placed.append(target)  # before the call: a failed copy may still have created it
                if copy:
                    retrier.call(lambda: self._copy(source, target), path=self._display(target), action="commit")
                else:
                    retrier.call(lambda: self._fs.move(source, target), path=self._display(target), action="commit")

            return run

        with ThreadPoolExecutor(self._commit_threads(len(targets)), thread_name_prefix="commit") as pool:
            failures = _run_all(pool, [(self._display(p), create(p)) for p in parents])
            if failures:
                return failures
            calls = [
                (self._display(target), place(f"{self.staging_dir}/{relative}", target))
                for relative, target in zip(relatives, targets, strict=True)
            ]
            return _run_all(pool, calls)

    def _copy(self, source: str, target: str) -> None:
        inner = _fsspec_of(self._fs)
        if inner is not None:
            inner.cp_file(source, target)  # one copy request; ``copy_file`` would list both paths first
        else:
            self._fs.copy_file(source, target)

    def _remove_marker(self, marker: str, retrier: Retrier) -> None:
        def remove() -> None:
            if self._fs.get_file_info(marker).type != pafs.FileType.NotFound:
                self._fs.delete_file(marker)

        retrier.call(remove, path=self._display(marker), action="remove")

    def _write_marker(self, marker: str, retrier: Retrier) -> None:
        def put() -> None:
            with self._fs.open_output_stream(marker) as out:
                out.write(b"")

        retrier.call(put, path=self._display(marker), action="write")

    def _step(self, path: str, fn: Callable[[], None]) -> list[tuple[str, BaseException]]:
        try:
            fn()
        except Exception as exc:  # reported with the others by _abort_commit
            return [(self._display(path), exc)]
        return []

    def _abort_commit(self, total: int, placed: list[str], failures: list[tuple[str, BaseException]]) -> None:
        """Remove what this commit placed and the staging folder (best effort), then raise."""
        retrier = Retrier(self._retry_policy)

        def remove(path: str) -> Callable[[], None]:
            def run() -> None:
                def delete() -> None:
                    if self._fs.get_file_info(path).type == pafs.FileType.File:
                        self._fs.delete_file(path)

                retrier.call(delete, path=self._display(path), action="remove")

            return run

        remaining: list[str] = []
        if placed:
            with ThreadPoolExecutor(self._commit_threads(len(placed)), thread_name_prefix="commit") as pool:
                calls = [(self._display(path), remove(path)) for path in dict.fromkeys(placed)]
                remaining = [path for path, _ in _run_all(pool, calls, stop_early=False)]
        with contextlib.suppress(Exception):  # hidden from readers; the commit error below matters more
            self._remove_staging()
        shown = "; ".join(f"{path}: {type(exc).__name__}: {exc}" for path, exc in failures[:3])
        more = f"; and {len(failures) - 3} more" if len(failures) > 3 else ""
        if not placed:
            outcome = "none of its files had been put in place"
        elif remaining:
            listed = ", ".join(remaining[:3]) + (f" and {len(remaining) - 3} more" if len(remaining) > 3 else "")
            outcome = f"{len(remaining)} of its files could not be removed again and remain: {listed}"
        else:
            outcome = "the files it had put in place were removed again"
        msg = (
            f"could not commit write {self._write_id} ({total} files) to {self._display(self._root)}: "
            f"{shown}{more}. No {SUCCESS_MARKER} was written; {outcome}"
        )
        raise CommitError(msg, failures, remaining) from failures[0][1]

    def _split_by_partition(self, table: pa.Table) -> Iterator[tuple[str, pa.Table]]:
        if not self._partition_cols:
            yield "", table
            return
        missing = [c for c in self._partition_cols if c not in table.column_names]
        if missing:
            raise ValueError(f"partition_cols {missing} are not columns of the data: {table.column_names}")
        data_columns = [c for c in table.column_names if c not in self._partition_cols]
        if not data_columns and table.num_rows:
            msg = (f"partition_cols {self._partition_cols} are every column of the data: its files would hold no "
                   "column, and reading them back would give no rows; leave at least one column out of partition_cols")
            raise ValueError(msg)
        # one grouping pass and one gather, then a slice per folder (a filter per partition value
        # was a pass over the block each: 0.38 s for 125,000 rows and 1,000 values, now ~10 ms)
        grouped, keys, offsets = grouped_rows(table.select([*data_columns, *self._partition_cols]), self._partition_cols)
        data = grouped.select(data_columns)
        for i, key in enumerate(keys):
            values = key if len(self._partition_cols) > 1 else (key,)
            folder = "/".join(folder_name(name, value) for name, value in zip(self._partition_cols, values, strict=True))
            yield folder, data.slice(int(offsets[i]), int(offsets[i + 1] - offsets[i]))

    def _upload(self, finished: tuple[str, pa.Buffer | list[pa.Table]], retrier: Retrier, files: list[str],
                ctx: TaskContext) -> int:
        """Stage one file: its bytes, or its tables encoded straight into the staged file (a
        retry encodes them again); returns the bytes written."""
        relative, data = finished
        target = f"{self._task_staging(ctx) if self.resumes else self.staging_dir}/{relative}"
        parent = target.rsplit("/", 1)[0]

        def put() -> int:
            self._fs.create_dir(parent, recursive=True)
            with self._open_output(target) as out:
                if isinstance(data, pa.Buffer):
                    write_in_pieces(out, data)
                else:
                    self._encode_into(data, out)
                return int(out.tell())

        size = retrier.call(put, path=self._display(target), action="write")
        files.append(relative)
        return size

    def _open_output(self, path: str) -> pa.NativeFile:
        """``path`` (a staged file) opened for writing, with ``arrow_open_stream_args``."""
        return self._fs.open_output_stream(path, **self._open_args)

    def _encode(self, tables: list[pa.Table]) -> pa.Buffer:
        """The bytes of one file holding ``tables`` (all with one schema); per format, unless
        it overrides ``_encode_into``."""
        raise NotImplementedError

    def _encode_into(self, tables: list[pa.Table], out: pa.NativeFile) -> None:
        """Write one file holding ``tables`` into ``out``: the bytes of ``_encode``, unless the
        format's writer streams (Parquet, CSV, ORC override this), so that a file is never
        whole in memory (a 512 MiB file held 512 MiB, and up to twice that while its buffer grew)."""
        write_in_pieces(out, self._encode(tables))


def write_in_pieces(out: pa.NativeFile, data: pa.Buffer) -> None:
    """``data`` into ``out`` in writes of at most ``DISK_WRITE_BYTES``: a file on a local disk
    written in bigger pieces is cached in large folios, many times slower to fill on a VM that
    hands free memory back to its host (``engine.object_store.DISK_WRITE_BYTES``; a 300 MiB
    file there: 2.5-2.9 ms per MB in one write, 0.19-0.25 ms in 1 MiB pieces; past the first
    0.5-1 GB of new files 1 MiB pieces cost 4.6-10 ms per MB too, 256 KiB pieces 0.16-0.26). Slices
    are views: nothing is copied; an object store's stream gathers them into its parts."""
    data = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    for offset in range(0, data.size, DISK_WRITE_BYTES):
        out.write(data.slice(offset, min(DISK_WRITE_BYTES, data.size - offset)))


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

    def add(self, table: pa.Table) -> Iterator[tuple[str, list[pa.Table]]]:
        limit = self._sink._max_rows
        # rows counted here, and slices always given their length: pyarrow's slice(offset) of a
        # table without columns (partition_cols naming every column) keeps all its rows, and a
        # loop on what was left never ended
        offset, left = 0, table.num_rows
        while left:
            take = left if limit is None else min(left, limit - self._rows)
            head = table.slice(offset, take)
            offset, left = offset + take, left - take
            self._pending.append(head)
            self._rows += take
            self._bytes += head.nbytes
            if (limit is not None and self._rows >= limit) or self._bytes >= MAX_FILE_BYTES:
                yield self._flush()

    def finish(self) -> Iterator[tuple[str, list[pa.Table]]]:
        if self._rows:
            yield self._flush()

    def _flush(self) -> tuple[str, list[pa.Table]]:
        """The next file's name and its tables (encoded as they are staged)."""
        sink, ctx = self._sink, self._ctx
        # a resumable write names files by input unit, never by attempt: a re-run writes the same names
        task = ctx.unit if sink.resumes and ctx.unit is not None else ctx.task_index
        if sink._filename_provider is not None:
            task_name = sink._filename_provider.get_filename_for_task(sink._write_id, task)
            name = _numbered(str(task_name), sink.EXTENSION, self._sequence, always=sink.NUMBERS_EVERY_FILE)
        elif sink.resumes:
            name = f"{sink._write_id}_{task:06d}_{self._sequence:04d}{sink.EXTENSION}"
        else:
            name = f"{sink._write_id}_{ctx.task_index:06d}_{ctx.attempt}_{self._sequence:04d}{sink.EXTENSION}"
        self._sequence += 1
        tables = self._pending
        self._pending, self._rows, self._bytes = [], 0, 0
        return (f"{self._folder}/{name}" if self._folder else name), tables


def combine(tables: list[pa.Table]) -> pa.Table:
    """One table from ``tables``, promoting types that differ compatibly (null -> int, int32 -> int64)."""
    if len(tables) == 1:
        return tables[0]
    return pa.concat_tables(tables, promote_options="permissive")


def _run_all(
    pool: ThreadPoolExecutor, calls: list[tuple[str, Callable[[], None]]], *, stop_early: bool = True
) -> list[tuple[str, BaseException]]:
    """Run ``calls`` (``(path, fn)``) on ``pool``; the ``(path, error)`` of each that failed.

    With ``stop_early``, calls not started yet are cancelled after the first failure.
    """
    futures: dict[Future[None], str] = {pool.submit(fn): path for path, fn in calls}
    failures: list[tuple[str, BaseException]] = []
    for future in as_completed(futures):
        if future.cancelled():
            continue
        error = future.exception()
        if error is None:
            continue
        if stop_early and not failures:
            for other in futures:
                other.cancel()
        failures.append((futures[future], error))
    return failures


def _fsspec_of(fs: pafs.FileSystem) -> Any:
    if isinstance(fs, pafs.PyFileSystem) and isinstance(fs.handler, pafs.FSSpecHandler):
        return fs.handler.fs
    return None


def _is_object_store(fs: pafs.FileSystem) -> bool:
    """Whether moving a file means copying it (S3, GCS, Azure): then the commit copies in parallel."""
    if isinstance(fs, pafs.SubTreeFileSystem):
        return _is_object_store(fs.base_fs)
    if isinstance(fs, _NATIVE_OBJECT_STORES):
        return True
    inner = _fsspec_of(fs)
    if inner is None:
        return False
    protocols = inner.protocol if isinstance(inner.protocol, tuple | list) else (inner.protocol,)
    return any(protocol in _OBJECT_STORE_PROTOCOLS for protocol in protocols)

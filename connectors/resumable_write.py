"""The manifest of a resumable write (``mode="resume"``): which input units are committed.

A resumable write commits each input unit (one read task's rows, written by one write task)
by itself, on the worker, as soon as its files are staged, and records it in a manifest folder
beside the output, ``<dest>/_resume/`` (hidden from readers: ``_``-prefixed):

* ``job.json``: the job's fingerprint (a hash of its read tasks' inputs, its plan and the
  sink's options), the read parallelism that made its units, their number, and whether the
  job completed;
* ``units/<unit>.intent.json``: the files a unit's task is about to put in place;
* ``units/<unit>.json``: the unit is committed (its files, rows and bytes).

A unit's task stages its files in ``_staging-<job>/<unit>-<attempt>/``, writes its intent,
moves the files into place (names depend only on the job, the unit and the file's number in
it, so a re-run writes the same names), writes its record, then removes the intent and its
staging folder. A run that starts (``ResumeManifest.recover``) removes the files named by the
intents of units that have no record (a driver killed in the middle of a unit's commit) and the
job's staging folder, then skips the units that have a record. Each record and ``job.json`` is
written in one request (a new object on object stores, a rename on file systems), so a record
that exists is whole.

Whatever the moment the driver is killed, running the same write again with ``mode="resume"``
ends with the files an uninterrupted run writes, file for file and row for row, provided the
plan is deterministic per row (the same input rows give the same output rows, in order).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow.fs as pafs

from connectors.retry import Retrier

MANIFEST_DIR = "_resume"
FORMAT_VERSION = 1


class ResumeMismatchError(ValueError):
    """The write's input, plan or options differ from the job its manifest records."""


@dataclass
class ResumeState:
    """What the manifest says about the job being resumed (empty for a new job)."""

    fingerprint: str | None = None
    parallelism: int | None = None
    num_units: int | None = None
    complete: bool = False
    committed: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Unit -> its record (``files``, ``rows``, ``bytes``)."""


def fingerprint(units: Sequence[Any], plan: str, options: dict[str, Any]) -> str:
    """A hash of what decides the output: each read task's inputs and size, the plan, the
    sink's options."""
    described = []
    for task in units:
        meta = getattr(task, "metadata", None)
        described.append([
            list(getattr(meta, "input_files", None) or []),
            getattr(meta, "num_rows", None),
            getattr(meta, "size_bytes", None),
        ])
    text = json.dumps({"units": described, "plan": plan, "options": options}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class ResumeManifest:
    """Reads and writes ``<root>/_resume/`` on ``fs`` (every call retried by ``retrier``)."""

    def __init__(self, fs: pafs.FileSystem, root: str, retrier: Retrier, display: Callable[[str], str]) -> None:
        self._fs = fs
        self._root = root
        self._dir = f"{root}/{MANIFEST_DIR}"
        self._retrier = retrier
        self._display = display

    @property
    def path(self) -> str:
        return self._display(self._dir)

    def load(self) -> ResumeState:
        """The job and its committed units, as the manifest has them (empty if there is none)."""
        job = self._read_json(f"{self._dir}/job.json")
        if job is None:
            return ResumeState()
        if job.get("version") != FORMAT_VERSION:
            raise ResumeMismatchError(f"{self.path}/job.json was written by another version of dataflow "
                                      f"(format {job.get('version')!r}, this one reads {FORMAT_VERSION})")
        state = ResumeState(job["fingerprint"], job["parallelism"], job["units"], bool(job.get("complete")))
        for name in self._unit_files():
            if name.endswith(".json") and not name.endswith(".intent.json"):
                record = self._read_json(f"{self._dir}/units/{name}")
                if record is not None:
                    state.committed[int(record["unit"])] = record
        return state

    def recover(self, staging_dir: str) -> list[str]:
        """Undo what killed runs left half done: the files of units with an intent but no
        record, then the staging folder. Returns the files removed (for the log)."""
        names = set(self._unit_files())
        removed: list[str] = []
        for name in sorted(names):
            if not name.endswith(".intent.json"):
                continue
            unit = name.removesuffix(".intent.json")
            intent_path = f"{self._dir}/units/{name}"
            if f"{unit}.json" not in names:
                intent = self._read_json(intent_path) or {"files": []}
                for relative in intent["files"]:
                    if self._delete_file(f"{self._root}/{relative}"):
                        removed.append(relative)
            self._delete_file(intent_path)
        self._retrier.call(lambda: _delete_dir_if_exists(self._fs, staging_dir), path=self._display(staging_dir),
                           action="remove")
        return removed

    def start_job(self, state: ResumeState, fp: str, parallelism: int, num_units: int) -> None:
        """Record a new job, or check that this run is the job the manifest records."""
        if state.fingerprint is None:
            self._write_json(f"{self._dir}/job.json", {
                "version": FORMAT_VERSION, "fingerprint": fp, "parallelism": parallelism, "units": num_units,
                "complete": False, "started": time.time(),
            })
            state.fingerprint, state.parallelism, state.num_units = fp, parallelism, num_units
            return
        if state.fingerprint != fp:
            raise ResumeMismatchError(
                f"mode='resume': this write is not the job recorded in {self.path} (its input files, their "
                "sizes, the plan or the write options differ; an unseeded shuffle of the input files differs "
                "on every run). Write to a new folder, or remove the folder's contents (mode='overwrite') "
                "to start again"
            )

    def finish_job(self, state: ResumeState) -> None:
        """Mark the job complete: running it again writes nothing."""
        self._write_json(f"{self._dir}/job.json", {
            "version": FORMAT_VERSION, "fingerprint": state.fingerprint, "parallelism": state.parallelism,
            "units": state.num_units, "complete": True, "finished": time.time(),
        })

    # one unit, on a worker -----------------------------------------------------------------
    def commit_unit(self, unit: int, staged: str, files: Sequence[str], rows: int, num_bytes: int,
                    place: Callable[[str, str], None]) -> None:
        """Put a unit's staged files (``staged/<relative>``) in place and record the unit."""
        name = f"{unit:06d}"
        self._write_json(f"{self._dir}/units/{name}.intent.json", {"unit": unit, "files": list(files)})
        for relative in files:
            place(f"{staged}/{relative}", f"{self._root}/{relative}")
        self._write_json(f"{self._dir}/units/{name}.json",
                         {"unit": unit, "files": list(files), "rows": rows, "bytes": num_bytes})
        self._delete_file(f"{self._dir}/units/{name}.intent.json")
        self._retrier.call(lambda: _delete_dir_if_exists(self._fs, staged), path=self._display(staged), action="remove")

    # files ----------------------------------------------------------------------------------
    def _unit_files(self) -> list[str]:
        selector = pafs.FileSelector(f"{self._dir}/units", allow_not_found=True)
        infos = self._retrier.call(lambda: self._fs.get_file_info(selector), path=self.path, action="list")
        return [info.base_name for info in infos if info.type == pafs.FileType.File]

    def _read_json(self, path: str) -> dict[str, Any] | None:
        def read() -> bytes | None:
            try:
                with self._fs.open_input_stream(path) as f:
                    return f.read()
            except FileNotFoundError:
                return None

        data = self._retrier.call(read, path=self._display(path), action="read")
        if data is None:
            return None
        try:
            return json.loads(data)
        except ValueError as err:
            raise ResumeMismatchError(f"{self._display(path)} is not a manifest file ({err}); remove it to resume") from err

    def _write_json(self, path: str, value: dict[str, Any]) -> None:
        """Write ``path`` whole or not at all: a temporary name moved into place on file
        systems (a reader never sees half a record), one PUT on object stores."""
        data = json.dumps(value, sort_keys=True).encode()
        parent = posixpath.dirname(path)
        temporary = f"{parent}/.{posixpath.basename(path)}.{uuid.uuid4().hex[:8]}"

        def write() -> None:
            self._fs.create_dir(parent, recursive=True)
            with self._fs.open_output_stream(temporary) as out:
                out.write(data)
            self._fs.move(temporary, path)

        self._retrier.call(write, path=self._display(path), action="write")

    def _delete_file(self, path: str) -> bool:
        def delete() -> bool:
            try:
                self._fs.delete_file(path)
            except FileNotFoundError:
                return False
            return True

        return bool(self._retrier.call(delete, path=self._display(path), action="remove"))


def _delete_dir_if_exists(fs: pafs.FileSystem, path: str) -> None:
    if fs.get_file_info(path).type != pafs.FileType.NotFound:
        fs.delete_dir(path)

"""The write commit: parallel, exact, ``_SUCCESS`` last, and rolled back when a file fails.

A ``pyarrow.fs.PyFileSystem`` over the local disk records every call of the commit (how many
moves run at once, in which order the marker comes) and fails a chosen file on demand; the S3
tests run the same checks against the local moto server.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from connector_testing import read_all

import dataflow
from connectors.base import TaskContext
from connectors.csv_format import CSVDatasink
from connectors.file_datasink import LOCAL_COMMIT_THREADS, SUCCESS_MARKER, CommitError, WriteResult
from connectors.parquet_format import ParquetDatasink, ParquetDatasource


class RecordingHandler(pafs.FileSystemHandler):
    """The local filesystem, recording the commit's calls and failing ``fail_move``/``fail_write``."""

    def __init__(self, *, delay_s: float = 0.0) -> None:
        self.fs = pafs.LocalFileSystem()
        self.delay_s = delay_s
        self.fail_move: str | None = None
        self.fail_write: str | None = None
        self.on_move: Callable[[int], None] | None = None
        self.events: list[tuple[str, str]] = []
        self.moved: list[str] = []
        self.deleted: list[str] = []
        self.in_flight = 0
        self.started = 0
        self.peak_in_flight = 0
        self.lock = threading.Lock()

    def move(self, src: str, dest: str) -> None:
        with self.lock:
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            count = self.started  # moves started before this one: each count is seen once
            self.started += 1
        try:
            if self.on_move is not None:
                self.on_move(count)
            time.sleep(self.delay_s)
            if self.fail_move is not None and dest.endswith(self.fail_move):
                raise OSError(f"injected failure moving {os.path.basename(dest)}")
            self.fs.move(src, dest)
            with self.lock:
                self.moved.append(dest)
                self.events.append(("moved", dest))
        finally:
            with self.lock:
                self.in_flight -= 1

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        if self.fail_write is not None and path.endswith(self.fail_write):
            raise OSError(f"injected failure writing {os.path.basename(path)}")
        with self.lock:
            self.events.append(("write", path))
        return self.fs.open_output_stream(path, metadata=metadata)

    def delete_file(self, path: str) -> None:
        with self.lock:
            self.deleted.append(path)
        self.fs.delete_file(path)

    # the rest as the local filesystem does it
    def get_type_name(self) -> str:
        return "recording-local"

    def normalize_path(self, path: str) -> str:
        return self.fs.normalize_path(path)

    def equals(self, other: Any) -> bool:
        return self is other

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return self.fs.get_file_info(paths)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return self.fs.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        self.fs.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self.fs.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        raise OSError("not on the real root")

    def copy_file(self, src: str, dest: str) -> None:
        self.fs.copy_file(src, dest)

    def open_input_stream(self, path: str) -> Any:
        return self.fs.open_input_stream(path)

    def open_input_file(self, path: str) -> Any:
        return self.fs.open_input_file(path)

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        return self.fs.open_append_stream(path, metadata=metadata)


def _stage(sink: Any, tasks: int, rows_per_task: int, start: int = 0) -> list[WriteResult]:
    sink.on_write_start()
    return [
        sink.write(iter([pa.table({"id": list(range(first, first + rows_per_task))})]), TaskContext(i))
        for i, first in enumerate(range(start, start + tasks * rows_per_task, rows_per_task))
    ]


def _data_files(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if not n.startswith(("_", ".")))


def test_parallel_commit_is_exact_and_writes_the_marker_last(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    handler = RecordingHandler(delay_s=0.002)
    seen_mid_commit: list[tuple[int, bool]] = []

    def look_as_a_reader(count: int) -> None:  # what a reader sees halfway through the commit
        if count == 100 and not seen_mid_commit:
            seen_mid_commit.append((len(_data_files(dest)), (dest / SUCCESS_MARKER).exists()))

    handler.on_move = look_as_a_reader
    sink = ParquetDatasink(str(dest), max_rows_per_file=5, filesystem=pafs.PyFileSystem(handler))
    results = _stage(sink, tasks=20, rows_per_task=50)
    assert _data_files(dest) == [] and not (dest / SUCCESS_MARKER).exists()  # staged, nothing visible
    sink.on_write_complete(results)

    names = [os.path.basename(f) for f in sink.written_files]
    assert len(names) == len(set(names)) == 200
    assert sorted(os.listdir(dest)) == sorted([SUCCESS_MARKER, *names])  # no staging folder left
    assert sorted(read_all(ParquetDatasource(str(dest)))["id"].to_pylist()) == list(range(1000))
    assert 1 < handler.peak_in_flight <= LOCAL_COMMIT_THREADS
    [(visible, marker_then)] = seen_mid_commit
    assert 0 < visible < 200 and not marker_then
    # the marker is written once, after the last move finished
    assert [kind for kind, path in handler.events if path.endswith(SUCCESS_MARKER)] == ["write"]
    assert handler.events[-1] == ("write", str(dest / SUCCESS_MARKER))
    assert sum(kind == "moved" for kind, _ in handler.events) == 200
    marker_mtime = (dest / SUCCESS_MARKER).stat().st_mtime_ns
    assert (dest / SUCCESS_MARKER).stat().st_size == 0
    assert all((dest / name).stat().st_mtime_ns <= marker_mtime for name in names)


def test_failure_mid_commit_names_the_file_and_removes_what_was_committed(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    earlier = ParquetDatasink(str(dest))  # an earlier job's output in the same folder stays intact
    earlier.on_write_complete(_stage(earlier, tasks=1, rows_per_task=7, start=10_000))
    assert (dest / SUCCESS_MARKER).exists()

    handler = RecordingHandler(delay_s=0.001)
    sink = ParquetDatasink(str(dest), max_rows_per_file=5, filesystem=pafs.PyFileSystem(handler))
    results = _stage(sink, tasks=20, rows_per_task=50)
    failing = [name for result in results for name in result.files][120]
    handler.fail_move = failing
    with pytest.raises(CommitError, match=failing) as info:
        sink.on_write_complete(results)

    error = info.value
    assert isinstance(error, OSError) and "injected failure" in str(error) and SUCCESS_MARKER in str(error)
    assert [os.path.basename(path) for path, _ in error.failures] == [failing]
    assert error.remaining == []
    assert len(handler.moved) > 0  # files had been committed before the failure, and were removed again
    assert set(handler.moved) <= set(handler.deleted)
    assert sorted(os.listdir(dest)) == [os.path.basename(f) for f in earlier.written_files]  # no marker, no staging
    assert sink.written_files == []
    assert sorted(read_all(ParquetDatasource(str(dest)))["id"].to_pylist()) == list(range(10_000, 10_007))


def test_marker_that_cannot_be_written_fails_the_commit(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    handler = RecordingHandler()
    handler.fail_write = SUCCESS_MARKER
    sink = ParquetDatasink(str(dest), max_rows_per_file=10, filesystem=pafs.PyFileSystem(handler))
    results = _stage(sink, tasks=3, rows_per_task=20)
    with pytest.raises(CommitError, match=rf"{dest / SUCCESS_MARKER}.*injected failure writing"):
        sink.on_write_complete(results)
    assert len(handler.moved) == 6
    assert os.listdir(dest) == []


def test_marker_can_be_turned_off(tmp_path: Path) -> None:
    sink = CSVDatasink(str(tmp_path / "csv"), write_success_marker=False)
    sink.on_write_complete(_stage(sink, tasks=2, rows_per_task=3))
    assert sorted(os.listdir(tmp_path / "csv")) == sorted(os.path.basename(f) for f in sink.written_files)
    sink = ParquetDatasink(str(tmp_path / "pq"))
    sink.write_success_marker = False
    sink.on_write_complete(_stage(sink, tasks=1, rows_per_task=3))
    assert not (tmp_path / "pq" / SUCCESS_MARKER).exists()


def test_output_with_the_marker_reads_back(mode: str, tmp_path: Path) -> None:
    ds = dataflow.range(1000, override_num_blocks=4)
    ds.write_parquet(str(tmp_path / "pq"))
    ds.write_csv(str(tmp_path / "csv"))
    ds.write_json(str(tmp_path / "json"))
    for name in ("pq", "csv", "json"):
        assert (tmp_path / name / SUCCESS_MARKER).exists()
    assert sorted(r["id"] for r in dataflow.read_parquet(str(tmp_path / "pq")).take_all()) == list(range(1000))
    assert dataflow.read_csv(str(tmp_path / "csv")).count() == 1000
    assert dataflow.read_json(str(tmp_path / "json")).count() == 1000
    # no extension filter: the marker is still not read as data
    rows = dataflow.read_binary_files(str(tmp_path / "csv"), include_paths=True).take_all()
    assert rows and not any(r["path"].endswith(SUCCESS_MARKER) for r in rows)
    assert len(rows) == len(_data_files(tmp_path / "csv"))
    # a partitioned write puts one marker at the top
    dataflow.from_arrow(pa.table({"id": list(range(30)), "k": [i % 3 for i in range(30)]})).write_parquet(
        str(tmp_path / "p"), partition_cols=["k"]
    )
    assert sorted(os.listdir(tmp_path / "p")) == [SUCCESS_MARKER, "k=0", "k=1", "k=2"]
    assert dataflow.read_parquet(str(tmp_path / "p")).count() == 30


def _s3_sink(path: str, **kwargs: Any) -> tuple[ParquetDatasink, dict[str, int]]:
    """A Parquet sink on a private s3fs instance whose ``cp_file`` counts copies running at once."""
    from connectors.s3_filesystem import make_s3_filesystem

    fs = make_s3_filesystem(skip_instance_cache=True)
    copy = fs.cp_file
    counts = {"in_flight": 0, "peak": 0, "copies": 0}
    lock = threading.Lock()

    def counting_copy(*args: Any, **kw: Any) -> Any:
        with lock:
            counts["in_flight"] += 1
            counts["copies"] += 1
            counts["peak"] = max(counts["peak"], counts["in_flight"])
        try:
            return copy(*args, **kw)
        finally:
            with lock:
                counts["in_flight"] -= 1

    fs.cp_file = counting_copy
    return ParquetDatasink(path, filesystem=fs, **kwargs), counts


@pytest.mark.s3
@pytest.mark.timeout(120)
def test_s3_commit_copies_in_parallel_and_writes_the_marker(s3) -> None:
    sink, counts = _s3_sink("s3://test-bucket/many", max_rows_per_file=2)
    results = _stage(sink, tasks=6, rows_per_task=20)
    assert all("/_staging-" in k for k in s3.keys("many/"))  # staged, nothing visible
    sink.on_write_complete(results)
    keys = s3.keys("many/")
    assert len(keys) == 61 and "many/_SUCCESS" in keys and not any("_staging" in k for k in keys)
    assert counts["copies"] == 60 and counts["peak"] > 1
    assert s3.client.head_object(Bucket="test-bucket", Key="many/_SUCCESS")["ContentLength"] == 0
    assert sorted(read_all(ParquetDatasource("s3://test-bucket/many"))["id"].to_pylist()) == list(range(120))


@pytest.mark.s3
@pytest.mark.s3_faults
@pytest.mark.timeout(120)
def test_s3_copy_failure_names_the_key_and_leaves_nothing(s3) -> None:
    sink, counts = _s3_sink("s3://test-bucket/cfail", max_rows_per_file=2)
    results = _stage(sink, tasks=5, rows_per_task=20)
    failing = [name for result in results for name in result.files][30]
    s3.fault("denied", method="PUT", path=rf"/cfail/{failing}$", times=100)
    with pytest.raises(CommitError, match=rf"s3://test-bucket/cfail/{failing}") as info:
        sink.on_write_complete(results)
    assert isinstance(info.value.__cause__, PermissionError)
    assert s3.hits() == [1]  # access denied is not retried
    assert counts["copies"] > 1
    assert s3.keys("cfail/") == []

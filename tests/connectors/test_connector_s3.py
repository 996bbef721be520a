"""S3 against a real moto server (subprocess), with injected throttling, delays and cut bodies."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from connector_testing import read_all

from connectors import io_stats
from connectors.base import TaskContext
from connectors.csv_format import CSVDatasource
from connectors.errors import AccessDeniedError, PathNotFoundError
from connectors.parquet_format import ParquetDatasink, ParquetDatasource
from connectors.s3_filesystem import make_s3_filesystem

pytestmark = [pytest.mark.s3, pytest.mark.timeout(60)]


def _parquet_bytes(n: int, start: int = 0, row_group_size: int | None = None) -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.table({"id": list(range(start, start + n))}), out, row_group_size=row_group_size)
    return out.getvalue()


def _ids(table: pa.Table) -> list[int]:
    return sorted(table["id"].to_pylist())


def test_read_parquet_folder_with_partitions(s3) -> None:
    for k in range(3):
        s3.put(f"data/k={k}/part.parquet", _parquet_bytes(10, k * 10))
    s3.put("data/_SUCCESS", b"")
    source = ParquetDatasource("s3://test-bucket/data")
    assert source.count_rows() == 30
    out = read_all(source)
    assert _ids(out) == list(range(30))
    assert sorted(set(out["k"].to_pylist())) == ["0", "1", "2"]


def test_write_parquet_then_read_back_and_no_staging_left(s3) -> None:
    sink = ParquetDatasink("s3://test-bucket/out", max_rows_per_file=40)
    sink.on_write_start()
    results = [
        sink.write(iter([pa.table({"id": list(range(i * 50, i * 50 + 50))})]), TaskContext(i))
        for i in range(2)
    ]
    sink.on_write_complete(results)
    keys = s3.keys("out/")
    assert len(keys) == 5 and "out/_SUCCESS" in keys and not any("_staging" in k for k in keys)
    assert _ids(read_all(ParquetDatasource("s3://test-bucket/out"))) == list(range(100))


def test_failed_write_leaves_no_objects(s3) -> None:
    sink = ParquetDatasink("s3://test-bucket/failed")
    sink.on_write_start()
    sink.write(iter([pa.table({"id": [1, 2]})]), TaskContext(0))
    sink.on_write_failed(RuntimeError("another task failed"))
    assert s3.keys("failed/") == []


@pytest.mark.s3_faults
def test_throttled_reads_are_retried_and_exact(s3) -> None:
    for i in range(4):
        s3.put(f"t/f{i}.parquet", _parquet_bytes(25, i * 25, row_group_size=10))
    s3.fault("slowdown", method="GET", path=r"/t/f", times=5)
    before = io_stats.snapshot()
    out = read_all(ParquetDatasource("s3://test-bucket/t"))
    assert _ids(out) == list(range(100))
    after = io_stats.snapshot()
    assert s3.hits() == [5]
    assert after["throttled"] - before["throttled"] == 5 and after["retries"] - before["retries"] == 5


@pytest.mark.s3_faults
def test_listing_is_retried_under_throttling(s3) -> None:
    for i in range(3):
        s3.put(f"l/f{i}.csv", b"id\n%d\n" % i)
    s3.fault("slowdown", method="GET", path=r"^/test-bucket/?$", times=3)
    assert _ids(read_all(CSVDatasource("s3://test-bucket/l"))) == [0, 1, 2]
    assert s3.hits() == [3]


def test_arrow_open_stream_args_on_s3(s3) -> None:
    """A gzip object without ``.gz``, streamed through fsspec with Ray's open-stream arguments."""
    import gzip

    s3.put("gz/a.csv", gzip.compress(b"id\n" + b"".join(b"%d\n" % i for i in range(3000))))
    source = CSVDatasource("s3://test-bucket/gz/a.csv", arrow_open_stream_args={"compression": "gzip", "buffer_size": 4096})
    assert _ids(read_all(source)) == list(range(3000))


@pytest.mark.s3_faults
def test_body_cut_mid_stream_is_retried_and_exact(s3) -> None:
    s3.put("cut/a.csv", b"id\n" + b"".join(b"%d\n" % i for i in range(5000)))
    s3.put("cut/b.parquet", _parquet_bytes(3000, 0, row_group_size=500))
    s3.fault("truncate", method="GET", path=r"/cut/", times=2)
    assert _ids(read_all(CSVDatasource("s3://test-bucket/cut/a.csv"))) == list(range(5000))
    assert _ids(read_all(ParquetDatasource("s3://test-bucket/cut/b.parquet"))) == list(range(3000))
    assert s3.hits() == [2]


@pytest.mark.s3_faults
def test_slow_response_times_out_and_is_retried(s3) -> None:
    s3.put("slow/a.csv", b"id\n1\n2\n")
    fs = make_s3_filesystem(read_timeout=0.5, connect_timeout=0.5)
    s3.fault("delay", method="GET", path=r"/slow/a.csv", times=1, seconds=1.5)
    out = read_all(CSVDatasource("s3://test-bucket/slow/a.csv", filesystem=fs))
    assert _ids(out) == [1, 2]


@pytest.mark.s3_faults
def test_throttled_writes_are_retried(s3) -> None:
    s3.fault("slowdown", method="PUT", path=r"/w/", times=3)
    sink = ParquetDatasink("s3://test-bucket/w")
    sink.on_write_start()
    result = sink.write(iter([pa.table({"id": list(range(10))})]), TaskContext(0))
    sink.on_write_complete([result])
    assert _ids(read_all(ParquetDatasource("s3://test-bucket/w"))) == list(range(10))
    assert s3.hits() == [3]


def test_missing_bucket_and_key_fail_at_once_naming_the_path(s3) -> None:
    with pytest.raises(PathNotFoundError, match=r"s3://no-such-bucket-here/data"):
        ParquetDatasource("s3://no-such-bucket-here/data")
    with pytest.raises(PathNotFoundError, match=r"s3://test-bucket/missing.parquet"):
        ParquetDatasource("s3://test-bucket/missing.parquet")
    with pytest.raises(FileNotFoundError, match=r"s3://test-bucket/empty"):
        s3.put("empty/readme.txt", b"x")
        ParquetDatasource("s3://test-bucket/empty")


@pytest.mark.s3_faults
def test_access_denied_fails_at_once_naming_the_path(s3) -> None:
    s3.put("secret/a.parquet", _parquet_bytes(5))
    source = ParquetDatasource("s3://test-bucket/secret/a.parquet")
    s3.fault("denied", method="GET", path=r"/secret/", times=100)
    before = io_stats.snapshot()["retries"]
    with pytest.raises(AccessDeniedError, match=r"s3://test-bucket/secret/a.parquet") as info:
        read_all(source)
    assert isinstance(info.value, PermissionError)
    assert io_stats.snapshot()["retries"] == before  # no retry storm
    assert s3.hits() == [1]


def test_listing_pages_through_and_streams(s3) -> None:
    from connectors.filesystem import as_pyarrow_filesystem
    from connectors.retry import Retrier
    from connectors.s3_filesystem import iter_s3_objects

    for i in range(45):
        s3.put(f"many/f{i:05d}.csv", b"id\n%d\n" % i)
    s3.put("many/_tmp/skip.csv", b"id\n-1\n")
    fs = as_pyarrow_filesystem(make_s3_filesystem()).handler.fs
    pages = iter_s3_objects(fs, "test-bucket/many", Retrier(), page_size=10)
    first = next(pages)
    assert first == ("test-bucket/many/_tmp/skip.csv", 6)  # raw listing; the FileSet skips it
    assert len([first, *pages]) == 46
    assert _ids(read_all(CSVDatasource("s3://test-bucket/many"), parallelism=8)) == list(range(45))


def test_decoded_size_of_small_parquet_on_s3_is_bounded_from_its_footers(s3) -> None:
    """What lets a small exchange run in the task that reads: the footers (read in parallel)
    bound the decoded bytes; a dictionary-encoded column cannot be bounded, and files larger on
    disk than the limit are not even opened."""
    for k in range(5):
        s3.put(f"plain/part-{k}.parquet", _parquet_bytes(1000, k * 1000))
    bound = ParquetDatasource("s3://test-bucket/plain").decoded_bytes_at_most(1 << 20)
    assert bound is not None and 5 * 1000 * 8 <= bound <= 5 * 1000 * 9  # int64s and their validity bits
    assert ParquetDatasource("s3://test-bucket/plain").decoded_bytes_at_most(1000) is None
    out = io.BytesIO()
    pq.write_table(pa.table({"s": ["same"] * 1000}), out)  # dictionary-encoded by default
    s3.put("dict/part.parquet", out.getvalue())
    assert ParquetDatasource("s3://test-bucket/dict").decoded_bytes_at_most(1 << 20) is None
    guess = ParquetDatasource("s3://test-bucket/dict").decoded_bytes_at_most(1 << 20, guess_dictionaries=True)
    assert guess is not None and 1000 * 8 <= guess < 1000 * 9  # an offset a value, and the encoded bytes


def test_planning_reads_each_footer_once(s3) -> None:
    """A small sort on S3 sizes its input from the footers, then samples the schema for its
    read tasks from the same footers: inside one planning scope each footer is fetched once
    (on the threads that read footers in parallel too); the next scope fetches them afresh."""
    from connectors.base import planning

    for k in range(4):
        s3.put(f"footers/part-{k}.parquet", _parquet_bytes(1000, k * 1000))
    s3.fault("delay", method="GET", path="footers/part-", seconds=0, times=10_000)  # counts the GETs

    def plan() -> None:
        source = ParquetDatasource("s3://test-bucket/footers")
        assert source.decoded_bytes_at_most(1 << 20) is not None
        assert len(list(source.get_read_tasks(4))) >= 1

    ParquetDatasource("s3://test-bucket/footers").decoded_bytes_at_most(1 << 20)
    footers = s3.hits()[0]  # what reading each footer costs, once
    assert footers >= 4
    with planning():
        plan()
    assert s3.hits()[0] == 2 * footers
    with planning():
        plan()
    assert s3.hits()[0] == 3 * footers  # afresh, and again once each
    plan()  # no scope: each step reads its own
    assert s3.hits()[0] == 5 * footers


def test_counted_read_tasks_carry_the_rows_each_task_reads(s3) -> None:
    """What lets a shuffle over S3 files partition in its read tasks: each task's ``num_rows``,
    from the footers (read in parallel, with a throttled request retried), is what it reads;
    a filter makes the rows unknown up front."""
    for k, n in enumerate((700, 0, 1_500, 40, 2_000)):
        s3.put(f"counted/part-{k}.parquet", _parquet_bytes(n, k * 10_000, row_group_size=300))
    s3.fault("slowdown", method="GET", path=r"/counted/part-3", times=1)
    tasks = list(ParquetDatasource("s3://test-bucket/counted").counted_read_tasks(3))
    rows = [sum(t.num_rows for t in task()) for task in tasks]
    assert [task.metadata.num_rows for task in tasks] == rows and sum(rows) == 4_240
    filtered = ParquetDatasource("s3://test-bucket/counted", filter=pc.field("id") > 5)
    assert filtered.counted_read_tasks(3) is None

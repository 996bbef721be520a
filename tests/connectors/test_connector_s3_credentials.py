"""S3 without credentials: a clear error naming the path and the settings, raised at once."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import s3fs
from connector_testing import read_all

import dataflow
from connectors import io_stats
from connectors.csv_format import CSVDatasource
from connectors.errors import AccessDeniedError, MissingCredentialsError
from connectors.filesystem import as_pyarrow_filesystem
from connectors.json_format import JSONDatasource
from connectors.parquet_format import ParquetDatasource
from connectors.retry import Retrier
from connectors.s3_filesystem import S3FileSystem, iter_s3_objects, make_s3_filesystem

pytestmark = [pytest.mark.s3, pytest.mark.timeout(60)]

_CREDENTIAL_SOURCES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
)


def _clear_s3fs_instances() -> None:
    # s3fs reuses a filesystem (and its signed-in client) for the same arguments: start afresh
    S3FileSystem.clear_instance_cache()
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def fresh_s3fs() -> Iterator[None]:
    """No s3fs instance made with credentials is reused here, and none made without leaks out."""
    _clear_s3fs_instances()
    yield
    _clear_s3fs_instances()


def _remove_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No credentials anywhere botocore looks (and no wait on the EC2 metadata service)."""
    for name in _CREDENTIAL_SOURCES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-such-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-such-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    _clear_s3fs_instances()


def _check_message(error: BaseException, path: str) -> None:
    message = str(error)
    assert message.startswith(path + ": "), message
    for setting in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "filesystem=", "AWS_ENDPOINT_URL"):
        assert setting in message, f"{setting} missing from: {message}"
    assert "endpoint_url=" in message and "NoCredentialsError" in message
    assert isinstance(error, AccessDeniedError) and isinstance(error, PermissionError)


def _parquet_bytes() -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.table({"id": [1, 2]}), out)
    return out.getvalue()


def test_listing_without_credentials_names_the_path_and_the_settings(
    s3, fresh_s3fs: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    s3.put("data/a.csv", b"id\n1\n")
    s3.put("data/b.jsonl", b'{"id": 2}\n')
    s3.put("data/c.parquet", _parquet_bytes())
    _remove_credentials(monkeypatch, tmp_path)
    retries = io_stats.snapshot()["retries"]
    started = time.monotonic()
    cases = [
        (CSVDatasource, "s3://test-bucket/data"),
        (CSVDatasource, "s3://test-bucket/data/a.csv"),
        (CSVDatasource, "s3://test-bucket/data/*.csv"),
        (JSONDatasource, "s3://test-bucket/data/b.jsonl"),
        (ParquetDatasource, "s3://test-bucket/data/c.parquet"),
    ]
    for source_cls, path in cases:
        with pytest.raises(MissingCredentialsError) as info:
            source_cls(path)
        _check_message(info.value, path.replace("/*.csv", ""))
    with pytest.raises(MissingCredentialsError, match=r"^s3://test-bucket/data: no credentials"):
        with dataflow.options(execution_mode="local"):
            dataflow.read_csv("s3://test-bucket/data")
    assert io_stats.snapshot()["retries"] == retries  # not taken for a transient error
    assert time.monotonic() - started < 10


def test_paged_listing_without_credentials_names_the_prefix(
    s3, fresh_s3fs: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    s3.put("many/a.csv", b"id\n1\n")
    _remove_credentials(monkeypatch, tmp_path)
    fs = as_pyarrow_filesystem(make_s3_filesystem()).handler.fs
    with pytest.raises(MissingCredentialsError) as info:
        next(iter_s3_objects(fs, "test-bucket/many", Retrier()))
    _check_message(info.value, "s3://test-bucket/many")


def test_reading_without_credentials_names_the_file(
    s3, fresh_s3fs: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    s3.put("r/a.csv", b"id\n1\n2\n")
    s3.put("r/b.parquet", _parquet_bytes())
    sources = [CSVDatasource("s3://test-bucket/r/a.csv"), ParquetDatasource("s3://test-bucket/r/b.parquet")]
    tasks = [list(source.get_read_tasks(1)) for source in sources]  # listed with credentials
    _remove_credentials(monkeypatch, tmp_path)  # the workers have none
    retries = io_stats.snapshot()["retries"]
    for source_tasks, path in zip(tasks, ["s3://test-bucket/r/a.csv", "s3://test-bucket/r/b.parquet"], strict=True):
        with pytest.raises(MissingCredentialsError) as info:
            read_all(_Tasks(source_tasks))
        _check_message(info.value, path)
    assert io_stats.snapshot()["retries"] == retries


class _Tasks:
    """A source whose read tasks were made earlier (``read_all`` pickles them, as for a worker)."""

    def __init__(self, tasks: list) -> None:
        self._tasks = tasks

    def get_read_tasks(self, parallelism: int) -> list:
        return self._tasks

"""S3 through s3fs: the only module that imports s3fs (``filesystem`` imports it on first use).

The client's own retry loops (botocore's and s3fs's) are switched off by default, so that
``connectors.retry`` is the one place that decides: it classifies, backs off with jitter and
lowers the process's request concurrency under throttling. Without this, 20 injected 503s cost
21 s of nested retries before our policy even saw an error.

Endpoint, region and credentials come from the usual AWS environment (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``...), read by botocore itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import s3fs

from connectors.retry import Retrier


class S3FileSystem(s3fs.S3FileSystem):
    """s3fs with one attempt per request: retries belong to ``connectors.retry``."""

    retries = 1


def make_s3_filesystem(
    *,
    connect_timeout: float = 5.0,
    read_timeout: float = 30.0,
    client_retries: bool = False,
    **storage_options: Any,
) -> s3fs.S3FileSystem:
    """An s3fs filesystem; ``storage_options`` go to ``s3fs.S3FileSystem`` (``endpoint_url``, ``key``...).

    With ``client_retries=True`` the plain s3fs class is used, with its own retries on top of ours.
    """
    config = dict(storage_options.pop("config_kwargs", None) or {})
    config.setdefault("connect_timeout", connect_timeout)
    config.setdefault("read_timeout", read_timeout)
    if client_retries:
        return s3fs.S3FileSystem(config_kwargs=config, **storage_options)
    config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
    return S3FileSystem(config_kwargs=config, **storage_options)


def is_s3(fs: Any) -> bool:
    """Whether ``fs`` is an s3fs filesystem (ours or a user's)."""
    return isinstance(fs, s3fs.S3FileSystem)


def iter_s3_objects(
    fs: s3fs.S3FileSystem, prefix: str, retrier: Retrier, *, page_size: int = 1000
) -> Iterator[tuple[str, int]]:
    """``(bucket/key, size)`` of every object under ``bucket/prefix``, one listing page (``page_size`` keys) at a time.

    Keys come in S3's order (lexicographic); folder markers (keys ending in ``/``) are left out.
    """
    bucket, _, key_prefix = prefix.partition("/")
    if key_prefix and not key_prefix.endswith("/"):
        key_prefix += "/"
    token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": key_prefix, "MaxKeys": page_size}
        if token:
            kwargs["ContinuationToken"] = token
        page = retrier.call(
            lambda kw=kwargs: fs.call_s3("list_objects_v2", **kw), path=f"s3://{prefix}", action="list"
        )
        for entry in page.get("Contents", []):
            if not entry["Key"].endswith("/"):
                yield f"{bucket}/{entry['Key']}", int(entry["Size"])
        token = page.get("NextContinuationToken")
        if not page.get("IsTruncated") or not token:
            return

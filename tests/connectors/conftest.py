"""Fixtures for connector tests: fast retries, a helper to run read tasks, and a local S3.

The ``s3`` tier (marker ``s3``) runs against a real moto server in a subprocess on 127.0.0.1
(``s3_server.py``), wrapped in a fault-injecting middleware; it is reset between tests.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connectors.retry import RetryPolicy, set_default_retry_policy

SERVER = Path(__file__).with_name("s3_server.py")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "s3: needs a local S3 (moto server subprocess on 127.0.0.1)")
    config.addinivalue_line("markers", "s3_faults: S3 with injected faults (throttling, delays, cut bodies)")


@pytest.fixture(autouse=True)
def fast_retries() -> Iterator[RetryPolicy]:
    """Retries with millisecond backoff, so fault tests take milliseconds, not seconds."""
    policy = RetryPolicy(max_attempts=6, base_delay_s=0.005, max_delay_s=0.05)
    previous = set_default_retry_policy(policy)
    yield policy
    set_default_retry_policy(previous)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class S3:
    """Handle on the local S3: its endpoint, a boto3 client, and fault rules."""

    def __init__(self, endpoint: str) -> None:
        import boto3

        self.endpoint = endpoint
        self.client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")

    def _post(self, route: str, body: Any = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else b""
        request = urllib.request.Request(self.endpoint + route, data=data, method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read() or b"{}")

    def fault(self, kind: str, *, path: str = ".", method: str = ".", times: int = 1, **extra: Any) -> None:
        """Add a rule: the next ``times`` requests matching ``method``/``path`` get ``kind``."""
        self._post("/__faults__", [{"kind": kind, "path": path, "method": method, "times": times, **extra}])

    def hits(self) -> list[int]:
        """How many requests each rule has hit so far."""
        return list(self._post("/__faults__/log")["hits"])

    def reset(self) -> None:
        """Clear faults and every bucket."""
        self._post("/__faults__/reset")
        self._post("/moto-api/reset")

    def put(self, key: str, data: bytes, bucket: str = "test-bucket") -> None:
        """Upload ``data`` as ``bucket/key``."""
        self.client.put_object(Bucket=bucket, Key=key, Body=data)

    def keys(self, prefix: str = "", bucket: str = "test-bucket") -> list[str]:
        """Every key under ``prefix``."""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(obj["Key"] for page in pages for obj in page.get("Contents", []))


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A moto server subprocess with fault injection; its endpoint URL."""
    pytest.importorskip("moto")
    pytest.importorskip("s3fs")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), str(port)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != "ready":
            pytest.fail(f"local S3 server did not start (exit code {proc.poll()})")
        endpoint = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 10
        while True:
            try:
                urllib.request.urlopen(endpoint + "/moto-api/", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.fixture
def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3]:
    """A clean local S3 with a bucket ``test-bucket``; AWS env vars point every client at it."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    handle = S3(s3_endpoint)
    handle.reset()
    handle.client.create_bucket(Bucket="test-bucket")
    yield handle
    handle.reset()

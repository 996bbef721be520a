"""Test tiers and the leak checks every test runs under.

* ``tests/unit``: no processes, sockets or shared memory;
* ``tests/engine``: real worker processes and shared memory;
* ``tests/e2e``: user-level pipelines, each on both execution modes (``mode`` fixture);
* ``tests/connectors``: readers and writers, local files and a local S3 server.

The local S3 (``s3_endpoint``, ``s3``: moto in server mode, ``tests/connectors/s3_server.py``)
is shared by the connector and end-to-end tests.

After every test: blocks freed (the session folder holds no block files), no process left
behind that is not the live engine's, and no ``/dev/shm/dataflow-*`` folder but the live one.
"""

from __future__ import annotations

import fcntl
import gc
import glob
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

import dataflow
from engine import session as engine_session

NUM_CPUS = 2
S3_SERVER = Path(__file__).parent / "connectors" / "s3_server.py"


def _engine_pids() -> set[int]:
    current = engine_session.current_session()
    if current is None:
        return set()
    fs = current.executor.pool.forkserver
    if fs is None:
        return set()
    try:
        zygote = psutil.Process(fs.proc.pid)
        return {zygote.pid} | {p.pid for p in zygote.children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def _children() -> set[int]:
    """Live descendants, but for a Ray cluster's raylets and what they start: ``tests/ray``'s
    cluster lives for the whole run, and its raylets start and end idle workers when they like,
    during later tests too (the Ray tests check the cluster's own processes themselves)."""
    alive = set()
    ray_workers = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            alive.add(p.pid)
            if p.name() == "raylet":
                ray_workers |= {p.pid} | {c.pid for c in p.children(recursive=True)}
        except psutil.NoSuchProcess:  # it ended between the listing and the look
            pass
    return alive - ray_workers


def _orphaned_shm_dirs() -> set[str]:
    """Session folders whose owner is gone (their lock is free): leaks, not other live sessions."""
    orphaned = set()
    for path in glob.glob("/dev/shm/dataflow-*"):
        try:
            fd = os.open(os.path.join(path, "lock"), os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            orphaned.add(path)
        except BlockingIOError:
            pass
        finally:
            os.close(fd)
    return orphaned


def _block_files() -> list[str]:
    current = engine_session.current_session()
    if current is None:
        return []
    files = glob.glob(os.path.join(current.shm_dir, "*.arrow"))
    files += glob.glob(os.path.join(current.spill_dir, "*.arrow"))
    return files


def _spares_known(stats: dict) -> int:
    return stats["spare_files"] + stats["spare_files_lent"]


def _die_with_test_process() -> None:
    import ctypes
    import signal

    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def _wait_for(predicate, timeout: float = 5.0) -> bool:
    """``predicate()`` became true within ``timeout``. Garbage is collected between tries: a
    failed job's error holds the test's frames in a cycle, which a thread that was still done
    with it (a progress summary) can keep out of the one collection before the wait."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
        gc.collect()
    return predicate()


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Fail the test if it leaves blocks, processes or shared-memory folders behind."""
    before_children = _children()
    before_dirs = _orphaned_shm_dirs()
    # what exists now (imports, earlier tests' survivors) is out of the collector's way: the
    # collect below then only walks this test's objects (a full walk with torch and ray
    # imported takes ~120 ms, which over the suite's 1,300 tests was 2-3 minutes)
    gc.freeze()
    yield
    gc.collect()
    current = engine_session.current_session()
    if current is not None:
        current.executor.sync()
        assert _wait_for(lambda: not _block_files()), f"blocks left in the object store: {_block_files()[:5]}"
        # blocks of at most 64 KiB have no file: the store's count sees them
        assert _wait_for(lambda: current.executor.statistics()["store_used"] == 0), (
            f"blocks left in the object store: {current.executor.statistics()['store_used']} bytes counted"
        )
        # freed files kept to be written over: each one on disk is in the pool or lent to a task
        # still running (none orphaned)
        assert _wait_for(lambda: len(glob.glob(os.path.join(current.shm_dir, "spare-*")))
                         <= _spares_known(current.executor.statistics())), "spare block files outside the pool"
        assert not current.executor._executions or _wait_for(lambda: not current.executor._executions), (
            "an execution is still running after the test"
        )
    assert _wait_for(lambda: not (_children() - before_children - _engine_pids())), (
        f"processes left behind: {[psutil.Process(p).cmdline() for p in _children() - before_children - _engine_pids()]}"
    )
    leaked = _orphaned_shm_dirs() - before_dirs
    assert not leaked, f"shared-memory folders left behind: {leaked}"


@pytest.fixture(scope="session", autouse=True)
def engine_shutdown_at_end() -> Iterator[None]:
    """At the very end, shut down and check the engine removed everything it made."""
    yield
    current = engine_session.current_session()
    shm_dir = current.shm_dir if current else None
    dataflow.shutdown()
    if shm_dir is not None:
        assert not os.path.exists(shm_dir), f"shutdown left {shm_dir}"


@pytest.fixture(params=["local", "streaming"])
def mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the test on the in-process executor and on the multi-process one."""
    with dataflow.options(execution_mode=request.param, num_cpus=NUM_CPUS):
        if request.param == "streaming":
            current = engine_session.current_session()
            if current is None or current.options.resolved_num_cpus() != NUM_CPUS:
                dataflow.shutdown()
                dataflow.init(num_cpus=NUM_CPUS)
        yield request.param


@pytest.fixture
def streaming() -> Iterator[None]:
    """The multi-process engine with NUM_CPUS workers (shared between tests)."""
    with dataflow.options(execution_mode="streaming", num_cpus=NUM_CPUS):
        current = engine_session.current_session()
        if current is None or current.options.resolved_num_cpus() != NUM_CPUS:
            dataflow.shutdown()
            dataflow.init(num_cpus=NUM_CPUS)
        yield


@pytest.fixture
def fresh_engine() -> Iterator[None]:
    """Tests that start their own engine (other options) get a clean slate and leave one."""
    ctx = dataflow.DataContext.get_current()
    saved = (ctx.execution_mode, ctx.execution_options)
    dataflow.shutdown()
    yield
    dataflow.shutdown()
    ctx.execution_mode, ctx.execution_options = saved


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
        [sys.executable, str(S3_SERVER), str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        preexec_fn=_die_with_test_process,  # a killed test run must not leave the server behind
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


@pytest.fixture
def s3_engine(s3: S3, mode: str) -> Iterator[S3]:
    """The local S3, with the engine's workers started after the AWS variables were set."""
    if mode == "streaming":
        dataflow.shutdown()
        dataflow.init(num_cpus=2)
    yield s3
    if mode == "streaming" and engine_session.current_session() is not None:
        dataflow.shutdown()  # workers keep the test's AWS variables; the next test starts fresh ones


@pytest.fixture
def http_folder(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """(a folder, the base URL a real HTTP server on 127.0.0.1 serves it at)."""
    import functools
    import http.server

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield tmp_path, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


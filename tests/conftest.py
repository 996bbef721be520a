"""Test tiers and the leak checks every test runs under.

* ``tests/unit``: no processes, sockets or shared memory;
* ``tests/engine``: real worker processes and shared memory;
* ``tests/e2e``: user-level pipelines, each on both execution modes (``mode`` fixture);
* ``tests/connectors``: readers and writers, local files and a local S3 server.

After every test: blocks freed (the session folder holds no block files), no process left
behind that is not the live engine's, and no ``/dev/shm/dataflow-*`` folder but the live one.
"""

from __future__ import annotations

import fcntl
import gc
import glob
import os
import time
from collections.abc import Iterator

import psutil
import pytest

import dataflow
from engine import session as engine_session

NUM_CPUS = 2


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
    return {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}


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


def _wait_for(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Fail the test if it leaves blocks, processes or shared-memory folders behind."""
    before_children = _children()
    before_dirs = _orphaned_shm_dirs()
    yield
    gc.collect()
    current = engine_session.current_session()
    if current is not None:
        current.executor.sync()
        assert _wait_for(lambda: not _block_files()), f"blocks left in the object store: {_block_files()[:5]}"
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

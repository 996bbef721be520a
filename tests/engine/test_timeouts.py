"""A hung UDF does not hang its job forever, and a long-running task is named in stats()."""

from __future__ import annotations

import threading
import time

import pytest

import dataflow
from dataflow.errors import TaskTimeoutError
from engine import session as engine_session
from engine import stats as engine_stats


@pytest.fixture
def ready(streaming):
    assert engine_session.current_session().executor.wait_for_workers()


def _hangs_on(value: int):
    def udf(batch):
        if value in batch["id"]:
            time.sleep(600)
        return batch

    return udf


def test_a_hung_udf_fails_its_job_after_the_task_timeout(ready):
    ds = dataflow.range(1000, override_num_blocks=10).map_batches(_hangs_on(555))
    start = time.perf_counter()
    with dataflow.options(task_timeout_s=1.0), pytest.raises(TaskTimeoutError, match=r"task_timeout_s=1\.0"):
        ds.take_all()
    assert time.perf_counter() - start < 15
    assert dataflow.range(1000).map_batches(lambda b: b).count() == 1000  # the session goes on


def test_a_long_running_task_is_named_in_stats(ready, monkeypatch):
    monkeypatch.setattr(engine_stats, "LONG_TASK_S", 0.3)

    def slow_once(batch):
        if 500 in batch["id"]:
            time.sleep(2.0)
        return batch

    ds = dataflow.range(1000, override_num_blocks=10).map_batches(slow_once)
    rows: list[int] = []
    thread = threading.Thread(target=lambda: rows.extend(r["id"] for r in ds.take_all()))
    thread.start()
    seen = ""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and "Long-running" not in seen:
        time.sleep(0.1)
        if getattr(ds, "_last_handle", None) is not None:
            seen = ds.stats()
    thread.join(30)
    assert "Long-running: task" in seen and "slow_once" in seen, seen
    assert sorted(rows) == list(range(1000))


def test_a_per_operator_timeout_applies_to_that_operator_only(ready):
    def slowish(batch):
        time.sleep(1.5)
        return batch

    # the first step may take its time; the second one hangs past its own limit
    ds = (
        dataflow.range(100, override_num_blocks=2)
        .map_batches(slowish)
        .map_batches(_hangs_on(55), task_timeout_s=1.0)
    )
    with pytest.raises(TaskTimeoutError, match=r"MapBatches\(udf\)"):
        ds.take_all()
    with pytest.raises(ValueError, match="task_timeout_s"):
        dataflow.range(10).map_batches(lambda b: b, task_timeout_s=0)


def test_a_first_job_with_a_timeout_runs_where_it_can_be_killed(fresh_engine):
    """The cold start runs a new session's first tasks in the driver, where a hung UDF cannot be
    stopped: a task with a timeout waits for a worker instead, so the timeout holds."""
    dataflow.init(num_cpus=2)
    ds = dataflow.range(10).map_batches(_hangs_on(5), task_timeout_s=2.0)
    start = time.perf_counter()
    with pytest.raises(TaskTimeoutError, match=r"task_timeout_s=2\.0"):
        ds.take_all()
    assert time.perf_counter() - start < 20

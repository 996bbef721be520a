"""Short tasks wait in a queue behind each worker's running task, several deep, so a worker starts
the next the moment one ends; nothing queued is lost when the worker dies."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

import dataflow
from engine import session as engine_session
from engine.executor import PIPELINE_MAX_DEPTH

ROWS, BLOCKS = 200_000, 2_000


@pytest.fixture
def engine(fresh_engine):
    dataflow.init(num_cpus=2, min_task_input_bytes=1)
    executor = engine_session.current_session().executor
    assert executor.wait_for_workers()
    return executor


def _identity(batch):
    return batch


def _drain_watching(executor, on_sample: Callable[[object, int], bool]) -> tuple[np.ndarray, int, dataflow.Dataset]:
    """``map_batches(identity)`` over BLOCKS materialized blocks, drained, while a thread reads
    every worker's queue length (tasks sent to it, the running one first) until the job ends or
    ``on_sample(handle, length)`` returns True. The ids read, sorted; the longest queue seen;
    the dataset."""
    source = dataflow.range(ROWS, override_num_blocks=BLOCKS).materialize()
    stop, longest = threading.Event(), [0]

    def watch():
        while not stop.is_set():
            try:
                handles = list(executor.pool.workers.values())
            except RuntimeError:  # (the loop thread changed the dict meanwhile)
                continue
            for handle in handles:
                length = len(handle.tasks)
                longest[0] = max(longest[0], length)
                if on_sample(handle, length):
                    return
            time.sleep(0.0002)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        ds = source.map_batches(_identity)
        ids = [b["id"] for b in ds.iter_batches(batch_size=None, batch_format="numpy")]
    finally:
        stop.set()
        thread.join(timeout=5)
    # what the tasks sent to workers were expected to add to the store is counted back out
    # as they end or their worker dies (summed per worker, with up to 16 tasks on each)
    assert executor.sync()
    assert [h.expected_bytes for h in executor.pool.workers.values() if h.expected_bytes] == []
    assert executor._running_output_bytes() == 0
    return np.sort(np.concatenate(ids)), longest[0], ds


def test_short_tasks_queue_several_deep_and_come_back_exact(engine):
    ids, longest, ds = _drain_watching(engine, lambda handle, length: False)
    assert np.array_equal(ids, np.arange(ROWS))
    assert sum(op.tasks for op in ds._last_handle.stats().operators) >= 0.9 * BLOCKS
    # one running and more than one waiting (the first engine queued one at most)
    assert 3 <= longest <= PIPELINE_MAX_DEPTH + 1, longest


def test_a_worker_killed_with_tasks_queued_loses_none_of_them(engine):
    killed: list[int] = []

    def kill_a_deep_one(handle, length):
        if length >= 4 and handle.pid and not killed:
            killed.append(handle.pid)
            os.kill(handle.pid, signal.SIGKILL)
            return True
        return False

    ids, _, _ = _drain_watching(engine, kill_a_deep_one)
    assert killed, "no worker had four tasks sent to it"
    assert np.array_equal(ids, np.arange(ROWS))  # every row once: none lost, none twice
    assert dataflow.range(1000).map_batches(_identity).count() == 1000  # and the session goes on

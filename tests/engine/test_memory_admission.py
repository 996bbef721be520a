"""Heap-aware admission: when the workers' resident memory passes ``worker_memory_limit``,
each operator runs one task at a time until it falls."""

from __future__ import annotations

import time

import numpy as np
import pytest

import dataflow
from engine import session
from engine.executor import RSS_SAMPLE_S


def _slow(batch):
    start = time.time()
    time.sleep(0.25)
    n = len(batch["id"])
    return {"id": batch["id"], "start": np.full(n, start), "end": np.full(n, time.time())}


def _overlap(spans: list[tuple[float, float]]) -> int:
    """The most spans running at one instant."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running = best = 0
    for _, step in events:
        running += step
        best = max(best, running)
    return best


@pytest.mark.timeout(120)
def test_admission_slows_to_one_task_when_workers_memory_is_high(fresh_engine):
    dataflow.init(num_cpus=2, worker_memory_limit=1, min_task_input_bytes=1)  # any worker is "too big"
    # with the workers up, the first sample that counts them is at most RSS_SAMPLE_S away (one
    # taken while they start counts nothing); before that two tasks may run at once
    assert session.current_session().executor.wait_for_workers()
    ds = dataflow.range(24, override_num_blocks=24).map_batches(_slow)
    rows = ds.take_all()
    spans = sorted({(r["start"], r["end"]) for r in rows})
    settled = [s for s in spans if s[0] > spans[0][0] + 2 * RSS_SAMPLE_S + 0.5]  # after that sample
    assert settled and _overlap(settled) == 1
    stats = session.current_session().executor.statistics()
    assert stats["memory_pressure"] and stats["workers_rss"] > 0
    assert "workers' memory is high" in ds.stats()


@pytest.mark.timeout(120)
def test_no_slowdown_under_the_limit(fresh_engine):
    dataflow.init(num_cpus=2, min_task_input_bytes=1)
    rows = dataflow.range(24, override_num_blocks=24).map_batches(_slow).take_all()
    spans = sorted({(r["start"], r["end"]) for r in rows})
    assert _overlap(spans) == 2
    assert not session.current_session().executor.statistics()["memory_pressure"]


_HOARD: list[np.ndarray] = []


def _leaky(batch):
    _HOARD.append(np.ones(40 << 20, dtype=np.uint8))  # 40 MiB kept in the worker's heap per call
    time.sleep(0.3)
    return {"id": batch["id"]}


@pytest.mark.timeout(120)
def test_a_udf_whose_heap_grows_is_seen(fresh_engine):
    # 16 calls keep 640 MiB in the two workers' heaps; sampled once a second while they run
    dataflow.init(num_cpus=2, worker_memory_limit=250 << 20, min_task_input_bytes=1, inline_cold_start=False)
    ds = dataflow.range(16, override_num_blocks=16).map_batches(_leaky)
    assert ds.count() == 16
    stats = session.current_session().executor.statistics()
    assert stats["workers_rss"] > 250 << 20 and stats["memory_pressure"]
    assert "workers' memory is high" in ds.stats()


def _where(batch):
    import os

    return {"pid": np.full(len(next(iter(batch.values()))), os.getpid())}


def test_a_big_first_task_waits_for_a_worker_instead_of_decoding_in_the_driver(fresh_engine, tmp_path):
    """The cold start runs small tasks in the driver; a task that reads a big file there would
    hold its decoded rows in the driver's heap (a slow consumer's peak memory doubled)."""
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    big, small = tmp_path / "big", tmp_path / "small"
    big.mkdir()
    small.mkdir()
    pq.write_table(pa.table({"x": np.random.default_rng(0).random(3 << 20)}), big / "a.parquet")  # 24 MiB
    pq.write_table(pa.table({"x": np.arange(1000, dtype=np.float64)}), small / "a.parquet")
    dataflow.init(num_cpus=2)  # workers still starting: a small first task runs in the driver
    pids = set(dataflow.read_parquet(str(small)).map_batches(_where).to_numpy("pid").tolist())
    assert pids == {os.getpid()}
    dataflow.shutdown()
    dataflow.init(num_cpus=2)
    pids = set(dataflow.read_parquet(str(big)).map_batches(_where).to_numpy("pid").tolist())
    assert os.getpid() not in pids

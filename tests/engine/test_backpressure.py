"""A slow consumer stops the reads: memory stays within the byte budgets."""

from __future__ import annotations

import time

import numpy as np

import dataflow
from engine import session as engine_session

MiB = 1 << 20


def _big_rows(batch):
    # ~1 MiB per 1000-row batch
    return {"id": batch["id"], "payload": np.ones((len(batch["id"]), 128), dtype=np.float64)}


def test_slow_consumer_bounds_what_is_produced_ahead(fresh_engine):
    dataflow.init(num_cpus=2, op_output_budget=8 * MiB, consumer_buffer_bytes=4 * MiB, min_task_input_bytes=1)
    ds = dataflow.range(200_000, override_num_blocks=200).map_batches(_big_rows)
    it = ds.iter_batches(batch_size=1000, prefetch_batches=1)
    next(it)
    time.sleep(1.0)  # the consumer stalls: the engine must stop, not run ahead
    current = engine_session.current_session()
    store_used = current.executor.statistics()["store_used"]
    assert store_used <= 16 * MiB, f"{store_used / MiB:.1f} MiB produced ahead of a stalled consumer"
    produced = ds._last_handle.stats().operators[-1].rows_out
    assert produced < 50_000, f"{produced} rows produced while the consumer read 1000"
    rows = 1000 + sum(len(b["id"]) for b in it)
    assert rows == 200_000
    stats = ds.stats()
    assert "output budget full" in stats, stats
    peak = ds._last_handle.stats().operators[-1].peak_held_bytes
    assert peak <= 16 * MiB


def test_the_store_usage_count_returns_to_zero_after_limits_slice_blocks(streaming):
    """A limit slices its last block on the driver; that block is counted in and out like any."""
    executor = engine_session.current_session().executor
    for n in (7, 25_001):
        rows = dataflow.range(100_000, override_num_blocks=4).map_batches(lambda b: b).limit(n).take_all()
        assert len(rows) == n
    assert executor.sync()
    assert executor.statistics()["store_used"] == 0

"""Data already in the driver (``from_arrow``, ``from_items``, ``from_pandas``...): held as blocks
by the driver itself, whatever their size, counted and freed like any other block."""

from __future__ import annotations

import gc
import os
import pickle

import numpy as np
import pyarrow as pa
import pytest

import dataflow
from connectors.memory import ArrowDatasource, _TableSlice

MiB = 1 << 20


def test_a_row_bigger_than_a_message_to_a_worker(mode):
    """One 300 MiB row is one block: it failed with "more than the 256 MiB a message to a
    worker may carry", the row being sent to a worker to be stored."""
    ds = dataflow.from_items([{"k": 1, "b": b"x" * (300 * MiB)}])
    assert ds.num_blocks() == 1
    assert ds.map(lambda r: {"k": r["k"], "n": len(r["b"])}).take_all() == [{"k": 1, "n": 300 * MiB}]


def test_a_big_table_is_cut_into_blocks_with_every_row_once(mode):
    n = 24_000_000  # 384 MiB in two columns: failed as above, each block's task pickling it all
    table = pa.table({"id": np.arange(n), "x": np.arange(n, dtype=np.float64)})
    ds = dataflow.from_arrow(table)
    assert ds.num_blocks() > 1
    assert ds.count() == n
    assert ds.sum("id") == n * (n - 1) // 2
    assert ds.take(3) == [{"id": i, "x": float(i)} for i in range(3)]  # in order


def test_a_slice_pickles_as_its_own_rows():
    """A lazily read in-memory source (``from_huggingface``, the Ray runner) sends each read
    task its slice: pickle wrote the whole table's buffers for every slice."""
    table = pa.table({"id": np.arange(1_000_000), "s": [str(i) for i in range(1_000_000)]})
    piece = table.slice(500_000, 10)
    data = pickle.dumps(_TableSlice(piece))
    assert len(data) < 4096, len(data)
    assert pickle.loads(data)()[0].equals(piece)
    slices = ArrowDatasource([table], 7).slices()
    assert len(slices) == 7 and max(map(len, slices)) - min(map(len, slices)) <= 1
    assert pa.concat_tables(slices).equals(table)


def test_blocks_put_by_the_driver_are_counted_and_freed(streaming):
    from engine import session

    executor = session.current_session().executor
    executor.sync()
    before = executor.statistics()["store_used"]
    ds = dataflow.from_arrow(pa.table({"id": np.arange(4_000_000)}))  # 32 MB
    shm_dir = session.current_session().shm_dir
    assert any(name.endswith(".arrow") for name in os.listdir(shm_dir))
    executor.sync()
    assert executor.statistics()["store_used"] - before == 32_000_000
    assert ds.sum("id") == 4_000_000 * 3_999_999 // 2
    del ds
    gc.collect()
    executor.sync()
    assert executor.statistics()["store_used"] == before
    assert not any(name.endswith(".arrow") for name in os.listdir(shm_dir))


def test_what_the_store_cannot_hold_goes_to_disk(fresh_engine):
    from engine import session

    dataflow.init(execution_mode="streaming", num_cpus=2, object_store_memory=32 * MiB)
    n = 12_500_000  # 100 MB
    ds = dataflow.from_arrow(pa.table({"id": np.arange(n)}))
    executor = session.current_session().executor
    executor.sync()
    stats = executor.statistics()
    assert stats["store_used"] <= 32 * MiB < stats["store_used"] + stats["spilled_bytes"], stats
    assert ds.sum("id") == n * (n - 1) // 2
    del ds


def test_from_items_of_nothing_has_no_blocks_and_no_schema(mode):
    ds = dataflow.from_items([])
    assert ds.num_blocks() == 0 and ds.count() == 0 and ds.schema() is None and ds.take_all() == []


def test_after_shutdown_a_dataset_of_the_old_session_says_so(fresh_engine):
    dataflow.init(execution_mode="streaming", num_cpus=2)
    ds = dataflow.from_items([{"a": 1}])
    dataflow.shutdown()
    with pytest.raises(dataflow.DataflowError, match="shutdown"):
        ds.take_all()


def test_a_put_that_fails_part_way_leaves_nothing(mode):
    from engine import runner, session

    def tables():
        yield pa.table({"id": np.arange(100_000)})  # 800 KB: a file in shared memory
        yield pa.table({"id": np.arange(10)})
        raise ValueError("the third table could not be made")

    from engine import local

    ctx = dataflow.DataContext.get_current()
    held = len(local._STORE)
    with pytest.raises(ValueError, match="third table"):
        runner.hold(tables(), ctx.execution_options, ctx.execution_mode)
    assert len(local._STORE) == held  # the in-process mode's blocks
    if mode == "streaming":  # (and the leak check after the test counts the store's bytes)
        assert not any(name.endswith(".arrow") for name in os.listdir(session.current_session().shm_dir))

"""Shapes that used to deadlock: a batch, or a file's minimum rows, bigger than a budget.

Rule: an operator that needs N rows before it can run is always admitted enough to produce
them (spilled past the store's capacity); no batch size, file size or block size stalls a plan.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow.parquet as pq
import pytest

import dataflow

MiB = 1 << 20
ROW_BYTES = 64 << 10  # 64 KiB rows ("decoded images")


def _wide(batch):
    n = len(batch["id"])
    return {"id": batch["id"], "pixels": np.ones((n, ROW_BYTES // 8), dtype=np.float64)}


class Model:
    def __call__(self, batch):
        assert len(batch["id"]) == 512 or batch["id"][-1] == 2047, len(batch["id"])
        return {"id": batch["id"], "score": batch["pixels"].sum(axis=1)}


SMALL = {
    "object_store_memory": 64 * MiB,
    "op_output_budget": 8 * MiB,
    "consumer_buffer_bytes": 4 * MiB,
    "min_task_input_bytes": 1,  # one 2 MiB block per task: no bundle reaches a batch on its own
}


@pytest.fixture(params=["local", "streaming"])
def small_engine(request, fresh_engine):
    dataflow.init(execution_mode=request.param, num_cpus=2, **SMALL)
    yield request.param


@pytest.mark.timeout(90)
def test_a_batch_bigger_than_every_budget_runs(small_engine):
    # 512 rows x 64 KiB = 32 MiB per batch: over the 16 MiB per-operator share of a 64 MiB store
    ds = dataflow.range(2048, override_num_blocks=64).map_batches(_wide).map_batches(Model, batch_size=512, concurrency=1)
    ids = np.concatenate([b["id"] for b in ds.iter_batches(batch_size=None, batch_format="numpy")])
    assert sorted(ids.tolist()) == list(range(2048))


def _counted(batch):
    return {"n": np.array([len(batch["id"])]), "last": batch["id"][-1:]}


@pytest.mark.timeout(90)
def test_a_task_functions_batch_bigger_than_every_budget_runs(small_engine):
    """A function's ``batch_size`` bundles blocks until a task has that many rows (as Ray's):
    512 rows of 64 KiB, after an operator of its own, is over every budget here."""
    ds = dataflow.range(2048, override_num_blocks=64).map_batches(_wide).materialize()
    sizes = [r["n"] for r in ds.map_batches(_counted, batch_size=512).take_all()]
    assert sum(sizes) == 2048 and sum(1 for n in sizes if n != 512) <= 2048 // 512, sizes


@pytest.mark.timeout(90)
def test_a_file_minimum_bigger_than_every_budget_is_written(small_engine, tmp_path):
    ds = dataflow.range(4096, override_num_blocks=64).map_batches(_wide)
    ds.write_parquet(str(tmp_path), min_rows_per_file=1024)  # 64 MiB per file
    files = sorted(p for p in tmp_path.iterdir() if p.suffix == ".parquet")
    rows = [pq.ParquetFile(p).metadata.num_rows for p in files]
    assert sum(rows) == 4096
    assert all(n >= 1024 for n in rows), rows


@pytest.mark.timeout(90)
def test_waits_are_charged_to_the_whole_wait(small_engine):
    ds = dataflow.range(2048, override_num_blocks=64).map_batches(_wide).map_batches(Model, batch_size=512, concurrency=1)
    assert ds.count() == 2048
    stats = ds._last_handle.stats()
    for op in stats.operators:
        assert sum(op.waits.values()) <= stats.wall_s + 0.05, (op.name, op.waits, stats.wall_s)


def _fan_out(batch):
    """Each row becomes 400 rows of 4 KiB: a task's outputs are ~400 times its input."""
    ids = np.repeat(batch["id"], 400)
    return {"id": ids, "pad": np.ones((len(ids), 512), dtype=np.float64)}


def test_a_fan_out_past_every_estimate_stays_within_shared_memory(fresh_engine):
    """Outputs are counted when a task ends: a task that makes hundreds of times what was
    expected of it (flat_map's unknown fan-out) puts only its share of the free room in shared
    memory and the rest on disk (it filled 2.4 GiB of it for a 256 MiB store before)."""
    from engine import session

    dataflow.init(execution_mode="streaming", num_cpus=2, object_store_memory=32 * MiB)
    seen = []
    with dataflow.options(target_max_block_size=4 * MiB):  # a first task is expected to leave a block
        ds = dataflow.range(160, override_num_blocks=2).map_batches(_fan_out)  # 2 tasks of ~125 MiB
        for batch in ds.iter_batches(batch_size=None):
            seen.append(batch["id"])
    assert np.array_equal(np.sort(np.concatenate(seen)), np.repeat(np.arange(160), 400))
    executor = session.current_session().executor
    executor.sync()
    stats = executor.statistics()
    assert stats["spilled_bytes"] > 100 * MiB, stats
    assert stats["store_peak"] <= 32 * MiB + 2 * 4 * MiB, stats  # each task's room, plus a block past it


def _anon_bytes(pids: list[int]) -> int:
    """Anonymous resident memory (heaps; not the mapped blocks) of ``pids``."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as status:
                total += next(int(line.split()[1]) << 10 for line in status if line.startswith("RssAnon:"))
        except (OSError, StopIteration):
            pass
    return total


def _random_bytes(batch):
    rng = np.random.default_rng(int(batch["id"][0]))
    n = len(batch["id"])
    pad = rng.integers(0, 255, (n, 1024), dtype=np.uint8)
    return {"id": batch["id"], "pad": [row.tobytes() for row in pad]}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shuffle", [False, True])
def test_a_repartition_to_one_file_is_written_without_copying_it_whole(fresh_engine, tmp_path, shuffle):
    """``repartition(1).write_parquet`` (one output file): the reduce task hands its input
    blocks to the file one by one and the file is encoded straight to disk, instead of
    concatenating the dataset into one block (a copy in the heap and one in the store) that a
    write task then encoded into a buffer in memory (up to twice its size while it grew)."""
    import threading

    import psutil

    from engine import session

    dataflow.init(execution_mode="streaming", num_cpus=2, object_store_memory=512 * MiB)
    assert session.current_session().executor.wait_for_workers()  # (not the driver's first-task slot)
    data = dataflow.range(96 * 1024, override_num_blocks=16).map_batches(_random_bytes).materialize()  # 96 MiB
    tree = [os.getpid(), *(p.pid for p in psutil.Process().children(recursive=True))]
    before = _anon_bytes(tree)
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _anon_bytes(tree))
            done.wait(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    ds = data.repartition(1, shuffle=shuffle)
    try:
        ds.write_parquet(str(tmp_path))
    finally:
        done.set()
        sampler.join()
    files = sorted(tmp_path.glob("*.parquet"))
    assert len(files) == 1
    written = pq.read_table(files[0])
    ids = written.column("id").to_numpy()
    if shuffle:
        ids = np.sort(ids)
    else:  # the rows in the order of the materialized blocks
        ordered = np.concatenate([b["id"] for b in data.iter_batches(batch_size=None, batch_format="numpy")])
        assert np.array_equal(ids, ordered)
    assert np.array_equal(np.sort(ids), np.arange(96 * 1024))
    assert written.num_rows == 96 * 1024 and len(written.column("pad")[5].as_py()) == 1024
    grew = peak[0] - before
    assert grew < 40 * MiB, f"the workers' heaps grew by {grew / MiB:.0f} MiB writing 96 MiB"
    last = ds._last_stats.operators[-1]
    assert last.name.startswith("Repartition[1") and last.name.endswith("->Write[WriteParquet]"), last.name

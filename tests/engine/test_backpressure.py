"""A slow consumer stops the reads: memory stays within the byte budgets."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

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


def test_small_blocks_travel_in_their_refs_and_count_like_files(streaming):
    """Blocks of at most 64 KiB have no file in the store's folder, big ones do; the store
    counts both while they live and neither once they are freed; the rows come back exact,
    every time the dataset is read."""
    import glob

    from engine.object_store import INLINE_BLOCK_BYTES

    current = engine_session.current_session()
    executor = current.executor
    files = lambda: glob.glob(os.path.join(current.shm_dir, "*.arrow"))  # noqa: E731
    small = dataflow.range(8_000, override_num_blocks=8).materialize()  # 8 KB blocks
    assert max(b.size_bytes for b in small._blocks.refs) <= INLINE_BLOCK_BYTES
    assert files() == []
    assert executor.statistics()["store_used"] == 8_000 * 8
    big = dataflow.range(40_000, override_num_blocks=2).map_batches(_big_rows).materialize()  # ~20 MiB blocks
    assert len(files()) == 2
    assert executor.statistics()["store_used"] == 8_000 * 8 + sum(b.size_bytes for b in big._blocks.refs)
    for _ in range(2):
        assert sorted(small.map_batches(lambda b: {"id": b["id"] * 2}).to_arrow()["id"].to_pylist()) == list(
            range(0, 16_000, 2))
        assert big.sum("id") == sum(range(40_000))
    del small, big
    deadline = time.monotonic() + 5  # (freed by the datasets' finalizers, through the loop)
    while (executor.statistics()["store_used"] or files()) and time.monotonic() < deadline:
        executor.sync()
        time.sleep(0.02)
    assert executor.statistics()["store_used"] == 0 and files() == []


def test_reducers_are_sent_slices_without_the_planners_counts(streaming, monkeypatch):
    """A map output's ref carries 4 bytes per partition for the planner; sent with every slice
    to every reducer that was 84 MB of pickles for ``repartition(1000)`` of 1.5 MB."""
    from engine import serialization
    from engine.object_store import BlockSlice
    from engine.task import TaskSpec

    sent: list[TaskSpec] = []
    dumps_for_worker = serialization.dumps_for_worker

    def spy(obj):
        if isinstance(obj, TaskSpec):
            sent.append(obj)
        return dumps_for_worker(obj)

    monkeypatch.setattr(serialization, "dumps_for_worker", spy)
    with dataflow.options(min_task_input_bytes=1):
        base = dataflow.range(192_000, override_num_blocks=24).materialize()
        out = base.repartition(200, shuffle=True).materialize()
    assert out.num_blocks() == 200
    assert sorted(r["id"] for r in out.take_all()) == list(range(192_000))
    slices = [i for spec in sent for i in spec.inputs if isinstance(i, BlockSlice)]
    assert len(slices) >= 200
    assert all(piece.ref.partitions is None and piece.ref.sample is None for piece in slices)


def _busy(batch):
    x = np.random.default_rng(0).random(100_000)
    for _ in range(3):
        x = np.sqrt(x + 1.0)
    return batch


def test_an_abandoned_but_referenced_iterator_stops_at_its_budget(streaming):
    """A job nobody reads from stops at its budget: it does not keep the workers busy."""
    executor = engine_session.current_session().executor
    assert executor.wait_for_workers()
    ds = dataflow.range(10**8).map_batches(_busy)
    it = iter(ds.iter_batches())
    next(it)  # then nobody reads: ``it`` stays referenced
    time.sleep(1.0)
    tasks = ds._last_handle.stats().operators[-1].tasks
    time.sleep(1.0)
    assert ds._last_handle.stats().operators[-1].tasks == tasks, "the abandoned job kept running"
    start = time.perf_counter()
    assert dataflow.range(1000).map_batches(lambda b: b).count() == 1000
    assert time.perf_counter() - start < 1.0
    cpu = time.process_time()
    time.sleep(0.5)
    assert time.process_time() - cpu < 0.1, "the driver spins while nothing can run"
    del it


def _busy_to_one_row(batch):
    end = time.perf_counter() + 0.02
    while time.perf_counter() < end:
        pass
    return {"n": np.array([len(batch["id"])])}


def test_an_abandoned_iterator_of_tiny_blocks_stops_too(streaming):
    """Blocks of 8 bytes never fill a byte budget: the job ran on, one task at a time, until
    its last block (5,000 tasks of 20 ms here) while nobody read it. It stops once the
    consumer has a few dozen blocks unread, and goes on when they are read."""
    from engine.backpressure import consumer_block_cap

    executor = engine_session.current_session().executor
    assert executor.wait_for_workers()
    with dataflow.options(min_task_input_bytes=1):
        ds = dataflow.range(10**6, override_num_blocks=5000).map_batches(_busy_to_one_row)
        it = iter(ds.iter_batches(batch_size=None))
        next(it)  # (the execution starts here, under these options)
    time.sleep(1.0)
    tasks = ds._last_handle.stats().operators[-1].tasks
    time.sleep(1.0)
    assert ds._last_handle.stats().operators[-1].tasks == tasks, "the abandoned job kept running"
    assert tasks <= consumer_block_cap(2) + 4
    rows = sum(int(next(it)["n"][0]) for _ in range(100))  # read on: it resumes
    assert rows == 100 * 200
    del it


def _sleepy(batch):
    time.sleep(0.05)
    return batch


def test_two_executions_share_the_workers(streaming):
    """A train and an eval iterator running together both progress (free workers are dealt in turn)."""
    executor = engine_session.current_session().executor
    assert executor.wait_for_workers()
    done: dict[str, float] = {}
    with dataflow.options(min_task_input_bytes=1):
        train = dataflow.range(200, override_num_blocks=100).map_batches(_sleepy)
        evaluation = dataflow.range(12, override_num_blocks=6).map_batches(_sleepy)

        def consume(name: str, ds) -> None:
            for _ in ds.iter_batches(batch_size=None):
                pass
            done[name] = time.perf_counter()

        import threading

        start = time.perf_counter()
        first = threading.Thread(target=consume, args=("train", train))
        first.start()
        time.sleep(0.3)  # train has every worker by now
        second = threading.Thread(target=consume, args=("eval", evaluation))
        second.start()
        first.join(60)
        second.join(60)
    assert done["eval"] < done["train"], done
    # 6 tasks of 50 ms with half of 2 workers: ~0.3 s, not the ~2.5 s train takes
    assert done["eval"] - start < 0.3 + 1.5, (done["eval"] - start, done["train"] - start)


def test_outputs_parked_for_order_count_against_the_budget(fresh_engine):
    """preserve_order with a straggler: what finishes behind it is held, counted and bounded."""
    dataflow.init(num_cpus=2, object_store_memory=64 * MiB, consumer_buffer_bytes=4 * MiB, min_task_input_bytes=1)
    executor = engine_session.current_session().executor
    assert executor.wait_for_workers()

    def straggler(batch):
        if batch["id"][0] == 0:
            time.sleep(1.5)
        return {"id": batch["id"], "payload": np.ones((len(batch["id"]), 128), dtype=np.float64)}  # 1 KiB rows

    with dataflow.options(preserve_order=True):
        ds = dataflow.range(200_000, override_num_blocks=200).map_batches(straggler)  # 1 MiB blocks
        it = ds.iter_batches(batch_size=None)
        peak = 0
        import threading

        stop = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not stop.is_set():
                peak = max(peak, executor.statistics()["store_used"])
                time.sleep(0.01)

        sampler = threading.Thread(target=sample)
        sampler.start()
        ids = [b["id"][0] for b in it]
        stop.set()
        sampler.join()
    assert ids == sorted(ids) and len(ids) >= 200
    assert peak <= 16 * MiB, f"{peak / MiB:.1f} MiB held behind one straggler"


def _expand(batch):
    # 8-byte ids become 256 KiB rows: the output is 32,768x the input
    return {"id": batch["id"], "pad": np.ones((len(batch["id"]), 32_768), dtype=np.float64)}


def test_a_udf_whose_output_outgrows_its_input_is_not_bundled_into_one_huge_task(fresh_engine):
    """Small inputs are bundled into ~4 MiB tasks; bundling 16 KB of ids into one task would
    make that one task produce 500 MiB (on a cluster: 2 GiB in one task, 37 s to a first row).
    Until a task has finished each takes one input block; then bundles fit the learned ratio."""
    dataflow.init(num_cpus=2, target_max_block_size=16 * MiB)
    ds = dataflow.range(2000, override_num_blocks=20).map_batches(_expand, num_cpus=0.5)  # not fused with the read
    rows = 0
    for batch in ds.iter_batches(batch_size=None):
        rows += len(batch["id"])
    assert rows == 2000
    expand = next(op for op in ds._last_handle.stats().operators if "_expand" in op.name)
    assert expand.tasks >= 20, f"{expand.tasks} tasks: the ids were bundled into tasks of {500 // expand.tasks} MiB"
    assert expand.peak_held_bytes <= 200 * MiB


def _slow_group(group):
    start = time.time()
    time.sleep(0.3)
    n = len(group["k"])
    return {"k": group["k"], "pad": group["pad"], "pid": np.full(n, os.getpid()),
            "start": np.full(n, start), "end": np.full(n, time.time())}


def test_an_exchanges_reduce_gets_the_store_part_of_the_steps_that_finished(fresh_engine):
    """The store is split between the operators still running tasks. Split between all of them,
    a 64 MiB store left an exchange's reduce (whose inputs were all in, its upstreams done)
    room for one 5 MiB task at a time: one core idle for the whole reduce phase."""
    dataflow.init(num_cpus=2, object_store_memory=64 * MiB)
    ds = dataflow.range(40_000, override_num_blocks=8).map_batches(
        lambda b: {"k": b["id"] % 8, "pad": np.ones((len(b["id"]), 128))}  # 1 KiB rows, 5 MiB a group
    )
    rows = ds.groupby("k").map_groups(_slow_group, batch_format="numpy").select_columns(["k", "pid", "start", "end"]).take_all()
    assert len(rows) == 40_000
    spans = {(r["k"], r["pid"], r["start"], r["end"]) for r in rows}
    assert len(spans) == 8
    overlapping = [(a, b) for a in spans for b in spans if a[1] != b[1] and a[2] < b[3] and b[2] < a[3]]
    assert overlapping, f"the reduce ran its groups one at a time: {sorted(spans, key=lambda s: s[2])}"


def test_the_first_reduce_tasks_run_one_per_cpu_in_a_small_store(fresh_engine):
    """Before a reduce task is back, each is expected to leave its planned input in the store,
    not a whole block (128 MiB by default): with a whole block, a 64 MiB store had room for one,
    and the first reduce task ran alone while the other CPU waited for it."""
    dataflow.init(num_cpus=2, object_store_memory=64 * MiB)
    assert engine_session.current_session().executor.wait_for_workers()
    ds = dataflow.range(40_000, override_num_blocks=8).map_batches(
        lambda b: {"k": b["id"] % 8, "pad": np.ones((len(b["id"]), 128))}  # 1 KiB rows, 5 MiB a group
    )
    rows = ds.groupby("k").map_groups(_slow_group, batch_format="numpy").select_columns(["k", "pid", "start", "end"]).take_all()
    spans = sorted({(r["start"], r["end"], r["pid"]) for r in rows})
    _, first_end, first_pid = spans[0]
    alongside = [s for s in spans if s[2] != first_pid and s[0] < first_end]
    assert alongside, f"the first reduce task ran alone: {spans}"


def _slow_after_the_first(batch):
    time.sleep(0.01 if batch["id"][0] == 0 else 60)
    return batch


def test_a_cancelled_jobs_long_task_gives_its_worker_back(streaming):
    """Breaking out of a loop cancels the job; a task of it that runs on past the grace period
    has its worker replaced, so the next job does not wait for output nobody wants."""
    from engine.executor import CANCELLED_TASK_GRACE_S

    executor = engine_session.current_session().executor
    assert executor.wait_for_workers()
    ds = dataflow.range(4, override_num_blocks=4).map_batches(_slow_after_the_first, batch_size=1)
    for _ in ds.iter_batches(batch_size=1):
        break
    start = time.perf_counter()
    assert dataflow.range(1000).map_batches(lambda b: b).count() == 1000
    assert time.perf_counter() - start < CANCELLED_TASK_GRACE_S + 5.0


def _timed_slow_row(row):
    start = time.monotonic()
    time.sleep(0.3)
    return {**row, "pid": os.getpid(), "start": start, "end": time.monotonic()}


def _overlap(rows):
    return [(a["pid"], b["pid"]) for a in rows for b in rows
            if a["pid"] != b["pid"] and a["start"] < b["end"] and b["start"] < a["end"]]


def test_a_few_slow_rows_of_an_in_memory_source_run_on_every_worker(streaming):
    """``from_items`` of a few work items (prompts, paths) and ``range`` of a few ids make a
    block per row (Ray's layout: 2 per CPU at least), and the first wave of a slow function
    fills every worker: the rows ran one after another in one task before."""
    executor = engine_session.current_session().executor
    assert executor.wait_for_workers()
    for ds in (dataflow.from_items([{"id": i} for i in range(4)]), dataflow.range(4)):
        rows = ds.map(_timed_slow_row).take_all()
        assert sorted(r["id"] for r in rows) == [0, 1, 2, 3]
        assert _overlap(rows), f"the slow rows ran one at a time: {rows}"


def _slow_row(row):
    time.sleep(0.02)
    return {**row, "pid": os.getpid()}


def test_a_slow_functions_small_blocks_are_not_bundled_onto_one_worker(streaming):
    """Small blocks are bundled by bytes once a task's output is known; a slow function's
    tasks stop at about ``TASK_TARGET_S`` of work instead, so the blocks left after the first
    wave are shared by the workers rather than queued as one task on one of them."""
    executor = engine_session.current_session().executor
    assert executor.wait_for_workers()
    rows = dataflow.from_items([{"id": i} for i in range(60)]).map(_slow_row).take_all()
    assert sorted(r["id"] for r in rows) == list(range(60))
    per_pid: dict[int, int] = {}
    for r in rows:
        per_pid[r["pid"]] = per_pid.get(r["pid"], 0) + 1
    assert len(per_pid) == 2 and min(per_pid.values()) >= 15, per_pid


def _stamped(batch):
    # ~4 MiB per 512-row block, made in 20 ms (a Parquet read), and when it was made
    time.sleep(0.02)
    n = len(batch["id"])
    return {"id": batch["id"], "made": np.full(n, time.time()), "payload": np.ones((n, 1024), dtype=np.float64)}


class _Stamp:
    def __init__(self) -> None:
        self.up = time.time()

    def __call__(self, batch):
        return {"id": batch["id"], "made": batch["made"], "up": np.full(len(batch["id"]), self.up)}


def test_reads_go_on_while_the_actor_pool_they_feed_starts(fresh_engine):
    """A script that imported torch: the zygote imports it too before it forks the first actor
    (about a second). Meanwhile the task operator feeding the pool is not held to two waves of
    blocks: it reads ahead within its share of the store (the CPUs would idle), then waits
    for the pool like any operator. Exact rows either way."""
    pytest.importorskip("torch")
    dataflow.init(num_cpus=2, op_output_budget=4 * MiB)
    assert engine_session.current_session().executor.wait_for_workers(30)
    ds = dataflow.range(24 * 512, override_num_blocks=24).map_batches(_stamped).map_batches(
        _Stamp, concurrency=1, batch_size=512)
    rows = ds.take_all()
    assert sorted(r["id"] for r in rows) == list(range(24 * 512))
    up = rows[0]["up"]
    made_before = sum(1 for r in rows if r["made"] < up) // 512
    # two waves of two tasks would be 4-6 blocks; all 24 (96 MiB) fit the share of the store
    assert made_before >= 20, f"only {made_before} of 24 blocks were read while the pool started:\n{ds.stats()}"

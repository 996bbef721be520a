"""Worker deaths: detected at once, the task retried elsewhere, results exact."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

import dataflow
from dataflow.errors import WorkerDiedError
from engine import session as engine_session


@pytest.fixture(autouse=True)
def workers_ready(streaming):
    """Until the first worker is ready tasks run in the driver (cold start): wait for them."""
    assert engine_session.current_session().executor.wait_for_workers()


def _kill_once(marker: str):
    driver = os.getpid()  # captured by value: the closure travels to the worker

    def udf(batch):
        if batch["id"][0] == 5000 and os.getpid() != driver and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return {"id": batch["id"], "pid": np.full(len(batch["id"]), os.getpid())}

    return udf


def test_sigkill_mid_task_is_retried_with_exact_results(tmp_path, streaming):
    marker = str(tmp_path / "killed")
    ds = dataflow.range(20_000, override_num_blocks=20).map_batches(_kill_once(marker))
    start = time.perf_counter()
    rows = ds.take_all()
    elapsed = time.perf_counter() - start
    assert os.path.exists(marker), "the worker was never killed"
    assert sorted(r["id"] for r in rows) == list(range(20_000))
    assert elapsed < 10, f"recovery took {elapsed:.1f}s"
    assert "retried 1 tasks" in ds.stats()


def test_a_repartition_task_killed_while_it_writes_its_file_is_retried(tmp_path, streaming):
    """The reduce tasks of ``repartition(n)`` write their files themselves: one killed while it
    names its file runs again, and the destination holds each row once, in n files."""
    import pyarrow.parquet as pq

    from dataflow.datasource import FilenameProvider

    marker = str(tmp_path / "killed")
    driver = os.getpid()

    class KillOnce(FilenameProvider):
        def get_filename_for_task(self, write_uuid: str, task_index: int) -> str:
            if os.getpid() != driver and not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
            return f"{write_uuid}_{task_index:06d}.parquet"

    ds = dataflow.range(20_000, override_num_blocks=8).repartition(2)
    ds.write_parquet(str(tmp_path / "out"), filename_provider=KillOnce())
    assert os.path.exists(marker), "the worker was never killed"
    assert ds._last_stats.operators[-1].name == "Repartition[2]->Write[WriteParquet]"
    files = sorted((tmp_path / "out").glob("*.parquet"))
    assert len(files) == 2
    ids = sorted(i for f in files for i in pq.read_table(f).column("id").to_pylist())
    assert ids == list(range(20_000))
    assert not list((tmp_path / "out").glob("_staging*"))


def test_sigkill_of_an_actor_is_replaced(tmp_path, streaming):
    marker = str(tmp_path / "killed")
    driver = os.getpid()

    class Model:
        def __init__(self):
            self.pid = os.getpid()

        def __call__(self, batch):
            if batch["id"][0] == 300 and os.getpid() != driver and not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
            return {"id": batch["id"]}

    rows = dataflow.range(1000, override_num_blocks=10).map_batches(Model, concurrency=2, batch_size=100).take_all()
    assert os.path.exists(marker)
    assert sorted(r["id"] for r in rows) == list(range(1000))


def _always_die():
    driver = os.getpid()

    def udf(batch):
        if batch["id"][0] == 0:
            if os.getpid() == driver:
                raise RuntimeError("ran in the driver")
            os.kill(os.getpid(), signal.SIGKILL)
        return batch

    return udf


def test_a_task_that_always_kills_its_worker_fails_after_three_attempts(streaming):
    with pytest.raises(WorkerDiedError, match="failed 3 times") as info:
        dataflow.range(100, override_num_blocks=4).map_batches(_always_die()).take_all()
    assert "was killed by SIGKILL" in str(info.value)  # the error itself says how, not only the log
    # the engine is still usable afterwards
    assert dataflow.range(10).map(lambda r: r).count() == 10


def test_a_worker_killed_like_the_oom_killer_does_is_reported_as_such(streaming):
    """SIGKILL of a big worker: the error and stats() say signal, memory and operator."""
    driver = os.getpid()

    def hog(batch):
        if os.getpid() != driver:
            ballast = np.ones(200 << 17, dtype=np.float64)  # 200 MiB, resident
            time.sleep(1.5)  # long enough for the driver to sample it
            ballast += 1
            os.kill(os.getpid(), signal.SIGKILL)
        return batch

    ds = dataflow.range(10, override_num_blocks=1).map_batches(hog)
    with dataflow.options(max_task_attempts=2), pytest.raises(WorkerDiedError, match=r"RSS\) was") as info:
        ds.take_all()
    assert "killed by SIGKILL (the kernel's OOM killer" in str(info.value), info.value
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and "SIGKILL" not in ds.stats():
        time.sleep(0.05)
    text = ds.stats()
    assert "was killed by SIGKILL" in text and "OOM killer" in text and "hog" in text, text
    assert "MiB when last sampled" in text or "GiB when last sampled" in text, text


def _kill_late(marker: str, first_id: int):
    driver = os.getpid()

    def udf(batch):
        if batch["id"][0] == first_id and os.getpid() != driver and not os.path.exists(marker):
            time.sleep(0.5)  # the blocks after this one finish first and wait for it
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return batch

    return udf


def test_a_worker_death_under_preserve_order_keeps_the_order(tmp_path, streaming, caplog):
    """Outputs that finished after a lost task's keep waiting for its retry: they used to be
    let go at the death (as for an unordered job) and the retried block came out last."""
    ctx = dataflow.DataContext.get_current()
    saved = ctx.execution_options.preserve_order
    ctx.execution_options.preserve_order = True
    try:
        ds = dataflow.range(20_000, override_num_blocks=20).map_batches(_kill_late(str(tmp_path / "killed"), 5000))
        ids = [row["id"] for row in ds.take_all()]
    finally:
        ctx.execution_options.preserve_order = saved
    assert os.path.exists(tmp_path / "killed")
    assert ids == list(range(20_000))
    assert "no task has" not in caplog.text


def test_read_tasks_killed_while_they_partition_a_shuffle_are_retried_at_their_positions(
        tmp_path, streaming, monkeypatch):
    """A shuffle over Parquet partitions in its read tasks, each told where its rows start. The
    workers killed while they read and partition: the retried tasks keep their positions, so the
    seeded permutation is the one an undisturbed run gives."""
    import threading

    import pyarrow as pa
    import pyarrow.parquet as pq

    from engine.operators.exchange import PositionedReadPartitionOperator

    folder = tmp_path / "in"
    folder.mkdir()
    rng = np.random.default_rng(2)
    for i in range(12):
        rows = 20_000
        pq.write_table(pa.table({"id": np.arange(i * rows, (i + 1) * rows), "x": rng.random(rows),
                                 "s": pa.array([f"payload-{j:08d}" * 8 for j in range(rows)])}),
                       folder / f"part-{i:02}.parquet", row_group_size=5_000)

    def shuffled():
        ds = dataflow.read_parquet(str(folder)).random_shuffle(seed=3).select_columns(["id"])
        return [r["id"] for r in ds.take_all()], ds

    with dataflow.options(small_exchange_bytes=0):
        want, _ = shuffled()
        pool = engine_session.current_session().executor.pool
        killed: list[int] = []
        original = PositionedReadPartitionOperator.next_task

        def next_task(self):
            pending = original(self)
            if pending.spec.task_index == 3 and not killed:
                def kill() -> None:
                    for handle in pool.live():
                        if handle.pid is not None:
                            killed.append(handle.pid)
                            os.kill(handle.pid, signal.SIGKILL)
                threading.Timer(0.005, kill).start()
            return pending

        monkeypatch.setattr(PositionedReadPartitionOperator, "next_task", next_task)
        got, ds = shuffled()
    assert killed, "no worker was killed"
    assert got == want and sorted(got) == list(range(12 * 20_000))
    assert "ReadParquet->RandomShuffleMap" in ds.stats() and "retried" in ds.stats(), ds.stats()

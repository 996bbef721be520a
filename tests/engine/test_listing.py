"""A slow listing (a source's read-task generator) runs on its own thread, not the executor's."""

from __future__ import annotations

import functools
import threading

import pyarrow as pa
import pytest

import dataflow
from dataflow import BlockMetadata, Datasource, ReadTask


def _numbers(start: int) -> list[pa.Table]:
    return [pa.table({"n": list(range(start, start + 10))})]


class GatedListing(Datasource):
    """Lists one read task, then waits for ``gate`` (a listing stuck on a slow S3 page)."""

    def __init__(self, gate: threading.Event) -> None:
        self.gate = gate

    def get_read_tasks(self, parallelism: int):
        meta = BlockMetadata(num_rows=10, size_bytes=80)
        yield ReadTask(functools.partial(_numbers, 0), meta)
        assert self.gate.wait(60), "the test never opened the gate"
        yield ReadTask(functools.partial(_numbers, 10), meta)


def test_other_work_goes_on_while_a_listing_waits(streaming):
    gate = threading.Event()
    slow = dataflow.read_datasource(GatedListing(gate))
    got: list[int] = []
    reader = threading.Thread(target=lambda: got.extend(r["n"] for r in slow.iter_rows()), daemon=True)
    reader.start()
    try:
        # the executor is free: another job runs to the end while the listing is stuck
        assert dataflow.range(1000).map_batches(lambda b: b).count() == 1000
        assert not got or sorted(got) == list(range(10))
    finally:
        gate.set()
    reader.join(60)
    assert sorted(got) == list(range(20))


class FailingListing(Datasource):
    def get_read_tasks(self, parallelism: int):
        meta = BlockMetadata(num_rows=10, size_bytes=80)
        yield ReadTask(functools.partial(_numbers, 0), meta)
        raise PermissionError("listing s3://bucket/private/: access denied")


def test_a_listing_that_fails_on_its_thread_fails_the_dataset_with_its_error(mode):
    with pytest.raises(PermissionError, match="access denied"):
        dataflow.read_datasource(FailingListing()).take_all()


def test_read_tasks_are_bundled_the_same_however_fast_the_listing_thread_is(streaming):
    """Small read tasks are bundled to the task size whether or not the listing thread has
    caught up when the operator looks (a partial bundle goes only at the end of the listing)."""
    import re

    counts = set()
    for _ in range(3):
        ds = dataflow.range(2_000_000).map_batches(lambda b: b)
        assert ds.count() == 2_000_000
        counts.add(re.findall(r"(\d+) tasks", ds.stats())[0])
    assert len(counts) == 1, counts


def test_a_read_task_a_worker_cannot_unpickle_fails_the_dataset_and_not_the_worker(streaming):
    """Its inputs are unpickled by the worker after it sets the driver's sys.path; one that still
    cannot be (a module that exists only in the driver) is that task's error, with its type."""
    import sys
    import types

    from engine import session as engine_session

    ghost = types.ModuleType("ghost_source_module")
    exec("def rows():\n    return []\n", ghost.__dict__)
    sys.modules["ghost_source_module"] = ghost
    try:
        executor = engine_session.current_session().executor
        assert executor.wait_for_workers()
        workers = executor.statistics()["workers"]

        class GhostSource(Datasource):
            def get_read_tasks(self, parallelism: int):
                return [ReadTask(ghost.rows, BlockMetadata(num_rows=0, size_bytes=1))]

        with pytest.raises(ModuleNotFoundError, match="ghost_source_module"):
            dataflow.read_datasource(GhostSource()).take_all()
        assert executor.statistics()["workers"] == workers  # none died for it
    finally:
        del sys.modules["ghost_source_module"]

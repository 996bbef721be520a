"""Async UDFs: a callable class whose ``__call__`` is ``async def`` (a coroutine or an async
generator), or an ``async def`` function, as Ray's ``map_batches`` takes them."""

from __future__ import annotations

import asyncio

import pytest

import dataflow


class _AsyncDouble:
    def __init__(self) -> None:
        self.loop = None

    async def __call__(self, batch):
        loop = asyncio.get_running_loop()
        assert self.loop in (None, loop)  # one loop per worker thread: a client made at a first call stays usable
        self.loop = loop
        await asyncio.sleep(0)
        return {"id": batch["id"] * 2}


class _AsyncPieces:
    async def __call__(self, batch):
        for i in range(2):
            yield {"id": batch["id"] + 100 * i}


async def _async_fails(batch):
    raise KeyError("from the coroutine")


def test_async_udfs_run_to_their_results_as_in_ray(mode):
    """dataflow took the coroutine for a bad return value (UDFOutputError)."""
    assert sorted(r["id"] for r in dataflow.range(6).map_batches(_AsyncDouble, concurrency=1, batch_size=2).take_all()) == [
        0, 2, 4, 6, 8, 10]
    assert sorted(r["id"] for r in dataflow.range(3).map_batches(_AsyncPieces, concurrency=1).take_all()) == [
        0, 1, 2, 100, 101, 102]
    with pytest.raises(KeyError, match="from the coroutine"):
        dataflow.range(3).map_batches(_async_fails).take_all()


class _Slow:
    async def __call__(self, batch):
        await asyncio.sleep(0.2)  # a model server's or an API's latency
        return {"id": batch["id"]}


class _FailsOnThird:
    def __init__(self) -> None:
        self.started = 0

    async def __call__(self, batch):
        self.started += 1
        if batch["id"][0] == 2:
            raise ValueError("the third batch")
        await asyncio.sleep(0.05)
        return batch


def test_a_tasks_async_batches_overlap_and_keep_their_order(mode):
    """Ray awaits up to 4 batches of an async batch UDF at once: 8 batches of 0.2 s of latency
    in one task take about 0.4 s, not 1.6 s; the outputs keep the batches' order."""
    import time

    with dataflow.options(preserve_order=True):
        ds = dataflow.range(8, override_num_blocks=1).map_batches(_Slow, concurrency=1, batch_size=1)
        ds.take_all()  # the actor starts
        started = time.perf_counter()
        ids = [r["id"] for r in ds.take_all()]
        took = time.perf_counter() - started
    assert ids == list(range(8))
    assert took < 1.2, took
    with pytest.raises(ValueError, match="the third batch"):
        dataflow.range(8, override_num_blocks=1).map_batches(_FailsOnThird, concurrency=1, batch_size=1).take_all()


async def _plus_one(row):
    await asyncio.sleep(0)
    return {"id": row["id"] + 1}


async def _twice(row):
    for i in range(2):
        yield {"id": row["id"] * 10 + i}


async def _even(row):
    return row["id"] % 2 == 0


def test_async_row_functions(mode):
    """``map``, ``flat_map`` and ``filter`` take async functions too (Ray's row UDFs): a
    coroutine's value is the row, an async generator's outputs the rows."""
    assert sorted(r["id"] for r in dataflow.range(3).map(_plus_one).take_all()) == [1, 2, 3]
    assert sorted(r["id"] for r in dataflow.range(3).flat_map(_twice).take_all()) == [0, 1, 10, 11, 20, 21]
    assert sorted(r["id"] for r in dataflow.range(5).filter(_even).take_all()) == [0, 2, 4]


class _SlowRows:
    def __init__(self) -> None:
        self.running = 0
        self.most = 0

    async def __call__(self, row):
        self.running += 1
        self.most = max(self.most, self.running)
        await asyncio.sleep(0.1 if row["id"] % 2 else 0.2)  # later rows finish first
        self.running -= 1
        return {"id": row["id"], "most": self.most}


async def _pieces_later(row):
    await asyncio.sleep(0.05)
    return [{"id": row["id"]}, {"id": -row["id"]}]


async def _keep_odd_later(row):
    await asyncio.sleep(0.05)
    return row["id"] % 2 == 1


async def _raises_on_five(row):
    await asyncio.sleep(0.01)
    if row["id"] == 5:
        raise KeyError("row five")
    return row


def test_async_row_functions_overlap_16_calls_and_keep_the_rows_order(mode):
    """Ray awaits up to 16 calls of an async row function at once in a task; they ran one at a
    time here (32 rows of 0.1-0.2 s of latency: ~4.8 s, now ~0.4 s), in the rows' order."""
    import time

    with dataflow.options(preserve_order=True):
        ds = dataflow.range(32, override_num_blocks=1).map(_SlowRows, concurrency=1)
        ds.take_all()  # the actor starts
        started = time.perf_counter()
        rows = ds.take_all()
        took = time.perf_counter() - started
        assert [r["id"] for r in rows] == list(range(32))
        assert max(r["most"] for r in rows) == 16
        assert took < 2.0, took
        one = dataflow.range(8, override_num_blocks=1)
        assert [r["id"] for r in one.flat_map(_pieces_later).take_all()] == [v for i in range(8) for v in (i, -i)]
        assert [r["id"] for r in one.filter(_keep_odd_later).take_all()] == [1, 3, 5, 7]
    with pytest.raises(KeyError, match="row five"):
        dataflow.range(8, override_num_blocks=1).map(_raises_on_five).take_all()

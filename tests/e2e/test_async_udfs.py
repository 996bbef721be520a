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

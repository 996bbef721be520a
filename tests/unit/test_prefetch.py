"""The adaptive prefetch of ``iter_batches``: items in order whichever thread makes them, the
prefetch thread working only while the consumer is slow, errors and early stops."""

from __future__ import annotations

import threading
import time

import pytest

from dataflow.iterator import prefetch


def source(n: int, made_by: list[str], delay_s: float = 0.0, fail_at: int | None = None):
    try:
        for i in range(n):
            if delay_s:
                time.sleep(delay_s)
            if i == fail_at:
                raise KeyError(f"item {i}")
            made_by.append(threading.current_thread().name)
            yield i
    finally:
        made_by.append("closed")


def test_a_fast_consumer_makes_its_own_items():
    made_by: list[str] = []
    out = list(prefetch(source(2000, made_by), 1, adaptive=True))
    assert out == list(range(2000))
    assert made_by[-1] == "closed"
    by_thread = made_by.count("dataflow-prefetch")
    # (a pause of the consumer, a collection or the machine's, lets the thread make a few)
    assert by_thread < 200, f"the prefetch thread made {by_thread} of 2000 items for a consumer that never waits"


def test_a_slow_consumer_gets_items_made_ahead():
    made_by: list[str] = []
    out = []
    for item in prefetch(source(40, made_by, delay_s=0.002), 2, adaptive=True):
        time.sleep(0.004)  # a training step: the next items are made meanwhile
        out.append(item)
    assert out == list(range(40))
    assert made_by.count("dataflow-prefetch") >= 30


def test_order_holds_when_the_consumer_changes_pace():
    made_by: list[str] = []
    out = []
    for item in prefetch(source(600, made_by, delay_s=0.0001), 3, adaptive=True):
        if (item // 50) % 2:
            time.sleep(0.002)
        out.append(item)
    assert out == list(range(600))
    assert {"dataflow-prefetch", threading.current_thread().name} <= set(made_by)


@pytest.mark.parametrize("slow", [False, True])
def test_an_error_reaches_the_consumer_as_itself(slow):
    made_by: list[str] = []
    got = []
    with pytest.raises(KeyError, match="item 30"):
        for item in prefetch(source(100, made_by, fail_at=30), 1, adaptive=True):
            if slow:
                time.sleep(0.002)
            got.append(item)
    assert got == list(range(30))
    assert made_by[-1] == "closed"


def test_an_early_stop_closes_the_source_and_the_thread():
    made_by: list[str] = []
    before = set(threading.enumerate())
    items = prefetch(source(10_000, made_by, delay_s=0.0005), 2, adaptive=True)
    for item in items:
        if item == 20:
            break
        time.sleep(0.002)
    items.close()
    assert made_by[-1] == "closed"
    assert not set(threading.enumerate()) - before  # the close waited for the thread


def test_a_failure_of_the_prefetch_thread_itself_reaches_the_consumer(monkeypatch):
    """Not only the source's errors: the thread's own end the items with an error, not early."""
    from dataflow import iterator

    def broken(self):
        raise MemoryError("the prefetch thread could not go on")

    monkeypatch.setattr(iterator._SharedSource, "_run_ahead", broken)
    made_by: list[str] = []
    with pytest.raises(MemoryError, match="could not go on"):
        for _item in prefetch(source(100, made_by, delay_s=0.001), 1, adaptive=True):
            time.sleep(0.002)

"""Scheduling and backpressure decisions are pure functions: tested with plain data."""

from __future__ import annotations

from engine.backpressure import WAIT_BUDGET, WAIT_CONCURRENCY, OpLoad, blocked_reason
from engine.scheduler import Candidate, pick

MiB = 1 << 20


def test_an_idle_operator_may_always_start_one_task():
    assert blocked_reason(OpLoad(held_bytes=0, in_flight=0, expected_output_bytes=10 * MiB, budget=1)) is None


def test_budget_counts_held_and_expected_output():
    load = OpLoad(held_bytes=60 * MiB, in_flight=1, expected_output_bytes=20 * MiB, budget=100 * MiB)
    assert blocked_reason(load) is None  # 60 + 2 * 20 = 100
    load = OpLoad(held_bytes=61 * MiB, in_flight=1, expected_output_bytes=20 * MiB, budget=100 * MiB)
    assert blocked_reason(load) == WAIT_BUDGET


def test_a_slow_consumer_stops_the_producer():
    # nothing in flight, but its output is still held downstream: no new task
    load = OpLoad(held_bytes=200 * MiB, in_flight=0, expected_output_bytes=MiB, budget=100 * MiB)
    assert blocked_reason(load) == WAIT_BUDGET


def test_concurrency_cap():
    load = OpLoad(held_bytes=0, in_flight=2, expected_output_bytes=1, budget=10**12, max_concurrency=2)
    assert blocked_reason(load) == WAIT_CONCURRENCY


def test_downstream_first_then_fewest_in_flight():
    cands = [Candidate("read", 0, 0, 0), Candidate("map", 1, 10, 1), Candidate("write", 2, 0, 3)]
    assert pick(cands) == 2
    cands = [Candidate("a", 1, 0, 2), Candidate("b", 1, 0, 1)]
    assert pick(cands) == 1
    assert pick([]) is None

"""Scheduling and backpressure decisions are pure functions: tested with plain data."""

from __future__ import annotations

import itertools

import numpy as np

from engine.backpressure import WAIT_BUDGET, WAIT_CONCURRENCY, OpLoad, blocked_reason
from engine.operators.exchange import reduce_ranges
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


def test_a_new_actor_pool_starts_at_what_its_resources_allow():
    from engine.autoscale import PoolState, target_size

    assert target_size(PoolState(1, 8, 0, 0, 0, False, affordable=4), new=True) == 4
    assert target_size(PoolState(1, 2, 0, 0, 0, False, affordable=4), new=True) == 2
    assert target_size(PoolState(3, 8, 0, 0, 0, False, affordable=1), new=True) == 3  # the minimum first


def test_an_actor_pool_grows_by_one_only_when_every_actor_is_busy_and_work_waits():
    from engine.autoscale import PoolState, target_size

    assert target_size(PoolState(1, 4, 2, 0, 2, True, 8), new=False) == 3
    assert target_size(PoolState(1, 4, 2, 1, 1, True, 8), new=False) == 1  # one is still starting
    assert target_size(PoolState(1, 4, 2, 0, 1, True, 8), new=False) == 1  # an actor is free
    assert target_size(PoolState(1, 4, 2, 0, 2, False, 8), new=False) == 1  # nothing waits
    assert target_size(PoolState(1, 4, 4, 0, 4, True, 8), new=False) == 4  # at its maximum


def test_idle_actors_retire_oldest_first_down_to_the_minimum():
    from engine.autoscale import to_retire

    now = 100.0
    idle = [90.0, None, 80.0, 99.0, 85.0]  # None: busy
    assert to_retire(idle, min_size=1, idle_timeout_s=5.0, now=now) == [2, 4, 0]
    assert to_retire(idle, min_size=3, idle_timeout_s=5.0, now=now) == [2, 4]
    assert to_retire(idle, min_size=5, idle_timeout_s=5.0, now=now) == []
    assert to_retire(idle, min_size=0, idle_timeout_s=50.0, now=now) == []


def test_a_dead_worker_is_described_by_how_it_ended():
    from engine.worker_pool import describe_exit

    oom = describe_exit("w3", 42, "MapBatches(f)", -9, 3 << 30)
    assert "was killed by SIGKILL" in oom and "OOM killer" in oom and "3.00 GiB" in oom and "MapBatches(f)" in oom
    assert "exited with code 1" in describe_exit("w3", 42, None, 1, 0)
    assert "SIGSEGV" in describe_exit("w3", 42, None, -11, 0)
    assert "unknown" in describe_exit("w3", 42, None, None, 0)


def test_budgets_scale_with_block_size_and_stay_within_the_store_share():
    from engine.backpressure import op_budget

    MiB_ = 1 << 20
    store = 8 << 30
    # two waves of two tasks of 256 MiB blocks, far above the 192 MiB floor
    assert op_budget(store, 2, 2, 256 * MiB_, 192 * MiB_) == 4 * 256 * MiB_
    # the operator feeding the consumer: one wave and the block the consumer reads
    assert op_budget(store, 2, 2, 256 * MiB_, 128 * MiB_, feeds_consumer=True) == 3 * 256 * MiB_
    # small blocks: the floor
    assert op_budget(store, 2, 2, 1 * MiB_, 192 * MiB_) == 192 * MiB_
    # never more than the operator's share of half the store, even for huge blocks
    assert op_budget(store, 2, 64, 256 * MiB_, 192 * MiB_) == store // 4
    # a tiny store: the floor itself is capped by the share
    assert op_budget(64 * MiB_, 2, 2, 1 * MiB_, 192 * MiB_) == 16 * MiB_
    # before any task has finished: one wave of whole-block guesses, every slot busy...
    assert op_budget(store, 1, 2, 128 * MiB_, 128 * MiB_, feeds_consumer=True, first_wave=True) == 2 * 128 * MiB_
    # ...as far as the share holds them (64 slots of 128 MiB guesses on an 8 GiB store: 32)
    assert op_budget(store, 1, 64, 128 * MiB_, 192 * MiB_, first_wave=True) == store // 2
    # while the actor pool it feeds starts: the whole share (reads fill the idle CPUs), first
    # wave or not
    assert op_budget(store, 2, 2, 1 * MiB_, 192 * MiB_, pool_starting=True) == store // 4
    assert op_budget(store, 2, 2, 128 * MiB_, 192 * MiB_, first_wave=True, pool_starting=True) == store // 4


def test_a_tasks_output_is_capped_to_fit_its_operators_share_of_a_small_store():
    from engine.backpressure import MIN_TASK_OUTPUT, task_output_cap

    MiB_ = 1 << 20
    # a big store: the block target (target_max_block_size) is the cap
    assert task_output_cap(8 << 30, 2, 2, 128 * MiB_) == 128 * MiB_
    # 32 MiB, three operators of two slots: two waves of each one's tasks fit its share
    cap = task_output_cap(32 * MiB_, 3, 2, 128 * MiB_)
    assert cap * 2 * 2 * 3 <= 16 * MiB_ and cap >= MIN_TASK_OUTPUT
    # never below the floor, never above the target
    assert task_output_cap(4 * MiB_, 8, 16, 128 * MiB_) == MIN_TASK_OUTPUT
    assert task_output_cap(4 * MiB_, 8, 16, 1000) == 1000


def test_a_starved_downstream_admits_over_budget_and_a_backlogged_one_admits_one_task():
    from engine.backpressure import WAIT_BUDGET, OpLoad, blocked_reason

    over = OpLoad(held_bytes=300, in_flight=1, expected_output_bytes=100, budget=200)
    assert blocked_reason(over) == WAIT_BUDGET
    assert blocked_reason(OpLoad(300, 1, 100, 200, downstream_starved=True)) is None
    assert blocked_reason(OpLoad(0, 1, 1, 10**9, backlogged=True)) == WAIT_BUDGET
    assert blocked_reason(OpLoad(0, 0, 1, 10**9, backlogged=True)) is None


def test_execution_resources_copy_as_ray():
    from engine.options import ExecutionResources

    limits = ExecutionResources(cpu=4, object_store_memory=1e9)
    assert limits.copy(cpu=2) == ExecutionResources(cpu=2, object_store_memory=1e9)
    assert limits.copy() == limits and limits.copy(gpu=1).gpu == 1


def test_reduce_ranges_fill_the_last_wave_of_every_cpu():
    parts = np.full(256, 1.0)
    # 4.2 targets' worth of bytes: 6 equal ranges on 2 CPUs (not 4 full ones and a sliver)
    ranges = reduce_ranges(parts, None, target=61, cpus=2)
    assert len(ranges) == 6 and ranges[0][0] == 0 and ranges[-1][1] == 256
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    assert max(hi - lo for lo, hi in ranges) - min(hi - lo for lo, hi in ranges) <= 1
    assert len(reduce_ranges(parts, None, target=64, cpus=2)) == 4
    assert len(reduce_ranges(parts, None, target=64, cpus=3)) == 6
    assert reduce_ranges(parts, None, target=10_000, cpus=4) == [(0, 64), (64, 128), (128, 192), (192, 256)]
    assert len(reduce_ranges(np.full(3, 1.0), None, target=1, cpus=8)) == 3  # no more ranges than partitions
    assert reduce_ranges(np.zeros(256), None, target=1, cpus=2) == [(0, 256)]  # nothing arrived: one range
    # a fixed number is kept exactly, empty ranges included (repartition(n) makes n blocks)
    assert len(reduce_ranges(parts, 5, target=1, cpus=2)) == 5
    assert len(reduce_ranges(np.full(3, 1.0), 5, target=1, cpus=2)) == 5
    # 4 targets' worth in 10 partitions: 4 equal ranges would hold 30 bytes against a target of
    # 25, so one more wave: 6 ranges of at most 20 (not 5 of 20, cut greedily, on 2 CPUs)
    ranges = reduce_ranges(np.full(10, 10.0), None, target=25, cpus=2)
    assert len(ranges) == 6 and max(10 * (hi - lo) for lo, hi in ranges) == 20
    # partitions too coarse for equal ranges under the target: cut at the target as they come
    coarse = np.zeros(256)
    coarse[np.arange(8) * 31] = 5.0  # 8 groups of 5 bytes, target 8: one each, never two
    assert [coarse[lo:hi].sum() for lo, hi in reduce_ranges(coarse, None, target=8, cpus=2)] == [5.0] * 8
    # skewed bytes: ranges split the bytes, not the partitions, evenly
    skewed = np.concatenate([np.full(128, 10.0), np.full(128, 1.0)])
    ranges = reduce_ranges(skewed, None, target=710, cpus=2)
    sizes = [skewed[lo:hi].sum() for lo, hi in ranges]
    assert len(ranges) == 2 and max(sizes) / min(sizes) < 1.1


def test_a_worker_queue_holds_a_few_milliseconds_of_short_tasks():
    from engine.executor import PIPELINE_MAX_DEPTH, PIPELINE_QUEUE_S, pipeline_depth

    assert pipeline_depth(PIPELINE_QUEUE_S / 4, 0.0, 0.0) == 4  # by time
    assert pipeline_depth(1e-5, 0.0, 0.0) == PIPELINE_MAX_DEPTH  # at most this many
    assert pipeline_depth(0.0, 0.0, 0.0) == PIPELINE_MAX_DEPTH  # tasks too short to time
    assert pipeline_depth(0.019, 0.0, 0.0) == 1  # one may always wait
    # and no more than the queue's share of the store (queued tasks count as running)
    assert pipeline_depth(1e-4, 8 * MiB, 24 * MiB) == 3
    assert pipeline_depth(1e-4, 64 * MiB, 16 * MiB) == 1

"""``Dataset.mix``: weighted interleaving of datasets, as Ray Data 2.60's (names, defaults,
errors), deterministic where Ray's depends on timing."""

from __future__ import annotations

import time

import pytest

import dataflow
from dataflow import MixStoppingCondition

OFFSET = 1_000_000


def _inputs(rows_a: int, rows_b: int, block_rows: int = 100):
    """Two materialized datasets of ``block_rows``-row blocks; b's ids start at OFFSET."""
    with dataflow.options(min_task_input_bytes=1):  # a block per read task, not bundled
        a = dataflow.range(rows_a, override_num_blocks=rows_a // block_rows).materialize()
        b = dataflow.range(rows_b, override_num_blocks=rows_b // block_rows).map_batches(
            lambda t: {"id": t["id"] + OFFSET}).materialize()
    assert {a.num_blocks(), b.num_blocks()} == {rows_a // block_rows, rows_b // block_rows}
    return a, b


def _expected_sources(blocks: list[list[int]], weights: list[float], stop_on_shortest: bool) -> list[int]:
    """Which input each output block comes from, worked out by hand from Ray's rule: the input
    furthest behind ``weight * rows so far`` (ties to the larger weight, then the first)."""
    total_weight = sum(weights)
    shares = [w / total_weight for w in weights]
    taken = [0] * len(blocks)
    rows = [0] * len(blocks)
    out = []
    while True:
        live = [i for i in range(len(blocks)) if taken[i] < len(blocks[i])]
        if not live or (stop_on_shortest and len(live) < len(blocks)):
            return out
        total = sum(rows)
        best = max(live, key=lambda i: (shares[i] * total - rows[i], shares[i], -i))
        rows[best] += blocks[best][taken[best]]
        taken[best] += 1
        out.append(best)


def _sources(ds) -> list[int]:
    sources = []
    for block in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
        ids = block.column("id").to_pylist()
        assert len({i >= OFFSET for i in ids}) == 1, "an output block mixes rows of two inputs"
        sources.append(int(ids[0] >= OFFSET))
    return sources


def test_rays_example(mode):
    ds1 = dataflow.from_items([{"x": 1}, {"x": 2}, {"x": 3}, {"x": 4}]).repartition(2)
    ds2 = dataflow.from_items([{"x": 5}, {"x": 6}, {"x": 7}, {"x": 8}]).repartition(2)
    batches = list(ds1.mix(ds2, weights=[0.5, 0.5]).iter_batches(batch_size=4))
    assert [b["x"].tolist() for b in batches] == [[1, 2, 5, 6], [3, 4, 7, 8]]


def test_blocks_follow_the_weights_and_every_row_comes_once(mode):
    a, b = _inputs(3000, 1000)
    mixed = a.mix(b, weights=[3, 1])
    assert _sources(mixed) == _expected_sources([[100] * 30, [100] * 10], [3, 1], False)
    ids = sorted(r["id"] for r in mixed.take_all())
    assert ids == list(range(3000)) + list(range(OFFSET, OFFSET + 1000))
    assert mixed.count() == 4000  # from the inputs' metadata: every row comes once
    # three inputs, default (equal) weights, blocks of different sizes
    c = dataflow.range(600, override_num_blocks=3).map_batches(lambda t: {"id": t["id"] + 2 * OFFSET}).materialize()
    three = a.mix(b, c)
    got = [int(r["id"] // OFFSET) for r in three.take_all()]
    assert sorted(got) == [0] * 3000 + [1] * 1000 + [2] * 600
    rows = [0, 0, 0]
    for i, source in enumerate(got):  # while all three last, none falls a block behind its third
        rows[source] += 1
        if i < 1800:
            assert max(rows) - min(rows) <= 200, (i, rows)


def test_stop_on_shortest_ends_with_the_first_input_to_run_out(mode):
    a, b = _inputs(3000, 1000)
    mixed = a.mix(b, weights=[1, 1], stopping_condition=MixStoppingCondition.STOP_ON_SHORTEST)
    expected = _expected_sources([[100] * 30, [100] * 10], [1, 1], True)
    assert expected.count(1) == 10 and expected.count(0) == 10
    assert _sources(mixed) == expected
    assert mixed.count() == len(mixed.take_all()) == 2000
    # the value names the condition too, as Ray's enum values
    assert a.mix(b, stopping_condition="stop_on_shortest").count() == 2000


def test_where_it_stops_does_not_depend_on_timing(mode):
    """Ray's operator emits on while it does not know an empty input has ended; here a slow
    input (its blocks arrive late, its end later still) gives the same answer every time."""
    def slow(batch):
        time.sleep(0.01)
        return {"id": batch["id"] + OFFSET}

    a = dataflow.range(2000, override_num_blocks=20)
    b = dataflow.range(300, override_num_blocks=3).map_batches(slow, batch_size=100)
    mixed = a.mix(b, weights=[3, 1], stopping_condition=MixStoppingCondition.STOP_ON_SHORTEST)
    counts = {mixed.count() for _ in range(3)} | {len(mixed.take_all()) for _ in range(2)}
    assert len(counts) == 1, counts


def test_an_input_far_ahead_waits_at_its_budget(mode):
    """Blocks of a fast input parked for a slow one count against the fast one's budget: it
    pauses, rather than read all of itself into memory."""
    def big(batch):
        import numpy as np

        return {"id": batch["id"], "pad": np.zeros((len(batch["id"]), 1 << 16), dtype=np.uint8)}

    def slow(batch):
        time.sleep(0.05)
        return {"id": batch["id"] + OFFSET, "pad": batch["pad"]}

    with dataflow.options(min_task_input_bytes=1, op_output_budget=16 << 20):
        fast = dataflow.range(4000, override_num_blocks=200).map_batches(big)  # 200 blocks of 1.25 MiB
        slow_ds = dataflow.range(400, override_num_blocks=20).map_batches(big).map_batches(slow)
        mixed = fast.mix(slow_ds, weights=[1, 1], stopping_condition=MixStoppingCondition.STOP_ON_SHORTEST)
        assert mixed.count() == 800
    assert mixed._last_stats is not None
    peaks = {op.name: op.peak_held_bytes for op in mixed._last_stats.operators}
    fast_peak = max(peak for name, peak in peaks.items() if "big" in name and "slow" not in name)
    assert fast_peak <= 24 << 20, peaks  # its budget and a block or two in flight, never its 250 MiB


def test_mix_errors_name_the_argument():
    a = dataflow.range(10)
    with pytest.raises(ValueError, match=r"Number of datasets \(2\) must match number of weights \(3\)"):
        a.mix(a, weights=[1, 2, 3])
    with pytest.raises(ValueError, match="Weights must be positive"):
        a.mix(a, weights=[1, 0])
    with pytest.raises(ValueError, match="Weights must be positive"):
        a.mix(a, weights=[1, float("nan")])
    with pytest.raises(TypeError, match="weights must be numbers"):
        a.mix(a, weights=[1, "2"])
    with pytest.raises(ValueError, match="stopping_condition must be a MixStoppingCondition"):
        a.mix(a, stopping_condition="first")
    assert "Mix[0.25, 0.75]" in a.mix(a, weights=[1, 3]).explain()


def _uneven(batch):
    """Keeps a different share of each block, after a random pause: blocks of uneven sizes
    that finish in a different order each run."""
    import random

    time.sleep(random.random() * 0.02)
    first = int(batch["id"][0])
    keep = batch["id"] % (first // 100 % 5 + 1) == 0
    return {"id": batch["id"][keep]}


def test_stop_on_shortest_counts_the_same_when_blocks_finish_in_any_order(mode):
    a = dataflow.range(3000, override_num_blocks=30).map_batches(_uneven, batch_size=None)
    b = dataflow.range(1000, override_num_blocks=10).map_batches(_uneven, batch_size=None).map_batches(
        lambda t: {"id": t["id"] + OFFSET})
    with dataflow.options(min_task_input_bytes=1):
        mixed = a.mix(b, weights=[2, 1], stopping_condition=MixStoppingCondition.STOP_ON_SHORTEST)
        counts = [mixed.count() for _ in range(3)] + [len(mixed.take_all()) for _ in range(2)]
    assert len(set(counts)) == 1, counts

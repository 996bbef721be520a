"""The map side of a groupby: per-group partial states, or per-row states when a block's keys
are mostly distinct. Both must give the reduce side the same columns, types and answers."""

from __future__ import annotations

import math
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest

from dataflow.aggregate import (
    AbsMax,
    AggregateReducer,
    Count,
    Max,
    Mean,
    Min,
    MissingValuePercentage,
    PartialAggPartitioner,
    Std,
    Sum,
    ZeroPercentage,
    combine_states,
    mostly_distinct,
    partial_states,
    row_states,
    sort_by_keys,
)
from dataflow.shuffle import key_hashes

AGGS = [
    Count(), Count("v", ignore_nulls=True), Sum("v"), Sum("v", ignore_nulls=False), Min("v"), Max("v"),
    AbsMax("v"), Mean("v"), Mean("v", ignore_nulls=False), Std("v"), Std("v", ddof=0), MissingValuePercentage("v"),
    ZeroPercentage("v"), ZeroPercentage("v", ignore_nulls=False), Sum("i"), Min("i"), Mean("i"), Std("i"), Sum("b"), Mean("b"), Min("s"), Max("s"),
    Sum("f32"), Max("f32"), Sum("d"), Min("d"), Count("s", ignore_nulls=True),
]


def _table(n: int, keys: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    k = rng.integers(0, keys, n)
    v = rng.integers(-3, 4, n).astype(np.float64)
    v[rng.random(n) < 0.05] = np.nan
    null = rng.random(n) < 0.1
    return pa.table({
        "k": pa.array(k, mask=rng.random(n) < 0.02),
        "v": pa.array(v, mask=null),
        "i": pa.array(rng.integers(-5, 5, n).astype(np.int32), mask=rng.random(n) < 0.1),
        "b": pa.array(rng.random(n) < 0.5, mask=rng.random(n) < 0.1),
        "s": pa.array([f"s{x}" for x in rng.integers(0, 50, n)], mask=rng.random(n) < 0.1),
        "f32": pa.array(rng.random(n).astype(np.float32)),
        "d": pa.array([Decimal(int(x)) / 100 for x in rng.integers(0, 10_000, n)], type=pa.decimal128(10, 2)),
    })


def _same(a: pa.Table, b: pa.Table) -> None:
    assert a.schema == b.schema
    assert a.num_rows == b.num_rows
    for name in a.column_names:
        for x, y in zip(a.column(name).to_pylist(), b.column(name).to_pylist(), strict=True):
            if isinstance(x, float) and isinstance(y, float):
                assert (math.isnan(x) and math.isnan(y)) or x == pytest.approx(y, rel=1e-12, abs=1e-12), name
            else:
                assert x == y, name


@pytest.mark.parametrize("keys", [3, 500, 100_000])
def test_row_states_are_partial_states_of_groups_of_one_row(keys):
    t = _table(3000, keys)
    rows, grouped = row_states(t, ["k"], AGGS), partial_states(t, ["k"], AGGS)
    assert rows.schema == grouped.schema and rows.num_rows == t.num_rows
    expected = sort_by_keys(combine_states(grouped, ["k"], AGGS), ["k"])
    _same(sort_by_keys(combine_states(rows, ["k"], AGGS), ["k"]), expected)
    # blocks of one kind and of the other, merged by one reducer
    mixed = pa.concat_tables([row_states(t.slice(0, 1000), ["k"], AGGS), partial_states(t.slice(1000), ["k"], AGGS)])
    _same(sort_by_keys(combine_states(mixed, ["k"], AGGS), ["k"]), expected)


def test_row_states_of_several_keys_and_of_an_empty_block():
    t = _table(500, 20).append_column("k2", pa.array(np.arange(500) % 3))
    aggs = [Count(), Sum("v"), Std("i")]
    expected = sort_by_keys(combine_states(partial_states(t, ["k", "k2"], aggs), ["k", "k2"], aggs), ["k", "k2"])
    _same(sort_by_keys(combine_states(row_states(t, ["k", "k2"], aggs), ["k", "k2"], aggs), ["k", "k2"]), expected)
    assert row_states(t.slice(0, 0), ["k"], aggs).schema == partial_states(t.slice(0, 0), ["k"], aggs).schema


def test_row_states_raise_what_grouping_raises():
    t = _table(10, 3)
    with pytest.raises(pa.ArrowNotImplementedError):
        partial_states(t, ["k"], [Sum("s")])
    with pytest.raises(pa.ArrowNotImplementedError):
        row_states(t, ["k"], [Sum("s")])


def test_the_reducer_takes_rows_states_or_both():
    """What the map side sends (``PartialAggPartitioner.assign``: rows when the keys of its
    block are mostly distinct, else states) reduces to the same answer in any mix."""
    distinct, repeated = _table(3000, 30, seed=1), _table(3000, 30, seed=2)
    distinct = distinct.set_column(0, "k", pa.array(np.arange(3000) * 7))  # (null keys would be one heavy key)
    partitioner, reducer = PartialAggPartitioner(["k"], AGGS, 1), AggregateReducer(["k"], AGGS, partial=True)
    rows, states = partitioner.assign(distinct, 0)[0], partitioner.assign(repeated, 0)[0]
    assert rows.num_rows == distinct.num_rows and rows.column_names == ["k", "v", "i", "b", "s", "f32", "d"]
    assert states.num_rows <= 31 and states.schema.metadata is None
    assert reducer.prepare(rows).schema == states.schema and reducer.prepare(states) is states  # (pushed merges)
    for blocks, table in (([rows], distinct), ([states], repeated), ([rows, states], pa.concat_tables([distinct, repeated]))):
        expected = sort_by_keys(combine_states(partial_states(table, ["k"], AGGS), ["k"], AGGS), ["k"])
        (got,) = reducer([blocks], 0)
        _same(got, expected)


def _hashes(keys: np.ndarray) -> np.ndarray:
    return key_hashes(pa.table({"k": keys}), ["k"])


def test_mostly_distinct_keys_skip_grouping_and_repeated_or_skewed_ones_do_not():
    n = 200_000
    rng = np.random.default_rng(1)
    assert mostly_distinct(_hashes(rng.permutation(n)))
    assert mostly_distinct(_hashes(rng.integers(0, 5 * n, n)))  # ~90% distinct
    assert not mostly_distinct(_hashes(rng.integers(0, n // 5, n)))  # each key ~5 times
    assert not mostly_distinct(_hashes(np.arange(n) // 2))  # sorted, groups of 2: half the rows
    skewed = np.where(rng.random(n) < 0.5, -1, np.arange(n))  # one key holds half the rows
    assert not mostly_distinct(_hashes(skewed))
    assert not mostly_distinct(_hashes(np.zeros(n, dtype=np.int64)))
    # blocks no bigger than the sample are counted exactly
    assert mostly_distinct(_hashes(np.arange(10)))
    assert not mostly_distinct(_hashes(np.arange(10) % 7))
    assert not mostly_distinct(_hashes(np.zeros(0, dtype=np.int64)))

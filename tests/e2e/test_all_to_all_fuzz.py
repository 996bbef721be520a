"""Random tables through sort, groupby, join, zip, unique and shuffles, checked against pyarrow
and plain Python on the same rows: key types (int, string, float with NaN), nulls in keys and
values, empty inputs, one row, many small blocks, every join type, one key or two, both the
one-task and the partitioned exchange, and inputs as blocks in the store or as Parquet files
(whose reads then partition). A failing case names its seed in the test id."""

from __future__ import annotations

import itertools
import math
import os
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import dataflow
from dataflow.aggregate import Count, Max, Mean, Min, Std, Sum

SEEDS = range(int(os.environ.get("DATAFLOW_FUZZ_SEEDS", "8")))
"""More for a soak: ``DATAFLOW_FUZZ_SEEDS=500 pytest tests/e2e/test_all_to_all_fuzz.py``."""


def _column(rng: random.Random, kind: str, n: int, null_frac: float, distinct: int) -> pa.Array:
    values: list[Any] = []
    for _ in range(n):
        if rng.random() < null_frac:
            values.append(None)
        elif kind == "int":
            values.append(rng.randrange(-distinct, distinct))
        elif kind == "str":
            values.append(f"k{rng.randrange(distinct):03d}" * rng.choice([1, 1, 3]))
        else:
            values.append(float("nan") if rng.random() < 0.05 else rng.randrange(-distinct, distinct) / 4)
    return pa.array(values, {"int": pa.int64(), "str": pa.string(), "float": pa.float64()}[kind])


def _table(rng: random.Random, n: int, key_kind: str, prefix: str = "") -> pa.Table:
    null_frac = rng.choice([0.0, 0.0, 0.1, 0.5, 1.0])
    distinct = rng.choice([1, 3, 20, 1000])
    return pa.table({
        f"{prefix}id": pa.array(range(n), pa.int64()),
        "k": _column(rng, key_kind, n, null_frac, distinct),
        "k2": _column(rng, "int", n, null_frac / 2, 3),
        f"{prefix}v": pa.array([None if rng.random() < null_frac / 2 else rng.uniform(-100, 100) for _ in range(n)], pa.float64()),
    })


def _dataset(rng: random.Random, table: pa.Table) -> dataflow.Dataset:
    """``table`` in 1 to 12 blocks of random sizes (some empty)."""
    cuts = sorted(rng.randrange(table.num_rows + 1) for _ in range(rng.randrange(12)))
    bounds = [0, *cuts, table.num_rows]
    return dataflow.from_arrow([table.slice(a, b - a) for a, b in itertools.pairwise(bounds)])


def _files(rng: random.Random, table: pa.Table, folder: Path) -> dataflow.Dataset:
    """``table`` as 1 to 6 Parquet files of random sizes (some empty), read back: an exchange's
    map side then runs in the read tasks (``dataflow.compile._partitioned_read``)."""
    folder.mkdir()
    cuts = sorted(rng.randrange(table.num_rows + 1) for _ in range(rng.randrange(6)))
    row_group_size = rng.choice([None, 7, 100])
    for i, (a, b) in enumerate(itertools.pairwise([0, *cuts, table.num_rows])):
        pq.write_table(table.slice(a, b - a), folder / f"part-{i:02}.parquet", row_group_size=row_group_size)
    return dataflow.read_parquet(str(folder))


def _mapped(rng: random.Random, ds: dataflow.Dataset) -> dataflow.Dataset:
    """``ds`` through a map step (batches of a random size): an exchange's map side then runs
    in that step's tasks (``dataflow.compile._partitioned_map``)."""
    return ds.map_batches(lambda batch: batch, batch_format="pyarrow", batch_size=rng.choice([None, 7, 500]))


def _key(value: Any) -> tuple[int, Any]:
    """A total order over Python values with None and NaN (for comparing multisets of rows)."""
    if value is None:
        return (2, 0)
    if isinstance(value, float) and math.isnan(value):
        return (1, 0)
    return (0, value)


def _rows(table: pa.Table | list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    rows = table.to_pylist() if isinstance(table, pa.Table) else table
    return sorted(tuple(sorted((k, _key(v)) for k, v in row.items())) for row in rows)


def _close(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


@pytest.fixture(params=["one task", "partitioned"])
def exchange(request: pytest.FixtureRequest, mode: str):
    if request.param == "partitioned":
        if mode == "local":
            pytest.skip("the partitioned path runs in the multi-process engine")
        with dataflow.options(small_exchange_bytes=0):
            yield request.param
    else:
        yield request.param


@pytest.mark.parametrize("seed", SEEDS)
def test_sort_is_pyarrows_stable_sort(mode, exchange, seed):
    rng = random.Random(seed)
    table = _table(rng, rng.choice([0, 1, 7, 300, 2000]), rng.choice(["int", "str", "float"]))
    keys = rng.choice([["k"], ["k", "k2"], ["k2", "k"]])
    descending = [rng.random() < 0.5 for _ in keys]
    got = _dataset(rng, table).sort(keys, descending=descending).take_all()
    order = [(k, "descending" if d else "ascending", "at_end") for k, d in zip(keys, descending, strict=True)]
    expected = table.take(pc.sort_indices(table, sort_keys=order)).to_pylist()
    assert [[_key(r[k]) for k in keys] for r in got] == [[_key(r[k]) for k in keys] for r in expected], (seed, keys, descending)
    assert _rows(got) == _rows(expected)  # stable: rows with equal keys in input order too
    assert [r["id"] for r in got] == [r["id"] for r in expected], (seed, keys, descending)


@pytest.mark.parametrize("seed", SEEDS)
def test_groupby_aggregations_are_plain_pythons(mode, exchange, seed):
    _check_groupby(random.Random(1000 + seed), exchange, seed, _dataset)


@pytest.mark.parametrize("seed", SEEDS)
def test_groupby_over_files_is_plain_pythons(mode, exchange, seed, tmp_path):
    _check_groupby(random.Random(1500 + seed), exchange, seed, lambda rng, table: _files(rng, table, tmp_path / "in"))


@pytest.mark.parametrize("seed", SEEDS)
def test_groupby_after_a_map_is_plain_pythons(mode, exchange, seed, tmp_path):
    files = random.Random(seed).random() < 0.5
    _check_groupby(random.Random(1700 + seed), exchange, seed, lambda rng, table: _mapped(
        rng, _files(rng, table, tmp_path / "in") if files else _dataset(rng, table)))


def _check_groupby(rng: random.Random, exchange: str, seed: int, source: Any) -> None:
    table = _table(rng, rng.choice([0, 1, 7, 300, 2000]), rng.choice(["int", "str", "float"]))
    keys = rng.choice([["k"], ["k", "k2"]])
    aggs = [Count(), Sum("v"), Min("v"), Max("v"), Mean("v"), Std("v")]
    got = source(rng, table).groupby(keys).aggregate(*aggs).take_all()
    groups: dict[tuple[Any, ...], list[Any]] = defaultdict(list)
    nan_keys = 0
    for row in table.to_pylist():
        key = tuple(row[k] for k in keys)
        nan_keys += any(isinstance(k, float) and math.isnan(k) for k in key)
        groups[tuple(_key(k) for k in key)].append(row["v"])
    assert len(got) == len(groups), seed
    by_key = {tuple(_key(r[k]) for k in keys): r for r in got}
    assert set(by_key) == set(groups), seed
    for key, values in groups.items():
        row = by_key[key]
        present = [v for v in values if v is not None]
        assert row["count()"] == len(values), (seed, key)
        assert _close(row["sum(v)"], math.fsum(present) if present else None), (seed, key, row)
        assert row["min(v)"] == (min(present) if present else None), (seed, key)
        assert row["max(v)"] == (max(present) if present else None), (seed, key)
        assert _close(row["mean(v)"], math.fsum(present) / len(present) if present else None), (seed, key, row)
        if len(present) >= 2:
            mean = math.fsum(present) / len(present)
            std = math.sqrt(math.fsum((v - mean) ** 2 for v in present) / (len(present) - 1))
            assert math.isclose(row["std(v)"], std, rel_tol=1e-6, abs_tol=1e-6), (seed, key, row)
    if exchange == "one task" and keys == ["k"] and not nan_keys:  # in key order, nulls last
        # (partitioned, each reduce task's groups are in key order: hash partitions, as Ray's)
        assert [_key(r["k"]) for r in got] == sorted(_key(r["k"]) for r in got), seed


@pytest.mark.parametrize("seed", SEEDS)
def test_join_is_pyarrows_join(mode, exchange, seed):
    _check_join(random.Random(2000 + seed), seed, lambda rng, table, _: _dataset(rng, table))


@pytest.mark.parametrize("seed", SEEDS)
def test_join_over_files_is_pyarrows_join(mode, exchange, seed, tmp_path):
    joined = _check_join(random.Random(2500 + seed), seed, lambda rng, table, side: _files(rng, table, tmp_path / side))
    assert joined.stats().count("ReadParquet->Join") == 2, joined.stats()  # partitioned as read


@pytest.mark.parametrize("seed", SEEDS)
def test_join_after_maps_is_pyarrows_join(mode, exchange, seed, tmp_path):
    def source(rng: random.Random, table: pa.Table, side: str) -> dataflow.Dataset:
        ds = _files(rng, table, tmp_path / side) if side == "left" else _dataset(rng, table)
        # (an empty side's columns must be known from its plan for an outer join: no map step)
        return _mapped(rng, ds) if table.num_rows else ds

    _check_join(random.Random(2700 + seed), seed, source)


def _check_join(rng: random.Random, seed: int, source: Any) -> dataflow.Dataset:
    kind = rng.choice(["int", "str"])  # (pyarrow joins no float keys with NaN the same way everywhere)
    left = _table(rng, rng.choice([0, 1, 50, 700]), kind, prefix="l_")
    right = _table(rng, rng.choice([0, 1, 50, 700]), kind, prefix="r_").rename_columns(["r_id", "k", "k2", "r_v"])
    on = rng.choice([("k",), ("k", "k2")])
    if on == ("k",):
        right = right.drop_columns(["k2"]).append_column("r_k2", right.column("k2"))
        left = left.drop_columns(["k2"]).append_column("l_k2", left.column("k2"))
    how = rng.choice(["inner", "left_outer", "right_outer", "full_outer", "left_semi", "right_semi", "left_anti",
                      "right_anti"])
    joined = source(rng, left, "left").join(source(rng, right, "right"), how, num_partitions=rng.choice([1, 3, 8]), on=on)
    got = joined.take_all()
    expected = left.join(right, list(on), join_type=how.replace("_", " "), coalesce_keys=True)
    assert len(got) == expected.num_rows, (seed, how, on)
    assert _rows(got) == _rows(expected), (seed, how, on)
    return joined


@pytest.mark.parametrize("seed", SEEDS)
def test_shuffle_unique_zip_and_repartition_keep_every_row(mode, exchange, seed):
    rng = random.Random(3000 + seed)
    table = _table(rng, rng.choice([0, 1, 7, 300, 2000]), rng.choice(["int", "str", "float"]))
    ds = _dataset(rng, table)
    shuffled = ds.random_shuffle(seed=seed).take_all()
    assert _rows(shuffled) == _rows(table), seed
    again = ds.random_shuffle(seed=seed).take_all()
    assert [r["id"] for r in again] == [r["id"] for r in shuffled], seed  # a seed fixes the order
    unique = ds.unique("k")
    assert sorted(map(_key, unique)) == sorted({_key(v) for v in table.column("k").to_pylist()}), seed
    n = rng.choice([1, 2, 5, 13])
    parted = ds.repartition(n, shuffle=rng.random() < 0.5).materialize()
    assert parted.num_blocks() == n and _rows(parted.take_all()) == _rows(table), seed
    other = _dataset(rng, table.select(["k"]).rename_columns(["z"]))
    zipped = ds.zip(other).take_all()
    assert [r["id"] for r in zipped] == list(range(table.num_rows)), seed
    assert all(_key(r["k"]) == _key(r["z"]) for r in zipped), seed


@pytest.mark.parametrize("seed", SEEDS)
def test_shuffles_over_files_are_the_shuffles_over_blocks(mode, exchange, seed, tmp_path):
    """A seeded shuffle (and a round-robin repartition) depends on each row's position alone:
    over files, where the read tasks partition with positions counted from the footers, the
    rows come out in the order they do over the same rows as blocks in memory."""
    rng = random.Random(3500 + seed)
    table = _table(rng, rng.choice([0, 1, 7, 300, 2000]), rng.choice(["int", "str", "float"]))
    files, blocks = _files(rng, table, tmp_path / "in"), _dataset(rng, table)
    got = [r["id"] for r in files.random_shuffle(seed=seed).take_all()]
    assert got == [r["id"] for r in blocks.random_shuffle(seed=seed).take_all()], seed
    assert sorted(got) == list(range(table.num_rows)), seed
    n = rng.choice([1, 2, 5, 13])
    parted = files.repartition(n, shuffle=True).materialize()
    want = blocks.repartition(n, shuffle=True).materialize()
    assert parted.num_blocks() == n and [r["id"] for r in parted.take_all()] == [r["id"] for r in want.take_all()], seed


@pytest.mark.parametrize("seed", SEEDS)
def test_top_k_and_map_groups_are_plain_pythons(mode, exchange, seed):
    _check_top_k_and_map_groups(random.Random(4000 + seed), seed, _dataset)


@pytest.mark.parametrize("seed", SEEDS)
def test_top_k_and_map_groups_over_files_are_plain_pythons(mode, exchange, seed, tmp_path):
    _check_top_k_and_map_groups(random.Random(4500 + seed), seed, lambda rng, table: _files(rng, table, tmp_path / "in"))


@pytest.mark.parametrize("seed", SEEDS)
def test_top_k_and_map_groups_after_a_map_are_plain_pythons(mode, exchange, seed):
    _check_top_k_and_map_groups(random.Random(4700 + seed), seed, lambda rng, table: _mapped(rng, _dataset(rng, table)))


def _check_top_k_and_map_groups(rng: random.Random, seed: int, source: Any) -> None:
    table = _table(rng, rng.choice([0, 1, 7, 300, 2000]), rng.choice(["int", "str", "float"]))
    ds = source(rng, table)
    keys, descending = rng.choice([(["k"], False), (["k"], True), (["k2", "k"], [True, False])])
    k = rng.choice([0, 1, 5, 100, 5000])
    order = [(c, "descending" if d else "ascending", "at_end")
             for c, d in zip(keys, descending if isinstance(descending, list) else [descending], strict=True)]
    expected = table.take(pc.sort_indices(table, sort_keys=order)).slice(0, k)
    assert [r["id"] for r in ds.sort(keys, descending=descending).limit(k).take_all()] == expected.column("id").to_pylist(), seed

    def summarize(group: pa.Table) -> pa.Table:
        values = [v for v in group.column("v").to_pylist() if v is not None]
        return pa.table({"first_id": [group.column("id")[0].as_py()], "rows": [group.num_rows],
                         "ids": [sorted(group.column("id").to_pylist())], "total": [math.fsum(values)]})

    got = ds.groupby("k2").map_groups(summarize, batch_format="pyarrow").take_all()
    groups: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for row in table.to_pylist():
        groups[row["k2"]].append(row)
    assert sorted(r["rows"] for r in got) == sorted(len(g) for g in groups.values()), seed
    by_first = {r["first_id"]: r for r in got}
    for rows in groups.values():  # a group's rows in input order: its first row's id comes first
        summary = by_first[rows[0]["id"]]
        assert summary["ids"] == [r["id"] for r in rows], seed
        assert math.isclose(summary["total"], math.fsum(r["v"] for r in rows if r["v"] is not None), abs_tol=1e-9), seed


@pytest.mark.parametrize("seed", SEEDS)
def test_splits_and_samples_keep_every_row_once(mode, seed):
    rng = random.Random(5000 + seed)
    n = rng.choice([0, 1, 7, 300, 2000])
    table = _table(rng, n, "int")
    ds = _dataset(rng, table)
    indices = sorted(rng.randrange(n + 3) for _ in range(rng.randrange(1, 4)))  # (none: ValueError, as Ray)
    parts = ds.split_at_indices(indices)
    assert len(parts) == len(indices) + 1
    bounds = [0, *(min(i, n) for i in indices), n]
    assert [[r["id"] for r in p.take_all()] for p in parts] == [list(range(a, max(a, b))) for a, b in itertools.pairwise(bounds)], seed
    if n >= 2:
        train, test = ds.train_test_split(test_size=rng.choice([0.25, 1]), shuffle=rng.random() < 0.5, seed=seed)
        ids = [r["id"] for r in train.take_all()] + [r["id"] for r in test.take_all()]
        assert sorted(ids) == list(range(n)), seed
    equal = rng.random() < 0.5
    shards = ds.split(rng.choice([1, 2, 3]), equal=equal)
    rows = [r["id"] for shard in shards for r in shard.take_all()]
    assert len(rows) == len(set(rows)) and set(rows) <= set(range(n)), seed
    counts = [shard.count() for shard in shards]
    assert sum(counts) == len(rows), (seed, counts)
    if equal:  # the same count each, the last rows (fewer than one per shard) dropped
        assert len(set(counts)) == 1 and n - len(rows) < len(shards), (seed, counts)
    else:
        assert len(rows) == n, (seed, counts)
    sample = [r["id"] for r in ds.random_sample(rng.choice([0.0, 0.3, 1.0]), seed=seed).take_all()]
    assert len(sample) == len(set(sample)) and set(sample) <= set(range(n)), seed

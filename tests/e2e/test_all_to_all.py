"""All-to-all steps end to end, on both execution modes, with Ray Data's semantics."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dataflow
from dataflow.aggregate import (
    AbsMax,
    AggregateFn,
    AggregateFnV2,
    ApproximateQuantile,
    ApproximateTopK,
    AsList,
    Count,
    CountDistinct,
    Max,
    Mean,
    Min,
    Quantile,
    Std,
    Sum,
    Unique,
    ValueCounter,
)


@pytest.fixture(params=["one task", "partitioned"])
def exchange(request: pytest.FixtureRequest, mode: str) -> Iterator[str]:
    """Small inputs (these tests') run an exchange as one task; with ``small_exchange_bytes=0``
    the same steps partition them over map and reduce tasks, as larger inputs do."""
    if request.param == "one task":
        yield request.param
        return
    if mode == "local":
        pytest.skip("the partitioned path runs in the multi-process engine (and on Ray)")
    with dataflow.options(small_exchange_bytes=0):
        yield request.param


def _rows(n: int, blocks: int = 7) -> dataflow.Dataset:
    return dataflow.range(n, override_num_blocks=blocks).map(
        lambda r: {"id": r["id"], "k": r["id"] % 7, "v": float((r["id"] * 7919) % 1000) - 500.0, "s": f"s{r['id'] % 13:02d}"}
    )


# random_shuffle --------------------------------------------------------------------------------
def test_random_shuffle_is_a_permutation_fixed_by_its_seed(mode, exchange):
    ds = _rows(20_000)
    first = [r["id"] for r in ds.random_shuffle(seed=7).take_all()]
    assert sorted(first) == list(range(20_000))
    assert first != list(range(20_000))
    assert [r["id"] for r in ds.random_shuffle(seed=7).take_all()] == first
    assert [r["id"] for r in ds.random_shuffle(seed=8).take_all()] != first
    unseeded = [[r["id"] for r in ds.random_shuffle().take_all()] for _ in range(2)]
    assert unseeded[0] != unseeded[1]
    assert sorted(unseeded[0]) == list(range(20_000))


def test_seeded_shuffle_does_not_depend_on_blocks_or_workers(mode, exchange):
    expected = [r["id"] for r in _rows(5000, blocks=3).random_shuffle(seed=1).take_all()]
    assert [r["id"] for r in _rows(5000, blocks=50).random_shuffle(seed=1).take_all()] == expected
    with dataflow.options(num_cpus=1):
        assert [r["id"] for r in _rows(5000, blocks=11).random_shuffle(seed=1).take_all()] == expected


def _ids(ds) -> list[int]:
    return [r["id"] for r in ds.take_all()]


_EPOCHS_IN_A_FRESH_PROCESS = """
import json, dataflow
dataflow.init(num_cpus=1)
ds = dataflow.range(2000, override_num_blocks=5).random_shuffle(seed=dataflow.RandomSeedConfig(11))
print(json.dumps([[r["id"] for r in ds.take_all()] for _ in range(2)]))
"""


def test_a_random_seed_config_gives_each_execution_its_own_order_the_same_run_after_run(mode, exchange):
    """Ray's RandomSeedConfig(seed): each execution (epoch) a different order, executions
    numbered in the process as Ray's DataContext numbers them (the same dataset built again
    shuffles differently, as Ray's docstrings show), the sequence the same in a new process
    that runs the same executions; with reseed_after_execution=False (or an int seed) one order
    for every execution."""
    config = dataflow.RandomSeedConfig(11)
    ds = dataflow.range(2000, override_num_blocks=5).random_shuffle(seed=config)
    epochs = [_ids(ds) for _ in range(3)]
    assert all(sorted(e) == list(range(2000)) for e in epochs)
    assert len({tuple(e) for e in epochs}) == 3
    again = dataflow.range(2000, override_num_blocks=5).random_shuffle(seed=config)
    assert _ids(again) not in epochs
    after = ds.map(lambda r: r)
    assert _ids(after) not in epochs
    runs = [subprocess.run([sys.executable, "-c", _EPOCHS_IN_A_FRESH_PROCESS], capture_output=True, text=True, timeout=120)
            for _ in range(2)]
    assert all(run.returncode == 0 for run in runs), runs[0].stderr
    first, second = (json.loads(run.stdout.strip().splitlines()[-1]) for run in runs)
    assert first == second and first[0] != first[1]
    fixed = dataflow.range(2000, override_num_blocks=5).random_shuffle(seed=dataflow.RandomSeedConfig(11, reseed_after_execution=False))
    assert _ids(fixed) == _ids(fixed) == _ids(dataflow.range(2000, override_num_blocks=5).random_shuffle(seed=11))
    unseeded = dataflow.range(2000).random_shuffle(seed=dataflow.RandomSeedConfig())
    assert _ids(unseeded) != _ids(unseeded)


def test_random_sample_and_block_order_take_a_random_seed_config(mode):
    sample = dataflow.range(1000, override_num_blocks=4).random_sample(0.3, seed=dataflow.RandomSeedConfig(5))
    picks = [sorted(_ids(sample)) for _ in range(2)]  # (the rows picked; their order follows the tasks)
    assert picks[0] != picks[1] and all(0 < len(p) < 1000 for p in picks)
    again = dataflow.range(1000, override_num_blocks=4).random_sample(0.3, seed=dataflow.RandomSeedConfig(5))
    assert sorted(_ids(again)) not in picks  # a later execution in the process, as in Ray
    order = dataflow.range(1000, override_num_blocks=20).randomize_block_order(seed=dataflow.RandomSeedConfig(5))
    orders = [_ids(order) for _ in range(3)]
    assert all(sorted(o) == list(range(1000)) for o in orders) and len({tuple(o) for o in orders}) > 1


def test_bad_seeds_raise_as_ray():
    with pytest.raises(ValueError, match=r"Seed must be an integer or None\."):
        dataflow.RandomSeedConfig("x")
    for step in (lambda ds, s: ds.random_shuffle(seed=s), lambda ds, s: ds.randomize_block_order(seed=s),
                 lambda ds, s: ds.random_sample(0.5, seed=s)):
        with pytest.raises(ValueError, match="Invalid seed type: <class 'float'>"):
            step(dataflow.range(3), 1.5)


def test_a_steps_execution_number_is_drawn_once_per_compile():
    """A compile that asks a random step for its seed twice (a sort-like exchange over a read
    asks the partitioner in two places) numbers the execution once."""
    from dataflow.random_seed import StepSeed, compiling, execution_number, execution_seed

    seed = StepSeed(dataflow.RandomSeedConfig(3))
    with compiling():
        number = execution_number()
        assert seed.for_execution() == seed.for_execution() == execution_seed(3, number)
    with compiling():
        assert execution_number() > number and seed.for_execution() == execution_seed(3, execution_number())
    assert StepSeed(3).for_execution() == 3 and StepSeed(None).for_execution() is None


def _padded(batch):
    return {"id": batch["id"], "pad": np.ones((len(batch["id"]), 16))}


def test_a_seeded_shuffle_is_the_same_whatever_the_block_size(mode):
    """Small blocks (target_max_block_size of 256 KiB: blocks are cut, and tasks whose output
    outgrows their input are cut too) give the permutation the default blocks give, run after
    run, and the step after the shuffle keeps it (as after a sort)."""
    ds = dataflow.range(100_000, override_num_blocks=4).map_batches(_padded)
    runs = []
    for size in (None, 256 << 10, None, 256 << 10):
        with dataflow.options(**({"target_max_block_size": size} if size else {})):
            runs.append([r["id"] for r in ds.random_shuffle(seed=3).select_columns(["id"]).take_all()])
    assert sorted(runs[0]) == list(range(100_000)) and all(run == runs[0] for run in runs)


def test_shuffle_is_uniform_enough():
    # where row 0 lands over many seeds: roughly uniform over 10 buckets
    landing = [[r["id"] for r in dataflow.range(100).random_shuffle(seed=s).take_all()].index(0) // 10 for s in range(400)]
    counts = np.bincount(landing, minlength=10)
    assert counts.min() > 15 and counts.max() < 70, counts


def test_randomize_block_order_and_random_sample(mode):
    ds = dataflow.range(1000, override_num_blocks=10)
    ids = [r["id"] for r in ds.randomize_block_order(seed=3).take_all()]
    assert sorted(ids) == list(range(1000)) and ids != list(range(1000))
    assert ids == [r["id"] for r in ds.randomize_block_order(seed=3).take_all()]
    blocks = [ids[i : i + 100] for i in range(0, 1000, 100)]
    assert all(b == list(range(b[0], b[0] + 100)) for b in blocks)  # rows keep their order
    sample = ds.random_sample(0.2, seed=5).take_all()
    assert 120 < len(sample) < 280
    assert sorted(r["id"] for r in sample) == sorted(r["id"] for r in ds.random_sample(0.2, seed=5).take_all())
    with pytest.raises(ValueError, match="fraction"):
        ds.random_sample(1.5)


# sort -------------------------------------------------------------------------------------------
def test_sort_one_and_many_keys_with_directions(mode, exchange):
    ds = _rows(10_000)
    rows = ds.take_all()
    assert [r["v"] for r in ds.sort("v").take_all()] == sorted(r["v"] for r in rows)
    got = [(r["s"], r["v"], r["id"]) for r in ds.sort(["s", "v"], descending=[True, False]).take_all()]
    by_v = sorted(rows, key=lambda r: (r["v"], r["id"]))
    want = [(r["s"], r["v"], r["id"]) for r in sorted(by_v, key=lambda r: r["s"], reverse=True)]
    assert [(s, v) for s, v, _ in got] == [(s, v) for s, v, _ in want]
    assert [r["id"] for r in ds.sort("id", descending=True).take(5)] == [9999, 9998, 9997, 9996, 9995]


def test_sort_is_stable_and_keeps_order_across_batches(mode, exchange):
    ds = _rows(6000, blocks=9)
    ids = [r["id"] for r in ds.sort("k").take_all()]
    assert ids == sorted(range(6000), key=lambda i: i % 7)  # equal keys keep input order
    previous = -1
    for batch in ds.sort("k").map_batches(lambda b: b).iter_batches(batch_size=333, batch_format="numpy"):
        assert batch["k"][0] >= previous and np.all(np.diff(batch["k"]) >= 0)
        previous = batch["k"][-1]


def test_sort_puts_nulls_and_nans_last(mode, exchange):
    values = [3.0, None, -1.5, float("nan"), 2.0, None, -7.0, 0.0]
    ds = dataflow.from_items([{"x": v, "i": i} for i, v in enumerate(values)] * 50).repartition(4)
    up = [r["x"] for r in ds.sort("x").take_all()]
    assert up[:250] == sorted([v for v in values if v is not None and not math.isnan(v)] * 50)
    assert all(math.isnan(v) for v in up[250:300]) and up[300:] == [None] * 100
    down = [r["x"] for r in ds.sort("x", descending=True).take_all()]
    assert down[:250] == sorted([v for v in values if v is not None and not math.isnan(v)] * 50, reverse=True)
    assert all(math.isnan(v) for v in down[250:300]) and down[300:] == [None] * 100


def test_sort_edge_shapes(mode, exchange):
    assert dataflow.range(0).sort("id").take_all() == []
    same = dataflow.from_items([{"a": 1, "i": i} for i in range(500)])
    assert [r["i"] for r in same.sort("a").take_all()] == list(range(500))
    assert [r["id"] for r in dataflow.range(300, override_num_blocks=3).sort("id", descending=True).take_all()] == list(range(299, -1, -1))
    with pytest.raises(ValueError, match="descending"):
        dataflow.range(3).sort(["id"], descending=[True, False])
    # one value and nulls: two ranges, the first without rows. Its reduce task was skipped and the
    # other's output waited for it forever: every row was lost
    halves = dataflow.from_arrow(pa.table({"k": pa.array([None, 1, None, 1], pa.int64()), "i": [0, 1, 2, 3]}))
    assert [r["i"] for r in halves.sort("k").take_all()] == [1, 3, 0, 2]
    assert [r["i"] for r in halves.sort("k", descending=True).take_all()] == [1, 3, 0, 2]


def test_sort_limit_and_boundaries(mode):
    ds = _rows(5000)
    assert [r["v"] for r in ds.sort("v").limit(5).take_all()] == sorted(r["v"] for r in ds.take_all())[:5]
    bounded = ds.sort("id", boundaries=[1000, 2500]).materialize()
    assert [r["id"] for r in bounded.take_all()] == list(range(5000))


def test_sort_limit_is_a_stable_top_k(mode, exchange):
    ds = _rows(8000, blocks=8)
    assert "TopK[10]" in ds.sort("k").limit(10).explain()
    assert [r["id"] for r in ds.sort("k").limit(10).take_all()] == [i * 7 for i in range(10)]
    top = ds.sort(["v", "id"], descending=[True, False]).take(25)
    want = sorted(ds.take_all(), key=lambda r: (-r["v"], r["id"]))[:25]
    assert top == want
    assert ds.sort("k").limit(0).take_all() == []


def test_sort_missing_key_names_the_column(mode, exchange):
    with pytest.raises(Exception, match="nope") as info:
        dataflow.range(10).sort("nope").take_all()
    assert "id" in str(info.value)


def test_sort_keys_are_sampled_by_the_tasks_not_read_back_by_the_driver(streaming, monkeypatch):
    """The blocks feeding a sort are sampled by the tasks that make them; the driver reads none
    of them (on a cluster that would pull every block to the driver, and here read spilled
    blocks back from disk). Tasks the cold start runs in the driver's inline thread may sample."""
    import os
    import threading

    from dataflow.sort import RangePartitioner

    driver, real = os.getpid(), RangePartitioner.sample

    def sample(self, table):
        if os.getpid() == driver and threading.current_thread().name != "dataflow-inline":
            raise AssertionError(f"the driver sampled a block on {threading.current_thread().name}")
        return real(self, table)

    monkeypatch.setattr(RangePartitioner, "sample", sample)
    ds = dataflow.range(20_000, override_num_blocks=8).map_batches(lambda b: {"k": (b["id"] * 7919) % 20_011})
    with dataflow.options(small_exchange_bytes=0):  # partitioned on sampled boundaries, as a large input
        keys = [r["k"] for r in ds.sort("k").take_all()]
        assert len(keys) == 20_000 and keys == sorted(keys)
        with pytest.raises(Exception, match="nope"):  # a missing key is still the sort's error
            ds.sort("nope").take_all()


def test_a_small_exchange_is_one_task_with_the_partitioned_result(streaming):
    """An input under ``small_exchange_bytes`` is shuffled, sorted or aggregated by one task and
    no map task; the result is the partitioned one (the same permutation for a seed)."""
    ds = _rows(30_000, blocks=6).materialize()
    steps = {
        "RandomShuffle": lambda d: d.random_shuffle(seed=11),
        "Sort": lambda d: d.sort(["k", "v"], descending=[True, False]),
        "Aggregate[k]": lambda d: d.groupby("k").aggregate(Sum("v"), Count(), Std("v")),
        "TopK[20]": lambda d: d.sort("v").limit(20),
        "Aggregate": lambda d: d.groupby(None).aggregate(Sum("v"), Mean("id")),
    }
    for name, step in steps.items():
        small = step(ds)
        got = small.take_all()
        with dataflow.options(small_exchange_bytes=0):
            partitioned = step(ds)
            want = partitioned.take_all()
        if name.startswith("Aggregate"):  # groups come out in key order per reduce task; partial
            # states merged in another order may change a float's last bit
            got, want = sorted(got, key=lambda r: r.get("k", 0)), sorted(want, key=lambda r: r.get("k", 0))
            assert got == [pytest.approx(row, rel=1e-12) for row in want], name
        else:
            assert got == want, name
        assert f"{name}Map: 0 tasks" in small.stats() and f"{name}: 1 tasks" in small.stats(), small.stats()
        assert f"{name}Map: 0 tasks" not in partitioned.stats(), partitioned.stats()
    with pytest.raises(ValueError, match="small_exchange_bytes"), dataflow.options(small_exchange_bytes=-1):
        ds.sort("k").take_all()


def test_a_small_exchange_over_a_read_is_the_task_that_reads(streaming, tmp_path):
    """A small exchange straight over a read runs in the one task that reads every file (on
    several threads) and reduces: nothing else runs, and the result is the partitioned one. A
    broken file among them fails the step naming that file. Files whose decoded size the
    footers cannot bound (dictionary-encoded strings) take the ordinary path; a sort over them
    skips its key-only read when the footers say they are probably small, so one reduce task
    still takes the rows (the key-only read was a third of the time of a 200k-row sort)."""
    table = _rows(24_000, blocks=4).to_arrow()
    plain, dictionary = tmp_path / "plain", tmp_path / "dictionary"
    plain.mkdir()
    dictionary.mkdir()
    for i in range(6):  # six files of 4,000 rows: read by two threads, in order
        pq.write_table(table.slice(i * 4000, 4000), plain / f"part-{i}.parquet", use_dictionary=False)
        pq.write_table(table.slice(i * 4000, 4000), dictionary / f"part-{i}.parquet")
    shuffled = dataflow.read_parquet(str(tmp_path / "dictionary")).random_shuffle(seed=3)
    assert len(shuffled.take_all()) == 24_000
    assert "ReadParquet->RandomShuffle" not in shuffled.stats() and "RandomShuffleMap: 0 tasks" in shuffled.stats()
    ordered = dataflow.read_parquet(str(tmp_path / "dictionary")).sort(["s", "v"], descending=[False, True])
    assert ordered.take_all() == table.sort_by([("s", "ascending"), ("v", "descending")]).to_pylist()
    assert "SortMap: 0 tasks" in ordered.stats() and "Sort: 1 tasks" in ordered.stats(), ordered.stats()
    assert "ReadParquet->SortMap" not in ordered.stats(), ordered.stats()
    steps = {
        "RandomShuffle": lambda d: d.random_shuffle(seed=3),
        "Sort": lambda d: d.sort(["s", "v"], descending=[False, True]),
        "Aggregate[k]": lambda d: d.groupby("k").aggregate(Sum("v"), Count()),
        "TopK[7]": lambda d: d.sort("v", descending=True).limit(7),
    }
    for name, step in steps.items():
        small = step(dataflow.read_parquet(str(plain)))
        got = small.take_all()
        with dataflow.options(small_exchange_bytes=0):
            want = step(dataflow.read_parquet(str(plain))).take_all()
        if name.startswith("Aggregate"):
            got, want = sorted(got, key=lambda r: r["k"]), sorted(want, key=lambda r: r["k"])
        assert got == want, name
        stats = small.stats()
        assert f"ReadParquet->{name}: 1 tasks" in stats and f"{name}Map" not in stats, stats
        # counted by that task: a pushed filter leaves no count in the footers
        filtered = step(dataflow.read_parquet(str(plain)).filter(expr="k != 1"))
        assert filtered.count() == len(filtered.take_all()) == len(step(_rows(24_000, blocks=4).filter(expr="k != 1")).take_all())
    (plain / "part-3.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(Exception, match=r"part-3\.parquet"):
        dataflow.read_parquet(str(plain)).sort("v").take_all()


def test_a_sort_over_a_read_samples_its_key_columns_first(mode, tmp_path):
    """A sort straight over Parquet files reads their key columns alone to fit its ranges, then
    reads and partitions whole rows in the same tasks: the order is the stable one (ties keep
    the files' order), nulls last, and a key the files lack is still the sort's error."""
    rng = np.random.default_rng(3)
    tables = []
    for i in range(5):
        n = 3000
        k = rng.integers(0, 50, n).astype(float)
        k[rng.random(n) < 0.05] = np.nan
        table = pa.table({"k": pa.array(k, from_pandas=True), "s": [f"s{j % 11}" for j in range(n)],
                          "file": [i] * n, "row": np.arange(n)})
        pq.write_table(table, tmp_path / f"part-{i}.parquet")
        tables.append(table)
    want = pa.concat_tables(tables).sort_by([("k", "descending", "at_end"), ("s", "ascending", "at_end")])
    with dataflow.options(small_exchange_bytes=0):  # as a large input: not one task
        ds = dataflow.read_parquet(str(tmp_path)).sort(["k", "s"], descending=[True, False])
        got = ds.to_arrow()
        assert got.select(["file", "row"]).to_pylist() == want.select(["file", "row"]).to_pylist()
        if mode == "streaming":
            stats = ds.stats()
            assert "ReadParquet->SortMap" in stats and "\n  Operator 0 ReadParquet:" not in stats, stats
            assert "of its tasks read the sort key columns alone first" in stats, stats
        with pytest.raises(Exception, match="nope"):
            dataflow.read_parquet(str(tmp_path)).sort("nope").take_all()


# groupby ---------------------------------------------------------------------------------------
def test_groupby_aggregations_match_python(mode, exchange):
    ds = _rows(7000)
    rows = ds.take_all()
    got = {r["k"]: r for r in ds.groupby("k").aggregate(Count(), Sum("v"), Min("v"), Max("v"), Mean("v"), Std("v"), AbsMax("v")).take_all()}
    assert sorted(got) == list(range(7))
    for k in range(7):
        vals = [r["v"] for r in rows if r["k"] == k]
        g = got[k]
        assert g["count()"] == len(vals) and g["sum(v)"] == pytest.approx(sum(vals))
        assert g["min(v)"] == min(vals) and g["max(v)"] == max(vals) and g["abs_max(v)"] == max(abs(v) for v in vals)
        assert g["mean(v)"] == pytest.approx(statistics.mean(vals))
        assert g["std(v)"] == pytest.approx(statistics.stdev(vals))


def test_groupby_of_mostly_distinct_keys_matches_python(mode, exchange):
    """Blocks whose keys are almost all distinct skip grouping on the map side (a state per
    row), blocks of repeated keys group; one reducer merges both kinds: same answers."""
    def row(r):
        i = r["id"]
        v = None if i % 11 == 0 else (math.nan if i % 13 == 0 else float(i % 17) - 8.0)
        return {"k": (i if i < 12_000 else i % 40) if i % 101 else None, "v": v}

    ds = dataflow.range(24_000, override_num_blocks=6).map(row)
    groups: dict = {}
    for r in ds.take_all():
        groups.setdefault(r["k"], []).append(r["v"])
    got = {r["k"]: r for r in ds.groupby("k").aggregate(Count(), Sum("v"), Min("v"), Max("v"), Mean("v"), Std("v")).take_all()}
    assert len(got) == len(groups)
    for k, vals in groups.items():
        g, present = got[k], [v for v in vals if v is not None and not math.isnan(v)]
        assert g["count()"] == len(vals)
        if not present:
            assert g["sum(v)"] is None and g["mean(v)"] is None and g["std(v)"] is None
            continue
        assert (g["sum(v)"], g["min(v)"], g["max(v)"]) == (sum(present), min(present), max(present))
        assert g["mean(v)"] == pytest.approx(statistics.mean(present))
        if len(present) > 1:
            assert g["std(v)"] == pytest.approx(statistics.stdev(present))
        else:
            assert math.isnan(g["std(v)"])


def test_groupby_shortcuts_several_keys_and_names(mode):
    ds = _rows(2000)
    out = ds.groupby(["k", "s"]).sum("v").take_all()
    assert set(out[0]) == {"k", "s", "sum(v)"}
    assert len(out) == len({(r["k"], r["s"]) for r in ds.take_all()})
    assert ds.groupby("k").count().take(1)[0].keys() == {"k", "count()"}
    means = ds.select_columns(["k", "v", "id"]).groupby("k").mean().take(1)[0]
    assert set(means) == {"k", "mean(v)", "mean(id)"}
    assert set(ds.groupby("k").std(["v", "id"], ddof=0).take(1)[0]) == {"k", "std(v)", "std(id)"}


def test_groupby_nulls(mode, exchange):
    items = [{"k": None, "v": 1.0}, {"k": "a", "v": None}, {"k": "a", "v": 2.0}, {"k": None, "v": 3.0}, {"k": "b", "v": None}]
    ds = dataflow.from_items(items)
    got = {r["k"]: r for r in ds.groupby("k").aggregate(Count(), Count("v", ignore_nulls=True), Sum("v"), Mean("v")).take_all()}
    assert got[None]["count()"] == 2 and got[None]["sum(v)"] == 4.0  # null keys form one group
    assert got["a"]["count()"] == 2 and got["a"]["count(v)"] == 1 and got["a"]["mean(v)"] == 2.0
    assert got["b"]["sum(v)"] is None and got["b"]["mean(v)"] is None  # only nulls: null, as Ray
    strict = {r["k"]: r for r in ds.groupby("k").aggregate(Sum("v", ignore_nulls=False)).take_all()}
    assert strict["a"]["sum(v)"] is None and strict[None]["sum(v)"] == 4.0


def test_std_of_one_value_is_nan_as_ray(mode, exchange):
    """The sample deviation of one value is undefined: NaN, as Ray, pandas and numpy give; a group
    with no values gets null. Whole-group (Quantile alongside) and partial paths agree."""
    items = [{"k": "one", "v": 2.0}, {"k": "two", "v": 1.0}, {"k": "two", "v": 3.0}, {"k": "none", "v": None}]
    ds = dataflow.from_items(items, override_num_blocks=2)
    for aggs in ((Std("v"),), (Std("v"), Quantile("v"))):
        got = {r["k"]: r["std(v)"] for r in ds.groupby("k").aggregate(*aggs).take_all()}
        assert math.isnan(got["one"]) and got["two"] == pytest.approx(math.sqrt(2)) and got["none"] is None
    assert math.isnan(dataflow.from_items([{"v": 5}]).std("v"))
    assert dataflow.from_items([{"v": 5}]).std("v", ddof=0) == 0.0


def test_nan_is_null_for_sum_mean_std_whatever_the_blocks(mode, exchange):
    """Ray's docs: NaN is a null value, so ignore_nulls=True skips it. Ray 2.60 returns None or
    skips it depending on which block holds the NaN; here every block layout gives one answer."""
    items = [{"k": "b", "f": 2.5}, {"k": "b", "f": math.nan}, {"k": "b", "f": 1.0}, {"k": "c", "f": math.nan}]
    for blocks in (1, 2, 4):
        ds = dataflow.from_items(items, override_num_blocks=blocks)
        for extra in ((), (Quantile("f"),)):  # the partial path, and the whole-group path
            got = {r["k"]: r for r in ds.groupby("k").aggregate(Sum("f"), Mean("f"), Std("f"), Count("f"), *extra).take_all()}
            assert (got["b"]["sum(f)"], got["b"]["mean(f)"]) == (3.5, 1.75)
            assert got["b"]["std(f)"] == pytest.approx(statistics.stdev([2.5, 1.0]))
            assert got["b"]["count(f)"] == 3  # a NaN is a value to Count, as in Ray
            assert got["c"]["sum(f)"] is None and got["c"]["mean(f)"] is None and got["c"]["std(f)"] is None
        assert (ds.sum("f"), ds.mean("f")) == (3.5, 1.75)
        assert math.isnan(ds.sum("f", ignore_nulls=False)) and math.isnan(ds.mean("f", ignore_nulls=False))


def test_groupby_aggregate_with_no_aggregation_gives_the_groups_as_ray(mode, exchange):
    """Ray 2.60's ``groupby(k).aggregate()`` is one row per group, the keys alone (it was a
    ``ValueError`` here); ``sum()`` on a dataset with no other column is the same."""
    ds = dataflow.from_items([{"a": i % 3, "b": str(i % 2)} for i in range(12)], override_num_blocks=3)
    assert sorted(r["a"] for r in ds.groupby("a").aggregate().take_all()) == [0, 1, 2]
    assert sorted((r["a"], r["b"]) for r in ds.groupby(["a", "b"]).aggregate().take_all()) == [
        (a, b) for a in range(3) for b in ("0", "1")]
    assert ds.select_columns(["a"]).groupby("a").sum().columns() == ["a"]
    with pytest.raises(ValueError, match="needs at least one aggregation"):
        ds.aggregate()


def test_min_and_max_of_nothing_but_nan_are_none_as_of_nulls(mode, exchange):
    """Ray's docs make NaN a null for min and max too: a group (or dataset) whose values are all
    NaN has no minimum (None), as a group of nulls; Arrow alone answers NaN there (Ray 2.60 gives
    None globally and NaN per group). Other NaNs are skipped; ``ignore_nulls=False`` keeps them."""
    items = [{"k": "b", "f": 2.5}, {"k": "b", "f": math.nan}, {"k": "b", "f": -1.0}, {"k": "c", "f": math.nan},
             {"k": "c", "f": math.nan}, {"k": "d", "f": None}]
    for blocks in (1, 2, 4):
        ds = dataflow.from_items(items, override_num_blocks=blocks)
        for extra in ((), (Quantile("f"),)):  # the partial path, and the whole-group path
            got = {r["k"]: r for r in ds.groupby("k").aggregate(Min("f"), Max("f"), AbsMax("f"), *extra).take_all()}
            assert (got["b"]["min(f)"], got["b"]["max(f)"], got["b"]["abs_max(f)"]) == (-1.0, 2.5, 2.5)
            for k in ("c", "d"):
                assert (got[k]["min(f)"], got[k]["max(f)"], got[k]["abs_max(f)"]) == (None, None, None)
        assert (ds.min("f"), ds.max("f")) == (-1.0, 2.5)
        only_nan = ds.filter(lambda r: r["k"] == "c")
        assert (only_nan.min("f"), only_nan.max("f")) == (None, None)
        assert math.isnan(only_nan.min("f", ignore_nulls=False))


def test_std_with_a_null_or_nan_and_ignore_nulls_false_is_null_or_nan_as_ray(mode, exchange):
    """A null (or NaN) with ``ignore_nulls=False`` makes the deviation null (NaN), as it makes a
    sum or a mean: pooling the parts' variances turned it into 0.0, whatever the blocks."""
    items = [{"k": 1, "x": 1.0}, {"k": 1, "x": None}, {"k": 1, "x": 3.0}, {"k": 2, "x": 2.0}, {"k": 2, "x": 4.0}]
    for blocks in (1, 2, 3):
        ds = dataflow.from_items(items, override_num_blocks=blocks)
        got = {r["k"]: r["std(x)"] for r in ds.groupby("k").std("x", ignore_nulls=False).take_all()}
        assert got[1] is None and got[2] == pytest.approx(math.sqrt(2))
        assert ds.std("x", ignore_nulls=False) is None and ds.std("x") == pytest.approx(statistics.stdev([1, 3, 2, 4]))
    nan = dataflow.from_items([{"x": 1.0}, {"x": math.nan}, {"x": 3.0}], override_num_blocks=2)
    assert math.isnan(nan.std("x", ignore_nulls=False)) and nan.std("x") == pytest.approx(math.sqrt(2))
    nothing = dataflow.from_items([{"x": None}, {"x": None}]).map(lambda r: r)  # a column typed null
    assert nothing.std("x") is None and nothing.mean("x") is None


def test_unique_and_lists_keep_nulls_as_values_as_ray(mode, exchange):
    """Ray 2.60's ``Unique`` and ``AsList`` keep nulls unless ``ignore_nulls=True``;
    ``CountDistinct`` leaves them out unless ``ignore_nulls=False``, then counts null once."""
    from dataflow.aggregate import AsList, CountDistinct, Unique

    ds = dataflow.from_items([{"k": 1, "x": 1.0}, {"k": 1, "x": None}, {"k": 2, "x": 3.0}, {"k": 2, "x": 1.0}])
    got = ds.aggregate(Unique("x"), Unique("x", ignore_nulls=True, alias_name="u"), CountDistinct("x"),
                       CountDistinct("x", ignore_nulls=False, alias_name="cd"), AsList("x"))
    assert sorted(got["unique(x)"], key=str) == [1.0, 3.0, None] and sorted(got["u"]) == [1.0, 3.0]
    assert (got["count_distinct(x)"], got["cd"]) == (2, 3)
    assert sorted(got["list(x)"], key=str) == [1.0, 1.0, 3.0, None]
    groups = {r["k"]: r["unique(x)"] for r in ds.groupby("k").aggregate(Unique("x")).take_all()}
    assert sorted(groups[1], key=str) == [1.0, None] and sorted(groups[2]) == [1.0, 3.0]


def test_unique_of_a_list_column_compares_whole_lists(mode):
    """Arrow cannot group by a list: ``unique`` of one failed with ArrowNotImplementedError."""
    from dataflow.aggregate import Unique

    items = [{"l": [1, 2]}, {"l": [1, 2]}, {"l": [3]}, {"l": None}]
    assert dataflow.from_items(items).unique("l") == [[1, 2], [3], None]
    mapped = dataflow.from_items(items).map(lambda r: r)  # its schema is not known without a run
    assert mapped.unique("l", ignore_nulls=True) == [[1, 2], [3]]
    flat = dataflow.from_items(items).aggregate(Unique("l", ignore_nulls=True, encode_lists=True))
    assert sorted(flat["unique(l)"]) == [1, 2, 3]
    assert sorted(dataflow.from_items([{"s": {"a": 1}}, {"s": {"a": 1}}]).unique("s"), key=str) == [{"a": 1}]


def test_a_missing_column_is_rays_value_error_and_still_a_key_error(mode):
    from dataflow.errors import ColumnNotFoundError

    with pytest.raises(ValueError, match="column 'nope' not found; the dataset has \\['id'\\]") as info:
        dataflow.range(3).sum("nope")
    assert isinstance(info.value, KeyError) and isinstance(info.value, ColumnNotFoundError)
    # groupby checks its key at the call when the schema is known without running, with Ray's words
    with pytest.raises(ValueError, match=r"^You specified the column 'nope', but there's no such column in the "
                                         r"dataset\. The dataset has columns: \['id'\]$") as info:
        dataflow.range(3).groupby("nope")
    assert isinstance(info.value, KeyError) and isinstance(info.value, ColumnNotFoundError)
    with pytest.raises(ValueError, match="'nope'"):  # after a map the schema needs a run: the run says
        dataflow.range(3).map(lambda r: r).groupby("nope").count().take_all()


def test_a_missing_column_of_a_parquet_read_is_a_column_not_found_error(mode, tmp_path):
    """Projection, sort and filter over Parquet named the column in a plain ValueError, and a
    filter on a column the files lack was pushed into the scanner and read as a corrupt file."""
    from dataflow.errors import ColumnNotFoundError

    pq.write_table(pa.table({"a": [3, 1, 2], "b": ["x", "y", "z"]}), tmp_path / "f.parquet")
    jobs = {
        "columns=": lambda: dataflow.read_parquet(str(tmp_path), columns=["nope"]).take_all(),
        "select_columns": lambda: dataflow.read_parquet(str(tmp_path)).select_columns(["a", "nope"]).take_all(),
        "sort": lambda: dataflow.read_parquet(str(tmp_path)).sort("nope").take_all(),
        "sort of range": lambda: dataflow.range(3).sort("nope").take_all(),
        "filter": lambda: dataflow.read_parquet(str(tmp_path)).filter(expr="nope > 1").take_all(),
    }
    for name, job in jobs.items():
        with pytest.raises(ColumnNotFoundError, match="'nope'") as info:
            job()
        assert isinstance(info.value, ValueError) and isinstance(info.value, KeyError), name
        assert "not a readable Parquet file" not in str(info.value), name
    # a filter on a column the files have is still pushed into the read and still right
    ds = dataflow.read_parquet(str(tmp_path)).filter(expr="a > 1")
    assert sorted(r["a"] for r in ds.take_all()) == [2, 3]


def test_repeated_aggregation_names_get_rays_suffixes(mode, exchange):
    """Two aggregations of one name kept one column, holding the second's value."""
    ds = dataflow.from_items([{"k": 1, "f": 1.0}, {"k": 1, "f": None}])
    assert ds.aggregate(Count("f"), Count("f", ignore_nulls=True)) == {"count(f)": 2, "count(f)_2": 1}
    got = ds.groupby("k").aggregate(Sum("f"), Count("f"), Sum("f"), Sum("f", alias_name="sum(f)_2")).take_all()
    assert got == [{"k": 1, "sum(f)": 1.0, "count(f)": 2, "sum(f)_2": 1.0, "sum(f)_2_2": 1.0}]
    assert dataflow.range(0).aggregate(Count(), Count()) == {"count()": 0, "count()_2": 0}


def test_whole_group_aggregations_and_custom_ones(mode):
    ds = _rows(1400)
    rows = ds.take_all()
    got = {r["k"]: r for r in ds.groupby("k").aggregate(Quantile("id", q=0.5), Unique("s"), CountDistinct("s"), AsList("id")).take_all()}
    for k in range(7):
        ids = [r["id"] for r in rows if r["k"] == k]
        assert got[k]["quantile(id)"] == statistics.median(ids)
        assert sorted(got[k]["unique(s)"]) == sorted({r["s"] for r in rows if r["k"] == k})
        assert got[k]["count_distinct(s)"] == len({r["s"] for r in rows if r["k"] == k})
        assert sorted(got[k]["list(id)"]) == sorted(ids)
    product = AggregateFn(init=lambda key: 0, accumulate_row=lambda a, r: a + r["id"], merge=lambda a, b: a + b, name="total")
    assert ds.aggregate(product) == {"total": sum(range(1400))}
    # Ray rounds an interpolated quantile to 5 places (0.1 of 0..3 is 0.3, not 0.30000000000000004)
    assert dataflow.range(4).aggregate(Quantile("id", q=0.1)) == {"quantile(id)": 0.3}

    class Range(AggregateFnV2):
        def __init__(self, on):
            super().__init__(f"range({on})", zero_factory=lambda: (math.inf, -math.inf), on=on, ignore_nulls=True)

        def aggregate_block(self, block):
            values = block.column(self.on).to_pylist()
            return (min(values), max(values))

        def combine(self, a, b):
            return (min(a[0], b[0]), max(a[1], b[1]))

        def finalize(self, acc):
            return acc[1] - acc[0]

    spans = {r["k"]: r["range(id)"] for r in ds.groupby("k").aggregate(Range("id")).take_all()}
    assert spans == {k: max(i for i in range(1400) if i % 7 == k) - k for k in range(7)}


def test_global_aggregates(mode, exchange):
    ds = _rows(3000)
    vals = [r["v"] for r in ds.take_all()]
    assert ds.sum("v") == pytest.approx(sum(vals))
    assert ds.min("v") == min(vals) and ds.max("v") == max(vals)
    assert ds.mean("v") == pytest.approx(statistics.mean(vals))
    assert ds.std("v") == pytest.approx(statistics.stdev(vals))
    assert ds.sum(["v", "id"]) == {"sum(v)": pytest.approx(sum(vals)), "sum(id)": sum(range(3000))}
    assert set(ds.select_columns(["id", "v"]).max()) == {"max(id)", "max(v)"}
    assert ds.aggregate(Count(), Max("id")) == {"count()": 3000, "max(id)": 2999}
    assert sorted(ds.unique("s")) == sorted({f"s{i:02d}" for i in range(13)})
    assert dataflow.from_items([{"a": 1}, {"a": None}]).unique("a") in ([1, None], [None, 1])  # Ray's default
    assert dataflow.from_items([{"a": 1}, {"a": None}]).unique("a", ignore_nulls=True) == [1]
    # one column, however asked for, gives its value, as Ray's _aggregate_result
    assert dataflow.range(10).sum() == 45 and dataflow.range(4).sum(["id"]) == 6 and dataflow.range(0).sum(["id"]) is None
    assert dataflow.range(0).sum("id") is None
    assert dataflow.range(0).aggregate(Count()) == {"count()": 0}


def test_missing_and_zero_percentages_and_counts_of_lists_as_rays(mode, exchange):
    """Ray's ``MissingValuePercentage`` counts a NaN as missing (this counted nulls only),
    ``ZeroPercentage(ignore_nulls=False)`` counts nulls in the whole (it made no difference),
    and ``ValueCounter``/``ApproximateTopK`` count whole lists (they raised); whole-group
    (with a Quantile) and partial paths agree, whatever the blocks."""
    from dataflow.aggregate import MissingValuePercentage, ZeroPercentage

    items = [{"f": 1.0, "z": 0}, {"f": math.nan, "z": None}, {"f": None, "z": 0}, {"f": 2.0, "z": 3}]
    for blocks in (1, 2, 4):
        ds = dataflow.from_items(items, override_num_blocks=blocks)
        for extra in ((), (Quantile("z"),)):
            got = ds.aggregate(MissingValuePercentage("f"), ZeroPercentage("z"),
                               ZeroPercentage("z", ignore_nulls=False, alias_name="all"), *extra)
            assert (got["missing_pct(f)"], got["all"]) == (50.0, 50.0)
            assert got["zero_pct(z)"] == pytest.approx(200 / 3)
    lists = dataflow.from_items([{"l": [1, 2]}, {"l": [1, 2]}, {"l": [3]}])
    assert lists.aggregate(ValueCounter("l"), ApproximateTopK("l", k=1)) == {
        "value_counter(l)": {"values": [[1, 2], [3]], "counts": [2, 1]}, "approx_topk(l)": [{"l": [1, 2], "count": 2}]}


def test_a_users_aggregation_reads_rays_names():
    class Total(AggregateFnV2):
        def __init__(self, on):
            super().__init__(f"total({on})", lambda: 0, on=on, ignore_nulls=True)

        def aggregate_block(self, block):  # as code copied from Ray's built-ins reads them
            values = block.column(self.get_target_column()).to_pylist()
            return sum(v for v in values if v is not None) if self._ignore_nulls else sum(values)

        def combine(self, current, new):
            return current + new

    assert Total("x").get_agg_name() == "total(x)"
    assert dataflow.from_items([{"x": 1}, {"x": None}, {"x": 2}]).aggregate(Total("x")) == {"total(x)": 3}


def test_value_counts_top_k_and_quantiles_as_rays(mode, exchange):
    """Ray's ValueCounter, ApproximateTopK and ApproximateQuantile (its docstring examples,
    then grouped, over several blocks, with nulls): the sketches' answers are exact here."""
    letters = dataflow.from_items([{"category": c} for c in "ABACAB"])
    assert letters.aggregate(ValueCounter(on="category")) == {
        "value_counter(category)": {"values": ["A", "B", "C"], "counts": [3, 2, 1]}}
    words = dataflow.from_items([{"word": w} for w in ["apple", "banana", "apple", "cherry", "apple"]])
    assert words.aggregate(ApproximateTopK(on="word", k=2)) == {
        "approx_topk(word)": [{"word": "apple", "count": 3}, {"word": "banana", "count": 1}]}
    values = dataflow.from_items([{"value": v} for v in (20.0, 40.0, 60.0, 80.0, 100.0)])
    assert values.aggregate(ApproximateQuantile(on="value", quantiles=[0.1, 0.5, 0.9])) == {
        "approx_quantile(value)": [20.0, 60.0, 100.0]}
    two = dataflow.from_items([{"v": 50000}, {"v": 60000}, {"v": None}])  # Ray's summary example: the upper one
    assert two.aggregate(ApproximateQuantile("v", [0.5]))["approx_quantile(v)"] == [60000.0]
    items = [{"g": i % 3, "v": None if i % 10 == 0 else i % 7, "tags": [i % 2, i % 5]} for i in range(300)]
    ds = dataflow.from_items(items, override_num_blocks=6)
    out = {r["g"]: r for r in ds.groupby("g").aggregate(
        ValueCounter("v"), ApproximateTopK("v", k=2, alias_name="top"), ApproximateTopK("tags", k=1, encode_lists=True),
        ApproximateQuantile("v", [0.0, 0.5, 1.0], alias_name="q")).take_all()}
    for g in range(3):
        vs = [r["v"] for r in items if r["g"] == g and r["v"] is not None]
        with_nulls = [r["v"] for r in items if r["g"] == g]
        counter = out[g]["value_counter(v)"]
        assert sorted(zip(counter["values"], counter["counts"], strict=True), key=str) == sorted(
            ((v, with_nulls.count(v)) for v in set(with_nulls)), key=str)  # null among the values, as Ray's
        most = sorted({v: vs.count(v) for v in vs}.values(), reverse=True)[:2]
        assert [t["count"] for t in out[g]["top"]] == most
        assert all(vs.count(t["v"]) == t["count"] for t in out[g]["top"])
        ordered = sorted(vs)
        assert out[g]["q"] == [float(ordered[0]), float(ordered[len(ordered) // 2]), float(ordered[-1])]
        tags = [t for r in items if r["g"] == g for t in r["tags"]]
        (top_tag,) = out[g]["approx_topk(tags)"]  # the items of the lists are counted (ties: either)
        assert top_tag["count"] == tags.count(top_tag["tags"]) == max(tags.count(t) for t in set(tags))
    with pytest.raises(ValueError, match="quantiles must be"):
        ApproximateQuantile("v", [1.5])
    with pytest.raises(ValueError, match="k must be a positive int"):
        ApproximateTopK("v", k=0)


def test_summary_by_column_type(mode):
    """Ray 2.60's summary: its docstring example gives its documented numbers and shapes."""
    items = [{"age": 25, "salary": 50000, "name": "Alice", "city": "NYC"},
             {"age": 30, "salary": 60000, "name": None, "city": "LA"},
             {"age": 0, "salary": None, "name": "Bob", "city": None}]
    summary = dataflow.from_items(items).summary()
    frame = summary.to_pandas()
    assert list(frame.columns) == ["statistic", "age", "city", "name", "salary"]  # sorted, as Ray's
    assert frame["statistic"].tolist() == ["approx_quantile[0]", "approx_topk[0]", "approx_topk[1]", "count", "max",
                                           "mean", "min", "missing_pct", "std", "zero_pct"]
    age = dict(zip(*summary.get_column_stats("age").to_dict("list").values(), strict=True))
    assert age["approx_quantile[0]"] == 25 and age["count"] == 3 and age["max"] == 30 and age["min"] == 0
    assert age["mean"] == pytest.approx(18.333333) and age["std"] == pytest.approx(13.123346)  # ddof=0, as Ray's
    assert age["missing_pct"] == 0 and age["zero_pct"] == pytest.approx(33.333333)
    salary = dict(zip(frame["statistic"], frame["salary"], strict=True))
    assert salary["approx_quantile[0]"] == 60000 and salary["count"] == 3 and salary["std"] == 5000
    assert salary["missing_pct"] == pytest.approx(33.333333) and salary["zero_pct"] == 0
    name = dict(zip(frame["statistic"], frame["name"], strict=True))
    assert name["count"] == 3 and name["missing_pct"] == pytest.approx(33.333333)  # count: every row, as Ray's
    assert sorted(name[f"approx_topk[{i}]"]["name"] for i in range(2)) == ["Alice", "Bob"]
    assert all(name[f"approx_topk[{i}]"]["count"] == 1 for i in range(2))
    flags = dict(zip(*dataflow.from_items([{"f": True}, {"f": False}, {"f": None}, {"f": True}]).summary()
                     .get_column_stats("f").to_dict("list").values(), strict=True))
    assert flags["mean"] == pytest.approx(2 / 3) and flags["zero_pct"] == pytest.approx(100 / 3)  # booleans are numbers
    assert dataflow.from_items(items).summary(columns=["age"]).to_pandas().columns.tolist() == ["statistic", "age"]
    with pytest.raises(ValueError, match="nope"):
        dataflow.from_items(items).summary(columns=["nope"])
    with pytest.raises(ValueError, match="not found in summary"):
        summary.get_column_stats("nope")
    # Ray's override_dtype_agg_mapping, keyed by its DataType (or a pyarrow type, or a category)
    from dataflow.aggregate import Count, Sum
    from dataflow.datatype import DataType

    custom = dataflow.from_items(items).summary(override_dtype_agg_mapping={
        DataType.int64(): lambda col: [Count(on=col), Sum(on=col)],
        "temporal": lambda col: [Count(on=col)],  # a category key that no column here has
    })
    sums = custom.to_pandas().set_index("statistic")
    assert sums.loc["sum", "age"] == 55 and sums.loc["sum", "salary"] == 110000 and "mean" not in sums.index
    assert sums.loc["count", "name"] == 3  # other types keep Ray's defaults
    assert dataflow.from_items(items).summary(override_dtype_agg_mapping={pa.int64(): lambda col: [Sum(on=col)]}
                                              ).to_pandas().set_index("statistic").loc["sum", "age"] == 55
    with pytest.raises(TypeError, match="override_dtype_agg_mapping keys"):
        dataflow.from_items(items).summary(override_dtype_agg_mapping={"int": lambda col: []})


def test_grouped_with_column_adds_an_expression_column(mode):
    from dataflow.expressions import col

    items = [{"group": g, "value": v} for g in (1, 2, 3) for v in range(4)]
    ds = dataflow.from_items(items).groupby("group").with_column("twice", col("value") * 2)
    rows = ds.sort(["group", "value"]).take_all()
    assert rows == [{**r, "twice": r["value"] * 2} for r in items]  # Ray's docstring example, grown
    groups = [r["group"] for r in ds.take_all()]
    assert [g for i, g in enumerate(groups) if i == 0 or groups[i - 1] != g] == sorted(set(groups), key=groups.index)
    with pytest.raises(TypeError, match="expression"):
        dataflow.from_items(items).groupby("group").with_column("x", lambda r: 1)


def test_map_groups_sees_whole_groups(mode):
    ds = _rows(3000, blocks=9)

    def summarize(group):
        assert len(set(group["k"].tolist())) == 1
        return {"k": group["k"][:1], "n": np.array([len(group["k"])]), "first": group["id"][:1]}

    out = sorted(ds.groupby("k").map_groups(summarize, batch_format="numpy").take_all(), key=lambda r: r["k"])
    assert [r["n"] for r in out] == [len(range(k, 3000, 7)) for k in range(7)]

    class Scale:
        def __init__(self, factor):
            self.factor = factor

        def __call__(self, group):
            return group.assign(v=group["v"] * self.factor)

    scaled = ds.groupby("k").map_groups(Scale, batch_format="pandas", fn_constructor_args=(2,))
    assert sorted(r["v"] for r in scaled.take_all()) == sorted(2 * r["v"] for r in ds.take_all())


def test_map_groups_default_batches_are_pandas_frames_as_in_ray(mode):
    """Ray 2.60 hands each group to ``fn`` as a pandas DataFrame unless told otherwise (its
    docstring says NumPy; its code promotes Arrow groups to pandas), so Ray scripts call
    DataFrame methods on it; None gives the group's pyarrow Table (Ray: the block itself)."""
    import pandas as pd

    ds = dataflow.from_items([{"k": i % 2, "v": float(i)} for i in range(6)])

    def first(df):
        return df.assign(total=df["v"].sum()).head(1)

    out = sorted(ds.groupby("k").map_groups(first).take_all(), key=lambda r: r["k"])
    assert out == [{"k": 0, "v": 0.0, "total": 6.0}, {"k": 1, "v": 1.0, "total": 9.0}]
    kinds = ds.groupby("k").map_groups(lambda df: pd.DataFrame({"kind": [type(df).__name__], "dtype": [str(df["v"].dtype)]}))
    assert {(r["kind"], r["dtype"]) for r in kinds.take_all()} == {("DataFrame", "double[pyarrow]")}
    tables = ds.groupby("k").map_groups(lambda t: pa.table({"kind": [type(t).__name__]}), batch_format=None)
    assert {r["kind"] for r in tables.take_all()} == {"Table"}


def test_map_groups_error_is_the_udfs_own(mode):
    def bad(group):
        raise ZeroDivisionError("no groups today")

    with pytest.raises(ZeroDivisionError, match="no groups today") as info:
        dataflow.range(100).groupby("id").map_groups(bad).take_all()
    assert "bad" in str(info.value) or "bad" in "".join(getattr(info.value, "__notes__", []))


def test_groupby_missing_key_names_the_column(mode, exchange):
    with pytest.raises(KeyError, match="nope"):
        dataflow.range(10).groupby("nope").count().take_all()


# repartition, zip, join -------------------------------------------------------------------------
def test_repartition_sets_blocks_and_files(mode, tmp_path):
    ds = _rows(1000, blocks=3)
    m = ds.repartition(7).materialize()
    assert m.num_blocks() == 7 and [r["id"] for r in m.take_all()] == list(range(1000))
    dealt = [b["id"].to_pylist() for b in ds.repartition(4, shuffle=True).iter_batches(
        batch_size=None, batch_format="pyarrow")]  # row k to block k % 4: same blocks every run
    assert sorted(dealt) == [list(range(j, 1000, 4)) for j in range(4)]  # (blocks come as tasks end)
    by_rows = ds.repartition(target_num_rows_per_block=300).materialize()
    assert by_rows.num_blocks() == 4 and by_rows.count() == 1000
    keyed = ds.repartition(3, keys="k").materialize()
    assert keyed.num_blocks() == 3 and keyed.count() == 1000
    ds.repartition(1).write_parquet(str(tmp_path / "one"))
    assert len(list((tmp_path / "one").glob("*.parquet"))) == 1
    ds.repartition(5).write_parquet(str(tmp_path / "five"))
    files = list((tmp_path / "five").glob("*.parquet"))
    assert len(files) == 5 and sum(pq.ParquetFile(f).metadata.num_rows for f in files) == 1000
    with pytest.raises(ValueError):
        ds.repartition(0)


def test_repartition_to_more_blocks_than_rows_makes_empty_blocks(mode, tmp_path):
    """As Ray 2.60: ``repartition(10)`` of 5 rows is 10 blocks, 5 of them empty, in every
    variant (Ray's shuffle and keys variants put 2 rows in some blocks: here none does); the
    empty ones keep the schema, and a write skips them."""
    ds = dataflow.range(5, override_num_blocks=2)
    for variant in (ds.repartition(10), ds.repartition(10, shuffle=True), ds.repartition(10, keys="id")):
        m = variant.materialize()
        assert m.num_blocks() == 10 and sorted(r["id"] for r in m.take_all()) == list(range(5))
        assert m.schema().names == ["id"]
        sizes = sorted(len(b["id"]) for b in m.iter_batches(batch_size=None, batch_format="pyarrow"))
        assert sum(sizes) == 5 and all(size <= 1 for size in sizes)
    ds.repartition(10).write_parquet(str(tmp_path / "w"))
    files = list((tmp_path / "w").glob("*.parquet"))
    assert len(files) == 5 and sum(pq.ParquetFile(f).metadata.num_rows for f in files) == 5
    assert dataflow.range(0).repartition(4).materialize().num_blocks() == 4


def test_zip(mode):
    a = dataflow.range(1000, override_num_blocks=3)
    b = dataflow.range(1000, override_num_blocks=8).map(lambda r: {"id": r["id"] * 2, "y": str(r["id"])})
    rows = a.zip(b).take_all()
    assert rows[:2] == [{"id": 0, "id_1": 0, "y": "0"}, {"id": 1, "id_1": 2, "y": "1"}]
    assert all(r["id_1"] == 2 * r["id"] and r["y"] == str(r["id"]) for r in rows)
    with pytest.raises(ValueError, match="different number of rows"):
        a.zip(dataflow.range(10)).take_all()


@pytest.mark.parametrize("how", ["inner", "left_outer", "right_outer", "full_outer"])
def test_join_types(mode, how):
    left = dataflow.from_items([{"id": i, "x": i * 10} for i in range(0, 300)] + [{"id": None, "x": -1}])
    right = dataflow.from_items([{"key": i, "y": str(i), "tags": [i, i]} for i in range(150, 450)] + [{"key": None, "y": "n", "tags": []}])
    rows = left.join(right, how, num_partitions=4, on=("id",), right_on=("key",)).take_all()
    ids = sorted((r.get("id") if r.get("id") is not None else r.get("key")) for r in rows if (r.get("id") if r.get("id") is not None else r.get("key")) is not None)
    expected = {
        "inner": list(range(150, 300)),
        "left_outer": list(range(0, 300)),
        "right_outer": list(range(150, 450)),
        "full_outer": list(range(0, 450)),
    }[how]
    assert ids == expected
    matched = [r for r in rows if r.get("x") is not None and r.get("y") is not None]
    assert len(matched) == 150  # null keys never match
    assert all(r["y"] == str(r["x"] // 10) and r["tags"] == [r["x"] // 10] * 2 for r in matched)


def test_join_type_mismatch_and_errors(mode):
    left = dataflow.from_arrow(pa.table({"id": pa.array([1, 2, 3], pa.int32()), "a": [1, 2, 3]}))
    right = dataflow.from_arrow(pa.table({"id": pa.array([2, 3, 4], pa.int64()), "b": ["x", "y", "z"]}))
    assert sorted(r["b"] for r in left.join(right, "inner", on="id").take_all()) == ["x", "y"]
    with pytest.raises(ValueError, match="join_type"):
        left.join(right, "sideways")


def test_join_columns_on_both_sides_need_a_suffix(mode, exchange):
    """Without suffixes the right side's ``v`` replaced the left's, silently; Ray raises."""
    left = dataflow.from_items([{"k": 1, "v": "L"}, {"k": 2, "v": "L2"}])
    right = dataflow.from_items([{"k": 1, "v": "R"}])
    for how in ("inner", "left_outer", "right_outer", "full_outer"):
        with pytest.raises(ValueError, match=r"suffixes cannot be both None \(overlapping columns: \['v'\]\)"):
            left.join(right, how, 2, on=("k",)).take_all()
    rows = left.join(right, "left_outer", 2, on=("k",), left_suffix="_l").sort("k").take_all()
    assert rows == [{"k": 1, "v_l": "L", "v": "R"}, {"k": 2, "v_l": "L2", "v": None}]
    assert left.join(right, "left_semi", 2, on=("k",)).take_all() == [{"k": 1, "v": "L"}]  # one side's columns
    with pytest.raises(ValueError, match="more than one column named \\['v_x'\\]"):
        left.join(right, "inner", 2, on=("k",), left_suffix="_x", right_suffix="_x").take_all()


@pytest.mark.parametrize("emptied", ["filter", "limit"])
def test_outer_and_anti_joins_against_a_side_with_no_rows(mode, emptied):
    """A side emptied to no blocks dropped every row of the other side, silently (Ray 2.60
    raises ColumnNotFoundError after a filter); its columns come from its plan, as nulls."""
    full = dataflow.from_items([{"id": i, "a": i} for i in range(3)])
    other = dataflow.from_items([{"id": i, "b": float(i)} for i in range(3)])
    empty = other.filter(lambda r: False) if emptied == "filter" else other.limit(0)
    nulls = [{"id": i, "a": i, "b": None} for i in range(3)]
    for how in ("left_outer", "full_outer"):
        joined = full.join(empty, how, 2, on=("id",))
        assert sorted(joined.take_all(), key=lambda r: r["id"]) == nulls
        assert joined.materialize().schema().base_schema == pa.schema([("id", pa.int64()), ("a", pa.int64()), ("b", pa.float64())])
    right = empty.join(full, "right_outer", 2, on=("id",)).take_all()
    assert sorted(right, key=lambda r: r["id"]) == [{"b": None, "id": i, "a": i} for i in range(3)]
    assert sorted(r["id"] for r in full.join(empty, "left_anti", 2, on=("id",)).take_all()) == [0, 1, 2]
    assert sorted(r["id"] for r in empty.join(full, "right_anti", 2, on=("id",)).take_all()) == [0, 1, 2]
    for how in ("inner", "left_semi", "right_outer"):
        assert full.join(empty, how, 2, on=("id",)).take_all() == []
    unknown = dataflow.range(3).map_batches(lambda b: {"id": b["id"], "b": b["id"]}).filter(lambda r: False)
    with pytest.raises(ValueError, match="the right dataset has no rows, and its columns cannot be told"):
        full.join(unknown, "left_outer", 2, on=("id",)).take_all()
    assert sorted(r["id"] for r in full.join(unknown, "left_anti", 2, on=("id",)).take_all()) == [0, 1, 2]


def test_join_carries_tensor_columns(mode):
    """A fixed-shape tensor column failed Arrow's join (not supported in join non-key field emb)."""
    emb = dataflow.range(4).map_batches(lambda b: {"id": b["id"], "emb": np.stack([b["id"]] * 3, axis=1) * 1.0})
    names = dataflow.from_items([{"id": i, "name": f"n{i}"} for i in range(3)])
    rows = sorted(emb.join(names, "left_outer", 2, on=("id",)).take_all(), key=lambda r: r["id"])
    assert [(r["id"], r["name"], r["emb"].tolist()) for r in rows] == [
        (0, "n0", [0.0] * 3), (1, "n1", [1.0] * 3), (2, "n2", [2.0] * 3), (3, None, [3.0] * 3)]
    assert len(names.join(emb, "inner", 2, on=("id",)).take_all()) == 3


def test_join_right_on_keeps_the_left_key_names(mode):
    """A right column named as the left key renamed the left key too (k_l); Ray keeps ``k``."""
    left = dataflow.from_items([{"k": 1, "v": 1}])
    right = dataflow.from_items([{"kk": 1, "k": 5}, {"kk": 2, "k": 6}])
    for how in ("inner", "left_outer"):
        assert left.join(right, how, 2, on=("k",), right_on=("kk",), left_suffix="_l", right_suffix="_r").take_all() == [
            {"k": 1, "v": 1, "k_r": 5}]
        assert left.join(right, how, 2, on=("k",), right_on=("kk",), left_suffix="_l").take_all() == [
            {"k": 1, "v": 1, "k_right": 5}]
    full = left.join(right, "full_outer", 2, on=("k",), right_on=("kk",), right_suffix="_r").sort("k").take_all()
    assert full == [{"k": 1, "v": 1, "k_r": 5}, {"k": 2, "v": None, "k_r": 6}]


def test_join_keeps_a_left_column_named_as_the_right_key(mode):
    """Left {a, b} joined on a = right's b: a right outer join kept the right key as b and
    dropped the left's b without a word."""
    left = dataflow.from_items([{"a": i, "b": i * 10} for i in range(3)])
    right = dataflow.from_items([{"b": i, "c": i * 100} for i in range(1, 4)])
    for how in ("inner", "left_outer", "right_outer", "full_outer"):
        rows = left.join(right, how, 2, on=("a",), right_on=("b",), left_suffix="_l", right_suffix="_r").take_all()
        assert all("b_l" in r for r in rows) and {r["b_l"] for r in rows if r["b_l"] is not None} >= {10, 20}, (how, rows)
    with pytest.raises(ValueError, match="'b' is named as a right key"):
        left.join(right, "inner", 2, on=("a",), right_on=("b",), right_suffix="_r").take_all()


def test_join_validate_schemas_remote_args_and_size_hint(mode):
    """validate_schemas, aggregator_ray_remote_args and partition_size_hint were ignored."""
    from engine.errors import ResourceError

    ints = dataflow.from_items([{"k": 1, "v": 1}])
    strings = dataflow.from_items([{"k": "1", "w": 1}])
    with pytest.raises(ValueError, match=r"Key columns are expected to be present and have the same types.*left 'k': int64 and right 'k': string"):
        ints.join(strings, "inner", 2, on=("k",), validate_schemas=True)
    with pytest.raises(ValueError, match="left 'z': missing and right 'z': missing"):
        ints.join(strings, "inner", 2, on=("z",), validate_schemas=True)
    same = dataflow.from_items([{"k": 1, "w": 2}])
    assert ints.join(same, "inner", 2, on=("k",), validate_schemas=True).take_all() == [{"k": 1, "v": 1, "w": 2}]
    assert ints.join(same, "inner", 2, on=("k",), aggregator_ray_remote_args={"num_cpus": 1}).take_all() == [
        {"k": 1, "v": 1, "w": 2}]
    with pytest.raises(ResourceError, match="no_such_device"):  # held by its tasks: it could never run
        ints.join(same, "inner", 2, on=("k",), aggregator_ray_remote_args={"resources": {"no_such_device": 1}}).take_all()
    with pytest.raises(ValueError, match=r"aggregator_ray_remote_args=\{'memory': \.\.\.\}"):
        ints.join(same, "inner", 2, on=("k",), aggregator_ray_remote_args={"memory": 1 << 30})
    with pytest.raises(TypeError, match="unexpected keyword argument 'foo'"):
        ints.join(same, "inner", 2, on=("k",), aggregator_ray_remote_args={"foo": 1})
    with pytest.warns(DeprecationWarning, match="partition_size_hint"):
        joined = ints.join(same, "inner", 2, on=("k",), partition_size_hint=1 << 20)
    assert joined.take_all() == [{"k": 1, "v": 1, "w": 2}]


def test_zip_count_checks_rows_and_names_repeats_as_ray(mode):
    """count() gave the first input's rows (3) where Ray raises; a third ``x`` was ``x_1_``
    after an ``x_1`` (Ray: ``x_2``), and a later ``x_1`` was ``x_1_3`` (Ray: ``x_1_1``)."""
    with pytest.raises(ValueError, match="Cannot zip datasets of different number of rows: 3, 5"):
        dataflow.range(3).zip(dataflow.range(5)).count()
    with pytest.raises(ValueError, match="Cannot zip datasets of different number of rows: 3, 5"):
        dataflow.range(3).zip(dataflow.range(5).map_batches(lambda b: b)).count()
    assert dataflow.range(3).zip(dataflow.range(3)).count() == 3
    x = [dataflow.from_items([{"x": i}]) for i in range(4)]
    assert dataflow.from_items([{"x": 0, "x_1": 9}]).zip(x[1], x[2]).take_all() == [{"x": 0, "x_1": 9, "x_2": 1, "x_3": 2}]
    with_x1 = dataflow.from_items([{"x": 3, "x_1": 9}])
    assert x[0].zip(x[1], x[2], with_x1).take_all() == [{"x": 0, "x_1": 1, "x_2": 2, "x_3": 3, "x_1_1": 9}]


def test_union_of_sorted_and_shuffled(mode):
    a = dataflow.range(100).sort("id", descending=True)
    b = dataflow.range(100).random_shuffle(seed=1)
    assert sorted(r["id"] for r in a.union(b).take_all()) == sorted(list(range(100)) * 2)


# out of core ------------------------------------------------------------------------------------
MiB = 1 << 20


def _wide(batch):
    n = len(batch["id"])
    return {"id": batch["id"], "k": batch["id"] % 97, "pad": np.ones((n, 1024), dtype=np.float64)}  # 8 KiB a row


@pytest.mark.timeout(240)
@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
@pytest.mark.parametrize("step", ["sort", "sort_files", "shuffle", "map_groups", "groupby", "join"])
def test_out_of_core_at_three_times_the_store(step, warm, fresh_engine, tmp_path):
    """Cold, the first tasks run while workers start; warm, both workers take the first wave at
    once (bundles of up to 24 MiB each overshot a 32 MiB store to 94 MB before tasks were capped
    to fit their operator's share)."""
    from engine import session

    dataflow.init(execution_mode="streaming", num_cpus=2, object_store_memory=32 * MiB)
    if warm:
        assert session.current_session().executor.wait_for_workers()
    ds = dataflow.range(12_000, override_num_blocks=48).map_batches(_wide)  # ~96 MiB
    if step == "sort_files":  # the same rows from files: sampled by a key-only read, partitioned as read
        ds.write_parquet(str(tmp_path / "wide"), min_rows_per_file=500)
        out = dataflow.read_parquet(str(tmp_path / "wide")).sort("id", descending=True).select_columns(["id"])
        ids = [r["id"] for r in out.take_all()]
        assert ids == list(range(11_999, -1, -1))
        assert "ReadParquet->SortMap" in out.stats(), out.stats()
    elif step == "sort":
        out = ds.sort("id", descending=True).select_columns(["id"])
        ids = [r["id"] for r in out.take_all()]
        assert ids == list(range(11_999, -1, -1))
    elif step == "shuffle":
        ids = [r["id"] for r in ds.random_shuffle(seed=2).select_columns(["id"]).take_all()]
        assert sorted(ids) == list(range(12_000)) and ids != list(range(12_000))
    elif step == "join":  # both sides partitioned, the wide one three times the store
        right = dataflow.range(12_000, override_num_blocks=4).map_batches(lambda b: {"id": b["id"], "w": b["id"] * 2})
        rows = ds.join(right, "inner", on=("id",)).select_columns(["id", "w"]).take_all()
        assert sorted(r["id"] for r in rows) == list(range(12_000)) and all(r["w"] == 2 * r["id"] for r in rows)
    elif step == "map_groups":
        sizes = ds.groupby("k").map_groups(lambda g: {"k": g["k"][:1], "n": [len(g["k"])]}, batch_format="numpy")
        assert {r["k"]: r["n"] for r in sizes.take_all()} == {k: len(range(k, 12_000, 97)) for k in range(97)}
    else:  # partial states on the map side: only they cross the exchange
        got = {r["k"]: r["count()"] for r in ds.groupby("k").count().take_all()}
        assert got == {k: len(range(k, 12_000, 97)) for k in range(97)}
    executor = session.current_session().executor
    executor.sync()
    stats = executor.statistics()
    print(stats)
    if step != "groupby":
        assert stats["spilled_bytes"] > 32 * MiB  # the map outputs went to disk...
    assert stats["store_peak"] <= 32 * MiB + 8 * MiB  # ...and shared memory stayed near its capacity
    assert [f for f in os.listdir(executor.store.spill_dir) if f.endswith(".arrow")] == []  # nothing left behind


def _payload(batch):
    n = len(batch["id"])
    rng = np.random.default_rng(int(batch["id"][0]) if n else 0)
    letters = rng.integers(97, 123, (n, 2000), dtype=np.uint8)
    return {"id": batch["id"], "k": batch["id"] % 97, "s": [row.tobytes().decode() for row in letters]}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("step", ["sort", "join"])
def test_spilled_map_outputs_give_back_each_slice_as_it_is_read(step, fresh_engine):
    """Each reduce task reads one slice of every spilled map output; once it is done, the pages
    only that slice's rows occupy are punched out (``engine.row_pages``), not kept until the
    block's last slice is read: the answer is the same, and the stats say how much went back."""
    from engine import row_pages, session

    if not row_pages.can_punch():
        pytest.skip("no fallocate(PUNCH_HOLE) here")
    dataflow.init(execution_mode="streaming", num_cpus=2, object_store_memory=32 * MiB)
    ds = dataflow.range(48_000, override_num_blocks=48).map_batches(_payload)  # ~96 MiB of strings
    if step == "sort":
        out = ds.sort("k", descending=True)
        checked = out.take_all()
        assert [(r["k"], r["id"]) for r in checked] == sorted(((i % 97, i) for i in range(48_000)), key=lambda t: -t[0])
    else:
        right = dataflow.range(48_000, override_num_blocks=4).map_batches(lambda b: {"id": b["id"], "w": b["id"] * 2})
        out = ds.join(right, "inner", on=("id",))
        checked = out.take_all()
        assert all(r["w"] == 2 * r["id"] for r in checked)
    expected = {}
    for start in range(0, 48_000, 1000):  # the strings, made again as the blocks of 1,000 rows made them
        expected.update(zip(range(start, start + 1000), _payload({"id": np.arange(start, start + 1000)})["s"]))
    assert sorted(r["id"] for r in checked) == list(range(48_000))
    assert all(r["s"] == expected[r["id"]] for r in checked)
    given = re.search(r"gave back ([\d.]+) MiB of spilled map outputs", out.stats())
    assert given is not None and float(given.group(1)) > 16, out.stats()
    executor = session.current_session().executor
    executor.sync()
    assert [f for f in os.listdir(executor.store.spill_dir) if f.endswith(".arrow")] == []


def _groups_killing_once(marker: str):
    driver = os.getpid()  # (by value: the closure travels to the worker)

    def udf(group):
        if group["k"][0] == 13 and os.getpid() != driver and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return {"k": group["k"][:1], "ids": [sorted(group["id"].tolist())],
                "digest": [hashlib.sha256("".join(group["s"]).encode()).hexdigest()]}

    return udf


@pytest.mark.timeout(240)
def test_a_reduce_task_killed_after_others_gave_their_pages_back_reads_its_slices_whole(fresh_engine, tmp_path):
    """Reduce tasks that finished punched their slices' pages out of the shared map outputs; one
    killed after reading its own slices runs again and reads them as they were: its pages go
    only once a run of it is done."""
    from engine import row_pages, session

    if not row_pages.can_punch():
        pytest.skip("no fallocate(PUNCH_HOLE) here")
    dataflow.init(execution_mode="streaming", num_cpus=2, object_store_memory=32 * MiB)
    assert session.current_session().executor.wait_for_workers()
    marker = str(tmp_path / "killed")
    ds = dataflow.range(48_000, override_num_blocks=48).map_batches(_payload)
    out = ds.groupby("k").map_groups(_groups_killing_once(marker), batch_format="numpy")
    rows = {r["k"]: r for r in out.take_all()}
    assert os.path.exists(marker), "the worker was never killed"
    expected = {}
    for start in range(0, 48_000, 1000):
        expected.update(zip(range(start, start + 1000), _payload({"id": np.arange(start, start + 1000)})["s"]))
    for k in range(97):
        ids = list(range(k, 48_000, 97))
        assert list(rows[k]["ids"]) == ids
        assert rows[k]["digest"] == hashlib.sha256("".join(expected[i] for i in ids).encode()).hexdigest(), k
    stats = out.stats()
    assert "retried 1 tasks" in stats and "gave back" in stats, stats


def _slow_identity(batch):
    time.sleep(0.004)
    return batch


def test_map_outputs_are_merged_while_the_map_tasks_run(mode):
    """Past 64 map outputs the reduce merges them 32 at a time while the maps still run (an
    aggregation's partial states merged per group): the results are those of no merge."""
    with dataflow.options(min_task_input_bytes=1):
        ds = _rows(12_800, blocks=128).materialize()  # 128 blocks
    shuffled = [r["id"] for r in ds.random_shuffle(seed=5).take_all()]  # one task: no merge
    rows = ds.take_all()
    with dataflow.options(small_exchange_bytes=0, min_task_input_bytes=1):  # a map task per block
        # map tasks of a few ms: outputs arrive over many turns of the loop, so merges run while
        # maps remain even on a loaded machine (tasks of ~0.1 ms could all end in one turn)
        slow = ds.map_batches(_slow_identity, batch_format="pyarrow")
        steps = {
            "RandomShuffle": slow.random_shuffle(seed=5),
            "Sort": slow.sort(["s", "v"], descending=[False, True]),
            "Aggregate[k]": slow.groupby("k").aggregate(Count(), Sum("v"), Min("v"), Mean("v"), Std("v"), AbsMax("v")),
            # every key distinct: the map side ships rows, not states, and the merges make them states
            "Aggregate[id]": slow.groupby("id").aggregate(Count(), Sum("v"), Mean("v"), Std("v", ddof=0)),
        }
        got, merges = {}, {}
        for name, step in steps.items():
            got[name] = step.take_all()
            merges[name] = next(op.merges for op in step._last_handle.stats().operators if op.name == name)
            assert mode == "local" or f"merged its map outputs in {merges[name]} tasks" in step.stats()
    assert [r["id"] for r in got["RandomShuffle"]] == shuffled
    assert got["Sort"] == sorted(rows, key=lambda r: (r["s"], -r["v"]))  # stable: ties keep input order
    for r in got["Aggregate[k]"]:
        values = [x["v"] for x in rows if x["k"] == r["k"]]
        assert r["count()"] == len(values) and r["sum(v)"] == pytest.approx(sum(values))
        assert r["min(v)"] == min(values) and r["abs_max(v)"] == max(abs(v) for v in values)
        assert r["mean(v)"] == pytest.approx(statistics.mean(values), rel=1e-9)
        assert r["std(v)"] == pytest.approx(statistics.stdev(values), rel=1e-9)
    assert sorted((r["id"], r["count()"], r["sum(v)"], r["mean(v)"], r["std(v)"]) for r in got["Aggregate[id]"]) == sorted(
        (x["id"], 1, x["v"], x["v"], 0.0) for x in rows)
    if mode == "streaming":  # the in-process executor runs every map task first: nothing to merge
        # a merge is ready at the 64th and the 96th of the 128 outputs, with 32 map tasks or more
        # still to run: both run then (map tasks queued behind running ones used to take every
        # worker that freed up, so a merge waited for a moment with a worker idle: 0 or 1 merges)
        assert all(n == 2 for n in merges.values()), merges

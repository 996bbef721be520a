"""A join, a groupby, a top-k or a shuffle straight over files partitions in its read tasks
(``ReadParquet->...Map``), and a hash or top-k exchange after map steps in those steps' tasks:
they give the rows the separate map side gives, errors still name the column or the step, and
what may drop a failed read, needs row positions the source cannot count up front, or runs on
an actor pool keeps its own map side."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import dataflow
from connectors import file_datasource
from connectors.errors import FileFormatError
from dataflow.aggregate import Count, Sum
from engine.errors import ColumnNotFoundError


def _files(folder, table: pa.Table, parts: int) -> str:
    folder.mkdir()
    step = -(-table.num_rows // parts)
    for i in range(parts):
        pq.write_table(table.slice(i * step, step), folder / f"part-{i:02}.parquet")
    return str(folder)


@pytest.fixture
def sides(tmp_path):
    rng = np.random.default_rng(11)
    left = pa.table({"key": rng.integers(0, 3_000, 40_000), "v": rng.random(40_000),
                     "s": [f"row-{i}" for i in range(40_000)]})
    right = pa.table({"key": np.arange(0, 3_000, 2), "w": np.arange(1_500) * 10})
    return left, right, _files(tmp_path / "left", left, 8), _files(tmp_path / "right", right, 3)


def _sorted(rows: list[dict], *keys: str) -> list[dict]:
    return sorted(rows, key=lambda r: tuple(r[k] for k in keys))


def test_a_join_of_two_reads_partitions_in_the_read_tasks(mode, sides):
    left, right, left_dir, right_dir = sides
    joined = dataflow.read_parquet(left_dir).join(dataflow.read_parquet(right_dir), "inner", on=("key",))
    got = joined.take_all()
    want = left.join(right, "key", join_type="inner").to_pylist()
    assert _sorted(got, "s") == _sorted(want, "s")
    stats = joined.stats()
    assert stats.count("ReadParquet->Join[inner]Map") == 2, stats
    # the same join over blocks already in the store has a map side of its own: same rows
    stored = dataflow.read_parquet(left_dir).materialize().join(
        dataflow.read_parquet(right_dir).materialize(), "inner", on=("key",))
    assert _sorted(stored.take_all(), "s") == _sorted(got, "s")
    assert "ReadParquet->Join" not in stored.stats()
    # the same order on every run: the map outputs reach the reduce in read order
    assert dataflow.read_parquet(left_dir).join(dataflow.read_parquet(right_dir), "inner", on=("key",)).take_all() == got


@pytest.mark.parametrize("how", ["left_outer", "full_outer", "left_anti"])
def test_outer_and_anti_joins_over_reads(mode, sides, how):
    left, right, left_dir, right_dir = sides
    got = dataflow.read_parquet(left_dir).join(dataflow.read_parquet(right_dir), how, on=("key",)).take_all()
    arrow_how = {"left_outer": "left outer", "full_outer": "full outer", "left_anti": "left anti"}[how]
    want = left.join(right, "key", join_type=arrow_how).to_pylist()
    assert _sorted(got, "s") == _sorted(want, "s")


def test_a_groupby_over_a_read_partitions_in_the_read_tasks(mode, sides):
    left, _, left_dir, _ = sides
    with dataflow.options(small_exchange_bytes=0):  # (a small input would run as one task)
        grouped = dataflow.read_parquet(left_dir).groupby("key").aggregate(Sum("v"), Count())
        got = {r["key"]: (round(r["sum(v)"], 9), r["count()"]) for r in grouped.take_all()}
    want = left.group_by("key").aggregate([("v", "sum"), ("v", "count")]).to_pylist()
    assert got == {r["key"]: (round(r["v_sum"], 9), r["v_count"]) for r in want}
    assert "ReadParquet->Aggregate[key]Map" in grouped.stats(), grouped.stats()


def test_a_missing_join_key_fails_naming_it(mode, sides):
    _, _, left_dir, right_dir = sides
    ds = dataflow.read_parquet(left_dir).join(dataflow.read_parquet(right_dir), "inner", on=("nope",))
    with pytest.raises(ColumnNotFoundError, match="nope"):
        ds.take_all()


def test_tolerated_read_failures_keep_their_own_map_side(mode, sides):
    left, right, left_dir, right_dir = sides
    with dataflow.options(max_errored_blocks=1):
        joined = dataflow.read_parquet(left_dir).join(dataflow.read_parquet(right_dir), "inner", on=("key",))
        got = joined.take_all()
        shuffled = dataflow.read_parquet(left_dir).random_shuffle(seed=5)
        assert len(shuffled.take_all()) == left.num_rows
    assert len(got) == left.join(right, "key", join_type="inner").num_rows
    assert "ReadParquet->Join" not in joined.stats(), joined.stats()
    assert "ReadParquet->RandomShuffleMap" not in shuffled.stats(), shuffled.stats()


@pytest.fixture
def row_groups(tmp_path):
    """8 files of 5 row groups each: a read of 24 tasks splits some files into byte ranges."""
    table = pa.table({"id": np.arange(40_000), "s": [f"row-{i}" for i in range(40_000)]})
    folder = tmp_path / "groups"
    folder.mkdir()
    for i in range(8):
        pq.write_table(table.slice(i * 5_000, 5_000), folder / f"part-{i}.parquet", row_group_size=1_000)
    return table, str(folder)


@pytest.mark.parametrize("blocks", [None, 24])
def test_a_shuffle_over_files_partitions_in_the_read_tasks_with_the_rows_of_the_plain_path(
        mode, row_groups, blocks, monkeypatch):
    """``random_shuffle`` and ``repartition(n, shuffle=True)`` need each row's global position:
    the read tasks get theirs from the footers' row counts, so the result is, row for row, the
    one the separate read and map side give. Files are cut into byte ranges here (24 of them, or
    the default 200: many then hold no row group start and read nothing)."""
    table, folder = row_groups
    monkeypatch.setattr(file_datasource, "MIN_TASK_BYTES", 1)  # (files this small are split too)
    with dataflow.options(small_exchange_bytes=0):
        for step in (lambda ds: ds.random_shuffle(seed=5), lambda ds: ds.repartition(3, shuffle=True)):
            fused = step(dataflow.read_parquet(folder, override_num_blocks=blocks))
            got = [r["id"] for r in fused.take_all()]
            # a step between the read and the shuffle: the read feeds a map side of its own, in order
            plain = step(dataflow.read_parquet(folder, override_num_blocks=blocks).map_batches(lambda b: b))
            assert got == [r["id"] for r in plain.take_all()]
            assert "Operator 1 RandomShuffleMap" in plain.stats() or "Operator 1 Repartition[3, shuffle]Map" in plain.stats()
            assert sorted(got) == list(range(table.num_rows)) and got != sorted(got)
            stats = fused.stats()
            assert "ReadParquet->RandomShuffleMap" in stats or "ReadParquet->Repartition[3, shuffle]Map" in stats, stats
            tasks = int(stats.split("Map: ")[1].split(" tasks")[0])
            assert tasks > 8, stats  # byte ranges of files, some with no row group of their own


def test_a_shuffle_over_filtered_or_reshuffled_files_keeps_its_own_map_side(mode, row_groups):
    """Rows a filter drops, or a file order that changes with each execution, cannot be
    counted up front: the read feeds a map side of its own, in order, as before."""
    table, folder = row_groups
    with dataflow.options(small_exchange_bytes=0):
        filtered = dataflow.read_parquet(folder, filter=pc.field("id") < 30_000).random_shuffle(seed=1)
        got = [r["id"] for r in filtered.take_all()]
        assert sorted(got) == list(range(30_000))
        assert "ReadParquet->RandomShuffleMap" not in filtered.stats(), filtered.stats()
        listed = dataflow.read_parquet(folder, shuffle="files").random_shuffle(seed=1)
        assert sorted(r["id"] for r in listed.take_all()) == list(range(table.num_rows))
        assert "ReadParquet->RandomShuffleMap" not in listed.stats(), listed.stats()


def test_a_top_k_over_a_read_keeps_k_rows_per_read_task_and_ties_in_input_order(mode, tmp_path):
    """``sort(...).limit(k)`` straight over files: each read task keeps its own k candidates,
    so only k rows a task cross the store; equal keys come out in input order, as a stable
    sort of the whole input gives them."""
    rng = np.random.default_rng(5)
    table = pa.table({"score": rng.integers(0, 50, 30_000), "id": np.arange(30_000), "payload": ["x" * 40] * 30_000})
    folder = _files(tmp_path / "scores", table, 6)
    for descending in (False, True):
        with dataflow.options(small_exchange_bytes=0):
            ds = dataflow.read_parquet(folder).sort("score", descending=descending).limit(25)
            got = [r["id"] for r in ds.take_all()]
        order = "descending" if descending else "ascending"
        want = table.take(pc.sort_indices(table, sort_keys=[("score", order)]))["id"].to_pylist()[:25]
        assert got == want, descending
        stats = ds.stats()
        assert "ReadParquet->TopK[25]Map" in stats and "rows" in stats, stats


def test_a_sort_with_given_boundaries_partitions_in_the_read_tasks(mode, tmp_path):
    """``sort(key, boundaries=...)``: the ranges are known before any row is read, so the read
    tasks partition; one output block per range, rows in key order, ties in input order."""
    rng = np.random.default_rng(9)
    table = pa.table({"score": rng.integers(0, 100, 20_000), "id": np.arange(20_000)})
    folder = _files(tmp_path / "scores", table, 5)
    ds = dataflow.read_parquet(folder).sort("score", boundaries=[25, 50, 75]).materialize()
    assert "ReadParquet->SortMap" in ds.stats(), ds.stats()
    want = table.take(pc.sort_indices(table, sort_keys=[("score", "ascending")]))["id"].to_pylist()
    assert [r["id"] for r in ds.take_all()] == want
    assert ds.num_blocks() == 4


def test_a_shuffle_over_files_with_a_corrupt_footer_fails_naming_the_file(mode, tmp_path):
    """The footers are read to count the rows before any task runs: a file whose footer cannot
    be read (past the ones the schema was taken from) fails the job with its name."""
    folder = tmp_path / "files"
    folder.mkdir()
    table = pa.table({"id": np.arange(4_000)})
    for i in range(20):
        pq.write_table(table.slice(i * 200, 200), folder / f"part-{i:02}.parquet")
    (folder / "part-99.parquet").write_bytes(b"PAR1" + b"not a footer" * 8)
    with dataflow.options(small_exchange_bytes=0), pytest.raises(FileFormatError, match=r"part-99\.parquet"):
        dataflow.read_parquet(str(folder)).random_shuffle(seed=1).take_all()


def _doubled(batch: dict) -> dict:
    batch["v2"] = batch["v"] * 2
    return batch


def test_an_exchange_after_map_steps_partitions_in_their_tasks(mode, sides):
    """A groupby, a join or a top-k after ``map_batches`` partitions in the map's own tasks
    (``ReadParquet->MapBatches(_doubled)->Aggregate[key]Map``): the rows of the plain path,
    where the map's blocks go through the store to map tasks of their own."""
    left, right, left_dir, right_dir = sides
    with dataflow.options(small_exchange_bytes=0):
        grouped = dataflow.read_parquet(left_dir).map_batches(_doubled).groupby("key").aggregate(Sum("v2"), Count())
        got = {r["key"]: (round(r["sum(v2)"], 9), r["count()"]) for r in grouped.take_all()}
        assert "ReadParquet->MapBatches(_doubled)->Aggregate[key]Map" in grouped.stats(), grouped.stats()
        plain = dataflow.read_parquet(left_dir).map_batches(_doubled).materialize().groupby("key").aggregate(
            Sum("v2"), Count())
        assert got == {r["key"]: (round(r["sum(v2)"], 9), r["count()"]) for r in plain.take_all()}
        assert "Operator 1 Aggregate[key]Map" in plain.stats(), plain.stats()
        top = dataflow.read_parquet(left_dir).map_batches(_doubled).sort("v2", descending=True).limit(7)
        want = left.take(pc.sort_indices(left, sort_keys=[("v", "descending")]))["s"].to_pylist()[:7]
        assert [r["s"] for r in top.take_all()] == want
        assert "MapBatches(_doubled)->TopK[7]Map" in top.stats(), top.stats()
    joined = dataflow.read_parquet(left_dir).map_batches(_doubled).join(
        dataflow.read_parquet(right_dir).filter(expr="w >= 0"), "inner", on=("key",))
    rows = joined.take_all()
    assert sorted(r["s"] for r in rows) == sorted(left.join(right, "key", join_type="inner")["s"].to_pylist())
    assert all(r["v2"] == r["v"] * 2 for r in rows)
    assert "MapBatches(_doubled)->Join[inner]Map" in joined.stats(), joined.stats()
    assert [r["s"] for r in joined.take_all()] == [r["s"] for r in rows]  # the same order on every run


def _fails_on_row_7(batch: dict) -> dict:
    if 7 in batch["key"]:
        raise KeyError("no seven")
    return batch


class _Identity:
    def __call__(self, batch: dict) -> dict:
        return batch


def test_what_a_fused_map_side_keeps_apart(mode, sides):
    """A step's own error still names the step and keeps its type; an actor pool's steps keep a
    map side of their own (its actors' time is not spent partitioning); a small input may still
    go to one task whole."""
    _, _, left_dir, right_dir = sides
    with dataflow.options(small_exchange_bytes=0):
        with pytest.raises(KeyError, match="no seven") as info:
            dataflow.read_parquet(left_dir).map_batches(_fails_on_row_7).groupby("key").count().take_all()
        assert "_fails_on_row_7" in str(info.value), str(info.value)
        pooled = dataflow.read_parquet(left_dir).map_batches(_Identity, concurrency=1).groupby("key").count()
        assert len(pooled.take_all()) == 3_000
        assert "Operator 2 Aggregate[key]Map" in pooled.stats(), pooled.stats()
    small = dataflow.read_parquet(right_dir).map_batches(lambda batch: batch).groupby("key").count()
    assert len(small.take_all()) == 1_500
    assert "->Aggregate" not in small.stats() and "Aggregate[key]: 1 tasks" in small.stats(), small.stats()


def _explode(row: dict) -> list[dict]:
    return [{"k": (row["id"] * 7 + j) % 101, "v": float(j), "pad": "x" * 200} for j in range(2_000)]


def test_steps_that_make_far_more_than_they_read_are_partitioned_a_chunk_at_a_time(mode):
    """A ``flat_map`` before a groupby: its task partitions (and here pre-aggregates) one
    target block's worth at a time instead of holding its whole output (each of 4 tasks makes
    ~4.6 MB; with 1 MiB blocks, 101 groups per chunk come out of each of several chunks)."""
    with dataflow.options(small_exchange_bytes=0, target_max_block_size=1 << 20):
        ds = dataflow.range(40, override_num_blocks=4).flat_map(_explode).groupby("k").aggregate(Sum("v"), Count())
        got = sorted((r["k"], r["sum(v)"], r["count()"]) for r in ds.take_all())
        stats = ds.stats()
    want: dict[int, list[float]] = {}
    for i in range(40):
        for row in _explode({"id": i}):
            want.setdefault(row["k"], []).append(row["v"])
    assert got == sorted((k, sum(v), len(v)) for k, v in want.items())
    assert "ReadRange->FlatMap(_explode)->Aggregate[k]Map: 4 tasks" in stats, stats
    chunks = int(stats.split("Aggregate[k]Map: 4 tasks, ")[1].split(" rows")[0]) // 101
    assert chunks >= 8, stats  # at least two chunks a task, each with its own partial groups


def test_a_groupby_after_steps_over_a_large_materialized_dataset_partitions_in_their_tasks(mode):
    """With the default options a groupby may run as one task over a small input; steps over a
    materialized dataset past ``small_exchange_bytes`` (8 MiB) say it is not small, so the
    groupby partitions in their tasks; under that, the one task it was."""
    for rows, fused in ((1_500_000, True), (100_000, False)):  # 12 MB and 0.8 MB of int64
        stored = dataflow.range(rows, override_num_blocks=6).materialize()
        ds = stored.map_batches(lambda batch: {"k": batch["id"] % 10, "id": batch["id"]}).groupby("k").count()
        assert sorted((r["k"], r["count()"]) for r in ds.take_all()) == [(k, rows // 10) for k in range(10)]
        assert ("MapBatches(<lambda>)->Aggregate[k]Map" in ds.stats()) is fused, ds.stats()

"""Delta Lake: read a version's files from the log (partitions, time travel, pruning), write as one commit."""

from __future__ import annotations

import os
import sys

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from connector_testing import read_all

import dataflow
from connectors import io_stats

deltalake = pytest.importorskip("deltalake")

from connectors.delta_format import DeltaDatasource  # noqa: E402


def _table(n: int, start: int = 0) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table({"id": pa.array(ids, pa.int64()), "s": [f"row-{i}" for i in ids], "k": [i % 3 for i in ids]})


def _sorted_ids(rows: list[dict]) -> list[int]:
    return sorted(r["id"] for r in rows)


def _data_files(path) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(folder, name), path)
        for folder, _, names in os.walk(path)
        for name in names
        if "_delta_log" not in folder
    )


def test_round_trip_partitioned_on_both_modes(mode, tmp_path):
    path = str(tmp_path / "t")
    dataflow.from_arrow(_table(300), override_num_blocks=3).write_delta(path, partition_by=["k"])
    table = deltalake.DeltaTable(path)
    assert table.version() == 0 and table.metadata().partition_columns == ["k"]  # one commit
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == list(range(300))  # deltalake reads it
    assert all(f.split("/")[0] in ("k=0", "k=1", "k=2") for f in _data_files(path))

    ds = dataflow.read_delta(path)
    assert ds.count() == 300
    rows = ds.take_all()
    assert _sorted_ids(rows) == list(range(300))
    assert all(r["k"] == r["id"] % 3 for r in rows)  # the partition column, from the log, typed
    assert ds.schema().field("k").type == pa.int64()


def test_time_travel_and_modes(mode, tmp_path):
    path = str(tmp_path / "t")
    dataflow.from_arrow(_table(100)).write_delta(path)
    dataflow.from_arrow(_table(50, start=100)).write_delta(path, mode="append")
    dataflow.from_arrow(_table(10, start=1000)).write_delta(path, mode="overwrite")
    assert deltalake.DeltaTable(path).version() == 2
    assert _sorted_ids(dataflow.read_delta(path).take_all()) == list(range(1000, 1010))
    assert _sorted_ids(dataflow.read_delta(path, version=0).take_all()) == list(range(100))
    assert dataflow.read_delta(path, version=1).count() == 150

    dataflow.from_arrow(_table(5)).write_delta(path, mode="ignore")  # exists: nothing written
    assert deltalake.DeltaTable(path).version() == 2
    with pytest.raises(ValueError, match="exists"):
        dataflow.from_arrow(_table(5)).write_delta(path, mode="error")
    with pytest.raises(ValueError, match="mode must be one of"):
        dataflow.from_arrow(_table(5)).write_delta(path, mode="upsert")


def test_reads_tables_written_by_deltalake(tmp_path):
    path = str(tmp_path / "t")
    odd = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "p": ["a b", "x=y/z%", None]})
    deltalake.write_deltalake(path, odd, partition_by=["p"])
    # a later version adds a column: older files read it as nulls
    more = pa.table({"id": pa.array([4], pa.int64()), "p": ["a b"], "extra": [1.5]})
    deltalake.write_deltalake(path, more, mode="append", schema_mode="merge", partition_by=["p"])
    with dataflow.options(execution_mode="local"):
        rows = sorted(dataflow.read_delta(path).take_all(), key=lambda r: r["id"])
        assert rows == [
            {"id": 1, "extra": None, "p": "a b"},
            {"id": 2, "extra": None, "p": "x=y/z%"},
            {"id": 3, "extra": None, "p": None},
            {"id": 4, "extra": 1.5, "p": "a b"},
        ]
        files = dataflow.read_delta(path).input_files()  # the log's files, not a listing
        assert len(files) == 4 and all(f.startswith(path) and f.endswith(".parquet") for f in files)


def test_shuffle_orders_the_logs_files_and_scanner_arguments_are_refused(mode, tmp_path):
    """Ray's ``read_delta(shuffle=...)``: ``"files"`` a new file order each execution, a
    ``FileShuffleConfig`` seed the same orders for every dataset made with it (also under a
    filter); the ``**arrow_parquet_args`` Ray gives pyarrow's Scanner are refused by name."""
    path = str(tmp_path / "t")
    for i in range(8):
        deltalake.write_deltalake(path, _table(5, 5 * i), mode="append")

    def starts(ds) -> list[int]:  # the first id of each file, in the order read
        with dataflow.options(preserve_order=True):  # (else the blocks come as tasks finish)
            return [r["id"] for r in ds.take_all()][::5]

    plain = starts(dataflow.read_delta(path))
    assert sorted(plain) == list(range(0, 40, 5))
    files = dataflow.read_delta(path, shuffle="files")
    orders = [starts(files) for _ in range(4)]
    assert all(sorted(o) == sorted(plain) for o in orders) and len({tuple(o) for o in orders}) > 1
    seeded = dataflow.FileShuffleConfig(seed=3)
    a, b = dataflow.read_delta(path, shuffle=seeded), dataflow.read_delta(path, shuffle=seeded)
    first, second = starts(a), starts(a)
    assert first != second and (first, second) == (starts(b), starts(b))  # reseeded each execution
    assert sorted(first) == sorted(plain) and first != plain
    fixed = dataflow.FileShuffleConfig(seed=3, reseed_after_execution=False)
    kept = dataflow.read_delta(path, shuffle=fixed, filter=pc.field("id") >= 20)
    assert starts(kept) == starts(kept) and sorted(starts(kept)) == [20, 25, 30, 35]
    with pytest.raises(TypeError, match=r"read_delta\(dataset_kwargs=...\).*Scanner"):
        dataflow.read_delta(path, dataset_kwargs={})
    with pytest.raises(TypeError, match=r"read_delta.*'nope'"):
        dataflow.read_delta(path, nope=1)
    with pytest.raises(ValueError, match="shuffle"):
        dataflow.read_delta(path, shuffle="rows")


def test_filter_prunes_files_on_the_driver(tmp_path):
    path = str(tmp_path / "t")
    with dataflow.options(execution_mode="local"):
        # two writes x three partitions: six files; the second write's ids are all >= 50
        dataflow.from_arrow(_table(100).slice(0, 50)).write_delta(path, partition_by=["k"])
        dataflow.from_arrow(_table(100).slice(50)).write_delta(path, partition_by=["k"])
    source = DeltaDatasource(path)
    assert len(list(source.file_set.iter_files())) == 6
    io_stats.snapshot(reset=True)
    table = read_all(source.apply_filter((pc.field("k") == 1) & (pc.field("id") < 20)))
    counters = io_stats.snapshot(reset=True)
    assert sorted(table["id"].to_pylist()) == [i for i in range(20) if i % 3 == 1]
    assert counters["files_skipped"] == 5 and counters["files_read"] == 1
    narrow = read_all(source.apply_projection(["s"]))
    assert narrow.column_names == ["s"] and narrow.num_rows == 100
    assert source.count_rows() == 100  # from the log's statistics, nothing read


def test_filter_and_projection_through_the_dataset(mode, tmp_path):
    path = str(tmp_path / "t")
    dataflow.from_arrow(_table(90)).write_delta(path, partition_by=["k"])
    ds = dataflow.read_delta(path, columns=["id", "k"]).filter(expr=dataflow.col("k") == 2)
    assert ds.explain().split("Optimized Plan")[1].split() == ["--------", "ReadDelta"]
    rows = ds.take_all()
    assert _sorted_ids(rows) == [i for i in range(90) if i % 3 == 2]
    assert all(set(r) == {"id", "k"} for r in rows)


def test_failed_write_leaves_the_table_unchanged(mode, tmp_path):
    path = str(tmp_path / "t")
    dataflow.from_arrow(_table(30)).write_delta(path, partition_by=["k"])
    before = _data_files(path)

    def explode(row):
        if row["id"] == 77:
            raise ValueError("bad row 77")
        return row

    with pytest.raises(ValueError, match="bad row 77"):
        dataflow.from_arrow(_table(200), override_num_blocks=4).map(explode).write_delta(path, mode="overwrite")
    assert deltalake.DeltaTable(path).version() == 0
    assert _data_files(path) == before  # the staged files are gone too
    assert dataflow.read_delta(path).count() == 30


def test_a_failed_commit_removes_the_placed_files(tmp_path, monkeypatch):
    path = str(tmp_path / "t")
    with dataflow.options(execution_mode="local"):
        dataflow.from_arrow(_table(30)).write_delta(path)
        before = _data_files(path)

        def refuse(*args, **kwargs):
            raise RuntimeError("commit refused")

        monkeypatch.setattr(deltalake.DeltaTable, "create_write_transaction", refuse)
        with pytest.raises(RuntimeError, match="commit refused"):
            dataflow.from_arrow(_table(10, start=30)).write_delta(path)
    assert _data_files(path) == before and deltalake.DeltaTable(path).version() == 0


def test_appends_must_match_the_table(tmp_path):
    path = str(tmp_path / "t")
    with dataflow.options(execution_mode="local"):
        dataflow.from_arrow(_table(3)).write_delta(path, partition_by=["k"])
        # an int32 column is cast to the table's int64
        narrow = _table(3, start=3).set_column(0, "id", pa.array([3, 4, 5], pa.int32()))
        dataflow.from_arrow(narrow).write_delta(path)
        assert _sorted_ids(dataflow.read_delta(path).take_all()) == list(range(6))
        with pytest.raises(ValueError, match="partitioned by"):
            dataflow.from_arrow(_table(3)).write_delta(path, partition_by=["s"])
        with pytest.raises(Exception, match="missing columns"):
            dataflow.from_items([{"id": 1}]).write_delta(path)
    assert deltalake.DeltaTable(path).version() == 1


@pytest.mark.parametrize("execution", ["local", "streaming"])
def test_append_with_a_new_column_merges_the_schema_as_ray(tmp_path, execution):
    """Ray's ``schema_mode``: ``"merge"`` (the default) adds a column the table lacks, nullable,
    before the append's commit; ``"error"`` refuses it and leaves the table as it was."""
    path = str(tmp_path / "t")
    with dataflow.options(execution_mode=execution):
        dataflow.from_arrow(_table(3)).write_delta(path, partition_by=["k"])
        wider = _table(3, start=3).append_column("score", pa.array([0.5, 1.5, 2.5]))
        with pytest.raises(Exception, match=r"columns it does not have \['score'\]"):
            dataflow.from_arrow(wider).write_delta(path, schema_mode="error")
        assert deltalake.DeltaTable(path).version() == 0
        dataflow.from_arrow(wider).write_delta(path)  # merge, the default
        table = deltalake.DeltaTable(path)
        assert pa.schema(table.schema().to_arrow()).field("score").type == pa.float64()
        rows = {r["id"]: r["score"] for r in dataflow.read_delta(path).take_all()}
        assert rows == {0: None, 1: None, 2: None, 3: 0.5, 4: 1.5, 5: 2.5}
        assert table.version() == 2  # the column's commit, then the rows'
        with pytest.raises(ValueError, match=r"column 'id' \(string\) cannot be written as int64"):
            dataflow.from_items([{"id": "x", "s": "a", "k": 1, "score": 1.0}]).write_delta(path)
        assert deltalake.DeltaTable(path).version() == 2
    with pytest.raises(ValueError, match="schema_mode"):
        dataflow.range(3).write_delta(str(tmp_path / "u"), schema_mode="overwrite")


def test_missing_table_and_library(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="no Delta table"):
        dataflow.read_delta(str(tmp_path))
    monkeypatch.setitem(sys.modules, "deltalake", None)
    with pytest.raises(ImportError, match=r"dataflow\[delta\]"):
        dataflow.read_delta(str(tmp_path))
    with pytest.raises(ImportError, match=r"dataflow\[delta\]"):
        dataflow.range(3).write_delta(str(tmp_path / "t"))

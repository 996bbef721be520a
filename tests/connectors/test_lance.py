"""Lance: read by fragments with columns and filters pushed into Lance, write as one commit."""

from __future__ import annotations

import sys

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from connector_testing import read_all

import dataflow
from connectors import io_stats

lance = pytest.importorskip("lance")

from connectors.lance_format import LanceDatasource  # noqa: E402


def _table(n: int, start: int = 0) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table({"id": pa.array(ids, pa.int64()), "s": [f"row-{i}" for i in ids], "x": [i * 0.5 for i in ids]})


def _sorted_ids(rows: list[dict]) -> list[int]:
    return sorted(r["id"] for r in rows)


@pytest.fixture
def lance_path(tmp_path) -> str:
    """A Lance dataset of 1,000 rows in 4 fragments (version 1)."""
    path = str(tmp_path / "data.lance")
    lance.write_dataset(_table(1000), path, max_rows_per_file=250)
    return path


def test_round_trip_create_append_overwrite(mode, tmp_path):
    path = str(tmp_path / "out.lance")
    dataflow.from_arrow(_table(300), override_num_blocks=3).write_lance(path, min_rows_per_file=50)
    assert lance.dataset(path).version == 1  # one commit for all write tasks
    back = dataflow.read_lance(path)
    assert back.count() == 300
    rows = back.take_all()
    assert _sorted_ids(rows) == list(range(300))
    assert set(rows[0]) == {"id", "s", "x"}

    dataflow.from_arrow(_table(50, start=300)).write_lance(path, mode="append")
    assert lance.dataset(path).version == 2
    assert _sorted_ids(dataflow.read_lance(path).take_all()) == list(range(350))

    dataflow.from_arrow(_table(10, start=1000)).write_lance(path, mode="overwrite")
    assert _sorted_ids(dataflow.read_lance(path).take_all()) == list(range(1000, 1010))
    assert dataflow.read_lance(path, version=2).count() == 350  # older versions stay readable


def test_read_tasks_by_fragment_and_metadata_count(lance_path):
    source = LanceDatasource(lance_path)
    tasks = source.get_read_tasks(2)
    assert len(tasks) == 2 and [t.metadata.num_rows for t in tasks] == [500, 500]
    assert len(source.get_read_tasks(10)) == 4  # never more tasks than fragments
    assert source.count_rows() == 1000
    assert read_all(source).num_rows == 1000


def test_columns_and_filter_pushed_into_lance(mode, lance_path):
    ds = dataflow.read_lance(lance_path, columns=["s", "id"], filter="id >= 990")
    rows = ds.take_all()
    assert _sorted_ids(rows) == list(range(990, 1000))
    assert all(set(r) == {"s", "id"} for r in rows)
    # select_columns and filter(expr=...) after the read become part of it
    chained = dataflow.read_lance(lance_path).filter(expr=dataflow.col("id") < 5).select_columns(["id"])
    assert chained.explain().split("Optimized Plan")[1].split() == ["--------", "ReadLance"]
    assert chained.take_all() == [{"id": i} for i in range(5)]


def test_pushdown_reads_less(lance_path):
    source = LanceDatasource(lance_path)
    io_stats.snapshot(reset=True)
    assert read_all(source).num_rows == 1000
    full = io_stats.snapshot(reset=True)["bytes_read"]
    narrowed = source.apply_projection(["id"]).apply_filter(pc.field("id") < 10)
    table = read_all(narrowed)
    projected = io_stats.snapshot(reset=True)["bytes_read"]
    assert table.column_names == ["id"] and table["id"].to_pylist() == list(range(10))
    assert 0 < projected < full / 2  # the string and float columns were never read
    assert narrowed.count_rows() is None  # a filter: no count from metadata
    # a SQL string and a pyarrow expression do not combine: the engine filters after the read
    assert LanceDatasource(lance_path, filter="id > 3").apply_filter(pc.field("id") < 10) is None


def test_failed_write_leaves_the_dataset_unchanged(mode, lance_path):
    def explode(row):
        if row["id"] == 77:
            raise ValueError("bad row 77")
        return row

    with pytest.raises(ValueError, match="bad row 77"):
        dataflow.from_arrow(_table(200), override_num_blocks=4).map(explode).write_lance(lance_path, mode="append")
    dataset = lance.dataset(lance_path)
    assert dataset.version == 1 and dataset.count_rows() == 1000


def test_modes_checked_before_anything_runs(lance_path, tmp_path):
    with pytest.raises(ValueError, match="exists"):
        dataflow.from_arrow(_table(5)).write_lance(lance_path)  # mode="create"
    with pytest.raises(ValueError, match="mode must be one of"):
        dataflow.from_arrow(_table(5)).write_lance(str(tmp_path / "x.lance"), mode="upsert")
    with pytest.raises(FileNotFoundError, match="no Lance dataset"):
        dataflow.read_lance(str(tmp_path / "missing.lance"))
    with pytest.raises(ValueError, match=r"columns \['nope'\]"):
        dataflow.read_lance(lance_path, columns=["nope"])


def test_write_into_a_lance_namespace_as_ray(mode, tmp_path):
    """Ray's ``write_lance(table_id=, namespace_impl=, namespace_properties=)``: the table is
    declared in the namespace, which places it (``path`` is ignored, with Ray's warning);
    only ``mode="create"``; the two arguments go together; a second create of the table fails."""
    root = str(tmp_path / "ns")
    ns = {"namespace_impl": "dir", "namespace_properties": {"root": root}}
    ds = dataflow.from_arrow(_table(300)).repartition(3)
    with pytest.warns(UserWarning, match="'uri' argument is ignored"):
        ds.write_lance(str(tmp_path / "ignored.lance"), table_id=["events"], **ns)
    assert not (tmp_path / "ignored.lance").exists()
    dataset = lance.dataset(str(tmp_path / "ns" / "events.lance"))
    assert dataset.count_rows() == 300 and _sorted_ids(dataset.to_table().to_pylist()) == list(range(300))
    with pytest.raises(ValueError, match="only support mode='create'"):
        ds.write_lance(str(tmp_path / "x"), table_id=["other"], mode="append", **ns)
    with pytest.raises(ValueError, match="table_id and namespace_impl go together"):
        ds.write_lance(str(tmp_path / "x"), namespace_impl="dir")
    with pytest.raises(ValueError, match="table_id and namespace_impl go together"):
        ds.write_lance(str(tmp_path / "x"), table_id=["other"])
    with pytest.warns(UserWarning), pytest.raises(Exception, match="events"):
        ds.write_lance(str(tmp_path / "x"), table_id=["events"], **ns)
    assert lance.dataset(str(tmp_path / "ns" / "events.lance")).count_rows() == 300


def test_append_takes_the_dataset_types(lance_path):
    with dataflow.options(execution_mode="local"):
        # int32 ids are cast to the dataset's int64
        table = _table(5, start=2000).set_column(0, "id", pa.array(range(2000, 2005), pa.int32()))
        dataflow.from_arrow(table).write_lance(lance_path, mode="append")
        # raised by the sink on a worker (the engine reports sink errors as its own, whatever their class)
        with pytest.raises(Exception, match="missing columns"):
            dataflow.from_items([{"id": 1}]).write_lance(lance_path, mode="append")
    dataset = lance.dataset(lance_path)
    assert dataset.count_rows() == 1005 and dataset.schema.field("id").type == pa.int64()


def test_missing_library_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "lance", None)
    with pytest.raises(ImportError, match=r"dataflow\[lance\]"):
        dataflow.read_lance(str(tmp_path))
    with pytest.raises(ImportError, match=r"dataflow\[lance\]"):
        dataflow.range(3).write_lance(str(tmp_path / "x.lance"))

"""Iceberg: scans planned on the driver with pruning, file tasks read by pyiceberg; writes in one commit.

Every test makes its own SQL catalog (SQLite) with its warehouse in a temporary folder.
"""

from __future__ import annotations

import sys

import pyarrow as pa
import pytest
from connector_testing import read_all

import dataflow
from connectors import io_stats

pytest.importorskip("pyiceberg")
pytest.importorskip("sqlalchemy")

from pyiceberg.catalog import load_catalog

from connectors.iceberg_format import IcebergDatasource

SCHEMA = pa.schema([("id", pa.int64()), ("s", pa.string()), ("x", pa.float64())])


def _table(n: int, start: int = 0) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table({"id": ids, "s": [f"row-{i}" for i in ids], "x": [i * 0.5 for i in ids]}, schema=SCHEMA)


def _sorted_ids(rows: list[dict]) -> list[int]:
    return sorted(r["id"] for r in rows)


@pytest.fixture
def catalog_kwargs(tmp_path) -> dict[str, str]:
    """A SQLite catalog with namespace ``db`` and table ``db.t``: ids 0-99 and 100-199 in two snapshots."""
    kwargs = {
        "name": "test",
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/catalog.db",
        "warehouse": f"file://{tmp_path}/warehouse",
    }
    catalog = load_catalog(**kwargs)
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", schema=SCHEMA)
    table.append(_table(100))
    table.append(_table(100, start=100))
    return kwargs


def _load(kwargs):
    return load_catalog(**kwargs).load_table("db.t")


def test_read_on_both_modes(mode, catalog_kwargs):
    ds = dataflow.read_iceberg("db.t", catalog_kwargs=catalog_kwargs)
    assert ds.count() == 200
    rows = ds.take_all()
    assert _sorted_ids(rows) == list(range(200))
    assert rows[0]["s"] == f"row-{rows[0]['id']}"
    assert ds.schema() == SCHEMA


def test_row_filter_and_selected_fields_are_pushed_down(mode, catalog_kwargs):
    ds = dataflow.read_iceberg(
        "db.t", catalog_kwargs=catalog_kwargs, row_filter="id >= 150", selected_fields=("s", "id")
    )
    rows = ds.take_all()
    assert _sorted_ids(rows) == list(range(150, 200))
    assert all(list(r) == ["s", "id"] for r in rows)
    # select_columns after the read becomes part of it
    chained = dataflow.read_iceberg("db.t", catalog_kwargs=catalog_kwargs).select_columns(["x"])
    assert chained.explain().split("Optimized Plan")[1].split() == ["--------", "ReadIceberg"]
    assert sorted(r["x"] for r in chained.take_all()) == [i * 0.5 for i in range(200)]


def test_pruned_files_are_never_read(catalog_kwargs):
    everything = IcebergDatasource("db.t", catalog_kwargs=catalog_kwargs)
    assert sum(len(t.metadata.input_files) for t in everything.get_read_tasks(4)) == 2
    assert everything.count_rows() == 200
    source = IcebergDatasource("db.t", catalog_kwargs=catalog_kwargs, row_filter="id < 10", selected_fields=("id",))
    tasks = source.get_read_tasks(4)
    assert sum(len(t.metadata.input_files) for t in tasks) == 1  # the second file's ids are all >= 100
    io_stats.snapshot(reset=True)
    table = read_all(source)
    assert io_stats.snapshot(reset=True)["files_read"] == 1
    assert table.column_names == ["id"] and sorted(table["id"].to_pylist()) == list(range(10))
    assert source.count_rows() is None


def test_snapshot_id_and_deletes(catalog_kwargs):
    table = _load(catalog_kwargs)
    first = table.metadata.snapshots[0].snapshot_id
    table.delete("id >= 190")
    with dataflow.options(execution_mode="local"):
        assert dataflow.read_iceberg("db.t", catalog_kwargs=catalog_kwargs).count() == 190
        old = dataflow.read_iceberg("db.t", catalog_kwargs=catalog_kwargs, snapshot_id=first)
        assert _sorted_ids(old.take_all()) == list(range(100))


def test_write_append_and_overwrite_on_both_modes(mode, catalog_kwargs):
    before = len(_load(catalog_kwargs).metadata.snapshots)
    dataflow.from_arrow(_table(60, start=200), override_num_blocks=3).write_iceberg("db.t", catalog_kwargs)
    table = _load(catalog_kwargs)
    assert len(table.metadata.snapshots) == before + 1  # one commit for every write task
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == list(range(260))

    dataflow.from_arrow(_table(5, start=1000)).write_iceberg(
        "db.t", catalog_kwargs, mode="overwrite", snapshot_properties={"job": "nightly"}
    )
    table = _load(catalog_kwargs)
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == list(range(1000, 1005))
    assert table.current_snapshot().summary["job"] == "nightly"
    assert _sorted_ids(dataflow.read_iceberg("db.t", catalog_kwargs=catalog_kwargs).take_all()) == list(range(1000, 1005))


def test_overwrite_filter_replaces_only_matching_rows(catalog_kwargs):
    with dataflow.options(execution_mode="local"):
        dataflow.from_arrow(_table(10, start=500)).write_iceberg(
            "db.t", catalog_kwargs, mode="overwrite", overwrite_filter="id >= 100"
        )
    ids = sorted(_load(catalog_kwargs).scan().to_arrow()["id"].to_pylist())
    assert ids == list(range(100)) + list(range(500, 510))


def test_upsert_replaces_matching_rows_and_adds_the_rest(mode, catalog_kwargs):
    """Ray's ``SaveMode.UPSERT`` with ``upsert_kwargs={"join_cols": [...]}``: one commit; rows
    whose key matches a written row are replaced, new keys added, the others kept."""
    from dataflow import SaveMode

    snapshots = len(_load(catalog_kwargs).metadata.snapshots)
    written = _table(60, start=170).set_column(1, "s", pa.array([f"new-{i}" for i in range(170, 230)]))
    dataflow.from_arrow(written, override_num_blocks=3).write_iceberg(
        "db.t", catalog_kwargs, mode=SaveMode.UPSERT, upsert_kwargs={"join_cols": ["id"]}
    )
    table = _load(catalog_kwargs)
    rows = {r["id"]: r["s"] for r in table.scan().to_arrow().to_pylist()}
    assert sorted(rows) == list(range(230))  # 0-169 kept, 170-199 replaced, 200-229 added
    assert all(rows[i] == f"row-{i}" for i in range(170)) and all(rows[i] == f"new-{i}" for i in range(170, 230))
    assert table.scan().to_arrow().num_rows == 230  # no key twice
    assert len(table.metadata.snapshots) <= snapshots + 2  # one transaction (a delete and an append)
    # two keys at once, and a key written twice is refused, the table unchanged
    dataflow.from_arrow(_table(2, start=0)).write_iceberg(
        "db.t", catalog_kwargs, mode="upsert", upsert_kwargs={"join_cols": ["id", "s"], "case_sensitive": True}
    )
    assert _load(catalog_kwargs).scan().to_arrow().num_rows == 230
    current = _load(catalog_kwargs).metadata.current_snapshot_id
    with pytest.raises(ValueError, match="more than once"):
        dataflow.from_arrow(pa.concat_tables([_table(3), _table(3)])).write_iceberg(
            "db.t", catalog_kwargs, mode="upsert", upsert_kwargs={"join_cols": ["id"]}
        )
    assert _load(catalog_kwargs).metadata.current_snapshot_id == current
    with pytest.raises(ValueError, match="join_cols"):
        dataflow.range(3).write_iceberg("db.t", catalog_kwargs, mode="upsert")
    with pytest.raises(ValueError, match=r"\['nope'\] are not columns"):
        dataflow.from_arrow(_table(1)).write_iceberg("db.t", catalog_kwargs, mode="upsert",
                                                     upsert_kwargs={"join_cols": ["nope"]})
    with pytest.raises(TypeError, match="'when_matched_update_all' is not supported"):
        dataflow.from_arrow(_table(1)).write_iceberg("db.t", catalog_kwargs, mode="upsert",
                                                     upsert_kwargs={"join_cols": ["id"], "when_matched_update_all": True})
    dataflow.from_arrow(_table(1, start=5000)).write_iceberg(
        "db.t", catalog_kwargs, mode="overwrite", overwrite_filter="id >= 200", overwrite_kwargs={"case_sensitive": False}
    )
    assert sorted(_load(catalog_kwargs).scan().to_arrow()["id"].to_pylist()) == [*range(200), 5000]


def test_failed_write_leaves_the_table_unchanged(mode, catalog_kwargs):
    snapshot = _load(catalog_kwargs).metadata.current_snapshot_id

    def explode(row):
        if row["id"] == 277:
            raise ValueError("bad row 277")
        return row

    with pytest.raises(ValueError, match="bad row 277"):
        dataflow.from_arrow(_table(100, start=200), override_num_blocks=4).map(explode).write_iceberg(
            "db.t", catalog_kwargs, mode="overwrite"
        )
    table = _load(catalog_kwargs)
    assert table.metadata.current_snapshot_id == snapshot
    assert table.scan().to_arrow().num_rows == 200


def test_bad_arguments_and_missing_library(catalog_kwargs, monkeypatch):
    with pytest.raises(ValueError, match="mode must be one of"):
        dataflow.range(3).write_iceberg("db.t", catalog_kwargs, mode="merge")
    with pytest.raises(Exception, match="nope"):
        dataflow.read_iceberg("db.nope", catalog_kwargs=catalog_kwargs)
    with pytest.raises(ValueError, match="scan_kwargs may not set"):
        dataflow.read_iceberg("db.t", catalog_kwargs=catalog_kwargs, scan_kwargs={"snapshot_id": 1})
    monkeypatch.setitem(sys.modules, "pyiceberg.catalog", None)
    monkeypatch.setitem(sys.modules, "pyiceberg", None)
    with pytest.raises(ImportError, match=r"dataflow\[iceberg\]"):
        dataflow.read_iceberg("db.t", catalog_kwargs=catalog_kwargs)
    with pytest.raises(ImportError, match=r"dataflow\[iceberg\]"):
        dataflow.range(3).write_iceberg("db.t", catalog_kwargs)

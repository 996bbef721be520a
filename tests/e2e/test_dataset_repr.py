"""``repr(dataset)`` and ``Dataset.schema()`` as Ray Data 2.60 gives them (the expected strings
were printed by Ray 2.60 for the same pipelines). On both execution modes."""

from __future__ import annotations

import pickle
import time

import numpy as np
import pyarrow as pa
import pytest

import dataflow
from dataflow import Schema


def test_schema_prints_as_rays_table_and_wraps_the_arrow_schema(mode):
    schema = dataflow.range(3).map(lambda r: {"id": r["id"], "s": str(r["id"])}).schema()
    assert isinstance(schema, Schema)
    assert repr(schema) == str(schema) == "Column  Type\n------  ----\nid      int64\ns       string"
    assert schema.names == ["id", "s"]
    assert schema.types == [pa.int64(), pa.string()]
    assert schema.base_schema == pa.schema([("id", pa.int64()), ("s", pa.string())])
    assert schema == pa.schema([("id", pa.int64()), ("s", pa.string())])
    assert schema == Schema(pa.schema([("id", pa.int64()), ("s", pa.string())]))
    assert schema != Schema(pa.schema([("id", pa.int32()), ("s", pa.string())]))
    # what pyarrow's schema has, for code written against it
    assert len(schema) == 2 and schema.field("s").type == pa.string() and schema[0].name == "id"
    assert [f.name for f in schema] == ["id", "s"]
    assert schema.empty_table().num_rows == 0
    assert pickle.loads(pickle.dumps(schema)) == schema
    assert dataflow.range(3).iterator().schema() == pa.schema([("id", pa.int64())])


def test_schema_without_running_where_the_plan_tells(mode):
    ds = dataflow.range(10)
    assert ds.random_shuffle().limit(3).schema(fetch_if_missing=False).names == ["id"]
    renamed = ds.select_columns(["id"]).rename_columns({"id": "x"}).filter(expr="x > 2")
    assert renamed.schema(fetch_if_missing=False).names == ["x"]
    grouped = dataflow.from_items([{"k": "a", "v": 1, "f": 0.5}]).groupby("k").aggregate(
        dataflow.aggregate.Count(), dataflow.aggregate.Mean("f"), dataflow.aggregate.Max("v"))
    expected = pa.schema([("k", pa.string()), ("count()", pa.int64()), ("mean(f)", pa.float64()),
                          ("max(v)", pa.int64())])
    assert grouped.schema(fetch_if_missing=False) == expected
    assert grouped.schema() == expected  # what running it gives
    assert ds.map(lambda r: r).schema(fetch_if_missing=False) is None
    assert ds.select_columns(["nope"]).schema(fetch_if_missing=False) is None


def test_lazy_dataset_with_a_known_schema_prints_its_columns(mode):
    assert repr(dataflow.range(10)) == (
        "shape: (10, 1)\n"
        "╭───────╮\n"
        "│ id    │\n"
        "│ ---   │\n"
        "│ int64 │\n"
        "╰───────╯\n"
        "(Dataset isn't materialized)"
    )
    assert str(dataflow.range(10).groupby("id").count()) == (
        "shape: (?, 2)\n"
        "╭───────┬─────────╮\n"
        "│ id    ┆ count() │\n"
        "│ ---   ┆ ---     │\n"
        "│ int64 ┆ int64   │\n"
        "╰───────┴─────────╯\n"
        "(Dataset isn't materialized)"
    )


def test_steps_above_the_source_when_the_schema_is_unknown(mode):
    ds = dataflow.range(10).map(lambda r: r).filter(lambda r: True).map_batches(lambda b: b)
    assert repr(ds) == (
        "MapBatches(<lambda>)\n"
        "+- Filter(<lambda>)\n"
        "   +- Map(<lambda>)\n"
        "      +- Dataset(num_rows=10, schema={id: int64})"
    )
    named = dataflow.range(5).map(lambda r: r)
    named.set_name("train")
    assert repr(named) == "Map(<lambda>)\n+- Dataset(name=train, num_rows=5, schema={id: int64})"
    wide = dataflow.from_items([{f"a_very_long_column_name_number_{i}": i for i in range(4)}]).map(lambda r: r)
    assert repr(wide) == (
        "Map(<lambda>)\n"
        "+- Dataset(\n"
        "      num_rows=1,\n"
        "      schema={\n"
        "         a_very_long_column_name_number_0: int64,\n"
        "         a_very_long_column_name_number_1: int64,\n"
        "         a_very_long_column_name_number_2: int64,\n"
        "         a_very_long_column_name_number_3: int64\n"
        "      }\n"
        "   )"
    )


def test_materialized_dataset_shows_its_first_and_last_rows(mode):
    with dataflow.options(preserve_order=True):  # the blocks in row order: the head and tail are known
        ds = dataflow.range(100, override_num_blocks=3).materialize()
    expected = ["shape: (100, 1)", "╭───────╮", "│ id    │", "│ ---   │", "│ int64 │", "╞═══════╡"]
    expected += [f"│ {i:<5} │" for i in range(5)] + ["│ …     │"] + [f"│ {i:<5} │" for i in range(95, 100)]
    expected += ["╰───────╯", "(Showing 10 of 100 rows)"]
    assert repr(ds) == "\n".join(expected)
    assert repr(ds) == repr(ds)  # printing reads the blocks; it frees none of them
    assert ds.count() == 100 and ds.take_all()[-1] == {"id": 99}

    with dataflow.options(preserve_order=True):
        small = dataflow.range(3).filter(lambda r: True).materialize()
    assert str(small).splitlines()[-5:] == ["│ 0     │", "│ 1     │", "│ 2     │", "╰───────╯",
                                            "(Showing 3 of 3 rows)"]
    long_values = dataflow.range(12).map_batches(lambda b: {"s": ["x" * 60] * len(b["id"])}).materialize()
    assert repr(long_values).splitlines()[6] == "│ " + "x" * 39 + "… │"
    assert repr(dataflow.range(3).filter(lambda r: False).materialize()) == (
        "MaterializedDataset(num_rows=0, schema=Unknown schema)")


def test_iterator_repr_is_its_datasets(mode):
    ds = dataflow.range(10)
    assert repr(ds.iterator()) == f"DataIterator({ds!r})"


@pytest.mark.parametrize("columns", [["id"], []])
def test_repr_runs_nothing(mode, columns):
    ds = dataflow.range(4).select_columns(columns).map_batches(lambda b: 1 / 0)  # raises if it runs
    assert repr(ds).startswith("MapBatches(<lambda>)\n+- ")


def test_embeddings_keep_the_tensor_type_through_parquet(mode, tmp_path):
    """A column of one-dimensional arrays written to Parquet reads back as the same tensor type
    (Arrow's canonical fixed_shape_tensor, which Ray Data and polars read as well)."""
    import pyarrow.parquet as pq

    dataflow.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4)).write_parquet(str(tmp_path / "emb"))
    (written,) = (tmp_path / "emb").glob("*.parquet")
    assert isinstance(pq.read_schema(written).field("data").type, pa.FixedShapeTensorType)
    back = dataflow.read_parquet(str(tmp_path / "emb"))
    assert repr(back.schema()).endswith("data    ArrowTensorTypeV2(shape=(4,), dtype=float)")
    assert back.take_batch()["data"].tolist() == np.arange(12, dtype=np.float32).reshape(3, 4).tolist()


def test_tensor_columns_print_with_rays_type_names(mode):
    fixed = dataflow.from_numpy(np.zeros((4, 2, 3)))
    assert repr(fixed.schema()) == "Column  Type\n------  ----\ndata    ArrowTensorTypeV2(shape=(2, 3), dtype=double)"
    assert isinstance(fixed.schema().types[0], pa.FixedShapeTensorType)  # still the Arrow type
    assert repr(fixed.map(lambda r: r)) == (
        "Map(<lambda>)\n"
        "+- Dataset(\n"
        "      num_rows=4,\n"
        "      schema={data: ArrowTensorTypeV2(shape=(2, 3), dtype=double)}\n"
        "   )"
    )
    # one dimension a row (a model's embeddings, a 2-d from_numpy): Ray's tensor type too, where
    # a fixed_size_list column printed (and wrote) differently from Ray's
    embeddings = dataflow.range(3).map_batches(lambda b: {"e": np.ones((len(b["id"]), 4), np.float32)})
    want = "Column  Type\n------  ----\ne       ArrowTensorTypeV2(shape=(4,), dtype=float)"
    assert repr(embeddings.materialize().schema()) == want
    assert repr(dataflow.from_numpy(np.zeros((3, 2))).schema()).endswith("data    ArrowTensorTypeV2(shape=(2,), dtype=double)")
    assert repr(dataflow.from_items([{"a": np.zeros(2)}, {"a": np.ones(2)}]).schema()).endswith("ArrowTensorTypeV2(shape=(2,), dtype=double)")
    batch = embeddings.take_batch()
    assert batch["e"].shape == (3, 4) and batch["e"].dtype == np.float32
    assert [r["e"].tolist() for r in embeddings.take_all()] == [[1.0] * 4] * 3
    assert dataflow.from_items([{"a": [1, 2]}]).schema().types == [pa.list_(pa.int64())]  # Python lists stay lists, as in Ray
    ragged = dataflow.from_items([{"a": np.zeros((2,))}, {"a": np.zeros((3,))}])
    assert repr(ragged.schema()) == "Column  Type\n------  ----\na       ArrowVariableShapedTensorType(ndim=1, dtype=double)"
    assert repr(ragged) == (
        "shape: (2, 1)\n"
        "╭──────────────────────────────────────────╮\n"
        "│ a                                        │\n"
        "│ ---                                      │\n"
        "│ ArrowVariableShapedTensorType(ndim=1, d… │\n"
        "╞══════════════════════════════════════════╡\n"
        "│ [0. 0.]                                  │\n"
        "│ [0. 0. 0.]                               │\n"
        "╰──────────────────────────────────────────╯\n"
        "(Showing 2 of 2 rows)"
    )


def test_range_tensor_prints_its_tensor_column_without_running(mode):
    """Ray 2.60's print for ``range_tensor`` (a source there; a column step over ``range`` here)."""
    ds = dataflow.range_tensor(1000, shape=(2, 2))
    assert repr(ds) == (
        "shape: (1000, 1)\n"
        "╭──────────────────────────────────────────╮\n"
        "│ data                                     │\n"
        "│ ---                                      │\n"
        "│ ArrowTensorTypeV2(shape=(2, 2), dtype=i… │\n"
        "╰──────────────────────────────────────────╯\n"
        "(Dataset isn't materialized)"
    )
    assert ds.schema(fetch_if_missing=False).types[0] == pa.fixed_shape_tensor(pa.int64(), [2, 2])
    assert ds.take(2)[1]["data"].tolist() == [[1, 1], [1, 1]]


def _with_text(row):
    return {"id": row["id"], "s": str(row["id"])}


def test_from_items_of_nothing_is_empty_without_a_schema(mode):
    """Ray 2.60: no blocks, ``schema()`` and ``columns()`` None; it was a block with a null-typed
    ``item`` column."""
    empty = dataflow.from_items([])
    assert empty.schema() is None and empty.columns() is None and empty.num_blocks() == 0
    assert repr(empty) == "MaterializedDataset(num_rows=0, schema=Unknown schema)"
    assert empty.count() == 0 and empty.take_all() == [] and empty.map(lambda r: r).take_all() == []
    assert len(empty.to_pandas()) == 0


def _no_execution_running(timeout: float = 10.0) -> None:
    from engine.session import current_session

    current = current_session()
    deadline = time.monotonic() + timeout
    while current is not None and current.executor.statistics()["executions"] and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_run_tells_the_schema_and_row_count_as_in_ray(mode, tmp_path):
    """After a run, Ray 2.60 prints a function's output as a table with the rows it counted,
    and ``schema()`` does not run the plan again (the strings below were printed by Ray)."""
    ds = dataflow.range(10).filter(lambda r: r["id"] < 3).map(_with_text)
    assert repr(ds).startswith("Map(_with_text)\n")
    ds.take_all()
    assert repr(ds) == (
        "shape: (3, 2)\n"
        "╭───────┬────────╮\n"
        "│ id    ┆ s      │\n"
        "│ ---   ┆ ---    │\n"
        "│ int64 ┆ string │\n"
        "╰───────┴────────╯\n"
        "(Dataset isn't materialized)"
    )
    calls = tmp_path / "calls"

    def counted(batch):
        with open(calls, "a") as f:
            f.write("x")
        return {"id": batch["id"], "half": batch["id"] / 2}

    other = dataflow.range(10).map_batches(counted)
    assert other.schema().names == ["id", "half"]
    _no_execution_running()  # schema() stops at its first row; a task already sent may still call counted
    runs = len(calls.read_text())
    assert other.schema().names == ["id", "half"] and len(calls.read_text()) == runs  # not run again
    assert repr(other).startswith("shape: (?, 2)\n")  # a batch function may change the rows

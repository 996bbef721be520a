"""Small Dataset and DataIterator API of Ray Data: num_blocks, size_bytes, input_files, name,
copy; DataIterator.stats, schema, materialize, to_torch. On both execution modes."""

from __future__ import annotations

import pickle
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dataflow
from dataflow.dataset import MaterializedDataset


def test_num_blocks_only_for_materialized(mode):
    ds = dataflow.range(100, override_num_blocks=4)
    with pytest.raises(NotImplementedError, match="materialize"):
        ds.num_blocks()
    assert ds.materialize().num_blocks() == 4


def test_size_bytes(mode):
    assert dataflow.range(10).size_bytes() == 80  # Ray's example
    ds = dataflow.range(1000, override_num_blocks=3).map_batches(lambda b: {"id": b["id"], "y": b["id"] * 1.0})
    assert ds.size_bytes() == 16_000
    assert ds.materialize().size_bytes() == 16_000


def test_input_files_also_after_materialize_and_split(mode, tmp_path):
    for i in range(2):
        pq.write_table(pa.table({"x": list(range(i * 5, i * 5 + 5))}), tmp_path / f"part-{i}.parquet")
    ds = dataflow.read_parquet(str(tmp_path))
    files = sorted(ds.input_files())
    assert [f.rsplit("/", 1)[-1] for f in files] == ["part-0.parquet", "part-1.parquet"]
    assert sorted(ds.map(lambda r: r).input_files()) == files
    materialized = ds.materialize()
    assert sorted(materialized.input_files()) == files
    assert sorted(materialized.split(2)[0].input_files()) == files
    assert dataflow.range(10).input_files() == []


def test_name_is_inherited_and_shown_in_stats(mode):
    ds = dataflow.range(10)
    assert ds.name is None
    ds.set_name("train")
    assert ds.name == "train"
    mapped = ds.map(lambda r: r)
    assert mapped.name == "train"
    materialized = mapped.materialize()
    assert materialized.name == "train"
    assert materialized.stats().startswith("Dataset train:")


def test_dataset_id_names_the_dataset_and_counts_its_runs(mode):
    ds = dataflow.range(10).map(lambda r: r)
    name, uid, runs = ds.get_dataset_id().rsplit("_", 2)
    assert name == "dataset" and len(uid) == 32 and runs == "0"
    ds.take_all()
    ds.take_all()
    assert ds.get_dataset_id() == f"dataset_{uid}_2"  # the same object, run twice
    ds.set_name("train")
    assert ds.get_dataset_id().startswith(f"train_{uid}_")
    assert dataflow.Dataset.copy(ds).get_dataset_id() != ds.get_dataset_id()
    assert ds.map(lambda r: r).get_dataset_id().split("_")[1] != uid


def test_copy_is_a_static_method_sharing_the_plan(mode):
    materialized = dataflow.range(10, override_num_blocks=2).materialize()
    twin = dataflow.Dataset.copy(materialized)
    assert isinstance(twin, MaterializedDataset) and twin is not materialized
    assert twin.take_all() == materialized.take_all()
    del materialized
    assert twin.count() == 10  # the blocks live as long as any copy
    plain = dataflow.Dataset.copy(dataflow.range(3))
    assert type(plain) is dataflow.Dataset and plain.count() == 3


def test_iterator_stats_schema_materialize(mode):
    ds = dataflow.range(20, override_num_blocks=2)
    it = ds.iterator()
    assert it.schema() == pa.schema([("id", pa.int64())])
    assert it.stats() == ""  # nothing ran yet: Ray's answer
    assert sum(len(b["id"]) for b in it.iter_batches(batch_size=8)) == 20
    assert "ReadRange" in it.stats()
    materialized = it.materialize()
    assert isinstance(materialized, MaterializedDataset) and materialized.count() == 20


def test_split_iterator_materialize(mode):
    its = dataflow.range(100, override_num_blocks=4).streaming_split(1)
    materialized = its[0].materialize()
    assert sorted(r["id"] for r in materialized.take_all()) == list(range(100))
    # the schema the plan tells without running, as Ray's split iterator gives its dataset's
    assert its[0].schema() == pa.schema([("id", pa.int64())])
    assert pickle.loads(pickle.dumps(its[0])).schema() == pa.schema([("id", pa.int64())])
    # a schema that needs a run gets one, as Ray's (it was None), and travels with the iterator
    mapped = dataflow.range(10).map(lambda r: {"x": r["id"] * 1.0}).streaming_split(2)
    assert mapped[0].schema() == pa.schema([("x", pa.float64())])
    if mode == "streaming":  # (an in-process split iterator cannot leave its process)
        assert pickle.loads(pickle.dumps(mapped[1])).schema() == pa.schema([("x", pa.float64())])
    with ThreadPoolExecutor(2) as pool:  # the run for the schema leaves the split's epoch whole
        parts = list(pool.map(lambda it: [r["x"] for r in it.iter_rows()], mapped))
    assert sorted(parts[0] + parts[1]) == [float(i) for i in range(10)]


def test_iterator_to_torch_as_ray(mode):
    torch = pytest.importorskip("torch")
    ds = dataflow.from_items([{"a": float(i), "b": 2.0 * i, "y": i} for i in range(5)])
    with pytest.deprecated_call():
        torch_ds = ds.iterator().to_torch(label_column="y", batch_size=2)
    batches = list(torch_ds)
    features, label = batches[0]
    assert features.shape == (2, 2) and label.shape == (2, 1)
    assert torch.equal(features, torch.tensor([[0.0, 0.0], [1.0, 2.0]], dtype=torch.float64))
    assert [len(lbl) for _, lbl in batches] == [2, 2, 1]
    with pytest.deprecated_call():
        grouped = ds.iterator().to_torch(
            feature_columns={"x": ["a"], "z": ["a", "b"]}, feature_column_dtypes={"x": torch.float32, "z": torch.float32},
            batch_size=5,
        )
    ((features, label),) = list(grouped)
    assert label is None and features["x"].shape == (5, 1) and features["z"].shape == (5, 2)
    assert features["x"].dtype == torch.float32
    with pytest.deprecated_call():
        flat = ds.iterator().to_torch(feature_columns=["a"], label_column="y", unsqueeze_feature_tensors=False,
                                      unsqueeze_label_tensor=False, batch_size=5)
    ((features, label),) = list(flat)
    assert features.shape == (5,) and label.tolist() == [0, 1, 2, 3, 4]
    with pytest.deprecated_call(), pytest.raises(ValueError, match="same keys"):
        ds.iterator().to_torch(feature_columns={"x": ["a"]}, feature_column_dtypes={"q": torch.float32})


def test_schema_of_a_union_and_of_a_filter_that_leaves_no_rows(mode):
    """A union's schema is its inputs' unified (it was the first input's), and a dataset whose
    filter left nothing still has its input's columns (it was None), as in Ray."""
    mixed = dataflow.from_items([{"a": 1}]).union(dataflow.from_items([{"a": 1.5}]))
    assert mixed.schema() == pa.schema([("a", pa.float64())])
    assert mixed.to_arrow().column("a").to_pylist() == [1.0, 1.5]
    assert dataflow.range(2).union(dataflow.from_items([{"x": "a"}])).schema().names == ["id", "x"]
    assert dataflow.range(3).filter(lambda r: False).schema().names == ["id"]
    assert dataflow.range(3).filter(expr="id > 5").sort("id").limit(1).schema().names == ["id"]
    assert dataflow.range(3).map(lambda r: {"z": 1}).filter(lambda r: False).schema().names == ["z"]
    # a column selection, drop or rename of a dataset without rows: its input's, as Ray's
    empty = dataflow.from_arrow(pa.table({"a": pa.array([], pa.int64()), "b": pa.array([], pa.string())}))
    assert empty.select_columns(["b"]).schema().base_schema == pa.schema([("b", pa.string())])
    assert empty.rename_columns({"a": "x"}).drop_columns(["b"]).schema().names == ["x"]
    assert empty.select_columns(["b"]).to_arrow().schema == pa.schema([("b", pa.string())])
    assert empty.map(lambda r: r).schema() is None  # (a UDF's output has no schema until it runs, as in Ray)
    from dataflow.expressions import col

    added = empty.with_column("n", col("a") * 2.5).rename_columns({"a": "z"}).filter(expr="n > 1")
    assert added.schema().base_schema == pa.schema([("z", pa.int64()), ("b", pa.string()), ("n", pa.float64())])


def test_schema_skips_empty_blocks_before_the_first_rows(mode, tmp_path):
    """A header-only CSV file first in a folder: the schema was its columns typed null; Ray's
    (and now this) comes from the first block with rows. With no rows at all, the empty
    block's columns are still the schema."""
    (tmp_path / "a.csv").write_text("id,name\n")
    (tmp_path / "b.csv").write_text("id,name\n1,x\n")
    assert dataflow.read_csv(str(tmp_path)).schema() == pa.schema([("id", pa.int64()), ("name", pa.string())])
    assert dataflow.read_csv(str(tmp_path / "a.csv")).schema().names == ["id", "name"]


def test_context_is_the_current_one(mode):
    ds = dataflow.range(4)
    ctx = dataflow.DataContext.get_current()
    assert ds.context is ctx and ds.iterator().get_context() is ctx
    assert ds.streaming_split(2)[0].get_context() is ctx
    old = ctx.execution_options.preserve_order
    try:
        ds.context.execution_options.preserve_order = True  # as Ray users set it
        assert dataflow.DataContext.get_current().execution_options.preserve_order is True
        assert [r["id"] for r in ds.map(lambda r: r).iter_rows()] == [0, 1, 2, 3]
    finally:
        ctx.execution_options.preserve_order = old


def test_in_memory_sources_are_materialized_as_in_ray(mode, tmp_path):
    import numpy as np
    import pandas as pd
    import polars as pl

    made = [
        dataflow.from_items([{"a": 1}, {"a": 2}]),
        dataflow.from_pandas(pd.DataFrame({"a": [1, 2]})),
        dataflow.from_arrow(pa.table({"a": [1, 2]})),
        dataflow.from_numpy(np.arange(2)),
        dataflow.from_polars(pl.DataFrame({"a": [1, 2]})),
    ]
    for ds in made:
        assert isinstance(ds, MaterializedDataset) and ds.num_blocks() >= 1 and ds.count() == 2
    ds = dataflow.from_items(list(range(100)), override_num_blocks=4)
    assert ds.num_blocks() == 4
    for _ in range(2):  # read twice: executions over it free none of its blocks
        assert sorted(r["item"] for r in ds.map(lambda r: r).take_all()) == list(range(100))
    assert ds.take_all() == [{"item": i} for i in range(100)]  # the blocks keep the items' order
    ds.write_parquet(str(tmp_path / "out"))  # one file per block, as Ray writes a materialized dataset
    assert len(list((tmp_path / "out").glob("*.parquet"))) == 4

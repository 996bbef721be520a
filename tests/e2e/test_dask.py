"""Dask DataFrames in and out (``Dataset.to_dask``, ``dataflow.from_dask``), on both modes."""

from __future__ import annotations

import pickle
import sys

import cloudpickle
import numpy as np
import pytest

import dataflow

dd = pytest.importorskip("dask.dataframe")
pd = pytest.importorskip("pandas")


def test_to_dask_has_one_partition_per_block_and_the_rows(mode):
    ds = dataflow.range(1000, override_num_blocks=4).map_batches(lambda b: {"id": b["id"], "sq": b["id"] ** 2})
    ddf = ds.to_dask()
    assert ddf.npartitions == 4
    assert list(ddf.columns) == ["id", "sq"]
    frame = ddf.compute()
    assert sorted(frame["id"].tolist()) == list(range(1000))  # blocks in the order they were made
    assert (frame["sq"] == frame["id"] ** 2).all()
    assert int(ddf["sq"].sum().compute()) == sum(i * i for i in range(1000))
    assert str(frame["id"].dtype) == str(ds.to_pandas()["id"].dtype)  # to_pandas's dtypes


def test_to_dask_graph_carries_its_blocks_and_takes_meta(mode):
    """The blocks travel in the graph: pickled (as a scheduler in other processes gets it), it
    still computes, after the dataset is gone."""
    ds = dataflow.from_items([{"a": i, "b": f"s{i}"} for i in range(30)], override_num_blocks=3)
    ctx = dataflow.DataContext.get_current()
    saved = ctx.enable_arrow_backed_pandas_conversion
    ctx.enable_arrow_backed_pandas_conversion = False  # numpy dtypes, as this meta says
    try:
        meta = pd.DataFrame({"a": pd.Series(dtype="int64"), "b": pd.Series(dtype="str")})
        ddf = ds.to_dask(meta=meta)
        del ds
        out = pickle.loads(cloudpickle.dumps(ddf)).compute(scheduler="sync")
    finally:
        ctx.enable_arrow_backed_pandas_conversion = saved
    assert sorted(out["a"].tolist()) == list(range(30))
    assert dict(out.sort_values("a").iloc[3]) == {"a": 3, "b": "s3"}


def test_frames_made_one_after_another_never_share_keys(mode):
    """Each block's key is unique to its to_dask call: frames combined in one graph keep their rows."""
    frames = [dataflow.from_items([{"v": i}]).to_dask() for i in range(200)]
    assert sorted(dd.concat(frames).compute()["v"].tolist()) == list(range(200))


def test_to_dask_of_an_empty_dataset_keeps_its_columns(mode):
    ddf = dataflow.range(10).filter(lambda r: r["id"] < 0).to_dask()
    assert list(ddf.columns) == ["id"] and len(ddf.compute()) == 0


def test_from_dask_makes_a_block_per_partition(mode):
    frame = pd.DataFrame({"x": np.arange(100), "y": np.arange(100) * 0.5}, index=np.arange(100) + 1000)
    ds = dataflow.from_dask(dd.from_pandas(frame, npartitions=5))
    assert isinstance(ds, dataflow.MaterializedDataset)
    assert ds.num_blocks() == 5
    rows = ds.take_all()
    assert [r["x"] for r in rows] == list(range(100)) and rows[10]["y"] == 5.0
    assert set(rows[0]) == {"x", "y"}  # the index is dropped, as from_pandas drops it
    back = ds.map_batches(lambda b: {"x": b["x"] * 2}).to_dask().compute()
    assert sorted(back["x"].tolist()) == [2 * i for i in range(100)]
    with pytest.raises(TypeError, match=r"dask\.dataframe\.DataFrame"):
        dataflow.from_dask(frame)


def test_import_dataflow_loads_no_dask():
    import subprocess

    code = "import sys, dataflow; dataflow.range(3).take_all(); print('dask' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

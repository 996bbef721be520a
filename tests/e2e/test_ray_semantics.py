"""Behaviour Ray Data 2.60 scripts rely on that differed here (each probed on Ray first)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import dataflow


def test_an_iter_call_is_an_iterable_of_passes_as_rays(mode):
    """Ray's ``iter_batches``/``iter_rows``/``iter_torch_batches`` return an iterable: each loop
    over it is a new pass. A generator gave the rows once and then nothing, so a training loop
    that kept ``batches = ds.iter_torch_batches()`` ran empty epochs without a word."""
    ds = dataflow.range(10)
    batches = ds.iter_batches(batch_size=4)
    assert [sum(len(b["id"]) for b in batches) for _ in range(3)] == [10, 10, 10]
    rows = ds.iter_rows()
    assert [sorted(r["id"] for r in rows) for _ in range(2)] == [list(range(10))] * 2
    tensors = ds.iter_torch_batches(batch_size=5)
    assert [sum(len(b["id"]) for b in tensors) for _ in range(2)] == [10, 10]
    it = dataflow.range(10, override_num_blocks=1).iterator().iter_batches(batch_size=4)
    for _ in it:
        break  # a pass left early: the next loop starts again from the first row
    assert sum(len(b["id"]) for b in it) == 10
    # next() on it (as on a generator) reads one pass; a loop after it goes on with that pass
    it = dataflow.range(10, override_num_blocks=1).iter_batches(batch_size=4)
    first = next(it)
    assert len(first["id"]) + sum(len(b["id"]) for b in it) == 10


def _typed(row):
    return {"t": torch.as_tensor([row["id"], 1]), "i": np.int32(row["id"]), "f": np.float32(0.5), "tu": (1, 2)}


def _types(row):
    return {k: type(v).__name__ for k, v in row.items()}


def test_a_row_function_after_another_sees_rows_as_ray_hands_them_on(mode):
    """Ray builds a block of each row function's output: the next one sees numpy arrays for
    tensors, Python numbers for numpy scalars and lists for tuples (Ray's PyTorch guide asserts
    it). Fused here, the next function got the objects themselves."""
    ds = dataflow.range(3).map(_typed)
    assert ds.filter(lambda r: isinstance(r["t"], np.ndarray)).count() == 3
    assert ds.flat_map(lambda r: [_types(r)]).take(1) == [{"t": "ndarray", "i": "int", "f": "float", "tu": "list"}]
    assert ds.map(_types).take(1) == [{"t": "ndarray", "i": "int", "f": "float", "tu": "list"}]
    plain = dataflow.range(3).map(lambda r: {"id": r["id"], "s": str(r["id"])}).map(lambda r: {**r, "n": len(r["s"])})
    assert sorted(r["id"] for r in plain.take_all()) == [0, 1, 2]


def test_rows_with_different_keys_get_nulls_as_in_ray(mode):
    """Ray 2.60 fills the keys a row lacks with None; this raised (or not, with the same
    function, depending on how rows fell into blocks)."""
    ds = dataflow.range(4, override_num_blocks=1).map(lambda r: {"a": 1, "b": None} if r["id"] > 1 else {"a": 2})
    assert sorted(ds.take_all(), key=lambda r: (r["a"], r["b"] is None)) == [
        {"a": 1, "b": None}, {"a": 1, "b": None}, {"a": 2, "b": None}, {"a": 2, "b": None}]
    flat = dataflow.range(2, override_num_blocks=1).flat_map(lambda r: [{"x": r["id"]}, {"y": "s"}])
    assert sorted(map(str, flat.take_all())) == sorted(map(str, [{"x": 0, "y": None}, {"x": None, "y": "s"},
                                                                 {"x": 1, "y": None}, {"x": None, "y": "s"}]))
    with pytest.raises(ValueError, match="must return a dict"):
        dataflow.range(2).map(lambda r: 5).take_all()


def test_write_json_keeps_a_tensors_shape_as_ray(mode, tmp_path):
    """Ray's guide: a ``(2, 2)`` tensor is written as ``[[0, 0], [0, 0]]``; its four values were
    written flat, and read back as a flat list."""
    dataflow.range_tensor(3, shape=(2, 2)).write_json(str(tmp_path / "fixed"))
    back = sorted(dataflow.read_json(str(tmp_path / "fixed")).take_all(), key=lambda r: r["data"][0][0])
    assert back == [{"data": [[i, i], [i, i]]} for i in range(3)]
    ragged = dataflow.from_items([{"a": np.zeros((2, 3))}, {"a": np.ones((1, 3))}], override_num_blocks=1)
    ragged.write_json(str(tmp_path / "ragged"))
    (written,) = (tmp_path / "ragged").glob("*.json")
    assert written.read_text() == '{"a":[[0.0,0.0,0.0],[0.0,0.0,0.0]]}\n{"a":[[1.0,1.0,1.0]]}\n'


def test_the_custom_aggregation_of_rays_guide_runs_with_its_imports_changed(mode):
    """Ray's aggregation guide (``aggregating-data.md``): a ``Mean`` built on
    ``BlockAccessor.count``/``sum`` and ``ray.data._internal.util.is_null``; both were missing."""
    from dataflow._internal.util import is_null
    from dataflow.aggregate import AggregateFnV2
    from dataflow.block import BlockAccessor

    class Mean(AggregateFnV2):
        def __init__(self, on=None, ignore_nulls=True, alias_name=None):
            super().__init__(alias_name if alias_name else f"mean({on})", on=on, ignore_nulls=ignore_nulls,
                             zero_factory=lambda: [0, 0])

        def aggregate_block(self, block):
            accessor = BlockAccessor.for_block(block)
            count = accessor.count(self._target_col_name, self._ignore_nulls)
            if count == 0 or count is None:
                return None
            total = accessor.sum(self._target_col_name, self._ignore_nulls)
            return None if is_null(total) else [total, count]

        def combine(self, current_accumulator, new):
            return [current_accumulator[0] + new[0], current_accumulator[1] + new[1]]

        def finalize(self, accumulator):
            return np.nan if accumulator[1] == 0 else accumulator[0] / accumulator[1]

    assert dataflow.range(100).aggregate(Mean(on="id")) == {"mean(id)": 49.5}
    grouped = dataflow.range(100).map(lambda r: {"g": r["id"] % 3, "id": r["id"]}).groupby("g").aggregate(Mean(on="id"))
    assert sorted(grouped.take_all(), key=lambda r: r["g"]) == [
        {"g": 0, "mean(id)": 49.5}, {"g": 1, "mean(id)": 49.0}, {"g": 2, "mean(id)": 50.0}]
    values = dataflow.from_items([{"v": 1.0}, {"v": None}, {"v": 3.0}], override_num_blocks=1)
    assert values.aggregate(Mean(on="v")) == {"mean(v)": 2.0}
    assert values.aggregate(Mean(on="v", ignore_nulls=False, alias_name="m2")) == {"m2": None}
    assert is_null(float("nan")) and is_null(None) and not is_null(0)


def test_block_accessor_answers_as_rays_for_custom_code():
    import pyarrow as pa

    from dataflow._internal.delegating_block_builder import DelegatingBlockBuilder
    from dataflow.block import BlockAccessor

    acc = BlockAccessor.for_block(pa.table({"x": [1, None, 3], "y": ["a", "b", "c"]}))
    assert acc.count("x", True) == 2 and acc.count("x") == 3
    assert acc.sum("x", True) == 4 and acc.sum("x", False) is None
    assert (acc.min("x", True), acc.max("x", True), acc.mean("x", True)) == (1, 3, 2.0)
    assert acc.sum_of_squared_diffs_from_mean("x", True) == 2.0
    with pytest.raises(ValueError, match="'z' not present"):
        acc.sum("z", True)
    assert acc.select(["y"]).column_names == ["y"] and acc.take([2]).to_pylist() == [{"x": 3, "y": "c"}]
    assert acc.rename_columns({"y": "w"}).column_names == ["x", "w"]
    assert acc.fill_column("k", 7)["k"].to_pylist() == [7, 7, 7]
    assert acc.hstack(pa.table({"z": [0, 0, 0]})).column_names == ["x", "y", "z"]
    assert acc._get_row(1) == {"x": None, "y": "b"}
    assert sorted(acc.random_shuffle(0)["y"].to_pylist()) == ["a", "b", "c"]
    builder = DelegatingBlockBuilder()
    builder.add({"a": 1})
    builder.add_block(pa.table({"a": [2, 3]}))
    builder.add({"a": 4})
    assert builder.num_rows() == 4 and builder.build()["a"].to_pylist() == [1, 2, 3, 4]
    assert BlockAccessor.builder().build().num_rows == 0


def test_smaller_api_differences_ray_scripts_ran_into():
    import pyarrow as pa

    from dataflow.datatype import DataType
    from dataflow.expressions import col

    with dataflow.options(execution_mode="local"):
        ds = dataflow.from_items([{"s": "aaa"}], override_num_blocks=1)
        # pyarrow's option, which Ray's str.replace passes on
        assert ds.with_column("r", col("s").str.replace("a", "X", max_replacements=2)).take_all() == [{"s": "aaa", "r": "XXa"}]
    ragged = DataType.variable_shaped_tensor(dtype=DataType.float32(), ndim=2).to_arrow_dtype()
    assert isinstance(ragged, pa.ExtensionType) and ragged.ndim == 2 and ragged.value_type == pa.float32()
    ctx = dataflow.DataContext.get_current()
    with pytest.warns(UserWarning, match="no effect here"):
        ctx.set_config("debug_limit_shuffle_execution_to_num_blocks", 2)
    ctx.remove_config("debug_limit_shuffle_execution_to_num_blocks")


def test_a_null_typed_column_becomes_nans_in_torch_batches_as_rays(mode):
    import pyarrow as pa

    ds = dataflow.from_arrow(pa.table({"f": pa.nulls(3), "x": [1, 2, 3]}))
    (batch,) = list(ds.iter_torch_batches(batch_size=3))
    assert batch["f"].dtype == torch.float32 and bool(torch.isnan(batch["f"]).all())


def _first_row_slow(row):
    if row["id"] == 0:
        import time

        time.sleep(0.3)
    return row


def test_small_jobs_give_rows_in_input_order_without_preserve_order(mode):
    """Ray promises no order without preserve_order, but small jobs come out in input order
    there; with a block per item (Ray's from_items layout) and both workers busy, ours came out
    as tasks finished. The head of an operator's output now waits for its earlier tasks."""
    for _ in range(2):
        # the first block is the slowest: its task finishes last
        rows = dataflow.range(1000).map(_first_row_slow).take_all()
        assert [r["id"] for r in rows] == list(range(1000))
        assert [r["item"] for r in dataflow.from_items(list(range(20))).take(5)] == [0, 1, 2, 3, 4]


def test_argument_errors_are_the_value_errors_ray_raises():
    ds = dataflow.from_items([{"A": 1, "B": 2}], override_num_blocks=1)
    with pytest.raises(ValueError, match="Key must be a string or a list of strings"):
        ds.groupby(lambda r: r)
    with pytest.raises(ValueError, match=r"filter\(expr=") as info:  # Ray: ValueError; a TypeError too
        ds.filter(fn="A > 1")
    assert isinstance(info.value, TypeError)
    from dataflow.aggregate import Count, Max, Std

    # Ray's block accessor refuses a column of None (a ValueError from the tasks); here at the call
    for agg in (Max(), Std()):
        with pytest.raises(ValueError, match="`on` value has to be non-null"):
            ds.aggregate(agg)
        with pytest.raises(ValueError, match="`on` value has to be non-null"):
            ds.groupby("A").aggregate(agg)
    assert ds.aggregate(Count()) == {"count()": 1}  # a count needs no column

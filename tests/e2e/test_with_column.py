"""Expressions end to end: with_column(s) and filter(expr=...) with strings and Exprs, on both modes."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import dataflow
from dataflow.datatype import DataType
from dataflow.errors import UserCodeError
from dataflow.expressions import col, lit, udf


def _people() -> dataflow.Dataset:
    return dataflow.from_items(
        [
            {"id": 0, "name": "alice", "age": 30, "score": 1.5},
            {"id": 1, "name": "Bob", "age": None, "score": 2.0},
            {"id": 2, "name": "carol", "age": 25, "score": None},
            {"id": 3, "name": "dave", "age": 41, "score": 0.5},
        ]
    )


def test_with_column_and_with_columns(mode):
    ds = (
        _people()
        .with_column("age_next", col("age") + 1)
        .with_columns(
            {
                "upper": col("name").str.upper(),
                "score": col("score").fill_null(0.0) * 2,  # replaced where it stands
                "adult": col("age") >= 30,
                "bucket": col("id") // 2,
                "one": lit(1),
            }
        )
    )
    rows = sorted(ds.take_all(), key=lambda r: r["id"])
    assert list(rows[0]) == ["id", "name", "age", "score", "age_next", "upper", "adult", "bucket", "one"]
    assert [r["age_next"] for r in rows] == [31, None, 26, 42]
    assert [r["upper"] for r in rows] == ["ALICE", "BOB", "CAROL", "DAVE"]
    assert [r["score"] for r in rows] == [3.0, 4.0, 0.0, 1.0]
    assert [r["adult"] for r in rows] == [True, None, False, True]
    assert [r["bucket"] for r in rows] == [0, 0, 1, 1]
    assert [r["one"] for r in rows] == [1, 1, 1, 1]
    assert ds.count() == 4


def test_filter_with_strings_and_expressions(mode):
    ds = _people()
    by_string = ds.filter(expr="age >= 30 and name != 'bob' or age is None")
    assert sorted(r["id"] for r in by_string.take_all()) == [0, 1, 3]
    by_expr = ds.filter(expr=col("name").str.starts_with("b", ignore_case=True) | col("score").is_null())
    assert sorted(r["id"] for r in by_expr.take_all()) == [1, 2]
    assert sorted(r["id"] for r in ds.filter(expr="id in [3, 0]").take_all()) == [0, 3]
    chained = ds.with_column("double", col("id") * 2).filter(expr="double > 2")
    assert sorted(r["id"] for r in chained.take_all()) == [2, 3]


def test_a_missing_column_is_named(mode):
    with pytest.raises(KeyError, match="no column 'agee'") as info:
        _people().filter(expr="agee > 3").take_all()
    assert isinstance(info.value, UserCodeError)
    with pytest.raises(KeyError, match="with_column\\('x'\\): no column 'nme'"):
        _people().with_column("x", col("nme").str.upper()).take_all()


def test_string_filter_skips_parquet_row_groups(tmp_path):
    from connectors import io_stats

    table = pa.table({"id": pa.array(range(10_000), pa.int64()), "k": [i % 4 for i in range(10_000)]})
    pq.write_table(table, tmp_path / "data.parquet", row_group_size=500)
    with dataflow.options(execution_mode="local"):
        io_stats.snapshot(reset=True)
        ds = dataflow.read_parquet(str(tmp_path)).filter(expr="id < 700 and k == 1")
        rows = ds.take_all()
        counters = io_stats.snapshot(reset=True)
        assert "Filter" not in ds.explain().split("Optimized Plan")[1]
    assert sorted(r["id"] for r in rows) == [i for i in range(700) if i % 4 == 1]
    assert counters["row_groups_read"] == 2 and counters["row_groups_skipped"] == 18


def test_a_missing_column_in_a_pushed_filter_is_named(tmp_path):
    pq.write_table(pa.table({"id": [1, 2, 3]}), tmp_path / "data.parquet")
    with dataflow.options(execution_mode="local"), pytest.raises(UserCodeError, match="zz"):
        dataflow.read_parquet(str(tmp_path)).filter(expr="zz > 1").take_all()


def test_a_filter_on_a_column_projected_away_fails_on_parquet_as_in_memory(tmp_path):
    """``select_columns(["a"]).filter(expr="b > 5")`` names ``b`` whatever the source: Arrow's
    Parquet scanner could filter on the dropped column, so that filter is not pushed."""
    table = pa.table({"a": list(range(10)), "b": [10 * i for i in range(10)]})
    pq.write_table(table, tmp_path / "data.parquet")
    with dataflow.options(execution_mode="local"):
        for ds in (dataflow.read_parquet(str(tmp_path)).select_columns(["a"]), dataflow.read_parquet(str(tmp_path), columns=["a"]),
                   dataflow.from_arrow(table).select_columns(["a"])):
            with pytest.raises(UserCodeError, match="no column 'b'"):
                ds.filter(expr="b > 50").take_all()
        kept = dataflow.read_parquet(str(tmp_path)).select_columns(["a"]).filter(expr="a > 5")
        assert kept.take_all() == [{"a": a} for a in range(6, 10)]
        assert "Filter" not in kept.explain().split("Optimized Plan")[1]  # still pushed


def test_rays_math_methods_and_string_concatenation(mode):
    ds = dataflow.from_items([{"a": -1.5, "i": 4, "s": "ab"}, {"a": 2.5, "i": -2, "s": "c"}])
    got = ds.with_columns({
        "ceil": col("a").ceil(), "floor": col("a").floor(), "round": col("a").round(), "trunc": col("a").trunc(),
        "abs": col("a").abs(), "sign": col("i").sign(), "pow": col("i").power(2), "neg": col("i").negate(),
        "ln": col("i").abs().ln(), "cat": col("s") + "x", "cat2": lit("<") + col("s"),
    }).take_all()
    assert [(r["ceil"], r["floor"], r["round"], r["trunc"], r["abs"]) for r in got] == [(-1.0, -2.0, -2.0, -1.0, 1.5), (3.0, 2.0, 2.0, 2.0, 2.5)]
    assert [(r["sign"], r["pow"], r["neg"]) for r in got] == [(1, 16, -4), (-1, 4, 2)]
    assert got[0]["ln"] == pytest.approx(math.log(4)) and [r["cat"] for r in got] == ["abx", "cx"]
    assert [r["cat2"] for r in got] == ["<ab", "<c"]
    assert dataflow.range(4).filter(expr=(col("id") - 2).abs() >= 1).take_all() == [{"id": 0}, {"id": 1}, {"id": 3}]


def test_range_tensor_and_from_blocks(mode):
    ds = dataflow.range_tensor(5, shape=(2, 2), override_num_blocks=2)
    rows = ds.take_all()
    assert [r["data"].tolist() for r in rows] == [[[i, i], [i, i]] for i in range(5)]
    assert rows[0]["data"].dtype == np.int64
    blocks = dataflow.from_blocks([pa.table({"a": [1]}), pd.DataFrame({"a": [2, 3]}), pa.table({"a": [4]})])
    assert isinstance(blocks, dataflow.MaterializedDataset)  # eager, as Ray's
    assert blocks.num_blocks() == 3 and blocks.take_all() == [{"a": i} for i in range(1, 5)]  # in order
    assert [b.num_rows for b in blocks.iter_batches(batch_size=None, batch_format="pyarrow")] == [1, 2, 1]


def test_list_struct_and_datetime_functions_in_a_pipeline(mode):
    """Ray's ``.list``, ``.struct`` and ``.dt`` functions in ``with_column`` and ``filter`` (a
    filter on one runs on the data: it has no pyarrow form to push into a read)."""
    import datetime

    items = [{"tags": list(range(i % 4)), "point": {"x": i, "y": -i},
              "at": datetime.datetime(2026, 1, 1) + datetime.timedelta(days=i)} for i in range(40)]
    ds = dataflow.from_items(items, override_num_blocks=4)
    out = (ds.filter(expr=col("tags").list.len() >= 2)
           .with_columns({"last": col("tags").list[-1], "x": col("point").struct["x"], "month": col("at").dt.month()})
           .take_all())
    assert sorted(r["x"] for r in out) == [i for i in range(40) if i % 4 >= 2]
    assert all(r["last"] == r["x"] % 4 - 1 and r["month"] == (datetime.datetime(2026, 1, 1)
               + datetime.timedelta(days=r["x"])).month for r in out)


@udf(return_dtype=DataType.int32())
def add_one(column):
    return pc.add(column, 1)


@udf(return_dtype=DataType.int32())
class AddOffset:
    def __init__(self, offset):
        self.offset = offset

    def __call__(self, x):
        return pc.add(x, self.offset)


@udf(return_dtype=DataType.string())
def full_name(first, last):
    return pc.binary_join_element_wise(first, last, " ")


@udf(return_dtype=DataType.int64())
def broken(column):
    raise ZeroDivisionError("bad math in broken")


def test_rays_udf_expressions(mode):
    """Ray's ``@udf`` examples (``Dataset.with_column``'s docstring): a function and a callable
    class of pyarrow arrays, used in ``with_column`` and ``filter``; its error is its own."""
    ds = dataflow.range(10, override_num_blocks=3)
    assert ds.with_column("id_plus_one", add_one(col("id"))).take(2) == [{"id": 0, "id_plus_one": 1},
                                                                          {"id": 1, "id_plus_one": 2}]
    add_five = AddOffset(5)
    assert AddOffset.__name__ == "AddOffset"
    out = ds.with_column("id_plus_five", add_five(col("id")))
    assert sorted(r["id_plus_five"] for r in out.take_all()) == list(range(5, 15))
    assert out.schema().types[-1] == pa.int32()  # the declared return type
    names = dataflow.from_items([{"first": "John", "last": "Doe"}, {"first": "Jane", "last": "Smith"}])
    assert [r["name"] for r in names.with_column("name", full_name(col("first"), col("last"))).take_all()] == [
        "John Doe", "Jane Smith"]
    assert sorted(r["id"] for r in ds.filter(expr=add_one(col("id")) > 8).take_all()) == [8, 9]
    assert sorted(r["y"] for r in ds.with_column("y", add_one(col("id") * 2) + lit(1)).take_all()) == [
        2 * i + 2 for i in range(10)]
    with pytest.raises(ZeroDivisionError, match="bad math in broken") as info:
        ds.with_column("x", broken(col("id"))).take_all()
    assert "broken" in str(info.value)

"""User errors keep their identity, name the UDF and carry the worker's traceback."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import dataflow
from dataflow.errors import ResourceError, UserCodeError


def parse_price(row):
    if row["id"] == 37:
        raise ValueError(f"bad price in row {row['id']}")
    return row


def test_udf_exception_keeps_its_type(mode):
    with pytest.raises(ValueError, match="bad price in row 37") as info:
        dataflow.range(100).map(parse_price).take_all()
    err = info.value
    assert isinstance(err, UserCodeError)
    text = str(err)
    assert "parse_price" in text
    assert "test_errors.py" in text  # the worker's traceback points at the user's line
    assert "engine/" not in err.remote_traceback  # engine frames trimmed
    assert isinstance(err.__cause__, ValueError)


class CustomError(Exception):
    def __init__(self, code, detail):
        super().__init__(code, detail)
        self.code = code


def raise_custom(batch):
    raise CustomError(42, "nope")


def test_custom_exception_class_with_extra_args(mode):
    with pytest.raises(CustomError) as info:
        dataflow.range(10).map_batches(raise_custom).count()
    assert "raise_custom" in str(info.value)
    assert info.value.__cause__.code == 42


class BrokenModel:
    def __init__(self):
        raise RuntimeError("weights not found")

    def __call__(self, batch):
        return batch


def test_constructor_failure(mode):
    with pytest.raises(RuntimeError, match="weights not found") as info:
        dataflow.range(10).map_batches(BrokenModel, concurrency=1).take_all()
    assert "BrokenModel" in str(info.value)


def test_bad_udf_return_names_the_udf(mode):
    with pytest.raises(TypeError, match="must return a dict") as info:
        dataflow.range(10).map_batches(lambda b: 5).take_all()
    assert "MapBatches(" in str(info.value) and "<lambda>" in str(info.value)
    with pytest.raises(TypeError, match="must return a dict"):
        dataflow.range(10).map(lambda r: 5).take_all()
    # Ray raises ValueError here: UDFOutputError is both
    with pytest.raises(ValueError, match="must return a dict") as info:
        dataflow.range(10).flat_map(lambda r: [1]).take_all()
    assert isinstance(info.value, dataflow.errors.UDFOutputError)


@pytest.mark.parametrize("value", [1, np.int64(1), "xy", None, {"k": [1]}, np.array(3), b"ab", {5, 6}])
def test_a_batch_column_that_is_one_value_is_refused_naming_it(mode, value):
    """Ray 2.60 refuses a dict value that is not a list or an array (ValueError). Here a string
    became one row per character, and a number failed with "'int' object is not iterable"."""
    with pytest.raises(ValueError, match=r"column 'a' is one .*, not a column") as info:
        dataflow.range(4, override_num_blocks=1).map_batches(lambda b: {"id": b["id"], "a": value}).take_all()
    assert isinstance(info.value, TypeError) and "MapBatches(<lambda>)" in str(info.value)


@pytest.mark.parametrize("value", [{"a": 1}, None, "ab", 5])
def test_a_flat_map_that_returns_no_rows_list_is_refused_naming_it(mode, value):
    """A dict came out as its keys, each "not a dict"; None as "'NoneType' object is not
    iterable". Ray refuses both (ValueError, TypeError)."""
    with pytest.raises(ValueError, match=r"flat_map function must return a list .* of rows, got") as info:
        dataflow.range(3).flat_map(lambda r: value).take_all()
    assert isinstance(info.value, TypeError) and "FlatMap(<lambda>)" in str(info.value)
    assert dataflow.range(3).flat_map(lambda r: value, on_error="skip").take_all() == []


def test_batch_columns_of_every_kind_are_columns(mode):
    import pandas as pd

    kinds = {"list": [1, 2], "tuple": (1, 2), "range": range(1, 3), "array": np.array([1, 2]),
             "arrow": pa.array([1, 2]), "chunked": pa.chunked_array([[1], [2]]), "series": pd.Series([1, 2])}
    rows = dataflow.range(2, override_num_blocks=1).map_batches(lambda b: dict(kinds)).take_all()
    assert rows == [dict.fromkeys(kinds, 1), dict.fromkeys(kinds, 2)]


def test_two_columns_of_one_name_are_refused_naming_it(mode):
    """A rename onto a column that exists made a table with two "b" columns: selecting either
    failed later ('Field "b" exists 2 times'), and the Ray runner could not ship the block (a
    "worker died" error). Ray 2.60 keeps one "b" and drops the other's values silently."""
    ds = dataflow.from_items([{"a": 1, "b": 2}])
    with pytest.raises(ValueError, match=r"rename_columns\(\{'a': 'b'\}\) would give two columns named 'b'"):
        ds.rename_columns({"a": "b"}).take_all()
    assert ds.rename_columns({"a": "b", "b": "a"}).take_all() == [{"b": 1, "a": 2}]  # a swap is fine
    with pytest.raises(ValueError, match="gives two columns the name 'x'"):
        ds.rename_columns({"a": "x", "b": "x"})  # at the call
    twice = dataflow.range(2).map_batches(
        lambda t: pa.table([t["id"], t["id"]], names=["v", "v"]), batch_format="pyarrow")
    with pytest.raises(ValueError, match="returned two columns named 'v'") as info:
        twice.take_all()
    assert "MapBatches(<lambda>)" in str(info.value)


def _other_keys(row):
    return {"a": "x"} if row["id"] > 5 else {"b": "x"}


def _keys_in_any_order(row):
    return {"a": 1, "b": 2} if row["id"] > 5 else {"b": 2, "a": 1}


def test_rows_with_other_keys_get_nulls_as_in_ray(mode):
    # Ray 2.60's TableBlockBuilder fills a key a row lacks with None
    rows = dataflow.range(10, override_num_blocks=1).map(_other_keys).take_all()
    assert sorted(map(str, rows)) == sorted(map(str, [{"b": "x", "a": None}] * 6 + [{"b": None, "a": "x"}] * 4))
    assert dataflow.range(10, override_num_blocks=1).map(_keys_in_any_order).take_all() == [{"a": 1, "b": 2}] * 10
    assert dataflow.from_items([{"a": 1}, {"b": 2}], override_num_blocks=1).take_all() == [
        {"a": 1, "b": None}, {"a": None, "b": 2}]


def test_arguments_are_checked_when_called():
    with pytest.raises(TypeError, match="expects a function"):
        dataflow.range(3).map(5)
    with pytest.raises(ValueError, match="batch_format"):
        dataflow.range(3).map_batches(lambda b: b, batch_format="arrowish")
    with pytest.raises(ValueError, match="concurrency"):
        dataflow.range(3).map_batches(lambda b: b, concurrency=(3, 1))
    with pytest.raises(ValueError, match="batch_size"):
        dataflow.range(3).map_batches(lambda b: b, batch_size=0)
    with pytest.raises(ValueError, match="exactly one"):
        dataflow.range(3).filter()
    for names in (str.upper, {"id": 1}, ["a", 2], "id"):  # Ray: TypeError at the call too
        with pytest.raises(TypeError, match="rename_columns takes a dict of old to new names or a list"):
            dataflow.range(3).rename_columns(names)
    with pytest.raises(TypeError, match="add_column: the column name must be a str, got int"):
        dataflow.range(3).add_column(1, lambda df: df["id"])
    for call in (lambda ds: ds.union(5), lambda ds: ds.zip(ds, 5), lambda ds: ds.join(5, "inner", on=("id",))):
        with pytest.raises(TypeError, match=r"\(\) takes datasets, got int: 5"):
            call(dataflow.range(3))
    with pytest.raises(ValueError, match=r"path to write to must be a str or os\.PathLike, got int"):
        dataflow.range(3).write_parquet(5)  # (it was written as a folder named "5")


def test_impossible_resources_fail_at_once(mode):
    with pytest.raises(ResourceError, match="num_gpus=1"):
        dataflow.range(3).map_batches(lambda b: b, num_gpus=1).take_all()
    with pytest.raises(ResourceError, match="TPU"):
        dataflow.range(3).map_batches(lambda b: b, resources={"TPU": 1}).take_all()


def test_error_after_partial_consumption_frees_everything(mode):
    def fail_late(batch):
        if batch["id"][0] >= 500:
            raise KeyError("late")
        return batch

    seen = 0
    with pytest.raises(KeyError):
        for batch in dataflow.range(1000, override_num_blocks=10).map_batches(fail_late).iter_batches(batch_size=10):
            seen += len(batch["id"])
    assert seen <= 500


def test_early_break_cancels_cleanly(mode):
    for i, _ in enumerate(dataflow.range(100_000, override_num_blocks=50).map(lambda r: r).iter_batches(batch_size=10)):
        if i == 3:
            break


def test_a_source_failing_while_listing_fails_the_job_not_the_engine(mode):
    from connectors.base import Datasource

    class Listing(Datasource):
        def get_read_tasks(self, parallelism):
            from connectors.base import BlockMetadata, ReadTask

            yield ReadTask(lambda: [__import__("pyarrow").table({"x": [1]})], BlockMetadata(num_rows=1))
            raise PermissionError("s3://bucket/private/: access denied while listing")

    with pytest.raises(PermissionError, match="access denied while listing"):
        dataflow.read_datasource(Listing()).take_all()
    assert dataflow.range(10).map(lambda r: r).count() == 10  # the engine still works


def test_a_failed_job_keeps_nothing_of_the_caller_alive(mode, tmp_path):
    """The error a failed job raises holds the caller's frames; nothing in the engine may keep
    it (the slot that runs tasks in the driver kept its last task until the next one came)."""
    import gc
    import weakref

    def fail(batch):
        raise KeyError("boom")

    ds = dataflow.from_items([{"v": [1, 2]}, {"v": [3]}], override_num_blocks=1)
    alive = weakref.ref(ds)
    with pytest.raises(KeyError):
        ds.map_batches(fail).take_all()
    with pytest.raises(TypeError):
        ds.write_numpy(str(tmp_path / "npy"), column="v")  # lists of different lengths
    del ds
    gc.collect()
    assert alive() is None


class _HTTPError(Exception):
    def __init__(self, status, url):  # not the args it passes up: pickling alone cannot rebuild it
        super().__init__(f"{status} for {url}")
        self.status, self.url = status, url


class _APIError(Exception):
    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


class _BadStr(Exception):
    def __str__(self):
        return "row %s failed: %s" % self.args  # noqa: UP031 (raises TypeError with one argument)


def _raise_http(row):
    raise _HTTPError(503, "http://example/api")


def _raise_api(row):
    raise _APIError("service unavailable", status=503)


def _raise_bad_str(row):
    raise _BadStr("only one")


def test_user_exceptions_keep_their_class_and_attributes_whatever_their_constructor(mode):
    with pytest.raises(_HTTPError) as info:
        dataflow.range(3).map(_raise_http).take_all()
    assert info.value.status == 503 and "503 for http://example/api" in str(info.value)
    with pytest.raises(_APIError) as api:
        dataflow.range(3).map(_raise_api).take_all()
    assert api.value.status == 503 and "Map(_raise_api)" in str(api.value)
    # a __str__ that raises is the UDF's error still, not a worker that died three times
    with pytest.raises(_BadStr, match=r"Map\(_raise_bad_str\).*__str__ raised TypeError"):
        dataflow.range(3).map(_raise_bad_str).take_all()
    assert dataflow.range(3).count() == 3

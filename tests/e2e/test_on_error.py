"""on_error="skip" drops only the rows a UDF raises on; counts, the error sink, max_errored_blocks."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dataflow
from dataflow.errors import UserCodeError

BAD = {37, 500, 901}


def fail_on_bad_rows(row):
    if row["id"] in BAD:
        raise ValueError(f"bad row {row['id']}")
    return {"id": row["id"], "double": row["id"] * 2}


def fail_on_bad_batches(batch):
    hit = sorted(set(batch["id"].tolist()) & BAD)
    if hit:
        raise KeyError(f"bad rows {hit}")
    return {"id": batch["id"], "double": batch["id"] * 2}


def operator_stats(ds) -> dict:
    ds.stats()
    return ds._last_stats.to_dict()["operators"][-1]


def test_a_bad_row_in_a_batch_of_1000_costs_one_row(mode):
    calls = []

    def one_bad_row(batch):
        calls.append(len(batch["id"]))
        if 500 in batch["id"]:
            raise ValueError("row 500 is bad")
        return batch

    ds = dataflow.range(1000, override_num_blocks=1).map_batches(one_bad_row, batch_size=1000, on_error="skip")
    ids = sorted(row["id"] for row in ds.take_all())
    assert ids == [i for i in range(1000) if i != 500]
    stats = operator_stats(ds)
    assert stats["rows_skipped"] == 1
    assert stats["errors"] == {"ValueError": 1}
    if mode == "local":  # the calls are seen in this process: bisection, not one call per row
        assert len(calls) <= 2 * 10 + 1


def test_row_stages_skip_each_failing_row(mode):
    def bad_filter(row):
        if row["id"] == 3:
            raise ZeroDivisionError("no")
        return row["id"] % 2 == 1

    def bad_flat_map(row):
        if row["id"] == 5:
            raise RuntimeError("no")
        return [row, row]

    ds = (
        dataflow.range(1000)
        .map(fail_on_bad_rows, on_error="skip")
        .filter(bad_filter, on_error="skip")
        .flat_map(bad_flat_map, on_error="skip")
    )
    ids = sorted(row["id"] for row in ds.take_all())
    assert ids == sorted(2 * [i for i in range(1000) if i % 2 == 1 and i not in BAD | {3, 5}])
    assert ds.count() == len(ids)
    stats = operator_stats(ds)
    assert stats["rows_skipped"] == 5
    assert stats["errors"] == {"ValueError": 3, "ZeroDivisionError": 1, "RuntimeError": 1}
    assert 'skipped 5 rows (on_error="skip")' in ds.stats()


def test_a_row_function_returning_no_dict_is_a_skipped_row(mode):
    ds = dataflow.range(10).map(lambda r: r if r["id"] != 4 else 4, on_error="skip")
    assert [r["id"] for r in ds.take_all()] == [0, 1, 2, 3, 5, 6, 7, 8, 9]
    assert operator_stats(ds)["errors"] == {"UDFOutputError": 1}  # a TypeError and a ValueError


def test_skip_on_an_actor_pool(mode):
    class Model:
        def __call__(self, batch):
            return fail_on_bad_batches(batch)

    ds = dataflow.range(1000, override_num_blocks=4).map_batches(Model, batch_size=100, concurrency=1, on_error="skip")
    assert sorted(r["id"] for r in ds.take_all()) == [i for i in range(1000) if i not in BAD]
    assert operator_stats(ds)["errors"] == {"KeyError": 3}


def test_error_sink_holds_the_rows_and_their_errors(mode, tmp_path):
    source = tmp_path / "in"
    source.mkdir()
    pq.write_table(pa.table({"id": list(range(500))}), source / "first.parquet")
    pq.write_table(pa.table({"id": list(range(500, 1000))}), source / "second.parquet")
    sink = tmp_path / "errors"

    ds = dataflow.read_parquet(str(source)).map_batches(
        fail_on_bad_batches, batch_size=250, on_error="skip", error_sink=str(sink)
    )
    assert ds.count() == 1000 - len(BAD)

    errors = pq.read_table(sink).sort_by("row").to_pylist()
    assert [json.loads(e["row"]) for e in errors] == [{"id": 37}, {"id": 500}, {"id": 901}]
    for error in errors:
        assert error["operator"] == "MapBatches(fail_on_bad_batches)"
        assert error["exception_type"] == "KeyError"
        assert error["message"] == f"'bad rows [{json.loads(error['row'])['id']}]'"
        assert "test_on_error.py" in error["traceback"] and "raise KeyError" in error["traceback"]
        assert "engine/" not in error["traceback"]
    assert [e["input_file"].rsplit("/", 1)[1] for e in errors] == ["first.parquet", "second.parquet", "second.parquet"]


def test_error_sink_of_a_row_stage(mode, tmp_path):
    ds = dataflow.from_items([{"id": i, "name": f"n{i}", "vec": [i, i]} for i in range(40)]).map(
        fail_on_bad_rows, on_error="skip", error_sink=str(tmp_path / "e")
    )
    assert ds.count() == 39
    (error,) = pq.read_table(tmp_path / "e").to_pylist()
    assert json.loads(error["row"]) == {"id": 37, "name": "n37", "vec": [37, 37]}
    assert error["operator"] == "Map(fail_on_bad_rows)"
    assert error["exception_type"] == "ValueError" and error["message"] == "bad row 37"
    assert error["input_file"] is None


@pytest.mark.s3
def test_error_sink_on_s3(s3, tmp_path):
    with dataflow.options(execution_mode="local"):
        ds = dataflow.range(100).map(fail_on_bad_rows, on_error="skip", error_sink="s3://test-bucket/errors/")
        assert ds.count() == 99
        (key,) = s3.keys("errors/")
        assert key.endswith(".parquet")
        table = dataflow.read_parquet("s3://test-bucket/errors/").to_arrow()
    assert table.column("row").to_pylist() == ['{"id": 37}']


def test_raise_is_the_default_and_names_the_input_file(mode, tmp_path):
    pq.write_table(pa.table({"id": list(range(100))}), tmp_path / "rows.parquet")
    with pytest.raises(ValueError, match="bad row 37") as info:
        dataflow.read_parquet(str(tmp_path)).map(fail_on_bad_rows).take_all()
    assert isinstance(info.value, UserCodeError)
    assert "rows.parquet" in str(info.value)
    assert "Map(fail_on_bad_rows)" in str(info.value)


def test_arguments_are_checked():
    with pytest.raises(ValueError, match=r'"raise".*"skip"'):
        dataflow.range(3).map(fail_on_bad_rows, on_error="ignore")
    with pytest.raises(ValueError, match='pass on_error="skip"'):
        dataflow.range(3).map_batches(fail_on_bad_batches, error_sink="/tmp/x")
    with pytest.raises(ValueError, match="for fn"):
        dataflow.range(3).filter(expr="id > 1", on_error="skip")
    with pytest.raises(ValueError, match="max_errored_blocks"):
        dataflow.DataContext.get_current().max_errored_blocks = -2


def test_max_errored_blocks(mode):
    ctx = dataflow.DataContext.get_current()
    assert ctx.max_errored_blocks == 0

    def pipeline():  # ten tasks of 100 rows; the tasks holding 37, 500 and 901 fail
        return dataflow.range(1000, override_num_blocks=10).map_batches(fail_on_bad_batches)

    with dataflow.options(min_task_input_bytes=1), pytest.raises(KeyError, match="bad rows"):
        pipeline().take_all()
    with dataflow.options(min_task_input_bytes=1, max_errored_blocks=2), pytest.raises(KeyError, match="bad rows"):
        pipeline().take_all()
    for limit in (3, -1):
        with dataflow.options(min_task_input_bytes=1, max_errored_blocks=limit):
            ds = pipeline()
            ids = sorted(r["id"] for r in ds.take_all())
            assert ids == [i for i in range(1000) if i // 100 not in (0, 5, 9)]
            stats = operator_stats(ds)
            assert stats["blocks_errored"] == 3 and stats["errors"] == {"KeyError": 3}
            assert "dropped 3 blocks (max_errored_blocks)" in ds.stats()
    ctx.max_errored_blocks = 3  # Ray's spelling: the context's setting
    try:
        with dataflow.options(min_task_input_bytes=1):
            assert pipeline().count() == 700
        # with the default bundling too: a failure drops its block's rows only, as in Ray (a task
        # bundling several small blocks dropped all of them)
        assert pipeline().count() == 700
        materialized = dataflow.range(1000, override_num_blocks=10).materialize()
        assert materialized.map_batches(fail_on_bad_batches).count() == 700
    finally:
        ctx.max_errored_blocks = 0

"""Columns made rather than computed: random(), uuid(), monotonically_increasing_id(),
download(column) and unnest(struct), as Ray Data 2.60 documents them, on both modes."""

from __future__ import annotations

import logging
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import dataflow
from connectors.download import DownloadError
from dataflow.datatype import DataType
from dataflow.expressions import col, download, monotonically_increasing_id, random, udf, unnest, uuid


def test_monotonically_increasing_id_has_rays_layout(mode):
    """Ray's docstring: range(4, override_num_blocks=2) gives 0, 1, 2**33, 2**33 + 1."""
    with dataflow.options(min_task_input_bytes=1):  # one task per block, as Ray runs them
        rows = dataflow.range(4, override_num_blocks=2).with_column("uid", monotonically_increasing_id()).take_all()
    assert sorted(r["uid"] for r in rows) == [0, 1, 1 << 33, (1 << 33) + 1]


def test_monotonically_increasing_id_is_unique_and_increasing_within_a_task(mode):
    with dataflow.options(min_task_input_bytes=1):
        ds = dataflow.range(10_000, override_num_blocks=7).map_batches(lambda b: b, batch_size=300)
        table = ds.with_column("uid", monotonically_increasing_id()).to_arrow()
    uids = table.column("uid").to_numpy()
    assert len(np.unique(uids)) == 10_000
    tasks = uids >> 33
    assert len(np.unique(tasks)) == 7
    for task in np.unique(tasks):  # each task's rows numbered 0, 1, 2... across its batches
        mine = np.sort(uids[tasks == task] & ((1 << 33) - 1))
        assert (mine == np.arange(len(mine))).all()


@pytest.fixture
def one_task_per_block():
    """Seeded draws are reproducible where each task gets the same inputs (as Ray's): small
    blocks are otherwise bundled into tasks as they arrive, which timing decides."""
    with dataflow.options(min_task_input_bytes=1):
        yield


def _draws(ds: dataflow.Dataset) -> np.ndarray:
    """The ``rand`` column in ``id`` order (blocks arrive in any order)."""
    table = ds.to_arrow()
    return table.column("rand").to_numpy()[np.argsort(table.column("id").to_numpy())]


def test_random_with_a_seed_is_reproducible_and_new_each_execution(mode, one_task_per_block):
    ds = dataflow.range(1000, override_num_blocks=4).with_column("rand", random(seed=42))
    first, second = _draws(ds), _draws(ds)
    assert ((first >= 0) & (first < 1)).all() and len(np.unique(first)) == 1000
    assert not np.array_equal(first, second)  # reseed_after_execution=True: a new draw per execution
    # the same dataset built again is a later execution of the process: new draws, as Ray's
    # docstring shows (its DataContext numbers executions)
    again = dataflow.range(1000, override_num_blocks=4).with_column("rand", random(seed=42))
    third = _draws(again)
    assert not np.array_equal(third, first) and not np.array_equal(third, second)

    fixed = dataflow.range(1000, override_num_blocks=4).with_column("rand", random(seed=7, reseed_after_execution=False))
    assert np.array_equal(_draws(fixed), _draws(fixed))
    other = dataflow.range(1000, override_num_blocks=4).with_column("rand", random(seed=8, reseed_after_execution=False))
    assert not np.array_equal(_draws(fixed), _draws(other))


def test_random_without_a_seed_differs_each_execution_and_samples_in_a_filter(mode):
    ds = dataflow.range(500).with_column("rand", random())
    assert not np.array_equal(_draws(ds), _draws(ds))
    sampled = dataflow.range(20_000, override_num_blocks=4).filter(expr=random(seed=3) < 0.25)
    kept = sampled.count()
    assert 4_500 < kept < 5_500
    assert repr(random()) == "RANDOM()"
    assert repr(random(seed=1234)) == "RANDOM(seed=1234, reseed_after_execution=True)"
    with pytest.raises(TypeError, match="seed"):
        random(seed="1")


def test_uuid_gives_version_4_strings(mode):
    table = dataflow.range(2000, override_num_blocks=3).with_column("u", uuid()).to_arrow()
    values = table.column("u").to_pylist()
    assert table.schema.field("u").type == pa.string() and len(set(values)) == 2000
    shape = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
    assert all(shape.match(v) for v in values)
    plain = dataflow.range(3).with_column("u", uuid().str.replace("-", "")).take_all()  # Ray's docstring example
    assert all(len(r["u"]) == 32 for r in plain)


def test_download_reads_each_uri_and_nulls_the_rest(mode, tmp_path, caplog):
    for i in range(5):
        (tmp_path / f"f{i}.bin").write_bytes(bytes([i]) * (i + 1))
    rows = [{"uri": str(tmp_path / f"f{i}.bin")} for i in range(5)]
    rows += [{"uri": None}, {"uri": str(tmp_path / "missing.bin")}, {"uri": f"file://{tmp_path}/f4.bin"}]
    with caplog.at_level(logging.WARNING, logger="dataflow"):
        out = dataflow.from_items(rows, override_num_blocks=1).with_column("bytes", download("uri")).take_all()
    got = {r["uri"]: r["bytes"] for r in out}
    assert [got[str(tmp_path / f"f{i}.bin")] for i in range(5)] == [bytes([i]) * (i + 1) for i in range(5)]
    assert got[None] is None and got[str(tmp_path / "missing.bin")] is None
    assert got[f"file://{tmp_path}/f4.bin"] == bytes([4]) * 5
    if mode == "local":  # (in a worker the warning goes to the worker's log)
        assert "missing.bin" in caplog.text and "1 of 8 URIs could not be read" in caplog.text


def test_download_on_error_raise_names_the_uri(mode, tmp_path):
    (tmp_path / "a.bin").write_bytes(b"a")
    ds = dataflow.from_items([{"uri": str(tmp_path / "a.bin")}, {"uri": str(tmp_path / "gone.bin")}])
    with pytest.raises(DownloadError, match=r"gone\.bin"):
        ds.with_column("bytes", download("uri", on_error="raise")).take_all()
    with pytest.raises(KeyError, match="nope"):
        ds.with_column("bytes", download("nope")).take_all()
    with pytest.raises(ValueError, match="on_error"):
        download("uri", on_error="skip")


@pytest.mark.s3
def test_download_from_s3(s3_engine, mode):
    for i in range(20):
        s3_engine.put(f"images/{i}.jpg", f"image {i}".encode())
    uris = [{"uri": f"s3://test-bucket/images/{i}.jpg"} for i in range(20)] + [{"uri": "s3://test-bucket/images/none.jpg"}]
    out = dataflow.from_items(uris).with_column("bytes", download("uri")).take_all()
    got = {r["uri"]: r["bytes"] for r in out}
    assert all(got[f"s3://test-bucket/images/{i}.jpg"] == f"image {i}".encode() for i in range(20))
    assert got["s3://test-bucket/images/none.jpg"] is None


def test_download_over_http(mode, http_folder):
    """A real HTTP server on 127.0.0.1: each URI fetched; a 404 is null."""
    folder, base = http_folder
    for i in range(6):
        (folder / f"{i}.txt").write_bytes(f"page {i}".encode())
    uris = [{"uri": f"{base}/{i}.txt"} for i in range(6)] + [{"uri": f"{base}/absent.txt"}]
    out = dataflow.from_items(uris).with_column("bytes", download("uri")).take_all()
    got = {r["uri"]: r["bytes"] for r in out}
    assert [got[f"{base}/{i}.txt"] for i in range(6)] == [f"page {i}".encode() for i in range(6)]
    assert got[f"{base}/absent.txt"] is None


@udf(return_dtype=DataType.struct([("sum_ab", DataType.int64()), ("product_ab", DataType.int64())]))
def make_features(a: pa.ChunkedArray, b: pa.ChunkedArray) -> pa.StructArray:
    """Ray's docstring example: its arguments are the columns' ChunkedArrays."""
    return pa.StructArray.from_arrays(
        [pc.add(a, b).combine_chunks(), pc.multiply(a, b).combine_chunks()], names=["sum_ab", "product_ab"]
    )


def test_unnest_expands_a_struct_into_columns(mode):
    ds = dataflow.from_items([{"a": 2, "b": 10}, {"a": 3, "b": 20}])
    assert ds.with_columns(unnest(make_features(col("a"), col("b")))).take(1) == [
        {"a": 2, "b": 10, "sum_ab": 12, "product_ab": 20}]
    mixed = ds.with_columns({"a2": col("a") * 2}, unnest(make_features(col("a"), col("b")))).take_all()
    assert mixed == [{"a": 2, "b": 10, "a2": 4, "sum_ab": 12, "product_ab": 20},
                     {"a": 3, "b": 20, "a2": 6, "sum_ab": 23, "product_ab": 60}]
    nested = dataflow.from_items([{"p": {"x": 1, "y": "u"}}, {"p": {"x": 2, "y": "v"}}])
    assert nested.with_columns(unnest(col("p"))).take_all() == [
        {"p": {"x": 1, "y": "u"}, "x": 1, "y": "u"}, {"p": {"x": 2, "y": "v"}, "x": 2, "y": "v"}]


def test_unnest_errors(mode):
    with pytest.raises(TypeError, match="cannot be aliased"):
        unnest(col("p")).alias("q")
    with pytest.raises(TypeError, match="nested"):
        unnest(unnest(col("p")))
    with pytest.raises(TypeError, match="struct-typed"):
        dataflow.range(3).with_columns(unnest(col("id"))).take_all()
    with pytest.raises(ValueError, match="given twice"):
        dataflow.range(3).with_columns({"a": col("id")}, {"a": col("id") + 1})

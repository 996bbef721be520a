"""Every file format through the Dataset API, on both execution modes: round trips, pushdown,
footer counts, file sizing, partitioned and atomic writes, S3, and bad input named by file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

import dataflow


def _files(folder: Path, suffix: str = "") -> list[Path]:
    return sorted(p for p in folder.rglob(f"*{suffix}") if p.is_file())


def _table(n: int = 1000) -> pa.Table:
    ids = np.arange(n, dtype=np.int64)
    return pa.table({"id": ids, "k": ids % 4, "x": ids * 0.5, "s": [f"s{i}" for i in ids]})


def _write_parts(folder: Path, table: pa.Table, parts: int = 4, **kwargs) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    step = -(-table.num_rows // parts)
    for i in range(parts):
        pq.write_table(table.slice(i * step, step), folder / f"part-{i}.parquet", **kwargs)


def _ids(rows) -> list[int]:
    return sorted(r["id"] for r in rows)


# ----- round trips ----------------------------------------------------------------------------


def test_parquet_round_trip(mode, tmp_path):
    table = _table(2000)
    _write_parts(tmp_path / "in", table)
    ds = dataflow.read_parquet(str(tmp_path / "in"))
    assert ds.schema() == table.schema
    ds.map_batches(lambda b: {**b, "y": b["x"] * 2}).write_parquet(str(tmp_path / "out"))
    back = dataflow.read_parquet(str(tmp_path / "out")).to_arrow().sort_by("id")
    assert back.select(["id", "k", "x", "s"]).equals(table)
    assert back["y"].to_pylist() == [v * 2 for v in table["x"].to_pylist()]


def test_csv_round_trip(mode, tmp_path):
    table = _table(1500)
    dataflow.from_arrow(table).write_csv(str(tmp_path / "out"))
    files = _files(tmp_path / "out")
    assert tmp_path / "out" / "_SUCCESS" in files and all(p.suffix == ".csv" for p in files if p.name != "_SUCCESS")
    back = dataflow.read_csv(str(tmp_path / "out")).to_arrow().sort_by("id")
    assert back.equals(table)


def test_csv_options_pass_through(mode, tmp_path):
    (tmp_path / "a.csv").write_text("id;name\n1;x\n2;y\n")
    ds = dataflow.read_csv(
        str(tmp_path / "a.csv"),
        parse_options=pacsv.ParseOptions(delimiter=";"),
        convert_options=pacsv.ConvertOptions(column_types={"id": pa.int32()}),
    )
    assert ds.schema() is None or ds.schema().field("id").type == pa.int32()
    assert ds.take_all() == [{"id": 1, "name": "x"}, {"id": 2, "name": "y"}]


def test_json_round_trip(mode, tmp_path):
    table = _table(1200)
    dataflow.from_arrow(table).write_json(str(tmp_path / "out"))
    back = dataflow.read_json(str(tmp_path / "out")).to_arrow().sort_by("id")
    assert back.equals(table)
    (tmp_path / "array.json").write_text(json.dumps([{"a": 1}, {"a": 2}]))
    assert dataflow.read_json(str(tmp_path / "array.json")).take_all() == [{"a": 1}, {"a": 2}]


def test_text_and_binary(mode, tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "a.txt").write_text("one\ntwo\n\nthree\n")
    (tmp_path / "t" / "b.txt").write_text("four\r\nfive\r\n")
    rows = dataflow.read_text(str(tmp_path / "t")).take_all()
    assert sorted(r["text"] for r in rows) == ["five", "four", "one", "three", "two"]
    ds = dataflow.read_binary_files(str(tmp_path / "t"), include_paths=True)
    by_path = {os.path.basename(r["path"]): r["bytes"] for r in ds.take_all()}
    assert by_path == {"a.txt": b"one\ntwo\n\nthree\n", "b.txt": b"four\r\nfive\r\n"}
    assert ds.to_arrow().schema.field("bytes").type == pa.binary()  # Ray's type (not large_binary)


def test_images(mode, tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    pixels = [rng.integers(0, 255, (6, 8, 3), dtype=np.uint8) for _ in range(3)]
    for i, array in enumerate(pixels):
        Image.fromarray(array).save(tmp_path / f"img{i}.png")
    (tmp_path / "notes.txt").write_text("not an image; skipped by extension")
    batch = dataflow.read_images(str(tmp_path), include_paths=True).take_batch(10)
    order = np.argsort(batch["path"])
    assert batch["image"].shape == (3, 6, 8, 3) and batch["image"].dtype == np.uint8
    np.testing.assert_array_equal(batch["image"][order], np.stack(pixels))
    small = dataflow.read_images(str(tmp_path), size=(3, 4), mode="L").take_batch(10)
    assert small["image"].shape == (3, 3, 4)  # one channel: (h, w), as Ray's np.asarray(image)
    Image.fromarray(np.full((5, 7), 40000, dtype=np.uint16)).save(tmp_path / "deep.png")
    deep = dataflow.read_images(str(tmp_path / "deep.png")).take(1)[0]["image"]
    assert deep.shape == (5, 7) and int(deep.max()) == 40000  # 16-bit pixels kept, not cut to uint8


def test_numpy(mode, tmp_path):
    np.save(tmp_path / "a.npy", np.arange(12, dtype=np.float32).reshape(3, 2, 2))
    np.save(tmp_path / "b.npy", np.arange(12, 20, dtype=np.float32).reshape(2, 2, 2))
    batch = dataflow.read_numpy(str(tmp_path)).take_batch(10)
    np.testing.assert_array_equal(np.sort(batch["data"].reshape(-1)), np.arange(20, dtype=np.float32))
    assert batch["data"].shape == (5, 2, 2)
    np.savez(tmp_path / "c.npz", x=np.arange(3))
    with pytest.raises(ValueError, match=r"c\.npz.*an \.npz archive holds several arrays"):
        dataflow.read_numpy(str(tmp_path / "c.npz")).take_all()


def test_from_torch(mode):
    torch = pytest.importorskip("torch")
    from torch.utils.data import Dataset as TorchDataset

    class Squares(TorchDataset):
        def __len__(self) -> int:
            return 10

        def __getitem__(self, i: int):
            return torch.full((2,), float(i * i))

    batch = dataflow.from_torch(Squares()).take_batch(10)
    np.testing.assert_array_equal(batch["item"], np.array([[i * i] * 2 for i in range(10)], np.float32))
    assert dataflow.from_torch(Squares(), local_read=True).count() == 10  # Ray's option: always so here

    class Pairs(TorchDataset):
        def __len__(self) -> int:
            return 3

        def __getitem__(self, i: int):
            return {"x": torch.tensor([i, i]), "y": i}

    rows = dataflow.from_torch(Pairs()).take_all()
    assert [r["item"]["y"] for r in rows] == [0, 1, 2]
    assert list(rows[2]["item"]["x"]) == [2, 2]
    mixed = torch.utils.data.TensorDataset(torch.zeros(3, 2), torch.arange(3))  # (features, label) tuples
    items = [r["item"] for r in dataflow.from_torch(mixed).take_all()]  # kept as Python objects, as Ray
    assert [label for _, label in items] == [0, 1, 2] and all(f.shape == (2,) for f, _ in items)


def test_from_torch_does_not_import_torch_at_import():
    import subprocess
    import sys

    code = ("import sys, dataflow; assert 'torch' not in sys.modules and 'pandas' not in sys.modules "
            "and 'asyncio' not in sys.modules")  # (16 ms: only an async UDF needs it)
    subprocess.run([sys.executable, "-c", code], check=True)


def test_first_row_does_not_import_pyarrow_compute():
    """``import pyarrow.compute`` builds a wrapper per compute function (50-80 ms, as much as
    the rest of ``import dataflow``): the modules on the import path load it at first use."""
    import subprocess
    import sys

    code = (
        "import sys, dataflow\n"
        "assert dataflow.range(10).take(1) == [{'id': 0}]\n"
        "assert 'pyarrow.compute' not in sys.modules\n"
        "from dataflow.expressions import col\n"
        "assert dataflow.range(10).filter(expr=col('id') > 7).take_all() == [{'id': 8}, {'id': 9}]\n"
        "assert dataflow.range(4).sort('id', descending=True).take(1) == [{'id': 3}]\n"
        "assert 'pyarrow.compute' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_planning_and_counting_a_parquet_read_does_not_import_pandas(tmp_path):
    """``pyarrow.dataset`` imports pandas (~0.25 s); the driver plans a Parquet read, reads its
    footers and counts rows without it, and a hive-partitioned read plans without it too."""
    import subprocess
    import sys

    pq.write_table(pa.table({"a": list(range(10))}), tmp_path / "x.parquet")
    (tmp_path / "hive" / "k=1").mkdir(parents=True)
    pq.write_table(pa.table({"a": [1, 2]}), tmp_path / "hive" / "k=1" / "y.parquet")
    code = (
        "import sys, dataflow\n"
        f"assert dataflow.read_parquet({str(tmp_path / 'x.parquet')!r}).count() == 10\n"
        f"ds = dataflow.read_parquet({str(tmp_path / 'hive')!r})\n"
        "assert ds.schema().names == ['a', 'k'], ds.schema()\n"
        "assert 'pyarrow.dataset' not in sys.modules and 'pandas' not in sys.modules, "
        "[m for m in ('pyarrow.dataset', 'pandas') if m in sys.modules]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_from_huggingface(mode):
    hf = pytest.importorskip("datasets")
    data = hf.Dataset.from_dict({"id": list(range(100)), "text": [f"t{i}" for i in range(100)]})
    ds = dataflow.from_huggingface(data)
    assert ds.count() == 100
    assert ds.take(2) == [{"id": 0, "text": "t0"}, {"id": 1, "text": "t1"}]
    picked = dataflow.from_huggingface(data.select([5, 3])).take_all()
    assert picked == [{"id": 5, "text": "t5"}, {"id": 3, "text": "t3"}]
    with pytest.raises(TypeError, match="split"):
        dataflow.from_huggingface(hf.DatasetDict({"train": data}))


# ----- pushdown, metadata ---------------------------------------------------------------------


def test_hive_partitions_projection_and_filter_pushdown(mode, tmp_path):
    table = _table(4000)
    dataflow.from_arrow(table).write_parquet(str(tmp_path / "hive"), partition_cols=["k"])
    assert sorted(p.name for p in (tmp_path / "hive").iterdir()) == ["_SUCCESS", "k=0", "k=1", "k=2", "k=3"]
    for path in _files(tmp_path / "hive", ".parquet"):
        assert "k" not in pq.read_schema(path).names  # the folder holds the value
    ds = dataflow.read_parquet(str(tmp_path / "hive"), columns=["id", "k"])
    assert ds.columns() == ["id", "k"]
    filtered = ds.filter(expr=(dataflow.col("k") == "2") & (dataflow.col("id") < 100))  # folder values are strings
    assert "ReadParquet" in filtered.explain().split("Optimized Plan")[1]
    assert _ids(filtered.take_all()) == [i for i in range(100) if i % 4 == 2]
    assert all(set(r) == {"id", "k"} for r in filtered.take(5))
    # the same through select_columns, pushed into the read by the optimizer
    chained = dataflow.read_parquet(str(tmp_path / "hive")).select_columns(["s"]).take(3)
    assert all(set(r) == {"s"} for r in chained)


def test_filter_skips_row_groups_in_process(tmp_path):
    from connectors import io_stats

    _write_parts(tmp_path, _table(10_000), parts=2, row_group_size=500)
    with dataflow.options(execution_mode="local"):
        io_stats.snapshot(reset=True)
        rows = dataflow.read_parquet(str(tmp_path)).filter(expr=dataflow.col("id") < 700).take_all()
        counters = io_stats.snapshot(reset=True)
    assert _ids(rows) == list(range(700))
    assert counters["row_groups_read"] == 2 and counters["row_groups_skipped"] == 18


def test_include_paths(mode, tmp_path):
    _write_parts(tmp_path / "p", _table(100), parts=2)
    rows = dataflow.read_parquet(str(tmp_path / "p"), include_paths=True).take_all()
    assert {os.path.basename(r["path"]) for r in rows} == {"part-0.parquet", "part-1.parquet"}
    assert all(r["path"].endswith(f"part-{0 if r['id'] < 50 else 1}.parquet") for r in rows)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.csv").write_text("v\n1\n2\n")
    rows = dataflow.read_csv(str(tmp_path / "c"), include_paths=True).take_all()
    assert rows == [{"v": 1, "path": str(tmp_path / "c" / "a.csv")}, {"v": 2, "path": str(tmp_path / "c" / "a.csv")}]


def test_count_from_footers_runs_no_task(mode, tmp_path, monkeypatch):
    _write_parts(tmp_path, _table(3000), parts=3)

    def no_execution(*args, **kwargs):
        raise AssertionError("count() should not run a task")

    monkeypatch.setattr(dataflow.Dataset, "_execute", no_execution)
    assert dataflow.read_parquet(str(tmp_path)).count() == 3000
    assert dataflow.read_parquet(str(tmp_path), columns=["id"]).map(lambda r: r).count() == 3000


def test_override_num_blocks(mode, tmp_path):
    for i in range(8):
        (tmp_path / f"f{i}.csv").write_text(f"id\n{i}\n")
    ds = dataflow.read_csv(str(tmp_path), override_num_blocks=4).materialize()
    assert ds.num_blocks() == 4
    assert _ids(ds.take_all()) == list(range(8))


# ----- writes: file sizes, partitions, atomicity ---------------------------------------------


def _row_counts(folder: Path) -> list[int]:
    return [pq.read_metadata(p).num_rows for p in _files(folder, ".parquet")]


def test_files_have_sensible_sizes(mode, tmp_path):
    ds = dataflow.range(20_000, override_num_blocks=200)  # 200 blocks of 100 rows
    ds.write_parquet(str(tmp_path / "default"))
    assert len(_row_counts(tmp_path / "default")) < 20  # not one file per tiny block
    ds.write_parquet(str(tmp_path / "min"), min_rows_per_file=5000)
    counts = _row_counts(tmp_path / "min")
    assert sum(counts) == 20_000 and len(counts) <= 4
    assert sum(c < 5000 for c in counts) <= 1  # only the remainder may be short
    ds.write_parquet(str(tmp_path / "max"), max_rows_per_file=3000)
    counts = _row_counts(tmp_path / "max")
    assert sum(counts) == 20_000 and max(counts) <= 3000 and len(counts) <= 20
    ds.write_parquet(str(tmp_path / "both"), min_rows_per_file=4000, max_rows_per_file=4000)
    counts = _row_counts(tmp_path / "both")
    # each write task cuts its rows into files of max_rows_per_file; the engine does not slice
    # blocks to the minimum, so a task's last file may be short
    assert sum(counts) == 20_000 and max(counts) == 4000 and counts.count(4000) >= len(counts) // 2
    # after a read, where the row counts are known only once the read tasks ran
    dataflow.read_parquet(str(tmp_path / "max")).filter(lambda r: r["id"] % 2 == 0).write_csv(
        str(tmp_path / "csv"), min_rows_per_file=4000
    )
    rows = [len(p.read_text().splitlines()) - 1 for p in _files(tmp_path / "csv", ".csv")]
    assert sum(rows) == 10_000 and sum(r < 4000 for r in rows) <= 1


def test_partition_cols_round_trip(mode, tmp_path):
    table = pa.table({"id": list(range(60)), "year": [2020 + i % 3 for i in range(60)], "c": ["a", "b"] * 30})
    dataflow.from_arrow(table).write_parquet(str(tmp_path / "p"), partition_cols=["year", "c"])
    folders = sorted(str(p.relative_to(tmp_path / "p")) for p in (tmp_path / "p").glob("*/*"))
    assert folders == [f"year={y}/c={c}" for y in (2020, 2021, 2022) for c in ("a", "b")]
    back = dataflow.read_parquet(str(tmp_path / "p")).to_arrow().sort_by("id")
    assert back["id"].to_pylist() == list(range(60))
    assert back["year"].to_pylist() == [str(y) for y in table["year"].to_pylist()]  # strings, as Ray Data
    assert back["c"].to_pylist() == table["c"].to_pylist()
    selected = dataflow.read_parquet(str(tmp_path / "p")).filter(expr=dataflow.col("year") == "2021")
    assert _ids(selected.take_all()) == [i for i in range(60) if i % 3 == 1]


def test_failed_write_leaves_nothing(mode, tmp_path):
    def fail_late(batch):
        if batch["id"].max() >= 15_000:
            raise ValueError("boom at row 15000")
        return batch

    out = tmp_path / "out"
    ds = dataflow.range(20_000, override_num_blocks=40).map_batches(fail_late, batch_size=500)
    with pytest.raises(ValueError, match="boom"):
        ds.write_parquet(str(out), max_rows_per_file=1000)
    assert _files(out) == []  # neither committed files nor staged ones
    assert not any(p.name.startswith("_staging") for p in out.rglob("*")) if out.exists() else True


def test_filesystem_argument(mode, tmp_path):
    import pyarrow.fs as pafs

    fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    dataflow.range(100).write_parquet("data", filesystem=fs)
    assert _files(tmp_path / "data", ".parquet")
    assert dataflow.read_parquet("data", filesystem=fs).count() == 100
    assert _ids(dataflow.read_parquet("data", filesystem=fs).take_all()) == list(range(100))


# ----- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reader", ["read_parquet", "read_csv", "read_json", "read_text", "read_binary_files", "read_images", "read_numpy"]
)
def test_missing_path_fails_at_call(tmp_path, reader):
    missing = str(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="nope"):
        getattr(dataflow, reader)(missing)


def test_corrupt_parquet_names_the_file(mode, tmp_path):
    _write_parts(tmp_path, _table(100), parts=2)
    data = (tmp_path / "part-1.parquet").read_bytes()
    (tmp_path / "part-1.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"part-1\.parquet"):
        dataflow.read_parquet(str(tmp_path)).take_all()


def test_csv_wrong_field_count_names_file_and_line(mode, tmp_path):
    (tmp_path / "good.csv").write_text("a,b\n1,2\n")
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n3,4,5\n")
    with pytest.raises(ValueError, match=r"bad\.csv, row 3: expected 2 fields, got 3"):
        dataflow.read_csv(str(tmp_path)).take_all()


def test_schema_mismatch_names_the_file(mode, tmp_path):
    pq.write_table(pa.table({"a": [1, 2]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"a": ["x", "y"]}), tmp_path / "b.parquet")
    with pytest.raises(ValueError, match=r"b\.parquet.*column 'a'"):
        dataflow.read_parquet(str(tmp_path)).take_all()


def test_bad_json_line_names_the_file(mode, tmp_path):
    (tmp_path / "x.jsonl").write_text('{"a": 1}\n{"a": 2\n')
    with pytest.raises(ValueError, match=r"x\.jsonl"):
        dataflow.read_json(str(tmp_path)).take_all()


# ----- S3 ---------------------------------------------------------------------------------------


@pytest.mark.s3
def test_s3_parquet_round_trip(s3_engine, tmp_path):
    s3 = s3_engine
    table = _table(3000)
    for k in range(3):
        sink = pa.BufferOutputStream()
        pq.write_table(table.filter(pa.compute.equal(table["k"], k)).drop_columns(["k"]), sink)
        s3.put(f"in/k={k}/part.parquet", sink.getvalue().to_pybytes())
    ds = dataflow.read_parquet("s3://test-bucket/in")
    assert ds.count() == 2250
    pushed = ds.filter(expr=dataflow.col("k") == "1").select_columns(["id", "k"])  # folder values are strings
    assert _ids(pushed.take_all()) == [i for i in range(3000) if i % 4 == 1]
    ds.map_batches(lambda b: b).write_parquet("s3://test-bucket/out", max_rows_per_file=500)
    keys = s3.keys("out/")
    assert keys and not any("_staging" in k for k in keys)
    back = dataflow.read_parquet("s3://test-bucket/out").to_arrow()
    assert sorted(back["id"].to_pylist()) == [i for i in range(3000) if i % 4 != 3]


@pytest.mark.s3
def test_s3_failed_write_leaves_no_objects(s3_engine):
    s3 = s3_engine

    def fail(batch):
        if batch["id"].max() >= 900:
            raise RuntimeError("fail after some files were staged")
        return batch

    ds = dataflow.range(1000, override_num_blocks=10).map_batches(fail, batch_size=100)
    with pytest.raises(RuntimeError, match="fail after"):
        ds.write_parquet("s3://test-bucket/failed", max_rows_per_file=100)
    assert s3.keys("failed/") == []


@pytest.mark.s3
def test_s3_missing_prefix_fails_at_call(s3_engine):
    with pytest.raises(FileNotFoundError, match="s3://test-bucket/nothing"):
        dataflow.read_parquet("s3://test-bucket/nothing")

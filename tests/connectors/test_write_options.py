"""Ray Data's write arguments: ``mode`` (SaveMode), ``filename_provider``, ``num_rows_per_file``,
``min_bytes_per_file``, ``arrow_parquet_args``/``arrow_parquet_args_fn``, each with Ray's meaning."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dataflow
from dataflow import FilenameProvider, SaveMode


@pytest.fixture(autouse=True)
def _local():
    with dataflow.options(execution_mode="local"):
        yield


def _data_files(path: Path, ext: str = ".parquet") -> list[Path]:
    return sorted(p for p in path.rglob(f"*{ext}") if not any(part.startswith("_") for part in p.parts))


def _ids(path: Path) -> list[int]:
    return sorted(dataflow.read_parquet(str(path)).to_arrow()["id"].to_pylist())


def test_save_modes(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    dataflow.range(3).write_parquet(str(dest))  # APPEND, the default, into a new folder
    dataflow.range(3).write_parquet(str(dest), mode=SaveMode.APPEND)
    assert _ids(dest) == [0, 0, 1, 1, 2, 2]
    with pytest.raises(ValueError, match="already exists"):
        dataflow.range(3).write_parquet(str(dest), mode="error")
    with pytest.raises(ValueError, match="already exists"):
        dataflow.range(3).write_csv(str(dest), mode=SaveMode.CREATE)
    before = _data_files(dest)

    def boom(batch):
        raise RuntimeError("never runs")

    dataflow.range(3).map_batches(boom).write_parquet(str(dest), mode="ignore")  # nothing runs
    assert _data_files(dest) == before
    dataflow.from_items([{"id": i} for i in range(10, 15)]).write_parquet(str(dest), mode=SaveMode.OVERWRITE)
    assert _ids(dest) == [10, 11, 12, 13, 14]
    with pytest.raises(RuntimeError, match="never runs"):  # a failed overwrite keeps the old data
        dataflow.range(3).map_batches(boom).write_parquet(str(dest), mode="overwrite")
    assert _ids(dest) == [10, 11, 12, 13, 14]
    with pytest.raises(ValueError, match="mode must be one of"):
        dataflow.range(3).write_json(str(tmp_path / "j"), mode="replace")
    with pytest.raises(ValueError, match="UPSERT"):
        dataflow.range(3).write_parquet(str(tmp_path / "u"), mode=SaveMode.UPSERT)


class Named(FilenameProvider):
    def get_filename_for_task(self, write_uuid: str, task_index: int) -> str:
        return f"part-{task_index:03d}-{{i}}.parquet"


def test_filename_provider_names_the_files(tmp_path: Path) -> None:
    # names without the write's id would replace an earlier write's files: refused in the
    # default append mode, as Ray refuses them
    with pytest.raises(ValueError, match=r"missing from filename template 'part-000-\{i\}\.parquet'"):
        dataflow.range(5).write_parquet(str(tmp_path / "a"), filename_provider=Named())
    assert not (tmp_path / "a").exists()
    dataflow.range(100, override_num_blocks=1).write_parquet(
        str(tmp_path / "a"), filename_provider=Named(), max_rows_per_file=40, mode="overwrite"
    )
    assert [p.name for p in _data_files(tmp_path / "a")] == ["part-000-0.parquet", "part-000-1.parquet", "part-000-2.parquet"]
    dataflow.range(5, override_num_blocks=1).write_csv(str(tmp_path / "b"), filename_provider=FilenameProvider(dataset_uuid="ds", file_format="csv"))
    names = [p.name for p in _data_files(tmp_path / "b", ".csv")]
    # Ray's CSV and JSON sinks write a task's file under the provider's name as it is
    assert len(names) == 1 and names[0].startswith("ds_") and names[0].endswith("_000000.csv")

    class Plain(FilenameProvider):
        def get_filename_for_task(self, write_uuid: str, task_index: int) -> str:
            return f"{write_uuid}-task{task_index}.json"

    dataflow.range(100, override_num_blocks=1).write_json(str(tmp_path / "j"), filename_provider=Plain())
    (only,) = _data_files(tmp_path / "j", ".json")
    assert only.name.endswith("-task0.json") and "-task0-" not in only.name
    # a task that must write several files (max_rows_per_file) numbers the ones after its first
    dataflow.range(100, override_num_blocks=1).write_json(
        str(tmp_path / "j2"), filename_provider=Plain(), max_rows_per_file=40
    )
    names = sorted(p.name[p.name.index("task"):] for p in _data_files(tmp_path / "j2", ".json"))
    assert names == ["task0-1.json", "task0-2.json", "task0.json"]

    class Same(FilenameProvider):
        def get_filename_for_task(self, write_uuid: str, task_index: int) -> str:
            return "same.parquet"

    with pytest.raises(ValueError, match="same file name"):
        dataflow.range(10, override_num_blocks=2).repartition(2).write_parquet(
            str(tmp_path / "c"), filename_provider=Same(), mode="overwrite"
        )
    assert not (tmp_path / "c").exists() or _data_files(tmp_path / "c") == []


def test_num_rows_per_file_is_ray_s_deprecated_min_rows(tmp_path: Path) -> None:
    with pytest.warns(DeprecationWarning, match="num_rows_per_file"):
        dataflow.range(100, override_num_blocks=10).write_parquet(str(tmp_path / "a"), num_rows_per_file=50)
    rows = sorted((pq.read_metadata(p).num_rows for p in _data_files(tmp_path / "a")), reverse=True)
    assert sum(rows) == 100 and all(r >= 50 for r in rows[:-1]) and len(rows) <= 2
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="Cannot specify both"):
        dataflow.range(3).write_json(str(tmp_path / "b"), num_rows_per_file=1, min_rows_per_file=1)


def test_min_bytes_per_file_groups_blocks(tmp_path: Path) -> None:
    ds = dataflow.range(10_000, override_num_blocks=10).materialize()
    blocks = ds.num_blocks()
    assert blocks > 2 and ds.size_bytes() == 80_000
    ds.write_parquet(str(tmp_path / "a"))
    assert len(_data_files(tmp_path / "a")) == blocks  # a materialized dataset: a file per block, as Ray
    ds.write_parquet(str(tmp_path / "a2"), min_bytes_per_file=40_000)
    per_file = 40_000 // (80_000 // blocks)  # whole blocks, up to 40 KB of them
    assert len(_data_files(tmp_path / "a2")) == -(-blocks // per_file)
    assert _ids(tmp_path / "a2") == list(range(10_000))
    with pytest.raises(ValueError, match="cannot be used with"):
        ds.write_parquet(str(tmp_path / "b"), min_bytes_per_file=10, max_rows_per_file=5)


def test_arrow_parquet_args(tmp_path: Path) -> None:
    dataflow.range(100).write_parquet(str(tmp_path / "a"), compression="zstd", use_dictionary=False)
    meta = pq.read_metadata(_data_files(tmp_path / "a")[0])
    assert meta.row_group(0).column(0).compression == "ZSTD"
    dataflow.range(100, override_num_blocks=1).write_parquet(
        str(tmp_path / "b"), arrow_parquet_args_fn=lambda: {"row_group_size": 10, "compression": "gzip"}
    )
    meta = pq.read_metadata(_data_files(tmp_path / "b")[0])
    assert meta.num_row_groups == 10 and meta.row_group(0).column(0).compression == "GZIP"
    with pytest.raises(TypeError, match="unexpected keyword argument 'concurrency_x'"):
        dataflow.range(3).write_parquet(str(tmp_path / "c"), concurrency_x=2)
    with pytest.raises(TypeError, match=r"not an argument of pyarrow\.parquet\.write_table"):
        dataflow.range(3).write_parquet(str(tmp_path / "d"), arrow_parquet_args_fn=lambda: {"bogus": 1})


def test_partition_cols_with_mode_and_provider(tmp_path: Path) -> None:
    table = pa.table({"id": list(range(6)), "k": ["a", "b"] * 3})
    dataflow.from_arrow(table).write_parquet(str(tmp_path / "p"), partition_cols=["k"], filename_provider=Named(), mode="overwrite")
    assert sorted(str(p.relative_to(tmp_path / "p")) for p in _data_files(tmp_path / "p")) == [
        "k=a/part-000-0.parquet", "k=b/part-000-0.parquet",
    ]
    dataflow.from_arrow(table).write_parquet(str(tmp_path / "p"), partition_cols=["k"], mode="overwrite")
    assert len(_data_files(tmp_path / "p")) == 2 and _ids(tmp_path / "p") == list(range(6))


@pytest.mark.parametrize("execution", ["local", "streaming"])
def test_a_partitioned_write_groups_small_blocks_into_few_tasks(tmp_path: Path, execution: str) -> None:
    """Each write task writes a file into every folder its rows reach: small blocks are
    gathered into tasks of up to 128 MiB first, not written one task (and file per folder)
    each; ``min_bytes_per_file`` sets the size, ``concurrency=`` writes where it says, and a
    repartition's blocks stay the write tasks."""
    with dataflow.options(execution_mode=execution):
        ds = dataflow.range(4000, override_num_blocks=40).map(lambda r: {"id": r["id"], "k": r["id"] % 5})
        ds.write_parquet(str(tmp_path / "grouped"), partition_cols=["k"])
        files = _data_files(tmp_path / "grouped")
        assert len(files) == 5 and _ids(tmp_path / "grouped") == list(range(4000))
        with dataflow.options(min_task_input_bytes=1):  # (one block per task where nothing groups them)
            ds.write_parquet(str(tmp_path / "small"), partition_cols=["k"], min_bytes_per_file=1)
            ds.write_parquet(str(tmp_path / "given"), partition_cols=["k"], concurrency=2)
            ds.write_parquet(str(tmp_path / "one"), partition_cols=["k"])
        assert len(_data_files(tmp_path / "one")) == 5
        ds.repartition(2).write_parquet(str(tmp_path / "two"), partition_cols=["k"])  # its tasks, as asked
        assert len(_data_files(tmp_path / "two")) == 10 and _ids(tmp_path / "two") == list(range(4000))
        assert len(_data_files(tmp_path / "small")) == 200 and _ids(tmp_path / "small") == list(range(4000))
        assert len(_data_files(tmp_path / "given")) == 200 and _ids(tmp_path / "given") == list(range(4000))


@pytest.mark.parametrize("execution", ["local", "streaming"])
def test_writing_no_rows_leaves_no_destination(tmp_path: Path, execution: str) -> None:
    """As Ray 2.60: a write of zero rows creates no folder (no ``_SUCCESS``-only folder); a
    destination that existed already is left as it was, with the marker of a finished job."""
    with dataflow.options(execution_mode=execution):
        empty = dataflow.range(10, override_num_blocks=2).filter(lambda row: False)
        for fmt in ("parquet", "csv", "json"):
            getattr(empty, f"write_{fmt}")(str(tmp_path / fmt))
            assert not (tmp_path / fmt).exists()
        existing = tmp_path / "existing"
        dataflow.range(3).write_parquet(str(existing))
        before = _data_files(existing)
        empty.write_parquet(str(existing))
        assert _data_files(existing) == before and (existing / "_SUCCESS").exists()
        assert not [p for p in existing.iterdir() if p.name.startswith("_staging")]
        # rows again after an empty write: the folder appears as usual
        dataflow.range(4, override_num_blocks=1).write_csv(str(tmp_path / "csv"))
        assert len(_data_files(tmp_path / "csv", ".csv")) == 1 and (tmp_path / "csv" / "_SUCCESS").exists()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("execution", ["local", "streaming"])
def test_rows_without_columns_are_written_and_partition_cols_of_every_column_refused(
        tmp_path: Path, execution: str) -> None:
    """Both hung: a file writer looped forever on a table without columns (pyarrow's
    ``slice(offset)`` of one keeps all its rows). ``partition_cols`` naming every column would
    write files with no column, which read back as no rows: refused, naming them, as nothing."""
    with dataflow.options(execution_mode=execution):
        dataflow.range(5, override_num_blocks=1).drop_columns(["id"]).write_parquet(str(tmp_path / "none"), max_rows_per_file=2)
        assert len(_data_files(tmp_path / "none")) == 3
        for fmt in ("parquet", "csv"):
            with pytest.raises(ValueError, match=r"partition_cols \['g'\] are every column"):
                getattr(dataflow.from_items([{"g": 1}, {"g": 2}]), f"write_{fmt}")(str(tmp_path / fmt), partition_cols=["g"])
            assert not (tmp_path / fmt).exists()


def test_csv_and_json_writer_arguments_as_rays(tmp_path: Path) -> None:
    """Ray's ``write_csv(arrow_csv_args_fn=, **arrow_csv_args)`` and
    ``write_json(pandas_json_args_fn=, **pandas_json_args)``: the function is called in the
    write task, its arguments reach pyarrow's CSV writer or ``DataFrame.to_json``."""
    import pyarrow.csv as pacsv

    ds = dataflow.from_items([{"a": 1, "b": 0.123456}, {"a": 2, "b": 2.5}], override_num_blocks=1)
    ds.write_csv(str(tmp_path / "c"), arrow_csv_args_fn=lambda: {"write_options": pacsv.WriteOptions(delimiter=";")})
    (csv_file,) = _data_files(tmp_path / "c", ".csv")
    assert csv_file.read_text().splitlines() == ['"a";"b"', "1;0.123456", "2;2.5"]
    ds.write_json(str(tmp_path / "j"), double_precision=2)
    (json_file,) = _data_files(tmp_path / "j", ".json")
    assert json_file.read_text() == '{"a":1,"b":0.12}\n{"a":2,"b":2.5}\n'
    # what the function returns wins over the named arguments, as Ray resolves them
    ds.write_json(str(tmp_path / "p"), double_precision=3, pandas_json_args_fn=lambda: {"double_precision": 1})
    (precise_file,) = _data_files(tmp_path / "p", ".json")
    assert precise_file.read_text() == '{"a":1,"b":0.1}\n{"a":2,"b":2.5}\n'
    ds.write_json(str(tmp_path / "s"), pandas_json_args_fn=lambda: {"orient": "split", "lines": False, "index": False})
    (split_file,) = _data_files(tmp_path / "s", ".json")
    assert split_file.read_text() == '{"columns":["a","b"],"data":[[1,0.123456],[2,2.5]]}'
    with pytest.raises(TypeError, match="'delimiter'"):
        ds.write_csv(str(tmp_path / "x"), delimiter=";")
    with pytest.raises(TypeError, match=r"'orientt'.*DataFrame\.to_json"):
        ds.write_json(str(tmp_path / "y"), orientt="records")
    with pytest.raises(TypeError, match=r"'indnt'.*DataFrame\.to_json"):  # the function's, in the task
        ds.write_json(str(tmp_path / "z"), pandas_json_args_fn=lambda: {"indnt": 2})
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists() and not (tmp_path / "z").exists()


def test_json_default_encoder_and_rays_pandas_path_as_the_readme_says(tmp_path: Path) -> None:
    """The README lists where the default JSON encoder differs from Ray's pandas writer; each
    claim is pinned here, and the default output reads back as written."""
    import datetime
    import warnings

    table = pa.table({
        "ts": pa.array([datetime.datetime(2024, 1, 2, 3, 4, 5, 123456), None], pa.timestamp("us")),
        "d": pa.array([datetime.date(2024, 1, 2), None]),
        "b": pa.array([b"ab\xff", None]),
        "i": pa.array([2**62, None]),
    })
    dataflow.from_arrow(table).write_json(str(tmp_path / "own"))
    (own,) = _data_files(tmp_path / "own", ".json")
    assert own.read_text().splitlines()[0] == '{"ts":"2024-01-02T03:04:05.123456","d":"2024-01-02","b":"YWL/","i":4611686018427387904}'
    back = dataflow.read_json(str(own)).take_all()
    assert back[0]["i"] == 2**62 and back[1] == {"ts": None, "d": None, "b": None, "i": None}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pandas' notice that its default will become ISO
        dataflow.from_arrow(table.select(["ts", "d"])).write_json(str(tmp_path / "pandas"), date_format="epoch")
    (pandas_file,) = _data_files(tmp_path / "pandas", ".json")
    assert pandas_file.read_text().splitlines()[0] == '{"ts":1704164645123,"d":1704153600000}'


def test_a_file_encoded_whole_reaches_the_disk_in_small_pieces(tmp_path: Path, monkeypatch) -> None:
    """Formats that encode a file whole (JSON, NumPy, TFRecords...) hand it to the file system
    in writes of at most ``DISK_WRITE_BYTES`` (a bigger write is cached in large folios, many
    times slower to fill on a VM that returns free memory to its host); the file holds every
    byte."""
    from connectors.file_datasink import FileDatasink
    from engine.object_store import DISK_WRITE_BYTES

    sizes: list[int] = []
    real_open = FileDatasink._open_output

    class Counted:
        closed = False

        def __init__(self, out: pa.NativeFile) -> None:
            self.out = out

        def write(self, data) -> int:
            sizes.append(memoryview(data).nbytes)
            return self.out.write(data)

        def tell(self) -> int:
            return self.out.tell()

        def flush(self) -> None:
            self.out.flush()

        def close(self) -> None:
            self.out.close()
            self.closed = True

    monkeypatch.setattr(FileDatasink, "_open_output",
                        lambda self, path: pa.PythonFile(Counted(real_open(self, path)), mode="w"))
    table = pa.table({"id": list(range(40_000)), "text": [f"{i:0200d}" for i in range(40_000)]})
    dest = tmp_path / "out"
    dataflow.from_arrow(table).repartition(1).write_json(str(dest))
    files = _data_files(dest, ".json")
    assert len(files) == 1 and sum(sizes) == files[0].stat().st_size > 4 * DISK_WRITE_BYTES
    assert max(sizes) <= DISK_WRITE_BYTES
    assert dataflow.read_json(str(dest)).to_arrow().sort_by("id").equals(table)

"""Ray's bases for custom file formats, written as Ray's docs write them: ``FileBasedDatasource``
(``_read_stream``), ``BlockBasedFileDatasink`` (``write_block_to_file``) and
``RowBasedFileDatasink`` (``write_row_to_file``), on both execution modes."""

from __future__ import annotations

import gzip
import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

import dataflow
from dataflow.datasource import (
    BlockBasedFileDatasink,
    DefaultFileMetadataProvider,
    FileBasedDatasource,
    FilenameProvider,
    Partitioning,
    PathPartitionParser,
    RowBasedFileDatasink,
)


class KeyValueDatasource(FileBasedDatasource):
    """``key=value`` lines; ``.kv`` files only."""

    _FILE_EXTENSIONS = ["kv"]

    def _read_stream(self, f, path):
        lines = f.read().decode().splitlines()
        pairs = [line.split("=", 1) for line in lines if line]
        yield pa.table({"key": [k for k, _ in pairs], "value": [int(v) for _, v in pairs]})


def write_kv(path: Path, rows: list[tuple[str, int]], *, compress: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(f"{k}={v}\n" for k, v in rows).encode()
    path.write_bytes(gzip.compress(data) if compress else data)


@pytest.fixture
def kv_folder(tmp_path: Path) -> Path:
    root = tmp_path / "kv"
    write_kv(root / "year=2023" / "a.kv", [("a", 1), ("b", 2)])
    write_kv(root / "year=2024" / "b.kv", [("c", 3)])
    write_kv(root / "year=2024" / "c.kv.gz", [("d", 4), ("e", 5)], compress=True)
    (root / "year=2024" / "notes.txt").write_text("not a kv file")
    return root


def test_a_custom_format_reads_its_files_with_partitions_paths_and_compression(mode, kv_folder):
    source = KeyValueDatasource(str(kv_folder), partitioning=Partitioning("hive"), include_paths=True)
    ds = dataflow.read_datasource(source)
    rows = sorted(ds.take_all(), key=lambda r: r["key"])
    assert [(r["key"], r["value"], r["year"]) for r in rows] == [
        ("a", 1, "2023"), ("b", 2, "2023"), ("c", 3, "2024"), ("d", 4, "2024"), ("e", 5, "2024")]
    assert {os.path.basename(r["path"]) for r in rows} == {"a.kv", "b.kv", "c.kv.gz"}
    assert ds.count() == 5
    assert sorted(os.path.basename(f) for f in ds.input_files()) == ["a.kv", "b.kv", "c.kv.gz"]


def test_file_extensions_and_partition_filter_pick_the_files(mode, kv_folder):
    from dataflow.datasource import PathPartitionFilter

    only_2024 = PathPartitionFilter.of(lambda values: values.get("year") == "2024")
    ds = dataflow.read_datasource(KeyValueDatasource(str(kv_folder), partition_filter=only_2024))
    assert sorted(r["key"] for r in ds.take_all()) == ["c", "d", "e"]
    plain = KeyValueDatasource(str(kv_folder), file_extensions=["kv"])  # the gzip file is .kv.gz: kept
    assert dataflow.read_datasource(plain).count() == 5


def test_rows_per_file_answers_count_without_reading(mode, tmp_path):
    class Fixed(FileBasedDatasource):
        def _rows_per_file(self):
            return 2

        def _read_stream(self, f, path):
            raise AssertionError("count() must not read")

    for i in range(3):
        write_kv(tmp_path / f"{i}.kv", [("x", i), ("y", i)])
    assert dataflow.read_datasource(Fixed(str(tmp_path))).count() == 6


def test_random_access_by_overriding_the_opener(mode, tmp_path):
    """A format with a footer: the subclass opens files for random access, as Ray's docs say."""

    class Footer(FileBasedDatasource):
        def _open_input_source(self, filesystem, path, **open_args):
            return filesystem.open_input_file(path)

        def _read_stream(self, f, path):
            size = f.size()
            f.seek(size - 8)
            count = int.from_bytes(f.read(8), "little")
            f.seek(0)
            yield pa.table({"n": list(range(count)), "file": [os.path.basename(path)] * count})

    for name, count in (("a.bin", 3), ("b.bin", 4)):
        (tmp_path / name).write_bytes(b"\0" * 100 + count.to_bytes(8, "little"))
    rows = dataflow.read_datasource(Footer(str(tmp_path))).take_all()
    assert sorted((r["file"], r["n"]) for r in rows) == [("a.bin", i) for i in range(3)] + [("b.bin", i) for i in range(4)]


def test_a_metadata_provider_that_lists_its_own_files(mode, tmp_path):
    class Manifest(DefaultFileMetadataProvider):
        def expand_paths(self, paths, filesystem, partitioning=None, ignore_missing_paths=False):
            folder = paths[0]
            for line in (Path(folder) / "_manifest").read_text().split():
                path = f"{folder}/{line}"
                yield path, os.path.getsize(path)

    for name in ("a.kv", "b.kv", "c.kv"):
        write_kv(tmp_path / name, [(name, 1)])
    (tmp_path / "_manifest").write_text("c.kv\na.kv\n")
    ds = dataflow.read_datasource(KeyValueDatasource(str(tmp_path), meta_provider=Manifest()))
    assert sorted(r["key"] for r in ds.take_all()) == ["a.kv", "c.kv"]
    # a selection (shuffle, partition_filter) picks from the provider's listing, not from a walk
    shuffled = KeyValueDatasource(str(tmp_path), meta_provider=Manifest(), shuffle="files")
    assert sorted(r["key"] for r in dataflow.read_datasource(shuffled).take_all()) == ["a.kv", "c.kv"]
    from dataflow.datasource import PathPartitionFilter

    everything = PathPartitionFilter.of(lambda values: True)
    filtered = KeyValueDatasource(str(tmp_path), meta_provider=Manifest(), partition_filter=everything)
    assert sorted(r["key"] for r in dataflow.read_datasource(filtered).take_all()) == ["a.kv", "c.kv"]
    (tmp_path / "_manifest").write_text("")
    with pytest.raises(FileNotFoundError, match="named no files"):
        KeyValueDatasource(str(tmp_path), meta_provider=Manifest())


def test_read_errors_keep_their_type_and_name_the_file(mode, tmp_path):
    class Broken(FileBasedDatasource):
        def _read_stream(self, f, path):
            raise KeyError(f"no such record in {os.path.basename(path)}")

    write_kv(tmp_path / "bad.kv", [("a", 1)])
    with pytest.raises(KeyError, match=r"no such record in bad\.kv"):
        dataflow.read_datasource(Broken(str(tmp_path))).take_all()
    write_kv(tmp_path / "bad.kv", [("a", 1)])
    (tmp_path / "bad.kv").write_text("a=not-a-number\n")
    with pytest.raises(ValueError, match=r"bad\.kv"):
        dataflow.read_datasource(KeyValueDatasource(str(tmp_path))).take_all()
    with pytest.raises(FileNotFoundError):
        KeyValueDatasource(str(tmp_path / "missing"))
    with pytest.raises(TypeError, match="open_input_stream"):
        KeyValueDatasource(str(tmp_path), open_stream_args={"bogus": 1})


class CSVDatasink(BlockBasedFileDatasink):
    """Ray's docstring example."""

    def __init__(self, path, **kwargs):
        super().__init__(path, file_format="csv", **kwargs)

    def write_block_to_file(self, block, file):
        pacsv.write_csv(block.to_arrow(), file)


def test_a_block_based_sink_writes_one_file_per_task_and_reads_back(mode, tmp_path):
    out = tmp_path / "csv"
    dataflow.range(1000, override_num_blocks=4).write_datasink(CSVDatasink(str(out)))
    names = sorted(os.listdir(out))
    data = [n for n in names if not n.startswith("_")]
    assert "_SUCCESS" in names and data and all(n.endswith(".csv") for n in data)
    assert sorted(r["id"] for r in dataflow.read_csv(str(out)).take_all()) == list(range(1000))


def test_a_block_based_sink_with_min_rows_mode_and_filename_provider(mode, tmp_path):
    out = tmp_path / "csv"
    sink = CSVDatasink(str(out), min_rows_per_file=1000)
    dataflow.range(1000, override_num_blocks=10).write_datasink(sink)
    assert len([n for n in os.listdir(out) if n.endswith(".csv")]) == 1
    with pytest.raises(ValueError, match="already exists"):
        dataflow.range(5).write_datasink(CSVDatasink(str(out), mode="error"))

    class Named(FilenameProvider):
        def get_filename_for_task(self, write_uuid, task_index):
            return f"part-{write_uuid}-{task_index}.csv"

    named = tmp_path / "named"
    dataflow.range(10, override_num_blocks=1).write_datasink(CSVDatasink(str(named), filename_provider=Named()))
    written = [n for n in os.listdir(named) if not n.startswith("_")]
    assert len(written) == 1 and re.fullmatch(r"part-\w+-0\.csv", written[0]), written


def test_a_failing_block_writer_leaves_nothing(mode, tmp_path):
    class Failing(BlockBasedFileDatasink):
        def write_block_to_file(self, block, file):
            raise ZeroDivisionError("writer failed")

    out = tmp_path / "out"
    with pytest.raises(ZeroDivisionError, match="writer failed") as info:
        dataflow.range(100, override_num_blocks=1).write_datasink(Failing(str(out)))
    assert "Failing.write_block_to_file" in str(info.value) and "a file of 100 rows" in str(info.value)
    assert not out.exists() or os.listdir(out) == []


def test_a_failing_row_writer_names_the_row(mode, tmp_path):
    class Failing(RowBasedFileDatasink):
        def write_row_to_file(self, row, file):
            if row["id"] == 3:
                raise LookupError("no image for this row")
            file.write(b"x")

    with pytest.raises(LookupError, match="no image for this row") as info:
        dataflow.range(5, override_num_blocks=1).write_datasink(Failing(str(tmp_path / "rows")))
    assert "Failing.write_row_to_file" in str(info.value) and "row 3 of write task 0" in str(info.value)


def test_the_sinks_open_their_files_with_open_output_stream(mode, tmp_path):
    """Ray's sinks write every file through ``open_output_stream``; a subclass may override it."""

    class Compressed(CSVDatasink):
        def open_output_stream(self, path):
            return pa.CompressedOutputStream(super().open_output_stream(path), "gzip")

    out = tmp_path / "gz"
    dataflow.range(50, override_num_blocks=1).write_datasink(Compressed(str(out)))
    (name,) = [n for n in os.listdir(out) if n.endswith(".csv")]
    assert gzip.decompress((out / name).read_bytes()).decode().splitlines()[:2] == ['"id"', "0"]


class TextRowsDatasink(RowBasedFileDatasink):
    def __init__(self, path):
        super().__init__(path, file_format="txt")

    def write_row_to_file(self, row, file):
        file.write(f"{row['id']}:{row['word']}".encode())


def test_a_row_based_sink_writes_one_file_per_row(mode, tmp_path):
    out = tmp_path / "rows"
    words = ["zero", "one", "two", "three", "four", "five"]
    ds = dataflow.from_items([{"id": i, "word": w} for i, w in enumerate(words)], override_num_blocks=2)
    ds.write_datasink(TextRowsDatasink(str(out)))
    files = sorted(n for n in os.listdir(out) if n.endswith(".txt"))
    assert len(files) == 6
    assert all(n.rsplit("_", 2)[1] == "000000" for n in files)
    contents = sorted((out / n).read_text() for n in files)
    assert contents == sorted(f"{i}:{w}" for i, w in enumerate(words))
    with pytest.raises(ValueError, match="resume"):
        RowBasedFileDatasink(str(tmp_path / "r"), mode="resume")


def test_path_partition_parser_as_rays():
    parse = PathPartitionParser.of(field_types={"year": int, "ok": bool})
    assert parse("/data/year=2022/ok=True/month=01/f.csv") == {"year": 2022, "ok": True, "month": "01"}
    assert parse("/data/f.csv") == {}
    by_dir = PathPartitionParser(Partitioning("dir", base_dir="/data", field_names=["a", "b"]))
    assert by_dir("/data/x/y/f.csv") == {"a": "x", "b": "y"}
    assert by_dir("/elsewhere/x/y/f.csv") == {}


@pytest.mark.s3
def test_custom_format_and_sinks_on_s3(s3_engine):
    s3 = s3_engine
    s3.put("kv/year=2024/a.kv", b"a=1\nb=2\n")
    s3.put("kv/year=2025/b.kv.gz", gzip.compress(b"c=3\n"))
    source = KeyValueDatasource("s3://test-bucket/kv", partitioning=Partitioning("hive"))
    rows = sorted(dataflow.read_datasource(source).take_all(), key=lambda r: r["key"])
    assert [(r["key"], r["value"], r["year"]) for r in rows] == [("a", 1, "2024"), ("b", 2, "2024"), ("c", 3, "2025")]
    dataflow.range(300, override_num_blocks=3).write_datasink(CSVDatasink("s3://test-bucket/csv"))
    keys = s3.keys("csv/")
    assert "csv/_SUCCESS" in keys and not any("_staging" in k for k in keys)
    assert sorted(r["id"] for r in dataflow.read_csv("s3://test-bucket/csv").take_all()) == list(range(300))
    dataflow.from_items([{"id": 1, "word": "x"}, {"id": 2, "word": "y"}]).write_datasink(TextRowsDatasink("s3://test-bucket/rows"))
    assert len([k for k in s3.keys("rows/") if k.endswith(".txt")]) == 2


class _Identity:
    def __call__(self, batch):
        return batch


def test_min_rows_per_file_spans_an_actor_pools_batches(mode, tmp_path):
    """A write fused into an actor pool's tasks wrote one file per batch (500 and 100 rows for
    min_rows_per_file=550), where a function's step wrote at least 550 rows a file (but the last)."""
    import pyarrow.parquet as pq

    base = dataflow.range(600, override_num_blocks=60)
    for name, ds in (("fn", base.map_batches(lambda b: b, batch_size=500)),
                     ("actor", base.map_batches(_Identity, batch_size=500, concurrency=1))):
        out = tmp_path / name
        ds.write_parquet(str(out), min_rows_per_file=550)
        rows = sorted((pq.read_metadata(f).num_rows for f in out.glob("*.parquet")), reverse=True)
        assert sum(rows) == 600 and all(r >= 550 for r in rows[:-1]) and rows[0] >= 550, (name, rows)

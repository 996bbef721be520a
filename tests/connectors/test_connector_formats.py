"""CSV, JSON, text, binary, image and NumPy sources (and CSV/JSON sinks) on local files."""

from __future__ import annotations

import gzip
import io
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from connector_testing import read_all

from connectors import SINKS, SOURCES
from connectors.base import TaskContext
from connectors.binary_format import BinaryDatasource
from connectors.csv_format import CSVDatasink, CSVDatasource
from connectors.errors import FileFormatError, PathNotFoundError, SchemaMismatchError
from connectors.file_datasource import plan_pieces
from connectors.filesystem import FileEntry, resolve_files
from connectors.image_format import ImageDatasource
from connectors.json_format import JSONDatasink, JSONDatasource
from connectors.numpy_format import NumpyDatasource
from connectors.text_format import TextDatasource


def test_registry_names_every_format() -> None:
    assert set(SOURCES) == {"parquet", "csv", "json", "text", "binary", "images", "numpy", "orc", "webdataset", "tfrecords",
                            "avro", "audio", "videos"}
    assert set(SINKS) == {"parquet", "csv", "json", "numpy", "images", "orc", "webdataset", "tfrecords"}


def test_csv_round_trip_with_partitions_and_gzip(tmp_path: Path) -> None:
    (tmp_path / "k=1").mkdir()
    (tmp_path / "k=1" / "a.csv").write_text("x,y\n1,a\n2,b\n")
    (tmp_path / "k=2").mkdir()
    (tmp_path / "k=2" / "b.csv.gz").write_bytes(gzip.compress(b"x,y\n3,c\n"))
    (tmp_path / "_SUCCESS").write_text("")  # hidden: never read
    out = read_all(CSVDatasource(str(tmp_path)))
    rows = sorted(zip(out["x"].to_pylist(), out["y"].to_pylist(), out["k"].to_pylist()))
    assert rows == [(1, "a", "1"), (2, "b", "1"), (3, "c", "2")]


def test_a_csv_folder_is_read_whole_unless_file_extensions_says_otherwise(tmp_path: Path) -> None:
    """Ray's read_csv reads every file of a folder but hidden ones (Hadoop's part-00000 has no
    extension); file_extensions=["csv"] picks the .csv files, compressed ones too."""
    (tmp_path / "part-00000").write_text("x,y\n1,a\n")
    (tmp_path / "b.csv.gz").write_bytes(gzip.compress(b"x,y\n2,b\n"))
    (tmp_path / ".part-00000.crc").write_text("hidden")
    out = read_all(CSVDatasource(str(tmp_path)))
    assert sorted(zip(out["x"].to_pylist(), out["y"].to_pylist())) == [(1, "a"), (2, "b")]
    (tmp_path / "notes.txt").write_text("x,y\n1,2,3\n")
    with pytest.raises(FileFormatError, match=r"notes\.txt"):  # read as CSV, as Ray does: named
        read_all(CSVDatasource(str(tmp_path)))
    only = read_all(CSVDatasource(str(tmp_path), file_extensions=[".csv"]))
    assert only["x"].to_pylist() == [2]


def test_csv_column_numeric_at_first_then_strings_becomes_string(tmp_path: Path) -> None:
    lines = ["a,b"] + [f"{i},{i}" for i in range(2000)] + ["unknown,5"]
    (tmp_path / "f.csv").write_text("\n".join(lines) + "\n")
    # a tiny block size makes pyarrow infer from the first block only; we fall back to string
    source = CSVDatasource(str(tmp_path / "f.csv"), read_options=pacsv.ReadOptions(block_size=1024))
    out = read_all(source)
    assert out.schema.field("a").type == pa.string()
    assert out.schema.field("b").type == pa.int64()
    assert out.num_rows == 2001 and out["a"].to_pylist()[-1] == "unknown"


def test_csv_row_with_wrong_number_of_fields_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n3,4\n5,6,7\n8,9\n")
    with pytest.raises(FileFormatError, match=r"bad.csv, row 4: expected 2 fields, got 3") as info:
        read_all(CSVDatasource(str(tmp_path / "bad.csv")))
    assert info.value.row == 4 and isinstance(info.value, ValueError)


def test_csv_options_pass_through(tmp_path: Path) -> None:
    (tmp_path / "f.csv").write_text("a;b\n1;x\n2;y\n")
    source = CSVDatasource(
        str(tmp_path / "f.csv"),
        parse_options=pacsv.ParseOptions(delimiter=";"),
        convert_options=pacsv.ConvertOptions(column_types={"a": pa.float64()}, include_columns=["a"]),
    )
    out = read_all(source)
    assert out.schema == pa.schema([("a", pa.float64())])


def test_csv_and_json_sinks_commit_and_read_back(tmp_path: Path) -> None:
    table = pa.table({"i": [1, 2, 3, 4, 5], "s": ["a", "b", "c", "d", "e"], "b": [b"\x00"] * 5})
    for sink_cls, source_cls in ((CSVDatasink, CSVDatasource), (JSONDatasink, JSONDatasource)):
        dest = tmp_path / sink_cls.__name__
        sink = sink_cls(str(dest), max_rows_per_file=2)
        sink.on_write_start()
        result = sink.write(
            iter([table.select(["i", "s"]) if sink_cls is CSVDatasink else table]), TaskContext(3)
        )
        sink.on_write_complete([result])
        assert len(os.listdir(dest)) == 4 and (dest / "_SUCCESS").exists()
        out = read_all(source_cls(str(dest)))
        assert sorted(out["i"].to_pylist()) == [1, 2, 3, 4, 5]
    first = sorted(n for n in os.listdir(tmp_path / "JSONDatasink") if n.endswith(".json"))[0]
    assert json.loads((tmp_path / "JSONDatasink" / first).read_text().splitlines()[0])["b"] == "AA=="


def test_json_sink_writes_nan_as_null_compactly_as_ray(tmp_path: Path) -> None:
    """JSON has no NaN: json.dumps wrote ``NaN``, which strict readers refuse."""
    table = pa.table({"a": [1, None], "f": [1.5, float("nan")], "g": pa.array([float("inf"), 2.0], pa.float32())})
    sink = JSONDatasink(str(tmp_path / "j"))
    sink.on_write_start()
    sink.on_write_complete([sink.write(iter([table]), TaskContext(0))])
    (name,) = [n for n in os.listdir(tmp_path / "j") if n.endswith(".json")]
    text = (tmp_path / "j" / name).read_text()
    assert text == '{"a":1,"f":1.5,"g":null}\n{"a":null,"f":null,"g":2.0}\n'
    assert [json.loads(line, parse_constant=pytest.fail) for line in text.splitlines()]


def test_json_lines_and_arrays(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"x": 1, "y": "a"}\n{"x": 2, "y": "b"}\n')
    (tmp_path / "b.json").write_text(json.dumps([{"x": 3, "y": "c"}, {"x": 4, "y": "d"}], indent=2))
    out = read_all(JSONDatasource(str(tmp_path)))
    assert sorted(out["x"].to_pylist()) == [1, 2, 3, 4]


def test_json_bad_line_names_file_and_row(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"x": 1}\n{"x": 2}\n{"x": nope}\n')
    with pytest.raises(FileFormatError, match=r"bad.jsonl, row 3") as info:
        read_all(JSONDatasource(str(tmp_path / "bad.jsonl")))
    assert info.value.row == 3 and "in row" not in str(info.value)  # pyarrow's 0-based block row: dropped
    (tmp_path / "bad.jsonl").write_text('{"x": 1}\n{"x": "s"}\n')
    with pytest.raises(FileFormatError, match=r"column 'x'"):
        read_all(JSONDatasource(str(tmp_path / "bad.jsonl")))
    (tmp_path / "bad.jsonl").write_text("[1, 2]")
    with pytest.raises(FileFormatError, match=r"must hold objects"):
        read_all(JSONDatasource(str(tmp_path / "bad.jsonl")))


def test_text_lines(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"one\r\ntwo\n\n  \nthree")
    assert read_all(TextDatasource(str(tmp_path / "a.txt")))["text"].to_pylist() == ["one", "two", "three"]  # as Ray
    keep = read_all(TextDatasource(str(tmp_path / "a.txt"), drop_empty_lines=False))
    assert keep["text"].to_pylist() == ["one", "two", "", "  ", "three"]
    # lines end at "\n" only (Ray's split("\n")): \r, \f and U+2028 inside a line stay in it
    (tmp_path / "c.txt").write_bytes("a\u2028b\nc\x0cd\ne\rf\ng\r\n".encode())
    assert read_all(TextDatasource(str(tmp_path / "c.txt")))["text"].to_pylist() == ["a\u2028b", "c\x0cd", "e\rf", "g"]
    (tmp_path / "b.txt").write_bytes(b"\xff\xfe bad utf-8")
    with pytest.raises(FileFormatError, match=r"b.txt"):
        read_all(TextDatasource(str(tmp_path / "b.txt")))


def test_binary_files_with_paths(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"\x00\x01")
    (tmp_path / "b.gz").write_bytes(b"raw, not decompressed")
    out = read_all(BinaryDatasource(str(tmp_path), include_paths=True))
    assert sorted(zip(out["path"].to_pylist(), out["bytes"].to_pylist())) == [
        (str(tmp_path / "a.bin"), b"\x00\x01"),
        (str(tmp_path / "b.gz"), b"raw, not decompressed"),
    ]
    assert out.schema.field("bytes").type == pa.binary()  # Ray's type


def test_a_binary_file_past_32_bit_offsets_comes_as_large_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from connectors import binary_format

    monkeypatch.setattr(binary_format, "BINARY_LIMIT", 10)  # stands for 2 GiB
    (tmp_path / "big.bin").write_bytes(b"x" * 11)
    (tmp_path / "small.bin").write_bytes(b"y" * 3)
    tables = {path: table for path in ("big.bin", "small.bin")
              for table in [read_all(BinaryDatasource(str(tmp_path / path)))]}
    assert tables["big.bin"].schema.field("bytes").type == pa.large_binary()
    assert tables["small.bin"].schema.field("bytes").type == pa.binary()
    assert tables["big.bin"]["bytes"].to_pylist() == [b"x" * 11]


def _png(array: np.ndarray, mode: str) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(array, mode=mode).save(buf, format="PNG")
    return buf.getvalue()


def test_images_decode_to_fixed_shape_tensors(tmp_path: Path) -> None:
    rgb = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
    (tmp_path / "a.png").write_bytes(_png(rgb, "RGB"))
    (tmp_path / "b.png").write_bytes(_png(rgb, "RGB"))
    out = read_all(ImageDatasource(str(tmp_path), include_paths=True))
    assert out.num_rows == 2
    images = out["image"].combine_chunks().to_numpy_ndarray()
    assert images.shape == (2, 4, 6, 3) and images.dtype == np.uint8
    assert np.array_equal(images[0], rgb)
    gray = np.full((5, 5), 7, dtype=np.uint8)
    (tmp_path / "c.png").write_bytes(_png(gray, "L"))
    out = read_all(ImageDatasource(str(tmp_path), size=(2, 3), mode="RGB"))
    assert out["image"].combine_chunks().to_numpy_ndarray().shape == (3, 2, 3, 3)
    (tmp_path / "d.png").write_bytes(b"not an image")
    with pytest.raises(FileFormatError, match=r"d.png"):
        read_all(ImageDatasource(str(tmp_path)))
    with pytest.raises(ValueError, match=r"size"):
        ImageDatasource(str(tmp_path), size=(0, 3))


def test_numpy_rows_along_first_axis(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.arange(12, dtype=np.float32).reshape(3, 2, 2))
    np.save(tmp_path / "b.npy", np.arange(8, dtype=np.float32).reshape(2, 2, 2))
    out = read_all(NumpyDatasource(str(tmp_path)))
    assert out.num_rows == 5
    assert out["data"].combine_chunks().to_numpy_ndarray().shape == (5, 2, 2)
    np.save(tmp_path / "c.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(FileFormatError, match=r"c.npy"):
        read_all(NumpyDatasource(str(tmp_path / "c.npy")))


def test_missing_and_empty_inputs(tmp_path: Path) -> None:
    with pytest.raises(PathNotFoundError, match=r"missing.csv"):
        CSVDatasource(str(tmp_path / "missing.csv"))
    (tmp_path / "e").mkdir()
    # an empty folder or glob: Ray's ValueError ("no files found"), and a FileNotFoundError
    with pytest.raises(PathNotFoundError, match=r"no files to read") as info:
        JSONDatasource(str(tmp_path / "e"))
    assert isinstance(info.value, ValueError)
    with pytest.raises(ValueError, match=r"matched no files") as info:
        TextDatasource(str(tmp_path / "*.txt"))
    assert isinstance(info.value, PathNotFoundError)
    with pytest.raises(ValueError, match=r"one filesystem"):
        TextDatasource([str(tmp_path), "s3://bucket/x"])
    with pytest.raises(ValueError, match=r"partitioning"):
        CSVDatasource(str(tmp_path), partitioning="directory")


def test_listing_streams_tasks_before_the_listing_ends(tmp_path: Path) -> None:
    for i in range(300):
        (tmp_path / f"f{i:04d}.txt").write_text("x\n")
    listed = 0
    files = resolve_files(str(tmp_path))

    def counting():
        nonlocal listed
        for entry in files.iter_files():
            listed += 1
            yield entry

    groups = plan_pieces(counting(), parallelism=4, lookahead=50)
    first = next(groups)
    assert listed <= 51 and len(first) >= 1  # the first task came after 50 files, not 300
    assert sum(len(g) for g in groups) + len(first) == 300


def test_planning_by_bytes_and_parallelism() -> None:
    entries = [FileEntry(f"f{i}", 100, "") for i in range(100)]
    groups = list(plan_pieces(entries, parallelism=10))
    assert len(groups) == 10 and all(len(g) == 10 for g in groups)
    big = [FileEntry("big", 10_000, ""), FileEntry("small", 10, "")]
    pieces = list(plan_pieces(big, parallelism=4, split_files=True))
    assert [(p.entry.path, p.index, p.count) for g in pieces for p in g][:4] == [
        ("big", 0, 4),
        ("big", 1, 4),
        ("big", 2, 4),
        ("big", 3, 4),
    ]


def test_hive_folders_above_the_path_given_are_partitions_too(tmp_path: Path) -> None:
    """As Ray Data: every ``key=value`` folder of a file's path is a partition column, also
    when the path passed is the file itself or a folder inside the partitions."""
    import pyarrow.parquet as pq

    import dataflow

    leaf = tmp_path / "sales" / "year=2022" / "month=09"
    leaf.mkdir(parents=True)
    (leaf / "sales.csv").write_text("order,quantity\n10107,30\n")
    (leaf / "sales.json").write_text('{"order": 10107, "quantity": 30}\n')
    pq.write_table(pa.table({"order": [10107], "quantity": [30]}), leaf / "sales.parquet")
    want = {"order": 10107, "quantity": 30, "year": "2022", "month": "09"}
    for read, name in ((dataflow.read_csv, "sales.csv"), (dataflow.read_json, "sales.json"),
                       (dataflow.read_parquet, "sales.parquet")):
        assert read(str(leaf / name)).take_all() == [want], name
        assert read(str(tmp_path / "sales" / "year=2022"), file_extensions=[name.split(".")[1]]).take_all() == [want]
        assert read(str(leaf / name), partitioning=None).take_all() == [{"order": 10107, "quantity": 30}]
    # a list of paths where one file has no partition folders: nulls there, as Ray's blocks without the column
    plain = tmp_path / "plain.csv"
    plain.write_text("order,quantity\n1,2\n")
    rows = sorted(dataflow.read_csv([str(leaf / "sales.csv"), str(plain)]).take_all(), key=lambda r: r["order"])
    assert rows == [{"order": 1, "quantity": 2, "year": None, "month": None}, want]
    # a folder named with two "=" is not a partition (Ray's rule)
    odd = tmp_path / "a=b=c" / "x.csv"
    odd.parent.mkdir()
    odd.write_text("v\n1\n")
    assert dataflow.read_csv(str(odd)).take_all() == [{"v": 1}]


def test_directory_partitioning_names_the_folders_below_base_dir(tmp_path: Path) -> None:
    """Ray's ``Partitioning("dir", field_names=..., base_dir=...)``: an image classification
    layout gives a class column (Ray's read_images example); types from ``field_types``; a file
    at another depth is an error naming it; ``PathPartitionFilter.of(style="dir")`` picks files."""
    import dataflow
    from dataflow.datasource import PathPartitionFilter
    from dataflow.datasource.partitioning import Partitioning, PartitionStyle

    for label in ("cat", "dog"):
        for i in range(2):
            folder = tmp_path / "images" / label
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{i}.png").write_bytes(_png(np.full((8, 8, 3), i, np.uint8), "RGB"))
    root = str(tmp_path / "images")
    ds = dataflow.read_images(root, size=(4, 4), partitioning=Partitioning("dir", field_names=["class"], base_dir=root))
    assert ds.schema().names == ["image", "class"] and ds.schema().types[1] == pa.string()
    assert sorted(r["class"] for r in ds.take_all()) == ["cat", "cat", "dog", "dog"]
    relative = os.path.relpath(root)  # a relative base_dir names the same folders
    again = dataflow.read_images(root, partitioning=Partitioning("dir", field_names=["class"], base_dir=relative))
    assert sorted(r["class"] for r in again.take_all()) == ["cat", "cat", "dog", "dog"]
    assert Partitioning("dir", field_names=["k"], base_dir="s3://bucket/data/").base_dir == "bucket/data"
    for year in (2024, 2025):
        (tmp_path / "logs" / str(year) / "eu").mkdir(parents=True)
        (tmp_path / "logs" / str(year) / "eu" / "a.csv").write_text(f"v\n{year}\n")
    logs = str(tmp_path / "logs")
    typed = Partitioning(PartitionStyle.DIRECTORY, base_dir=logs, field_names=["year", "region"], field_types={"year": int})
    rows = sorted(dataflow.read_csv(logs, partitioning=typed).take_all(), key=lambda r: r["v"])
    assert rows == [{"v": 2024, "year": 2024, "region": "eu"}, {"v": 2025, "year": 2025, "region": "eu"}]
    only = PathPartitionFilter.of(lambda v: v["year"] == "2025", style="dir", base_dir=logs, field_names=["year", "region"])
    assert [r["v"] for r in dataflow.read_csv(logs, partitioning=typed, partition_filter=only).take_all()] == [2025]
    (tmp_path / "logs" / "2026").mkdir()
    (tmp_path / "logs" / "2026" / "b.csv").write_text("v\n1\n")  # one folder where two are named
    with pytest.raises(SchemaMismatchError, match=r"b\.csv.*expected 2 partition folder"):
        dataflow.read_csv(logs, partitioning=typed).take_all()
    with pytest.raises(ValueError, match="needs field_names"):
        Partitioning("dir")
    with pytest.raises(ValueError, match="style must be"):
        Partitioning("range")

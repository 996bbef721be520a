"""WebDataset: shards built here with ``tarfile`` read back, round trips, streaming, damage, S3."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from connector_testing import read_all

import dataflow
from connectors.base import TaskContext
from connectors.errors import FileFormatError
from connectors.webdataset_format import (
    WebDatasetDatasink,
    WebDatasetDatasource,
    base_plus_ext,
    encode_shard,
    group_samples,
    iter_members,
    iter_sample_tables,
)

PIL = pytest.importorskip("PIL.Image")


def _png(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    PIL.fromarray(array).save(out, format="PNG")
    return out.getvalue()


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def _tar(members: list[tuple[str, bytes]]) -> bytes:
    """A tar written by the standard library (not by dataflow), members in the given order."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _image(i: int) -> np.ndarray:
    return (np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3) + i).astype(np.uint8)


def _sample_members(i: int, prefix: str = "train/") -> list[tuple[str, bytes]]:
    key = f"{prefix}s{i:03d}"
    return [
        (f"{key}.png", _png(_image(i))),
        (f"{key}.cls", str(i % 3).encode()),
        (f"{key}.json", json.dumps({"id": i, "tags": ["a", "b"]}).encode()),
        (f"{key}.npy", _npy(np.arange(3, dtype=np.float32) * i)),
        (f"{key}.seg.txt", f"caption {i}".encode()),
    ]


def _write_shards(folder: Path, shards: int = 2, per_shard: int = 3) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for s in range(shards):
        members = [m for i in range(s * per_shard, (s + 1) * per_shard) for m in _sample_members(i)]
        (folder / f"shard-{s:04d}.tar").write_bytes(_tar(members))


def test_key_is_the_name_up_to_the_first_dot_of_its_last_part() -> None:
    assert base_plus_ext("a/b.c/n01.seg.png") == ("a/b.c/n01", "seg.png")
    assert base_plus_ext("x.jpg") == ("x", "jpg")
    assert base_plus_ext("README") == (None, None)


def test_reads_shards_written_by_tarfile_with_the_default_decoders(mode: str, tmp_path: Path) -> None:
    _write_shards(tmp_path / "wds")
    rows = sorted(dataflow.read_webdataset(str(tmp_path / "wds")).take_all(), key=lambda r: r["__key__"])
    assert [r["__key__"] for r in rows] == [f"train/s{i:03d}" for i in range(6)]
    assert list(rows[0]) == ["__key__", "png", "cls", "json", "npy", "seg.txt", "__url__"]
    for i, row in enumerate(rows):
        np.testing.assert_array_equal(row["png"], _image(i))
        assert row["cls"] == i % 3
        assert row["json"] == {"id": i, "tags": ["a", "b"]}
        np.testing.assert_array_equal(row["npy"], np.arange(3, dtype=np.float32) * i)
        assert row["seg.txt"] == f"caption {i}"
        assert row["__url__"].endswith(f"shard-{i // 3:04d}.tar")


def test_decoder_false_callable_and_list(tmp_path: Path) -> None:
    _write_shards(tmp_path, shards=1, per_shard=2)
    raw = read_all(WebDatasetDatasource(str(tmp_path), decoder=False))
    assert raw["cls"].to_pylist() == [b"0", b"1"] and raw["png"].to_pylist()[0][:4] == b"\x89PNG"

    def upper(sample: dict) -> dict:
        return {**sample, "seg.txt": sample["seg.txt"].upper()}

    chained = read_all(WebDatasetDatasource(str(tmp_path), decoder=[True, upper]))
    assert chained["seg.txt"].to_pylist() == ["CAPTION 0", "CAPTION 1"]
    only_fn = read_all(WebDatasetDatasource(str(tmp_path), decoder=lambda s: {"__key__": s["__key__"], "n": len(s)}))
    assert only_fn["n"].to_pylist() == [6, 6]  # __key__ and five members: nothing decoded
    with pytest.raises(ValueError, match="PIL images"):
        WebDatasetDatasource(str(tmp_path), decoder="PIL")


def test_suffixes_fileselect_and_filerename(tmp_path: Path) -> None:
    _write_shards(tmp_path, shards=1, per_shard=2)
    out = read_all(WebDatasetDatasource(str(tmp_path), suffixes=["cls", "*.txt"]))
    assert out.column_names == ["__key__", "cls", "seg.txt", "__url__"]
    out = read_all(WebDatasetDatasource(str(tmp_path), fileselect=["*.cls"]))
    assert out.column_names == ["__key__", "cls", "__url__"]
    out = read_all(
        WebDatasetDatasource(str(tmp_path), fileselect=["*.label"], filerename=lambda n: n.replace(".cls", ".label"))
    )
    assert out.column_names == ["__key__", "label", "__url__"] and out["label"].to_pylist() == [b"0", b"1"]


def test_round_trip_through_write_webdataset(mode: str, tmp_path: Path) -> None:
    items = [
        {"__key__": f"k{i:02d}", "png": _image(i), "cls": i, "json": {"i": i}, "txt": f"t{i}", "npy": np.ones(2) * i}
        for i in range(8)
    ]
    dataflow.from_items(items, override_num_blocks=2).write_webdataset(str(tmp_path / "out"), min_rows_per_file=4)
    shards = sorted((tmp_path / "out").glob("*.tar"))
    assert len(shards) == 2
    with tarfile.open(shards[0]) as tar:  # readable by the standard library, members named <key>.<column>
        names = tar.getnames()
    assert names[:5] == ["k00.png", "k00.cls", "k00.json", "k00.txt", "k00.npy"]
    rows = sorted(dataflow.read_webdataset(str(tmp_path / "out")).take_all(), key=lambda r: r["__key__"])
    assert [r["__key__"] for r in rows] == [f"k{i:02d}" for i in range(8)]
    for i, row in enumerate(rows):
        np.testing.assert_array_equal(row["png"], _image(i))  # PNG is lossless
        assert (row["cls"], row["json"], row["txt"]) == (i, {"i": i}, f"t{i}")
        np.testing.assert_array_equal(row["npy"], np.ones(2) * i)


def test_write_rejects_a_key_readers_cannot_recover_and_a_value_that_is_not_bytes() -> None:
    with pytest.raises(ValueError, match=r"cannot recover the key 'a\.b'"):
        encode_shard(iter([{"__key__": "a.b", "txt": "x"}]))
    with pytest.raises(TypeError, match=r"column 'weird' of sample 'k'.*a tar member holds bytes"):
        encode_shard(iter([{"__key__": "k", "weird": 3}]))
    shard = encode_shard(iter([{"txt": "no key", "bin": b"\x00"}]), encoder=False)
    with tarfile.open(fileobj=io.BytesIO(shard)) as tar:
        names = tar.getnames()
    assert len(names) == 2 and names[0].endswith(".txt") and len(names[0]) == 32 + 4  # a random key


def test_projection_skips_decoding_the_members_not_selected(mode: str, tmp_path: Path) -> None:
    members = [("a.cls", b"1"), ("a.jpg", b"not a jpeg"), ("b.cls", b"2"), ("b.jpg", b"not a jpeg either")]
    (tmp_path / "s.tar").write_bytes(_tar(members))
    ds = dataflow.read_webdataset(str(tmp_path / "s.tar"))
    assert ds.select_columns(["cls", "__key__"]).take_all() == [{"cls": 1, "__key__": "a"}, {"cls": 2, "__key__": "b"}]
    with pytest.raises(ValueError, match=r"s\.tar: .*could not decode sample 'a''s 'jpg' member \(UnidentifiedImageError"):
        ds.take_all()

    def strict(sample: dict) -> dict:
        raise KeyError("the user's own error")

    with pytest.raises(KeyError, match="the user's own error"):  # a decoder's error keeps its type
        dataflow.read_webdataset(str(tmp_path / "s.tar"), decoder=strict).take_all()


def test_include_paths_and_one_task_per_shard(mode: str, tmp_path: Path) -> None:
    _write_shards(tmp_path, shards=4, per_shard=2)
    source = WebDatasetDatasource(str(tmp_path), include_paths=True)
    assert len(list(source.get_read_tasks(4))) == 4
    ds = dataflow.read_webdataset(str(tmp_path), include_paths=True, override_num_blocks=4)
    rows = ds.select_columns(["__key__", "path"]).take_all()
    assert len(rows) == 8 and {Path(r["path"]).name for r in rows} == {f"shard-{s:04d}.tar" for s in range(4)}


def test_gzip_shards_are_read(tmp_path: Path) -> None:
    (tmp_path / "s.tar.gz").write_bytes(gzip.compress(_tar(_sample_members(7))))
    out = read_all(WebDatasetDatasource(str(tmp_path)))
    assert out["__key__"].to_pylist() == ["train/s007"] and out["cls"].to_pylist() == [1]


class _ForwardOnly(io.RawIOBase):
    """A stream that cannot seek and records the largest read: what a shard on the network is."""

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)
        self._pos = 0
        self.largest = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        n = min(len(buffer), len(self._data) - self._pos)
        buffer[:n] = self._data[self._pos : self._pos + n]
        self._pos += n
        self.largest = max(self.largest, n)
        return n

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            raise AssertionError("the whole shard was asked for")
        return super().read(size)


def test_a_shard_is_streamed_in_bounded_blocks() -> None:
    payload = bytes(range(256)) * 40  # ~10 KiB per member
    members = [(f"s{i:04d}.bin", payload) for i in range(200)]
    stream = _ForwardOnly(_tar(members))
    samples = group_samples(iter_members(stream, "mem.tar"), "mem.tar")
    tables = list(iter_sample_tables(samples, "mem.tar", block_bytes=100_000))
    assert sum(t.num_rows for t in tables) == 200 and len(tables) >= 19
    assert max(t.num_rows for t in tables) <= 10
    assert stream.largest <= 64 * 1024  # read as a stream, never the whole 2 MiB at once


def test_a_new_block_starts_where_an_image_shape_changes() -> None:
    samples = [{"__key__": f"k{i}", "png": np.zeros((2 + i // 2, 2, 3), np.uint8)} for i in range(6)]
    tables = list(iter_sample_tables(iter(samples), "x.tar"))
    assert [t.num_rows for t in tables] == [2, 2, 2]


def test_corrupt_header_fails_naming_the_shard_the_member_and_the_offset(tmp_path: Path) -> None:
    data = bytearray(_tar([("a.txt", b"x" * 10), ("b.txt", b"y" * 10), ("c.txt", b"z")]))
    data[1024 + 100] ^= 0xFF  # inside the second header (after a's 512-byte header and data block)
    (tmp_path / "bad.tar").write_bytes(bytes(data))
    with pytest.raises(FileFormatError, match=r"bad\.tar: corrupt tar \(last member read: 'a\.txt'.*byte offset 1024") as info:
        read_all(WebDatasetDatasource(str(tmp_path / "bad.tar")))
    assert info.value.path.endswith("bad.tar")


def test_truncated_member_fails_naming_it(mode: str, tmp_path: Path) -> None:
    data = _tar([("a.txt", b"x" * 10), ("b.bin", b"y" * 5000)])
    (tmp_path / "cut.tar").write_bytes(data[: 1024 + 512 + 2000])
    with pytest.raises(ValueError, match=r"cut\.tar: corrupt tar \(last member read: 'b\.bin'.*unexpected end of data"):
        dataflow.read_webdataset(str(tmp_path / "cut.tar")).take_all()


def test_duplicate_member_in_a_sample_fails(tmp_path: Path) -> None:
    (tmp_path / "dup.tar").write_bytes(_tar([("a.txt", b"1"), ("a.txt", b"2")]))
    with pytest.raises(FileFormatError, match=r"dup\.tar: member 'a\.txt': sample 'a' already has a 'txt' file"):
        read_all(WebDatasetDatasource(str(tmp_path / "dup.tar")))


@pytest.mark.s3
def test_read_and_write_on_s3(s3) -> None:
    for s in range(2):
        s3.put(f"wds/shard-{s}.tar", _tar([m for i in range(s * 2, s * 2 + 2) for m in _sample_members(i)]))
    source = WebDatasetDatasource("s3://test-bucket/wds", include_paths=True)
    assert len(list(source.get_read_tasks(2))) == 2
    table = read_all(source).sort_by("__key__")
    assert table["cls"].to_pylist() == [0, 1, 2, 0]
    assert table["path"].to_pylist()[0] == "s3://test-bucket/wds/shard-0.tar"
    np.testing.assert_array_equal(table["png"].chunk(0).to_numpy_ndarray()[3], _image(3))
    sink = WebDatasetDatasink("s3://test-bucket/copy")
    sink.on_write_start()
    sink.on_write_complete([sink.write(iter([table.select(["__key__", "cls", "png"])]), TaskContext(0))])
    assert any(key.endswith(".tar") for key in s3.keys("copy/"))
    back = read_all(WebDatasetDatasource("s3://test-bucket/copy")).sort_by("__key__")
    assert back["cls"].to_pylist() == [0, 1, 2, 0]
    np.testing.assert_array_equal(back["png"].chunk(0).to_numpy_ndarray()[3], _image(3))


@pytest.mark.s3
def test_damaged_shard_on_s3_names_the_key(s3) -> None:
    s3.put("bad/s.tar", _tar(_sample_members(0))[:700])
    with pytest.raises(FileFormatError, match=r"s3://test-bucket/bad/s\.tar: corrupt tar \(last member read: 'train/s000\.png'"):
        read_all(WebDatasetDatasource("s3://test-bucket/bad"))


def test_arrow_open_stream_args_name_the_codec_of_a_shard(mode: str, tmp_path: Path) -> None:
    """A zstd-compressed shard named ``.tar`` reads with Ray's ``arrow_open_stream_args``."""
    import pyarrow as pa

    members = [("a.cls", b"1"), ("b.cls", b"2")]
    with pa.CompressedOutputStream(str(tmp_path / "s.tar"), "zstd") as out:
        out.write(_tar(members))
    ds = dataflow.read_webdataset(str(tmp_path / "s.tar"), arrow_open_stream_args={"compression": "zstd"})
    assert ds.select_columns(["cls", "__key__"]).take_all() == [{"cls": 1, "__key__": "a"}, {"cls": 2, "__key__": "b"}]
    with pytest.raises(Exception, match=r"s\.tar"):  # read as a plain tar: not one
        dataflow.read_webdataset(str(tmp_path / "s.tar")).take_all()


def test_expand_json_makes_each_field_a_column(mode: str, tmp_path: Path) -> None:
    """Ray's ``expand_json=True``: the fields of each sample's ``.json`` become columns, with
    the decoders on or off, and with a projection onto them."""
    _write_shards(tmp_path / "shards")
    rows = dataflow.read_webdataset(str(tmp_path / "shards"), expand_json=True).take_all()
    assert sorted(r["id"] for r in rows) == list(range(6))
    assert all(list(r["tags"]) == ["a", "b"] and r["json"]["id"] == r["id"] for r in rows)
    raw = dataflow.read_webdataset(str(tmp_path / "shards"), expand_json=True, decoder=False).take_all()
    assert sorted(r["id"] for r in raw) == list(range(6))  # the json member as bytes, parsed
    projected = dataflow.read_webdataset(str(tmp_path / "shards"), expand_json=True).select_columns(["__key__", "id"])
    assert sorted(r["id"] for r in projected.take_all()) == list(range(6))
    (tmp_path / "nojson").mkdir()
    (tmp_path / "nojson" / "a.tar").write_bytes(_tar([("s0.txt", b"x")]))
    with pytest.raises(Exception, match=r"no \.json member") as info:
        dataflow.read_webdataset(str(tmp_path / "nojson"), expand_json=True).take_all()
    assert "a.tar" in str(info.value)

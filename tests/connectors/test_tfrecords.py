"""TFRecords: Examples serialized by the protobuf runtime decode; framing, CRCs, gzip, S3, round trips."""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
from connector_testing import read_all

import dataflow
from connectors.base import TaskContext
from connectors.errors import FileFormatError
from connectors.protobuf_wire import KIND_BYTES, KIND_FLOAT, KIND_INT64, decode_example_dict, encode_example
from connectors.tfrecords_format import (
    TFRecordDatasink,
    TFRecordDatasource,
    crc32c,
    crc32c_python,
    iter_example_tables,
)

# One tf.train.Example serialized by Google's protobuf runtime (6.33, ``SerializeToString(deterministic=True)``
# on messages built from feature.proto's definitions), once with packed repeated fields, as TensorFlow
# writes them, and once with unpacked ones, which any parser must accept:
#   empty: int64_list {}, img: bytes_list [b"\x00\xffabc", b""], label: int64_list [7],
#   neg: int64_list [-1, 300, 2**40], w: float_list [0.5, -2.25]
PACKED = bytes.fromhex(
    "0a630a0b0a05656d70747912021a000a120a03696d67120b0a090a0500ff6162630a000a0e0a056c6162656c12051a030a01070a1d0a"
    "036e656712161a140a12ffffffffffffffffff01ac028080808080200a110a0177120c120a0a080000003f000010c0"
)
UNPACKED = bytes.fromhex(
    "0a630a0b0a05656d70747912021a000a120a03696d67120b0a090a0500ff6162630a000a0d0a056c6162656c12041a0208070a1e0a"
    "036e656712171a1508ffffffffffffffffff0108ac02088080808080200a110a0177120c120a0d0000003f0d000010c0"
)
EXPECTED = {
    "empty": (KIND_INT64, []),
    "img": (KIND_BYTES, [b"\x00\xffabc", b""]),
    "label": (KIND_INT64, [7]),
    "neg": (KIND_INT64, [-1, 300, 2**40]),
    "w": (KIND_FLOAT, [0.5, -2.25]),
}


def _masked(data: bytes) -> int:
    """The TFRecord spec's masked CRC32C, written out here from the spec."""
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def _frame(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", _masked(length)) + data + struct.pack("<I", _masked(data))


def test_crc32c_known_value_in_both_implementations() -> None:
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert crc32c_python(b"123456789") == 0xE3069283
    data = os.urandom(4096)
    assert crc32c_python(data) == crc32c(data)


def test_decodes_examples_serialized_by_protobuf_packed_or_not() -> None:
    assert decode_example_dict(PACKED) == EXPECTED
    assert decode_example_dict(UNPACKED) == EXPECTED
    assert encode_example(dict(sorted(EXPECTED.items()))) == PACKED  # what protobuf writes, byte for byte


def test_reads_a_hand_framed_file_with_ray_column_rules(tmp_path: Path) -> None:
    (tmp_path / "a.tfrecords").write_bytes(_frame(PACKED) + _frame(UNPACKED))
    out = read_all(TFRecordDatasource(str(tmp_path)))
    assert out.schema.field("label").type == pa.int64()  # one value in every record: a scalar
    assert out.schema.field("w").type == pa.list_(pa.float32())
    assert out.schema.field("img").type == pa.list_(pa.binary())
    assert out.schema.field("empty").type == pa.list_(pa.int64())
    assert out.to_pylist()[0] == {
        "empty": [],
        "img": [b"\x00\xffabc", b""],
        "label": 7,
        "neg": [-1, 300, 2**40],
        "w": [0.5, -2.25],
    }


def _records(*features: dict) -> bytes:
    return b"".join(_frame(encode_example(f)) for f in features)


def test_one_value_or_none_is_a_scalar_with_nulls_and_missing_features_are_null() -> None:
    data = _records(
        {"a": (KIND_INT64, [1]), "b": (KIND_FLOAT, [1.5]), "c": (KIND_BYTES, [b"x"])},
        {"a": (KIND_INT64, []), "b": (KIND_FLOAT, [2.5, 3.5])},
        {"a": (KIND_INT64, [3]), "b": (KIND_FLOAT, [4.0])},
    )
    (table,) = iter_example_tables(_reader(data), "mem")
    assert table.schema.field("a").type == pa.int64() and table["a"].to_pylist() == [1, None, 3]
    assert table["b"].to_pylist() == [[1.5], [2.5, 3.5], [4.0]]  # one record holds two: a list column
    assert table.schema.field("c").type == pa.binary() and table["c"].to_pylist() == [b"x", None, None]


def _reader(data: bytes):
    view = memoryview(data)
    position = 0

    def read(n: int) -> bytes:
        nonlocal position
        chunk = bytes(view[position : position + n])
        position += len(chunk)
        return chunk

    return read


def test_tf_schema_makes_list_columns_and_rejects_other_features(tmp_path: Path) -> None:
    data = _records({"a": (KIND_INT64, [1]), "b": (KIND_FLOAT, [1.5])}, {"a": (KIND_INT64, [2])})
    (tmp_path / "s.tfrecords").write_bytes(data)
    schema = SimpleNamespace(feature=[SimpleNamespace(name="a", type=2), SimpleNamespace(name="b", type=3),
                                      SimpleNamespace(name="z", type=1)])  # tensorflow_metadata's shape
    out = read_all(TFRecordDatasource(str(tmp_path), tf_schema=schema))
    assert out.column_names == ["a", "b", "z"]
    assert out.to_pylist() == [{"a": [1], "b": [1.5], "z": None}, {"a": [2], "b": None, "z": None}]
    with pytest.raises(FileFormatError, match=r"s\.tfrecords, row 0, column 'b'.*tf_schema does not name"):
        read_all(TFRecordDatasource(str(tmp_path), tf_schema={"a": "int"}))
    with pytest.raises(FileFormatError, match="holds float values, but tf_schema says int64"):
        read_all(TFRecordDatasource(str(tmp_path), tf_schema={"a": "int", "b": "int"}))


def test_round_trip_through_write_tfrecords(mode: str, tmp_path: Path) -> None:
    table = pa.table({
        "id": pa.array(range(10), pa.int64()),
        "x": pa.array([i / 4 for i in range(10)], pa.float64()),
        "name": [f"n{i}" for i in range(10)],
        "raw": [bytes([i, 0, 255]) for i in range(10)],
        "vec": [[float(i), float(-i)] for i in range(10)],
        "ids": [list(range(i % 3)) for i in range(10)],
        "flag": [i % 2 == 0 for i in range(10)],
    })
    dataflow.from_arrow(table).repartition(2).write_tfrecords(str(tmp_path / "out"))
    assert len(list((tmp_path / "out").glob("*.tfrecords"))) == 2
    rows = sorted(dataflow.read_tfrecords(str(tmp_path / "out")).take_all(), key=lambda r: r["id"])
    for i, row in enumerate(rows):
        assert row["id"] == i and row["x"] == pytest.approx(i / 4)
        assert (row["name"], row["raw"], row["flag"]) == (f"n{i}".encode(), bytes([i, 0, 255]), int(i % 2 == 0))
        assert list(row["vec"]) == [float(i), float(-i)] and list(row["ids"]) == list(range(i % 3))
    projected = dataflow.read_tfrecords(str(tmp_path / "out")).select_columns(["name", "id"]).take(1)
    assert list(projected[0]) == ["name", "id"]


def test_gzip_and_zlib(mode: str, tmp_path: Path) -> None:
    data = _records(*({"v": (KIND_INT64, [i])} for i in range(5)))
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "a.tfrecords.gz").write_bytes(gzip.compress(data))
    assert sorted(r["v"] for r in dataflow.read_tfrecords(str(tmp_path / "g")).take_all()) == list(range(5))
    (tmp_path / "named.tfrecords").write_bytes(gzip.compress(data))  # gzip without the extension: say so
    ds = dataflow.read_tfrecords(str(tmp_path / "named.tfrecords"), arrow_open_stream_args={"compression": "gzip"})
    assert ds.count() == 5
    # the datasource itself takes the codec the same way, decompressing once whatever the extension says
    for path in (tmp_path / "g", tmp_path / "named.tfrecords"):
        source = TFRecordDatasource(str(path), arrow_open_stream_args={"compression": "gzip", "buffer_size": 4096})
        assert read_all(source)["v"].to_pylist() == list(range(5))
    (tmp_path / "z.tfrecords").write_bytes(zlib.compress(data))
    assert read_all(TFRecordDatasource(str(tmp_path / "z.tfrecords"), compression="ZLIB"))["v"].to_pylist() == list(range(5))
    dataflow.range(7, override_num_blocks=1).write_tfrecords(str(tmp_path / "out"), compression="gzip")
    (written,) = (tmp_path / "out").glob("*.tfrecords.gz")
    assert gzip.decompress(written.read_bytes())[:8] == struct.pack("<Q", len(encode_example({"id": (KIND_INT64, [0])})))
    assert sorted(r["id"] for r in dataflow.read_tfrecords(str(tmp_path / "out")).take_all()) == list(range(7))
    dataflow.range(3, override_num_blocks=1).write_tfrecords(str(tmp_path / "zz"), arrow_open_stream_args={"compression": "zlib"})
    (written,) = (tmp_path / "zz").glob("*.tfrecords.zz")
    ds = dataflow.read_tfrecords(str(written), compression="zlib")
    assert sorted(r["id"] for r in ds.take_all()) == [0, 1, 2]


def test_corrupt_records_fail_naming_file_record_and_offset(tmp_path: Path) -> None:
    good = _records(*({"v": (KIND_INT64, [i])} for i in range(3)))
    first = len(_records({"v": (KIND_INT64, [0])}))
    data = bytearray(good)
    data[first + 14] ^= 0x01  # inside the second record's data
    (tmp_path / "data.tfrecords").write_bytes(bytes(data))
    with pytest.raises(FileFormatError, match=rf"data\.tfrecords, row 1: corrupt TFRecord 1 at byte offset {first}: the CRC of its"):
        read_all(TFRecordDatasource(str(tmp_path / "data.tfrecords")))
    data = bytearray(good)
    data[first] ^= 0x01  # the second record's length
    (tmp_path / "length.tfrecords").write_bytes(bytes(data))
    with pytest.raises(FileFormatError, match=rf"length\.tfrecords, row 1: corrupt TFRecord 1 at byte offset {first}: the CRC of its length"):
        read_all(TFRecordDatasource(str(tmp_path / "length.tfrecords")))
    (tmp_path / "cut.tfrecords").write_bytes(good[: first + 15])
    with pytest.raises(FileFormatError, match=rf"cut\.tfrecords, row 1: file ends inside TFRecord 1 at byte offset {first}"):
        read_all(TFRecordDatasource(str(tmp_path / "cut.tfrecords")))
    (tmp_path / "gz.tfrecords.gz").write_bytes(gzip.compress(bytes(data)))
    with pytest.raises(FileFormatError, match=rf"corrupt TFRecord 1 at byte offset {first} of the uncompressed stream"):
        read_all(TFRecordDatasource(str(tmp_path / "gz.tfrecords.gz")))
    (tmp_path / "notex.tfrecords").write_bytes(_frame(b"\x0a\x05\x0a"))  # a field running past its message
    with pytest.raises(FileFormatError, match=r"TFRecord 0 at byte offset 0 is not a valid tf.train.Example"):
        read_all(TFRecordDatasource(str(tmp_path / "notex.tfrecords")))


def test_bounded_blocks_from_one_file() -> None:
    data = _records(*({"v": (KIND_BYTES, [bytes(1000)])} for _ in range(100)))
    tables = list(iter_example_tables(_reader(data), "mem", block_bytes=10_000))
    assert sum(t.num_rows for t in tables) == 100 and max(t.num_rows for t in tables) <= 10


def test_projection_include_paths_and_override_num_blocks(mode: str, tmp_path: Path) -> None:
    for f in range(3):
        (tmp_path / f"p{f}.tfrecords").write_bytes(_records(*({"a": (KIND_INT64, [f]), "b": (KIND_FLOAT, [0.5])},) * 2))
    assert len(list(TFRecordDatasource(str(tmp_path)).get_read_tasks(3))) == 3
    ds = dataflow.read_tfrecords(str(tmp_path), include_paths=True, override_num_blocks=3)
    rows = ds.select_columns(["path", "a"]).take_all()
    assert sorted((Path(r["path"]).name, r["a"]) for r in rows) == [(f"p{f}.tfrecords", f) for f in range(3) for _ in range(2)]


def test_write_rejects_a_column_a_feature_cannot_hold() -> None:
    from connectors.tfrecords_format import encode_tfrecords

    with pytest.raises(TypeError, match=r"column 's' has type struct<x: int64>, which a tf.train.Feature cannot hold"):
        encode_tfrecords(pa.table({"s": [{"x": 1}]}))
    assert np.frombuffer(encode_tfrecords(pa.table({"x": [1]}))[:8], "<u8")[0] > 0


@pytest.mark.s3
def test_read_and_write_on_s3(s3) -> None:
    s3.put("tf/a.tfrecords", _frame(PACKED))
    s3.put("tf/b.tfrecords.gz", gzip.compress(_frame(UNPACKED)))
    out = read_all(TFRecordDatasource("s3://test-bucket/tf", include_paths=True))
    assert out["label"].to_pylist() == [7, 7]
    assert sorted(out["path"].to_pylist()) == ["s3://test-bucket/tf/a.tfrecords", "s3://test-bucket/tf/b.tfrecords.gz"]
    sink = TFRecordDatasink("s3://test-bucket/out", compression="gzip")
    sink.on_write_start()
    sink.on_write_complete([sink.write(iter([pa.table({"id": [1, 2, 3]})]), TaskContext(0))])
    assert any(key.endswith(".tfrecords.gz") for key in s3.keys("out/"))
    assert read_all(TFRecordDatasource("s3://test-bucket/out"))["id"].to_pylist() == [1, 2, 3]
    s3.put("bad/x.tfrecords", _frame(PACKED)[:-1])
    with pytest.raises(FileFormatError, match=r"s3://test-bucket/bad/x\.tfrecords, row 0: file ends inside TFRecord 0"):
        read_all(TFRecordDatasource("s3://test-bucket/bad"))

"""read_avro: records streamed from Avro container files with Arrow types from the Avro schema
(the same in every block, nested records, maps, logical types), partitions and paths, and
errors naming the file."""

from __future__ import annotations

import datetime
import decimal
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from connector_testing import read_all

import dataflow
from connectors.avro_format import AvroDatasource, arrow_schema
from connectors.errors import FileFormatError

fastavro = pytest.importorskip("fastavro")

SCHEMA = {
    "type": "record",
    "name": "Sample",
    "namespace": "test",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "label", "type": "int"},
        {"name": "score", "type": ["null", "float"]},
        {"name": "name", "type": "string"},
        {"name": "blob", "type": "bytes"},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["CAT", "DOG"]}},
        {"name": "features", "type": {"type": "array", "items": "double"}},
        {"name": "tags", "type": {"type": "map", "values": "long"}},
        {"name": "box", "type": ["null", {"type": "record", "name": "Box", "fields": [
            {"name": "x", "type": "int"}, {"name": "y", "type": "int"}]}]},
        {"name": "other_box", "type": ["null", "Box"]},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
    ],
}


def _record(i: int) -> dict:
    return {
        "id": i,
        "label": i % 10,
        "score": None if i % 7 == 0 else i / 4,
        "name": f"sample-{i}",
        "blob": bytes([i % 256]) * 3,
        "kind": "CAT" if i % 2 else "DOG",
        "features": [float(i), float(i) / 2],
        "tags": {"a": i, "b": -i},
        "box": None if i % 3 == 0 else {"x": i, "y": -i},
        "other_box": None,
        "day": datetime.date(2026, 1, 1) + datetime.timedelta(days=i % 300),
        "at": datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(milliseconds=i),
        "price": decimal.Decimal(i) / 100,
        "uid": uuid.UUID(int=i),
    }


def _write(path: Path, start: int, rows: int, schema: dict = SCHEMA, codec: str = "null") -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        fastavro.writer(f, fastavro.parse_schema(schema), (_record(i) for i in range(start, start + rows)), codec=codec)
    return str(path)


def test_records_become_rows_with_types_from_the_avro_schema(tmp_path: Path, mode: str) -> None:
    first = _write(tmp_path / "a" / "part-0.avro", 0, 20_000)
    _write(tmp_path / "a" / "part-1.avro", 20_000, 5_000, codec="deflate")
    ds = dataflow.read_avro(str(tmp_path / "a"))
    table = ds.to_arrow().sort_by("id")
    assert table.num_rows == 25_000 and table["id"].to_pylist() == list(range(25_000))
    with open(first, "rb") as f:
        assert table.schema == arrow_schema(fastavro.reader(f).writer_schema)
    types = dict(zip(table.schema.names, table.schema.types, strict=True))
    assert types["id"] == types["label"] == pa.int64() and types["score"] == pa.float64()  # as Ray infers
    assert types["kind"] == pa.string() and types["blob"] == pa.binary()
    assert types["features"] == pa.list_(pa.float64()) and types["tags"] == pa.map_(pa.string(), pa.int64())
    assert types["box"] == types["other_box"] == pa.struct([("x", pa.int64()), ("y", pa.int64())])
    assert types["other_box"] == types["box"]  # a named type used again
    assert types["day"] == pa.date32() and types["at"] == pa.timestamp("us", tz="UTC")
    assert types["price"] == pa.decimal128(10, 2) and types["uid"] == pa.string()
    row = table.slice(21, 1).to_pylist()[0]
    want = _record(21)
    assert row["score"] == want["score"] and row["box"] == want["box"] and row["other_box"] is None
    assert dict(row["tags"]) == want["tags"] and row["features"] == want["features"]
    assert row["day"] == want["day"] and row["at"] == want["at"] and row["price"] == want["price"]
    assert row["uid"] == str(want["uid"]) and row["blob"] == want["blob"] and row["kind"] == "CAT"
    assert table.column("score").null_count == len(range(0, 25_000, 7))


def test_a_block_of_nulls_keeps_the_columns_type(tmp_path: Path) -> None:
    """The first 8,192 records have no note: that table's column is still a string one, so the
    tables concatenate into a block (types inferred from the values would make it a null column)."""
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "id", "type": "long"}, {"name": "note", "type": ["null", "string"]}]}
    path = tmp_path / "n.avro"
    with open(path, "wb") as f:
        fastavro.writer(f, fastavro.parse_schema(schema),
                        ({"id": i, "note": None if i < 10_000 else f"n{i}"} for i in range(12_000)))
    (task,) = AvroDatasource(str(path)).get_read_tasks(1)
    table = pa.concat_tables(list(task()))
    assert table.schema.field("note").type == pa.string() and table["note"].null_count == 10_000


def test_partitions_paths_and_an_empty_file(tmp_path: Path, mode: str) -> None:
    _write(tmp_path / "t" / "year=2025" / "x.avro", 0, 10)
    _write(tmp_path / "t" / "year=2026" / "y.avro", 10, 5)
    _write(tmp_path / "t" / "year=2026" / "empty.avro", 0, 0)
    rows = dataflow.read_avro(str(tmp_path / "t"), partitioning="hive", include_paths=True).take_all()
    assert len(rows) == 15
    assert {(r["id"], r["year"]) for r in rows} == {(i, "2025") for i in range(10)} | {(i, "2026") for i in range(10, 15)}
    assert all(r["path"].endswith((f"year={r['year']}/x.avro", f"year={r['year']}/y.avro")) for r in rows)


def test_a_union_of_several_types_falls_back_to_the_values(tmp_path: Path) -> None:
    schema = {"type": "record", "name": "U", "fields": [{"name": "v", "type": ["null", "long", "string"]}]}
    assert arrow_schema(fastavro.parse_schema(schema)) is None
    path = tmp_path / "u.avro"
    with open(path, "wb") as f:
        fastavro.writer(f, fastavro.parse_schema(schema), [{"v": 1}, {"v": 2}, {"v": None}])
    assert read_all(AvroDatasource(str(path)))["v"].to_pylist() == [1, 2, None]


def test_not_avro_and_not_records_name_the_file(tmp_path: Path, mode: str) -> None:
    bad = tmp_path / "bad.avro"
    bad.write_bytes(b"PAR1" + b"\x00" * 100)
    with pytest.raises(FileFormatError, match=r"bad\.avro.*not an Avro object container"):
        dataflow.read_avro(str(bad)).take_all()
    longs = tmp_path / "longs.avro"
    with open(longs, "wb") as f:
        fastavro.writer(f, fastavro.parse_schema("long"), [1, 2, 3])
    with pytest.raises(FileFormatError, match=r"longs\.avro.*schema is 'long', not a record"):
        dataflow.read_avro(str(longs)).take_all()
    truncated = tmp_path / "cut.avro"
    whole = Path(_write(tmp_path / "whole.avro", 0, 2_000)).read_bytes()
    truncated.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(FileFormatError, match=r"cut\.avro"):
        dataflow.read_avro(str(truncated)).take_all()


def test_read_avro_is_no_longer_listed_as_missing() -> None:
    assert dataflow.read_avro.__module__ == "dataflow.read_api"  # not the "not provided" error

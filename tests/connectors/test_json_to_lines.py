"""JSON that is not one object a line (an array of objects, objects over several lines) is read as a
stream of pieces (``connectors.json_to_lines``), with the rows, types and errors of parsing it whole."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest
from connector_testing import read_all

import dataflow
from connectors.errors import FileFormatError
from connectors.json_format import JSONDatasource

TRICKY = ['a "quoted" word', "back\\slash\\", "\\\"", "[1, 2]", "{x}", "a,b", "tab\there", "new\nline", "ünï ☃", "", "\\\\\"]"]


def _value(rng: random.Random, kind: str):
    if rng.random() < 0.1:
        return None
    if kind == "int":
        return rng.randint(-10**12, 10**12)
    if kind == "float":
        return rng.randint(-10**6, 10**6) + 0.25
    if kind == "str":
        return rng.choice(TRICKY) + str(rng.randint(0, 99))
    if kind == "list":
        return [rng.randint(0, 9) for _ in range(rng.randint(0, 3))]
    return {"inner": rng.choice(TRICKY), "deep": [{"n": rng.randint(0, 5)}]}


def _rows(rng: random.Random, n: int) -> list[dict]:
    kinds = {"i": "int", "f": "float", "s": "str", "l": "list", "o": "struct", 'k,]}"\\': "str"}
    rows = [{k: _value(rng, kind) for k, kind in kinds.items()} for _ in range(n)]
    rows[0] = {"i": 1, "f": 0.5, "s": "x", "l": [1], "o": {"inner": "y", "deep": [{"n": 1}]},  # every type seen first
               'k,]}"\\': "\u0022"}
    return rows


@pytest.mark.parametrize("seed", range(6))
def test_a_streamed_array_gives_the_rows_of_parsing_it_whole(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    rows = _rows(rng, rng.randint(1, 400))
    indent = [None, 2, "\t"][seed % 3]
    path = tmp_path / "rows.json"
    path.write_text(" \n" + json.dumps(rows, indent=indent, ensure_ascii=seed % 2 == 0) + "\n\n")
    for block_bytes in (1, 97, 4096, 1 << 20):  # chunks cut after every element, ..., one chunk
        got = read_all(JSONDatasource(str(path), block_bytes=block_bytes))
        assert got.to_pylist() == rows, block_bytes
        assert got.schema.field("s").type == pa.string()


def test_an_array_is_read_in_chunks(tmp_path: Path) -> None:
    from connectors.json_format import parse_json_stream

    rows = [{"id": i, "pad": "x" * 100} for i in range(10_000)]
    path = tmp_path / "big.json"
    path.write_text(json.dumps(rows))
    import pyarrow.json as pajson

    with pa.OSFile(str(path)) as stream:
        tables = list(parse_json_stream(stream, display="big.json", read_options=pajson.ReadOptions(),
                                        parse_options=pajson.ParseOptions(), chunk_bytes=64 << 10))
    assert len(tables) >= 15 and max(t.num_rows for t in tables) < 1_000
    assert pa.concat_tables(tables).column("id").to_pylist() == list(range(10_000))


def test_a_big_array_is_read_in_bounded_memory(tmp_path: Path) -> None:
    """57 MiB of array: parsed whole into Python objects, the read took 7.5x its size."""
    path = tmp_path / "big.json"
    with path.open("w") as out:
        out.write("[")
        for start in range(0, 300_000, 10_000):
            out.write(("," if start else "") + ",".join(
                json.dumps({"id": i, "name": f"row-{i}", "v": i / 4, "tags": ["a", "b"], "pad": "p" * 120})
                for i in range(start, start + 10_000)))
        out.write("]")
    # the tables as the reader makes them (a task joins them into blocks of up to 64 MiB, which
    # here would be the whole file's 51 MB of Arrow data: what is measured is the parse)
    script = textwrap.dedent(f"""
        import resource
        import pyarrow as pa, pyarrow.json as pajson
        from connectors.json_format import parse_json_stream
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        with pa.OSFile({str(path)!r}) as stream:
            tables = parse_json_stream(stream, display="big.json", read_options=pajson.ReadOptions(),
                                       parse_options=pajson.ParseOptions())
            rows = sum(t.num_rows for t in tables)
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        print(rows, grown // 1024)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    rows, grown_mib = map(int, out.stdout.split())
    assert rows == 300_000
    size_mib = path.stat().st_size >> 20
    # measured: 85-110 MiB (about the same for a file three times the size); parsed whole, 428 MiB
    assert grown_mib < 220, f"reading a {size_mib} MiB array grew the process by {grown_mib} MiB"


def test_timestamps_stay_strings_as_when_parsed_whole(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps([{"when": "2024-01-02T03:04:05", "at": {"t": "2024-01-02 03:04:05"}}, {"when": "x", "at": None}]))
    table = read_all(JSONDatasource(str(path)))
    assert table.schema.field("when").type == pa.string()
    assert table.to_pylist()[0] == {"when": "2024-01-02T03:04:05", "at": {"t": "2024-01-02 03:04:05"}}


def test_a_key_first_seen_in_a_later_row_is_kept(tmp_path: Path) -> None:
    """``Table.from_pylist`` (how the whole array was read before) kept only the first row's keys."""
    path = tmp_path / "k.json"
    path.write_text(json.dumps([{"a": 1}, {"b": 2}]))
    assert read_all(JSONDatasource(str(path))).to_pylist() == [{"a": 1, "b": None}, {"a": None, "b": 2}]


@pytest.mark.parametrize(("text", "says"), [
    ("[1, 2]", "must hold objects"),
    ('[{"a": 1}, [2]]', "must hold objects"),
    ('[{"a": 1},]', "comma with no element"),
    ('[{"a": 1} {"a": 2}]', "must hold objects"),
    ('[{"a": 1}', "does not end"),
    ('[{"a": 1}] {"a": 2}', "extra data"),
    ('[{"a": 1}}', "unbalanced"),
    ('[{"a": 1}, {"a": tru}]', "could not parse as a JSON array of objects"),
    # objects over several lines
    ('{\n "a": 1\n}\n{\n "a": 2\n', "does not end"),
    ('{\n "a": 1\n}\n}\n', "unbalanced"),
    ('{\n "a": 1\n}\n{\n "a": tru\n}\n', "could not parse as JSON objects"),
])
def test_malformed_json_names_the_file(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(FileFormatError, match=says) as info:
        read_all(JSONDatasource(str(path)))
    assert "bad.json" in str(info.value)


def test_a_later_misfit_names_the_row_and_column(tmp_path: Path) -> None:
    rows = [{"a": i, "b": "x" * 50} for i in range(200)] + [{"a": "text", "b": "y"}]
    path = tmp_path / "late.json"
    path.write_text(json.dumps(rows))
    with pytest.raises(FileFormatError) as info:
        read_all(JSONDatasource(str(path), block_bytes=1024))
    assert info.value.column == "a" and info.value.row == 201, str(info.value)


def test_read_json_of_arrays_on_both_modes(mode, tmp_path: Path) -> None:
    for i in range(3):
        (tmp_path / f"part-{i}.json").write_text(json.dumps([{"id": i * 10 + j, "s": f'"{j}",]'} for j in range(10)], indent=1))
    ds = dataflow.read_json(str(tmp_path))
    assert sorted(r["id"] for r in ds.take_all()) == list(range(30))
    assert ds.filter(lambda r: r["s"] == '"3",]').count() == 3


def test_a_compressed_array_streams_too(tmp_path: Path) -> None:
    import gzip

    rows = [{"id": i, "s": f"row,{i}]"} for i in range(5_000)]
    (tmp_path / "rows.json.gz").write_bytes(gzip.compress(json.dumps(rows, indent=1).encode()))
    assert read_all(JSONDatasource(str(tmp_path / "rows.json.gz"), block_bytes=4096)).to_pylist() == rows


@pytest.mark.parametrize("seed", range(4))
def test_objects_over_several_lines_stream_with_their_rows(tmp_path: Path, seed: int) -> None:
    rng = random.Random(100 + seed)
    rows = _rows(rng, rng.randint(2, 300))
    path = tmp_path / "pretty.json"
    path.write_text("".join(json.dumps(row, indent=[2, "\t", 1, 4][seed], ensure_ascii=seed % 2 == 0) + "\n" for row in rows))
    for block_bytes in (1, 97, 4096, 1 << 20):
        assert read_all(JSONDatasource(str(path), block_bytes=block_bytes)).to_pylist() == rows, block_bytes
    compact = tmp_path / "compact.jsonl"  # JSON Lines read with newlines_in_values=True
    compact.write_text("".join(json.dumps(row) + "\n" for row in rows))
    import pyarrow.json as pajson

    spanning = pajson.ParseOptions(newlines_in_values=True)
    assert read_all(JSONDatasource(str(compact), parse_options=spanning, block_bytes=97)).to_pylist() == rows


def test_a_pretty_printed_file_past_pyarrows_block_is_read(tmp_path: Path) -> None:
    """Parsed whole without newlines_in_values, pyarrow's 1 MiB blocks cut objects at newlines:
    a 3 MiB file failed with 'Missing a name for object member'."""
    rows = [{"id": i, "pad": "p" * 400, "tags": ["a", "b"]} for i in range(7_000)]
    path = tmp_path / "pretty.json"
    path.write_text("".join(json.dumps(row, indent=2) + "\n" for row in rows))
    assert path.stat().st_size > 3 << 20
    assert read_all(JSONDatasource(str(path))).to_pylist() == rows


def test_object_pieces_are_bounded_and_end_where_objects_end(tmp_path: Path) -> None:
    import io

    from connectors.json_to_lines import object_pieces

    text = "".join(json.dumps({"i": i, "s": "}{" * (i % 7)}, indent=1) + "\n" for i in range(20_000)).encode()
    stream = io.BytesIO(text)
    pieces = list(object_pieces(stream.read, stream.read(1000), 64 << 10, "x"))
    assert b"".join(p for p, _ in pieces) == text.rstrip(b"\n")  # cut where an object ends, nothing lost
    assert sum(n for _, n in pieces) == 20_000 and len(pieces) >= 8
    assert max(len(p) for p, _ in pieces) <= 64 << 10
    assert all(json.loads("[" + p.decode().strip().replace("}\n{", "},{") + "]") for p, _ in pieces)


def test_a_single_object_over_several_lines_is_one_row_as_in_ray(tmp_path: Path) -> None:
    path = tmp_path / "one.json"
    path.write_text(json.dumps({"when": "2024-01-02T03:04:05", "n": [1, 2]}, indent=2))
    table = read_all(JSONDatasource(str(path)))
    assert table.to_pylist() == [{"when": "2024-01-02T03:04:05", "n": [1, 2]}]


@pytest.mark.s3
@pytest.mark.s3_faults
@pytest.mark.timeout(60)
def test_an_array_on_s3_cut_short_is_read_again_and_exact(s3) -> None:
    """A body cut mid-array is read again from the start; the pieces already handed on are not
    handed on twice."""
    rows = [{"id": i, "s": f"row {i}, [{{x}}]"} for i in range(40_000)]
    s3.put("a/rows.json", json.dumps(rows, indent=1).encode())
    s3.fault("truncate", method="GET", path=r"/a/rows", times=1)
    source = JSONDatasource("s3://test-bucket/a/rows.json", block_bytes=256 << 10)
    assert read_all(source).to_pylist() == rows
    assert s3.hits() == [1]

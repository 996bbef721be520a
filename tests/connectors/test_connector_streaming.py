"""CSV and JSON Lines files are read as streams: bounded blocks, whatever the file's size."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import cloudpickle
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pytest
from connector_testing import read_all

import dataflow
from connectors.base import Datasource
from connectors.csv_format import CSVDatasource
from connectors.errors import FileFormatError
from connectors.json_format import JSONDatasource
from connectors.numpy_format import NumpyDatasource
from connectors.text_format import TextDatasource

MiB = 1 << 20
PAD = "x" * 40


def _blocks(source: Datasource) -> Iterator[pa.Table]:
    """Blocks of every read task, one at a time (each task pickled, as on a worker)."""
    for task in source.get_read_tasks(4):
        yield from cloudpickle.loads(cloudpickle.dumps(task))()


def _table(start: int, n: int) -> pa.Table:
    ids = pa.array(np.arange(start, start + n))
    return pa.table({"id": ids, "s": pc.binary_join_element_wise("name-", pc.cast(ids, pa.string()), PAD, "")})


def _check_rows(block: pa.Table, start: int) -> int:
    """``block`` holds exactly rows ``start``, ``start + 1``...; returns the next row's id."""
    rows = block.select(["id", "s"])
    assert rows.equals(_table(start, block.num_rows).cast(rows.schema)), f"rows from {start} differ"
    return start + block.num_rows


def _big_csv(path: Path, rows: int) -> int:
    with pacsv.CSVWriter(path, _table(0, 0).schema) as writer:
        for start in range(0, rows, 200_000):
            writer.write_table(_table(start, min(200_000, rows - start)))
    return path.stat().st_size


def _big_jsonl(path: Path, rows: int) -> int:
    with path.open("wb") as out:
        for start in range(0, rows, 200_000):
            ids = pc.cast(pa.array(np.arange(start, min(start + 200_000, rows))), pa.string())
            lines = pc.binary_join_element_wise('{"id": ', ids, ', "s": "name-', ids, PAD + '"}\n', "")
            out.write(b"".join(s.as_buffer().to_pybytes() for s in lines))
    return path.stat().st_size


def _stream_and_measure(source: Datasource) -> tuple[int, int, int, int]:
    """(blocks, rows, largest block's bytes, most Arrow memory held while reading, above the start)."""
    baseline = pa.total_allocated_bytes()
    count = rows = largest = peak = 0
    for block in _blocks(source):
        peak = max(peak, pa.total_allocated_bytes() - baseline)
        rows = _check_rows(block, rows)
        count += 1
        largest = max(largest, block.nbytes)
        del block
    return count, rows, largest, peak


def test_big_csv_is_read_in_bounded_blocks(tmp_path: Path) -> None:
    rows = 1_000_000
    size = _big_csv(tmp_path / "big.csv", rows)
    assert size > 55 * MiB
    count, read, largest, _ = _stream_and_measure(CSVDatasource(str(tmp_path / "big.csv")))
    assert read == rows
    assert count > 1 and largest < size / 3, (count, largest, size)


def test_big_json_lines_file_is_read_in_bounded_blocks(tmp_path: Path) -> None:
    rows = 800_000
    size = _big_jsonl(tmp_path / "big.jsonl", rows)
    assert size > 55 * MiB
    count, read, largest, _ = _stream_and_measure(JSONDatasource(str(tmp_path / "big.jsonl")))
    assert read == rows
    assert count > 1 and largest < size / 3, (count, largest, size)


def test_memory_held_while_reading_is_bounded_by_the_block_sizes_not_the_file(tmp_path: Path) -> None:
    # smaller blocks than the defaults (16 MiB ours; 1 MiB pyarrow's, of which its CSV reader reads
    # up to 32 ahead) so that the bound shows on a 30 MB file
    size = _big_csv(tmp_path / "a.csv", 500_000) + _big_jsonl(tmp_path / "a.jsonl", 400_000)
    csv = CSVDatasource(
        str(tmp_path / "a.csv"), read_options=pacsv.ReadOptions(block_size=128 * 1024), block_bytes=2 * MiB
    )
    jsonl = JSONDatasource(str(tmp_path / "a.jsonl"), block_bytes=2 * MiB)
    for source, rows in ((csv, 500_000), (jsonl, 400_000)):
        count, read, largest, peak = _stream_and_measure(source)
        assert read == rows and count > 10 and largest <= 2 * MiB + 256 * 1024
        assert peak < 12 * MiB < size / 4, f"{peak} bytes of Arrow memory held reading {source}"


def test_read_csv_and_read_json_through_the_engine(tmp_path: Path) -> None:
    rows = 300_000
    _big_csv(tmp_path / "a.csv", rows)
    _big_jsonl(tmp_path / "a.jsonl", rows)
    with dataflow.options(execution_mode="local", target_max_block_size=8 * MiB):
        for ds in (dataflow.read_csv(str(tmp_path / "a.csv")), dataflow.read_json(str(tmp_path / "a.jsonl"))):
            blocks = list(ds.iter_batches(batch_size=None, batch_format="pyarrow"))
            assert len(blocks) > 1
            assert pa.concat_tables(blocks).sort_by("id")["id"].to_numpy().tolist() == list(range(rows))


def _piece_tasks(source: Datasource) -> list:
    return list(source.get_read_tasks(200))


@pytest.mark.parametrize("line_end", ["\n", "\r\n"])
def test_a_big_csv_is_read_as_byte_ranges_each_line_once(tmp_path: Path, line_end: str) -> None:
    """A file well over a task's bytes is cut into ranges, one task each: every row once, in
    order, whatever lines straddle the cuts, with the header's names and the head's types."""
    rows = 1_200_000
    table = _table(0, rows)
    text = "id,s" + line_end + line_end.join(f"{i},{s}" for i, s in zip(range(rows), table["s"].to_pylist(), strict=True))
    (tmp_path / "big.csv").write_text(text + line_end)
    assert (tmp_path / "big.csv").stat().st_size > 64 * MiB
    source = CSVDatasource(str(tmp_path / "big.csv"))
    tasks = _piece_tasks(source)
    assert len(tasks) >= 2, len(tasks)
    read = 0
    for task in tasks:
        for block in cloudpickle.loads(cloudpickle.dumps(task))():
            assert block.schema.field("id").type == pa.int64()
            read = _check_rows(block, read)
    assert read == rows


def test_csv_byte_ranges_keep_the_read_options(tmp_path: Path) -> None:
    """Rows skipped before the header and after it, given column names, chosen columns and a
    column's type apply as to the whole file; a range with no line start gives no rows."""
    rows = 1_000_000
    body = "\n".join(f"{i},{i * 2},{PAD}" for i in range(rows))
    (tmp_path / "h.csv").write_text("junk line\na,b,c\n0,0,skipped\n" + body + "\n")
    read_options = pacsv.ReadOptions(skip_rows=1, skip_rows_after_names=1)
    convert = pacsv.ConvertOptions(include_columns=["a", "b"], column_types={"b": pa.float64()})
    source = CSVDatasource(str(tmp_path / "h.csv"), read_options=read_options, convert_options=convert)
    out = read_all(source)
    assert len(_piece_tasks(source)) >= 2
    assert out.column_names == ["a", "b"] and out.schema.field("b").type == pa.float64()
    assert out["a"].to_pylist() == list(range(rows)) and out["b"][-1].as_py() == 2.0 * (rows - 1)
    (tmp_path / "n.csv").write_text(body + "\n")
    named = pacsv.ReadOptions(column_names=["x", "y", "z"])
    out = read_all(CSVDatasource(str(tmp_path / "n.csv"), read_options=named))
    assert out.column_names == ["x", "y", "z"] and out["x"].to_pylist() == list(range(rows))
    one_line = "a\n" + "1" * (80 * MiB) + "\n"  # two ranges, one line: the second holds no line start
    (tmp_path / "one.csv").write_text(one_line)
    tasks = _piece_tasks(CSVDatasource(str(tmp_path / "one.csv"), read_options=pacsv.ReadOptions(block_size=100 * MiB)))
    assert len(tasks) >= 2
    blocks = [b for task in tasks for b in task()]
    assert sum(b.num_rows for b in blocks) == 1


def test_csv_byte_ranges_only_where_a_newline_ends_a_row(tmp_path: Path) -> None:
    """Compressed files, newlines_in_values=True and other encodings are read whole."""
    _big_csv(tmp_path / "big.csv", 1_000_000)
    (tmp_path / "big.csv.gz").write_bytes(gzip.compress((tmp_path / "big.csv").read_bytes(), compresslevel=1))
    assert len(_piece_tasks(CSVDatasource(str(tmp_path / "big.csv")))) >= 2
    assert len(_piece_tasks(CSVDatasource(str(tmp_path / "big.csv.gz")))) == 1
    quoted = pacsv.ParseOptions(newlines_in_values=True)
    assert len(_piece_tasks(CSVDatasource(str(tmp_path / "big.csv"), parse_options=quoted))) == 1
    latin = pacsv.ReadOptions(encoding="utf16")
    assert len(_piece_tasks(CSVDatasource(str(tmp_path / "big.csv"), read_options=latin))) == 1


def test_a_late_misfit_in_a_csv_byte_range_names_the_column(tmp_path: Path) -> None:
    lines = ["a,b"] + [f"{i},{i}{PAD[:20]}" for i in range(1_500_000)] + ["unknown,x"]
    (tmp_path / "f.csv").write_text("\n".join(lines) + "\n")
    assert len(_piece_tasks(CSVDatasource(str(tmp_path / "f.csv")))) >= 2
    with pytest.raises(FileFormatError, match=r"f\.csv, column 'a': .*'unknown'.*column_types=\{'a'"):
        read_all(CSVDatasource(str(tmp_path / "f.csv")))


def _lines_with_blanks(rows: int, blank_every: int, line_end: str = "\n") -> str:
    """JSON Lines of rows ``{"id": i, "s": ...}``, a blank line after every ``blank_every``-th."""
    lines = []
    for i in range(rows):
        lines.append(f'{{"id": {i}, "s": "name-{i}{PAD}"}}{line_end}')
        if i % blank_every == blank_every - 1:
            lines.append(" " + line_end)
    return "".join(lines)


def test_a_big_json_lines_file_is_read_as_byte_ranges_each_line_once(tmp_path: Path) -> None:
    """Ranges of one file, one task each: every row once and in order, blank lines skipped,
    every range with the types of the file's first chunk (a column null at first is a number)."""
    rows = 700_000
    lines = _lines_with_blanks(rows, 1000, "\r\n").split("\r\n")
    last = max(i for i, line in enumerate(lines) if line.startswith("{"))
    lines[0] = lines[0][:-1] + ', "late": null}'
    lines[1] = lines[1][:-1] + ', "late": 5}'
    lines[last] = lines[last][:-1] + ', "late": 7}'
    (tmp_path / "big.jsonl").write_text("\r\n".join(lines))
    assert (tmp_path / "big.jsonl").stat().st_size > 48 * MiB  # (1.5 tasks of 32 MiB: split)
    tasks = _piece_tasks(JSONDatasource(str(tmp_path / "big.jsonl"), block_bytes=4 * MiB))
    assert len(tasks) >= 2, len(tasks)
    read, late = 0, []
    for task in tasks:
        for block in cloudpickle.loads(cloudpickle.dumps(task))():
            assert block.schema.field("id").type == pa.int64() and block.schema.field("late").type == pa.int64()
            read = _check_rows(block, read)
            late += block["late"].drop_null().to_pylist()
    assert read == rows and late == [5, 7]


def test_json_byte_ranges_only_for_json_lines_where_a_newline_ends_a_row(tmp_path: Path) -> None:
    """Compressed files, newlines_in_values=True, a JSON array and a file whose first chunk does
    not parse are each read whole, by one task (which names a bad row as ever)."""
    text = _lines_with_blanks(800_000, 10**9)
    (tmp_path / "big.jsonl").write_text(text)
    assert len(_piece_tasks(JSONDatasource(str(tmp_path / "big.jsonl")))) >= 2
    (tmp_path / "big.jsonl.gz").write_bytes(gzip.compress(text.encode(), compresslevel=1))
    assert len(_piece_tasks(JSONDatasource(str(tmp_path / "big.jsonl.gz")))) == 1
    spanning = pajson.ParseOptions(newlines_in_values=True)
    assert len(_piece_tasks(JSONDatasource(str(tmp_path / "big.jsonl"), parse_options=spanning))) == 1
    (tmp_path / "array.json").write_text("[" + text.replace("}\n", "},\n").rstrip(",\n") + "]")
    assert len(_piece_tasks(JSONDatasource(str(tmp_path / "array.json")))) == 1
    (tmp_path / "bad.jsonl").write_text('{"id": 0}\n{"id": nope}\n' + text)
    tasks = _piece_tasks(JSONDatasource(str(tmp_path / "bad.jsonl")))
    assert len(tasks) == 1
    with pytest.raises(FileFormatError, match=r"bad\.jsonl, row 2"):
        list(tasks[0]())


def test_a_bad_line_in_a_later_json_byte_range_names_its_row_in_the_file(tmp_path: Path) -> None:
    rows = 800_000
    lines = _lines_with_blanks(rows, 7).split("\n")
    assert lines[-2].startswith('{"id": 799999')
    lines[-2] = '{"id": "unknown", "s": "x"}'  # the last row, in the last range
    (tmp_path / "f.jsonl").write_text("\n".join(lines))
    tasks = _piece_tasks(JSONDatasource(str(tmp_path / "f.jsonl")))
    assert len(tasks) >= 2
    with pytest.raises(FileFormatError, match=r"f\.jsonl, row 800000, column 'id'.*explicit_schema") as info:
        list(tasks[-1]())
    assert info.value.row == rows
    lines[-2] = '{"id": 1, nope}'
    (tmp_path / "f.jsonl").write_text("\n".join(lines))
    with pytest.raises(FileFormatError, match=r"f\.jsonl, row 800000"):
        list(_piece_tasks(JSONDatasource(str(tmp_path / "f.jsonl")))[-1]())


def _text_lines(rows: int) -> list[str]:
    return [f"line {i} {PAD}" if i % 97 else "" for i in range(rows)]  # every 97th line empty


def test_a_text_file_streams_in_bounded_blocks_and_big_ones_in_ranges(tmp_path: Path) -> None:
    """read_text: blocks of about block_bytes however big the file (it was decoded whole, as
    Python strings), and a file well over a task's bytes read as ranges, one task each: every
    line once and in order, \r\n endings and blank lines as before, a line longer than a block."""
    lines = _text_lines(1_000_000)
    lines[500_000] = "y" * (3 * MiB)  # longer than a block
    (tmp_path / "big.txt").write_text("\r\n".join(lines) + "\r\n")
    size = (tmp_path / "big.txt").stat().st_size
    assert size > 48 * MiB  # (1.5 tasks of 32 MiB: split)
    want = [line for line in lines if line]
    tasks = _piece_tasks(TextDatasource(str(tmp_path / "big.txt"), block_bytes=2 * MiB))
    assert len(tasks) >= 2, len(tasks)
    got: list[str] = []
    for task in tasks:
        for block in cloudpickle.loads(cloudpickle.dumps(task))():
            got += block["text"].to_pylist()
    assert got == want
    baseline = pa.total_allocated_bytes()
    peak = largest = 0
    whole = TextDatasource(str(tmp_path / "big.txt"), block_bytes=2 * MiB, drop_empty_lines=False)
    for task in whole.get_read_tasks(1):  # one task: the file as one stream
        got = []
        for block in task():
            peak = max(peak, pa.total_allocated_bytes() - baseline)
            largest = max(largest, block.nbytes)
            got += block["text"].to_pylist()
        assert got == lines
    assert largest < 8 * MiB and peak < 24 * MiB < size / 2, (largest, peak)


def test_text_files_other_than_utf8_are_read_whole_and_bad_bytes_name_the_file(tmp_path: Path) -> None:
    (tmp_path / "l.txt").write_bytes("caf\xe9\r\n\n  \nna\xefve".encode("latin-1"))
    assert read_all(TextDatasource(str(tmp_path / "l.txt"), encoding="latin-1"))["text"].to_pylist() == ["caf\xe9", "na\xefve"]
    (tmp_path / "e.txt").write_bytes(b"")
    assert read_all(TextDatasource(str(tmp_path / "e.txt"), drop_empty_lines=False))["text"].to_pylist() == [""]  # as Ray
    (tmp_path / "bad.txt").write_bytes(("ok\n" * 2_000_000).encode() + b"\xff\xfe\n")
    with pytest.raises(FileFormatError, match=r"bad\.txt.*UTF8"):
        read_all(TextDatasource(str(tmp_path / "bad.txt"), block_bytes=MiB))


def test_a_big_npy_file_is_read_in_bounded_blocks_and_in_ranges_of_rows(tmp_path: Path) -> None:
    """Plain C-order values: the header, then block_bytes of rows at a time (the file was
    loaded whole), and ranges of rows, one task each, for a file well over a task's bytes;
    Fortran order is loaded whole by the first range; a file cut short names itself."""
    emb = np.arange(250_000 * 64, dtype=np.float32).reshape(250_000, 64)
    np.save(tmp_path / "emb.npy", emb)
    assert (tmp_path / "emb.npy").stat().st_size > 48 * MiB
    tasks = _piece_tasks(NumpyDatasource(str(tmp_path / "emb.npy"), block_bytes=2 * MiB))
    assert len(tasks) >= 2, len(tasks)
    blocks = [b for task in tasks for b in cloudpickle.loads(cloudpickle.dumps(task))()]
    assert max(b.nbytes for b in blocks) <= 2 * MiB
    assert np.array_equal(np.concatenate([b["data"].combine_chunks().to_numpy_ndarray() for b in blocks]), emb)
    np.save(tmp_path / "f.npy", np.asfortranarray(emb))
    tasks = _piece_tasks(NumpyDatasource(str(tmp_path / "f.npy")))
    assert len(tasks) >= 2
    blocks = [b for task in tasks for b in task()]
    assert np.array_equal(np.concatenate([b["data"].combine_chunks().to_numpy_ndarray() for b in blocks]), emb)
    (tmp_path / "cut.npy").write_bytes((tmp_path / "emb.npy").read_bytes()[: 10 * MiB])
    with pytest.raises(FileFormatError, match=r"cut\.npy.*ends after 40959 of the 250000 rows"):
        read_all(NumpyDatasource(str(tmp_path / "cut.npy")))


def test_a_parquet_row_group_past_the_batching_size_is_decoded_a_batch_at_a_time(tmp_path: Path, monkeypatch) -> None:
    """A row group that decodes to more than BATCHED_ROW_GROUP_BYTES (256 MiB; 2 MiB here) is
    read in batches of about a block: the same rows, in order, holding far less at once."""
    import pyarrow.parquet as pq

    import connectors.parquet_format as parquet_format
    from connectors import file_datasource
    from connectors.parquet_format import ParquetDatasource

    table = _table(0, 600_000)
    pq.write_table(table, tmp_path / "one.parquet", row_group_size=600_000)  # ~40 MiB decoded
    monkeypatch.setattr(parquet_format, "BATCHED_ROW_GROUP_BYTES", 2 * MiB)
    monkeypatch.setattr(parquet_format, "STREAM_BLOCK_BYTES", MiB)
    monkeypatch.setattr(file_datasource, "DEFAULT_BLOCK_BYTES", 4 * MiB)  # the blocks the batches make
    count, rows, largest, peak = _stream_and_measure(ParquetDatasource(str(tmp_path / "one.parquet")))
    assert rows == 600_000 and count >= 8 and largest < 6 * MiB, (count, largest)
    assert peak < 20 * MiB, peak  # (decoded whole: the row group's ~40 MiB and more)


def test_a_csv_row_longer_than_pyarrows_block_is_read(tmp_path: Path) -> None:
    """pyarrow fails on a row longer than its block_size ("straddling object"; so does Ray's
    reader): the read goes on with bigger blocks, handing on each row once, in the first block,
    deep in a file read whole, and in a later range of a file read as ranges."""
    long_rows = {1: 300_000, 150_000: 300_000, 1_400_000: 300_000}
    lines = ["a,b"] + [f"{i},{'y' * long_rows.get(i, 26)}" for i in range(1_500_000)]
    (tmp_path / "f.csv").write_text("\n".join(lines) + "\n")
    assert (tmp_path / "f.csv").stat().st_size > 48 * MiB  # (ranges of 32 MiB)
    small_blocks = pacsv.ReadOptions(block_size=65_536)
    for parallelism in (1, 200):  # one task; ranges
        source = CSVDatasource(str(tmp_path / "f.csv"), read_options=small_blocks, block_bytes=4 * MiB)
        tasks = list(source.get_read_tasks(parallelism))
        assert (len(tasks) >= 2) == (parallelism == 200)
        blocks = [b for task in tasks for b in cloudpickle.loads(cloudpickle.dumps(task))()]
        assert all(b.schema.field("a").type == pa.int64() for b in blocks)
        out = pa.concat_tables(blocks)
        assert out["a"].to_pylist() == list(range(1_500_000))
        lengths = pc.binary_length(out["b"]).to_numpy()
        assert [int(lengths[i]) for i in long_rows] == list(long_rows.values()) and lengths[2] == 26


def test_small_parquet_row_groups_are_read_in_runs(tmp_path: Path) -> None:
    """A file of 2,000 row groups of 50 rows is read in a few calls (one per row group took
    ~190 us each), with and without a filter, every row once and in order."""
    import pyarrow.parquet as pq

    from connectors.parquet_format import ParquetDatasource, _row_group_runs

    table = _table(0, 100_000)
    pq.write_table(table, tmp_path / "many.parquet", row_group_size=50)
    metadata = pq.ParquetFile(tmp_path / "many.parquet").metadata
    runs = list(_row_group_runs(metadata, list(range(metadata.num_row_groups)), None))
    assert len(runs) < 10 and [i for run, _, _ in runs for i in run] == list(range(2_000))
    assert not any(big for _, _, big in runs)
    assert read_all(ParquetDatasource(str(tmp_path / "many.parquet"))).equals(table)
    kept = read_all(ParquetDatasource(str(tmp_path / "many.parquet"), filter=pc.field("id") >= 70_000))
    assert kept["id"].to_pylist() == list(range(70_000, 100_000))


def test_csv_text_after_the_first_pyarrow_block_falls_back_to_string(tmp_path: Path) -> None:
    # pyarrow infers from its first block (1 MiB); "unknown" comes ~3 MiB in, still in our first block
    lines = ["a,b"] + [f"{i},{i}" for i in range(300_000)] + ["unknown,1"]
    (tmp_path / "f.csv").write_text("\n".join(lines) + "\n")
    out = read_all(CSVDatasource(str(tmp_path / "f.csv")))
    assert out.schema.field("a").type == pa.string() and out.schema.field("b").type == pa.int64()
    assert out.num_rows == 300_001 and out["a"][-1].as_py() == "unknown" and out["a"][7].as_py() == "7"


def test_csv_text_after_the_first_block_names_the_column_and_the_fix(tmp_path: Path) -> None:
    lines = ["a,b"] + [f"{i},{i}" for i in range(50_000)] + ["1,unknown"]
    (tmp_path / "f.csv").write_text("\n".join(lines) + "\n")
    source = CSVDatasource(
        str(tmp_path / "f.csv"), read_options=pacsv.ReadOptions(block_size=16_384), block_bytes=MiB // 8
    )
    with pytest.raises(FileFormatError, match=r"f\.csv, column 'b': .*'unknown'.*column_types=\{'b'") as info:
        read_all(source)
    assert info.value.column == "b"
    types = pacsv.ConvertOptions(column_types={"b": pa.string()})
    out = read_all(CSVDatasource(str(tmp_path / "f.csv"), convert_options=types, block_bytes=MiB // 8))
    assert out.num_rows == 50_001 and out["b"][-1].as_py() == "unknown"


def test_csv_wrong_field_count_deep_in_a_file_names_its_line(tmp_path: Path) -> None:
    lines = ["a,b"] + [f"{i},{i}" for i in range(100_000)] + ["1,2,3"] + ["4,5"]
    (tmp_path / "bad.csv.gz").write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    source = CSVDatasource(str(tmp_path / "bad.csv.gz"), block_bytes=MiB // 4)
    with pytest.raises(FileFormatError, match=r"bad\.csv\.gz, row 100002: expected 2 fields, got 3"):
        read_all(source)


def test_csv_header_that_is_not_text_names_the_file_and_the_likely_cause(tmp_path: Path) -> None:
    """A compressed file without its codec's extension parses as "CSV" with a binary header
    about one time in three (gzip's second byte is 0x8b): that is a FileFormatError naming the
    file and ``arrow_open_stream_args``, never a UnicodeDecodeError from deep in pyarrow."""
    (tmp_path / "a.csv").write_bytes(b"\x1f\x8b\x08,x\n1,2\n")
    with pytest.raises(FileFormatError, match=r"a\.csv.*header row is not utf8 text.*arrow_open_stream_args"):
        read_all(CSVDatasource(str(tmp_path / "a.csv")))
    (tmp_path / "b.csv").write_bytes(b"caf\xc3\xa9,x\n1,2\n")  # UTF-8 names still read
    assert read_all(CSVDatasource(str(tmp_path / "b.csv"))).column_names == ["caf\u00e9", "x"]


def test_compressed_csv_streams_with_partitions_and_paths(tmp_path: Path) -> None:
    (tmp_path / "k=7").mkdir()
    buf = pa.BufferOutputStream()
    pacsv.write_csv(_table(0, 50_000), buf)
    (tmp_path / "k=7" / "a.csv.gz").write_bytes(gzip.compress(buf.getvalue().to_pybytes()))
    source = CSVDatasource(str(tmp_path), include_paths=True, block_bytes=MiB // 4)
    blocks = list(_blocks(source))
    assert len(blocks) > 2
    start = 0
    for block in blocks:
        start = _check_rows(block, start)
        assert block.column_names == ["id", "s", "k", "path"]
        assert pc.all(pc.equal(block["k"], "7")).as_py()
        assert block["path"][0].as_py() == str(tmp_path / "k=7" / "a.csv.gz")
    assert start == 50_000


def _write_jsonl(path: Path, rows: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_json_lines_types_come_from_the_whole_first_chunk(tmp_path: Path) -> None:
    rows = [{"a": None, "b": 1} for _ in range(20_000)] + [{"a": 5, "b": 2.5}]
    _write_jsonl(tmp_path / "f.jsonl", rows)
    source = JSONDatasource(str(tmp_path / "f.jsonl"), read_options=pajson.ReadOptions(block_size=4096))
    out = read_all(source)
    assert out.schema.field("a").type == pa.int64() and out.schema.field("b").type == pa.float64()
    assert out["a"][-1].as_py() == 5 and out.num_rows == 20_001


def test_json_lines_later_chunks_keep_the_first_chunks_types(tmp_path: Path) -> None:
    rows = [{"a": i, "b": "x"} for i in range(30_000)] + [{"b": "y"}, {"a": 1, "b": None}]
    _write_jsonl(tmp_path / "f.jsonl", rows)
    blocks = list(_blocks(JSONDatasource(str(tmp_path / "f.jsonl"), block_bytes=64 * 1024)))
    assert len(blocks) > 3 and all(b.schema == blocks[0].schema for b in blocks)
    out = pa.concat_tables(blocks)
    assert out.num_rows == 30_002 and out["a"][-2].as_py() is None and out["a"][-1].as_py() == 1


@pytest.mark.parametrize(
    ("last", "message", "column"),
    [
        ({"a": "text"}, r"changed from number to string", "a"),
        ({"a": 1.5}, r"column\(s\) \['a'\] hold values that do not fit", "a"),
        ({"a": 1, "c": True}, r"the field\(s\) \['c'\] appear only after the first", "c"),
    ],
)
def test_json_lines_later_misfits_name_the_column_and_the_fix(
    tmp_path: Path, last: dict[str, object], message: str, column: str
) -> None:
    _write_jsonl(tmp_path / "f.jsonl", [{"a": i} for i in range(30_000)] + [last])
    source = JSONDatasource(str(tmp_path / "f.jsonl"), block_bytes=64 * 1024)
    with pytest.raises(FileFormatError, match=message) as info:
        read_all(source)
    assert info.value.column == column and "explicit_schema" in str(info.value)
    if column != "a" or "changed" in message:
        assert info.value.row == 30_001


def test_json_bad_line_deep_in_a_file_names_its_row(tmp_path: Path) -> None:
    text = "".join(json.dumps({"a": i}) + "\n" for i in range(30_000)) + '{"a": nope}\n'
    (tmp_path / "bad.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    source = JSONDatasource(str(tmp_path / "bad.jsonl.gz"), block_bytes=64 * 1024)
    with pytest.raises(FileFormatError, match=r"bad\.jsonl\.gz, row 30001") as info:
        read_all(source)
    assert info.value.row == 30_001 and "in row" not in str(info.value)


def test_a_json_line_longer_than_pyarrows_block_is_read(tmp_path: Path) -> None:
    """pyarrow refuses a line longer than its block_size ("straddling object"); Ray's reader
    grows the block size, and so does this one, in the first chunk and in later ones."""
    rows = [{"a": i, "s": "x" * (200_000 if i in (3, 7000) else 5)} for i in range(10_000)]
    _write_jsonl(tmp_path / "f.jsonl", rows)
    source = JSONDatasource(str(tmp_path / "f.jsonl"), read_options=pajson.ReadOptions(block_size=65_536),
                            block_bytes=256 * 1024)
    out = read_all(source)
    assert out["a"].to_pylist() == list(range(10_000)) and [len(s) for s in out["s"].to_pylist()][3::6997] == [200_000] * 2


def test_json_nested_field_after_the_first_chunk_names_the_column(tmp_path: Path) -> None:
    _write_jsonl(tmp_path / "f.jsonl", [{"a": {"x": i}} for i in range(30_000)] + [{"a": {"x": 1, "y": 2}}])
    with pytest.raises(FileFormatError, match=r"column 'a': the objects in \['a'\] have fields .*explicit_schema"):
        read_all(JSONDatasource(str(tmp_path / "f.jsonl"), block_bytes=64 * 1024))


def test_json_objects_spanning_lines_are_read_in_pieces(tmp_path: Path) -> None:
    (tmp_path / "f.json").write_text("".join(json.dumps({"a": i, "b": [i]}, indent=2) + "\n" for i in range(5000)))
    options = pajson.ParseOptions(newlines_in_values=True)
    out = read_all(JSONDatasource(str(tmp_path / "f.json"), parse_options=options, block_bytes=4096))
    assert out["a"].to_pylist() == list(range(5000))


@pytest.mark.s3
@pytest.mark.s3_faults
@pytest.mark.timeout(60)
def test_s3_streams_are_retried_after_a_cut_body_and_exact(s3) -> None:
    buf = pa.BufferOutputStream()
    pacsv.write_csv(_table(0, 40_000), buf)
    s3.put("s/a.csv.gz", gzip.compress(buf.getvalue().to_pybytes()))
    s3.put("s/b.jsonl", "".join(json.dumps({"id": i, "s": f"name-{i}{PAD}"}) + "\n" for i in range(40_000)).encode())
    s3.fault("truncate", method="GET", path=r"/s/a", times=1)
    s3.fault("truncate", method="GET", path=r"/s/b", times=1)
    for source in (
        CSVDatasource("s3://test-bucket/s/a.csv.gz", block_bytes=MiB // 2),
        JSONDatasource("s3://test-bucket/s/b.jsonl", block_bytes=MiB // 2),
    ):
        blocks = list(_blocks(source))
        assert len(blocks) > 2
        start = 0
        for block in blocks:
            start = _check_rows(block, start)
        assert start == 40_000
    assert s3.hits() == [1, 1]


def test_a_big_csv_on_s3_is_read_as_byte_ranges_and_a_cut_range_is_retried(s3) -> None:
    """Ranged reads of one object: each task asks for its range (and a line beyond); a body cut
    short is read again, and every row comes once."""
    buf = pa.BufferOutputStream()
    pacsv.write_csv(_table(0, 1_000_000), buf)
    data = buf.getvalue().to_pybytes()
    assert len(data) > 55 * MiB
    s3.put("r/big.csv", data)
    source = CSVDatasource("s3://test-bucket/r/big.csv")
    tasks = _piece_tasks(source)
    assert len(tasks) >= 2
    s3.fault("truncate", method="GET", path=r"/r/big", times=1)
    start = 0
    for task in tasks:
        for block in cloudpickle.loads(cloudpickle.dumps(task))():
            start = _check_rows(block, start)
    assert start == 1_000_000
    assert s3.hits() == [1]


def test_coalesce_counts_what_rows_use_not_shared_buffers():
    """Small tables are joined up to the block size; slices of one big table (whose buffers
    each slice shares) count by their own rows, so they are joined too, not cut one by one."""
    from connectors.file_datasource import coalesce

    small = [pa.table({"x": list(range(i * 100, i * 100 + 100))}) for i in range(30)]  # 800 B each
    blocks = list(coalesce(small, 8_000))
    assert [b.num_rows for b in blocks] == [1000, 1000, 1000]
    assert pa.concat_tables(blocks).column("x").to_pylist() == list(range(3000))
    big = pa.table({"x": list(range(100_000))})  # 800 KB
    slices = [big.slice(i * 1000, 1000) for i in range(100)]  # 8 KB of rows each, 800 KB of buffers
    blocks = list(coalesce(slices, 80_000))
    assert [b.num_rows for b in blocks] == [10_000] * 10
    assert pa.concat_tables(blocks).column("x").to_pylist() == list(range(100_000))


def test_csv_ranges_parse_with_the_head_found_while_planning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file's start is parsed once, in the driver; its ranges do not read it again. A big
    file whose start does not parse is one task, which names the file."""
    import connectors.csv_format as csv_format

    _big_csv(tmp_path / "big.csv", 1_000_000)
    tasks = _piece_tasks(CSVDatasource(str(tmp_path / "big.csv")))
    assert len(tasks) >= 2

    def no_second_read(*args, **kwargs):
        raise AssertionError("a range read the file's start again")

    monkeypatch.setattr(csv_format, "_head_schema", no_second_read)
    read = 0
    for task in tasks:
        for block in cloudpickle.loads(cloudpickle.dumps(task))():
            read = _check_rows(block, read)
    assert read == 1_000_000
    monkeypatch.undo()
    (tmp_path / "bad.csv").write_text("a\n1,2,3\n" + (tmp_path / "big.csv").read_text())
    bad = _piece_tasks(CSVDatasource(str(tmp_path / "bad.csv")))
    assert len(bad) == 1
    with pytest.raises(FileFormatError, match=r"bad\.csv"):
        list(bad[0]())

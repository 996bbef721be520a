"""Parquet source and sink on local files: pushdown, splitting, counts, bad input, atomic commit."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from connector_testing import read_all

import dataflow
from connectors import io_stats, parquet_format
from connectors.base import TaskContext
from connectors.errors import FileFormatError, PathNotFoundError, SchemaMismatchError
from connectors.parquet_format import ParquetDatasink, ParquetDatasource
from dataflow.expression_parser import parse


def _table(n: int, start: int = 0) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(start, start + n), pa.int64()),
            "name": [f"n{i}" for i in range(start, start + n)],
        }
    )


def _write(table: pa.Table, dest: Path, **kwargs) -> ParquetDatasink:
    sink = ParquetDatasink(str(dest), **kwargs)
    sink.on_write_start()
    result = sink.write(iter([table]), TaskContext(0))
    sink.on_write_complete([result])
    return sink


def test_round_trip_through_sink_and_source(tmp_path: Path) -> None:
    sink = _write(_table(1000), tmp_path / "out", max_rows_per_file=300)
    assert len(sink.written_files) == 4
    assert sorted(os.listdir(tmp_path / "out")) == sorted(
        ["_SUCCESS", *(os.path.basename(f) for f in sink.written_files)]
    )
    source = ParquetDatasource(str(tmp_path / "out"))
    assert source.count_rows() == 1000
    assert source.schema() == pa.schema([("id", pa.int64()), ("name", pa.string())])
    out = read_all(source)
    assert sorted(out["id"].to_pylist()) == list(range(1000))


def test_hive_partitions_become_string_columns_and_filters_prune(tmp_path: Path) -> None:
    table = _table(600).append_column("year", pa.array([2020 + i % 3 for i in range(600)]))
    _write(table, tmp_path / "p", partition_cols=["year"])
    assert sorted(os.listdir(tmp_path / "p")) == ["_SUCCESS", "year=2020", "year=2021", "year=2022"]
    source = ParquetDatasource(str(tmp_path / "p"))
    assert source.schema().field("year").type == pa.string()  # as Ray Data: the folder's text
    io_stats.snapshot(reset=True)
    out = read_all(source.apply_filter(pc.field("year") == "2021"))
    assert out.num_rows == 200 and set(out["year"].to_pylist()) == {"2021"}
    stats = io_stats.snapshot()
    # the other years' files are dropped from the listing by their folder names, never opened
    assert stats["files_read"] == 1 and stats["files_skipped"] == 2 and stats["row_groups_read"] == 1


def test_a_filter_on_partition_values_prunes_folders_and_only_those(tmp_path: Path, mode: str) -> None:
    """A filter is decided from a folder's values where it can be (Arrow simplifies it with
    them); one that also depends on the rows, or that the values cannot decide, keeps the files."""
    table = pa.table({"id": pa.array(range(1200), pa.int64()), "year": [str(2020 + i % 4) for i in range(1200)],
                      "k": [None if i % 3 == 0 else f"k{i % 3}" for i in range(1200)]})
    for part in range(3):  # three files in each folder
        sink = ParquetDatasink(str(tmp_path / "p"), partition_cols=["year", "k"], mode="append")
        sink.on_write_start()
        sink.on_write_complete([sink.write(iter([table.slice(part * 400, 400)]), TaskContext(part))])
    rows = table.to_pylist()
    cases = [
        (pc.field("year") == "2021", lambda r: r["year"] == "2021", 3 * 3),
        ((pc.field("year") == "2021") & pc.field("k").is_null(), lambda r: r["year"] == "2021" and r["k"] is None, 3),
        ((pc.field("year") == "2021") | (pc.field("id") < 10), lambda r: r["year"] == "2021" or r["id"] < 10, 36),
        ((pc.field("year") == "2022") & (pc.field("id") > 600), lambda r: r["year"] == "2022" and r["id"] > 600, 9),
        (pc.field("k").isin(["k1"]), lambda r: r["k"] == "k1", 12),
    ]
    for expr, keep, files in cases:
        ds = dataflow.read_parquet(str(tmp_path / "p"), filter=expr)
        got = sorted(ds.take_all(), key=lambda r: r["id"])
        assert got == [r for r in rows if keep(r)], expr
        read = ds._last_handle.stats().operators[0].io.get("files_read", 0)
        assert read == files, (expr, read)
    with pytest.raises(TypeError, match="compare them with strings"):  # undecided: read, and explained
        dataflow.read_parquet(str(tmp_path / "p"), filter=pc.field("year") > 2021).take_all()


def test_filter_skips_row_groups_by_statistics(tmp_path: Path) -> None:
    pq.write_table(_table(10_000), tmp_path / "f.parquet", row_group_size=1000)
    source = ParquetDatasource(str(tmp_path / "f.parquet"), filter=pc.field("id") >= 9500, columns=["id"])
    io_stats.snapshot(reset=True)
    out = read_all(source)
    assert out.column_names == ["id"]
    assert out["id"].to_pylist() == list(range(9500, 10_000))
    stats = io_stats.snapshot()
    assert stats["row_groups_read"] == 1 and stats["row_groups_skipped"] == 9
    assert source.count_rows() is None  # a filter makes the footer count wrong


# row groups whose statistics leave something out: NaN (not in min/max) and signed zeros
_FLOAT_GROUPS = [[math.nan, 2.0], [math.nan], [math.nan, None], [0.0, -0.0], [-0.0], [0.0], [None, 1.0], [None],
                 [1.0, 3.0], [5.0, 6.0]]


def _float_groups(path: Path) -> pa.Table:
    tables = [pa.table({"f": pa.array(g, pa.float64()), "g": pa.array([i] * len(g), pa.int64())})
              for i, g in enumerate(_FLOAT_GROUPS)]
    with pq.ParquetWriter(path, tables[0].schema) as writer:
        for table in tables:  # one row group each
            writer.write_table(table)
    return pa.concat_tables(tables)


@pytest.mark.parametrize("text, arrow", [
    ("f != 2", pc.field("f") != 2),
    ("not (f == 2)", ~(pc.field("f") == 2)),
    ("not (f > 0)", ~(pc.field("f") > 0)),
    ("is_nan(f)", pc.is_nan(pc.field("f"))),
    ("f in [0]", pc.field("f").isin([0.0])),
    ("f in [0, 5]", pc.field("f").isin([0.0, 5.0])),
    ("f not in [2]", ~pc.field("f").isin([2.0])),
    ("not (f not in [0])", pc.field("f").isin([0.0])),
    ("g > 2 and f != 2", (pc.field("g") > 2) & (pc.field("f") != 2)),
    ("g < 1 or f != 2", (pc.field("g") < 1) | (pc.field("f") != 2)),
    ("not (f >= 1 or g < 1)", ~((pc.field("f") >= 1) | (pc.field("g") < 1))),
])
def test_float_filters_lose_no_rows_to_row_group_statistics(tmp_path: Path, mode: str, text, arrow) -> None:
    """Statistics leave NaN out, and pyarrow skipped the groups of [0.0, -0.0] for is_in([0]):
    a pushed filter returns the rows the same filter keeps in memory, as a string, as an
    expression, and as a pyarrow expression (``filter=``, ``filter(expr=)``), projected or not."""
    table = _float_groups(tmp_path / "f.parquet")

    def rows(t: pa.Table) -> list[str]:
        return sorted(repr(r) for r in t.to_pylist())

    want = rows(table.filter(arrow))
    for ds in (dataflow.read_parquet(str(tmp_path)).filter(expr=text),
               dataflow.read_parquet(str(tmp_path), filter=arrow),
               dataflow.read_parquet(str(tmp_path)).filter(expr=arrow)):
        assert rows(ds.to_arrow()) == want, ds
    projected = dataflow.read_parquet(str(tmp_path)).filter(expr=text).select_columns(["g"])
    assert sorted(r["g"] for r in projected.take_all()) == sorted(table.filter(arrow)["g"].to_pylist())
    assert dataflow.read_parquet(str(tmp_path)).filter(expr=text).count() == len(want)


def test_float_filters_still_prune_where_statistics_are_exact(tmp_path: Path, mode: str) -> None:
    """Comparisons that are false for NaN prune as before, and the part of a filter on other
    columns prunes whatever its float part does."""
    table = _float_groups(tmp_path / "f.parquet")
    # (groups 1 and 2 hold only NaN and null: no min or max, never skipped)
    for text, groups_read in (("f > 4", 3), ("f == 0", 5), ("f in [0, 5]", 6), ("g == 8 and f != 3", 1),
                              ("not (f != 6)", 3), ("f != 2", 10)):
        ds = dataflow.read_parquet(str(tmp_path)).filter(expr=text)
        got = sorted(repr(r) for r in ds.take_all())
        assert got == sorted(repr(r) for r in table.filter(parse(text).to_pyarrow()).to_pylist()), text
        assert ds._last_handle.stats().operators[0].io.get("row_groups_read") == groups_read, text


def test_projection_and_include_paths(tmp_path: Path) -> None:
    pq.write_table(_table(10), tmp_path / "a.parquet")
    source = ParquetDatasource(str(tmp_path), include_paths=True).apply_projection(["name", "path"])
    assert source.schema().names == ["name", "path"]
    out = read_all(source)
    assert out.column_names == ["name", "path"]
    assert set(out["path"].to_pylist()) == {str(tmp_path / "a.parquet")}
    with pytest.raises(ValueError, match=r"nope"):
        ParquetDatasource(str(tmp_path), columns=["nope"]).schema()
    # as Ray's: include_paths adds ``path`` to the columns asked for
    assert read_all(ParquetDatasource(str(tmp_path), columns=["name"], include_paths=True)).column_names == ["name", "path"]


def test_only_derived_columns_keep_every_row(tmp_path: Path) -> None:
    """A projection onto ``path`` (or ``row_hash``) alone reads no file column: the rows stay."""
    pq.write_table(_table(10), tmp_path / "a.parquet")
    out = read_all(ParquetDatasource(str(tmp_path), include_paths=True).apply_projection(["path"]))
    assert out.num_rows == 10 and out.column_names == ["path"]
    out = read_all(ParquetDatasource(str(tmp_path), include_row_hash=True).apply_projection(["row_hash"]))
    assert out.num_rows == 10 and out.column_names == ["row_hash"] and len(set(out["row_hash"].to_pylist())) == 10


def test_include_row_hash_is_deterministic_and_replaces_the_files_own(tmp_path: Path) -> None:
    """Ray's ``include_row_hash``: a uint64 per row from the file's path and the row's position,
    the same on every read with the same configuration, whatever the task order."""
    for name, table in (("big", _table(20_000)), ("small", _table(500, start=20_000))):
        table = table.append_column("row_hash", pa.array([7] * table.num_rows, pa.int64()))
        pq.write_table(table, tmp_path / f"{name}.parquet", row_group_size=1000)
    size = (tmp_path / "big.parquet").stat().st_size

    def hashes(**kwargs) -> dict[int, int]:
        source = ParquetDatasource(str(tmp_path), include_row_hash=True, target_task_bytes=size // 5, **kwargs)
        assert source.schema().field("row_hash").type == pa.uint64()
        out = read_all(source, 8)
        return dict(zip(out["id"].to_pylist(), out["row_hash"].to_pylist(), strict=True))

    first = hashes()
    assert sorted(first) == list(range(20_500)) and len(set(first.values())) == 20_500  # the file's 7s replaced
    assert hashes() == first
    filtered = hashes(filter=pc.field("id") >= 20_000)  # positions count the rows the read outputs
    assert sorted(filtered) == list(range(20_000, 20_500))
    assert ParquetDatasource(str(tmp_path)).schema().field("row_hash").type == pa.int64()  # not asked: the file's

    def engine_hashes() -> dict[int, int]:
        ds = dataflow.read_parquet(str(tmp_path), include_row_hash=True).select_columns(["id", "row_hash"])
        return {r["id"]: r["row_hash"] for r in ds.take_all()}

    through_engine = engine_hashes()  # the engine's own task sizes: its own, stable, hashes
    assert len(set(through_engine.values())) == 20_500 and engine_hashes() == through_engine


def test_skip_paths_leaves_files_out(tmp_path: Path) -> None:
    for i in range(3):
        pq.write_table(_table(10, start=10 * i), tmp_path / f"f{i}.parquet")
    ds = dataflow.read_parquet(str(tmp_path), skip_paths=str(tmp_path / "f1.parquet"))
    assert sorted(r["id"] for r in ds.take_all()) == list(range(10)) + list(range(20, 30))
    ds = dataflow.read_parquet(str(tmp_path), skip_paths=[str(tmp_path / "f0.parquet"), str(tmp_path / "gone.parquet")])
    assert ds.count() == 20
    with pytest.raises(TypeError, match="skip_paths"):
        dataflow.read_parquet(str(tmp_path), skip_paths=[3])


def test_big_file_is_split_by_row_groups_exactly_once(tmp_path: Path) -> None:
    pq.write_table(_table(20_000), tmp_path / "big.parquet", row_group_size=1000)
    size = (tmp_path / "big.parquet").stat().st_size
    source = ParquetDatasource(str(tmp_path / "big.parquet"), target_task_bytes=size // 5)
    tasks = list(source.get_read_tasks(8))
    assert len(tasks) >= 5
    out = read_all(source, 8)
    assert sorted(out["id"].to_pylist()) == list(range(20_000))  # every row group read exactly once


def test_many_small_files_are_coalesced_into_few_tasks(tmp_path: Path) -> None:
    for i in range(40):
        pq.write_table(_table(5, i * 5), tmp_path / f"part-{i:03d}.parquet")
    (tmp_path / "_SUCCESS").write_text("")
    (tmp_path / ".part-000.parquet.crc").write_text("x")
    source = ParquetDatasource(str(tmp_path))
    tasks = list(source.get_read_tasks(4))
    assert len(tasks) == 4
    assert sum(len(t.metadata.input_files) for t in tasks) == 40
    assert source.count_rows() == 200
    out = read_all(source)
    assert sorted(out["id"].to_pylist()) == list(range(200))
    assert out.num_rows == 200


def test_missing_path_fails_at_construction(tmp_path: Path) -> None:
    with pytest.raises(PathNotFoundError, match=r"nope.parquet") as info:
        ParquetDatasource(str(tmp_path / "nope.parquet"))
    assert isinstance(info.value, FileNotFoundError)


def test_empty_folder_fails_naming_the_folder(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not parquet")
    with pytest.raises(FileNotFoundError, match=r"empty.*no files to read"):
        ParquetDatasource(str(tmp_path / "empty"))


@pytest.mark.parametrize("whole_file", [True, False], ids=["read-whole", "mapped"])
@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupt_file_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str,
                                     whole_file: bool) -> None:
    if not whole_file:  # (a bigger local file is read from a mapping of it)
        monkeypatch.setattr(parquet_format, "WHOLE_FILE_BYTES", 0)
    pq.write_table(_table(100), tmp_path / "good.parquet")
    pq.write_table(_table(100), tmp_path / "bad.parquet")
    data = (tmp_path / "bad.parquet").read_bytes()
    broken = {"truncate": data[: len(data) // 2], "garbage": b"not a parquet file at all", "empty": b""}[
        damage
    ]
    (tmp_path / "bad.parquet").write_bytes(broken)
    source = ParquetDatasource(str(tmp_path), schema=_table(1).schema)
    with pytest.raises(FileFormatError, match=r"bad.parquet") as info:
        read_all(source)
    assert isinstance(info.value, ValueError)
    assert info.value.path == str(tmp_path / "bad.parquet")


@pytest.mark.parametrize("whole_file", [True, False], ids=["read-whole", "footer-and-pages"])
def test_flipped_byte_is_caught_by_page_checksums(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, whole_file: bool
) -> None:
    """A small file is parsed from one read of its bytes, a bigger one from its footer and page
    reads: both verify the page checksums."""
    if not whole_file:
        monkeypatch.setattr(parquet_format, "WHOLE_FILE_BYTES", 0)
    table = pa.table({"x": pa.array(range(5000), pa.int64())})
    _write(table, tmp_path / "out", compression="none")
    [name] = [n for n in os.listdir(tmp_path / "out") if n != "_SUCCESS"]
    path = tmp_path / "out" / name
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF  # inside the data page
    path.write_bytes(bytes(data))
    with pytest.raises(FileFormatError, match=name):
        read_all(ParquetDatasource(str(path)))


def test_a_bigger_local_file_is_read_from_a_mapping_let_go_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A local file past ``WHOLE_FILE_BYTES`` is decoded from a memory mapping of it (no copy of
    its pages into a buffer first), one mapping per file, each closed when its rows are read:
    the rows are those of the footer-and-page reads, and no mapping outlives the read."""
    rng = np.random.default_rng(5)
    table = pa.table({"id": pa.array(range(400_000), pa.int64()), "x": rng.random(400_000),
                      "name": [f"n{i}" for i in range(400_000)]})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=100_000, compression="none")
    pq.write_table(table.slice(0, 1000), tmp_path / "b.parquet")
    assert os.path.getsize(tmp_path / "a.parquet") > parquet_format.WHOLE_FILE_BYTES
    assert os.path.getsize(tmp_path / "b.parquet") <= parquet_format.WHOLE_FILE_BYTES
    mapped: list[pa.MemoryMappedFile] = []
    real_map = pa.memory_map

    def spy(path, *args, **kwargs):
        mapped.append(real_map(path, *args, **kwargs))
        return mapped[-1]

    monkeypatch.setattr(parquet_format.pa, "memory_map", spy)
    got = read_all(ParquetDatasource(str(tmp_path)))
    assert mapped and all(m.closed for m in mapped)  # (a.parquet: b.parquet is read whole)
    maps = Path("/proc/self/maps").read_text()
    assert str(tmp_path / "a.parquet") not in maps
    expected = pa.concat_tables([table, table.slice(0, 1000)])
    assert got.sort_by([("id", "ascending"), ("x", "ascending")]).equals(
        expected.sort_by([("id", "ascending"), ("x", "ascending")]))
    # the same rows through pre-buffered reads of a file system that is not the local one
    monkeypatch.setattr(parquet_format.pa, "memory_map", real_map)
    remote = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    via_handle = read_all(ParquetDatasource(["a.parquet"], filesystem=remote))
    assert via_handle.sort_by("id").equals(table)


def test_small_files_read_whole_give_the_rows_of_footer_and_page_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = pa.table({"id": pa.array(range(3000), pa.int64()), "name": [f"n{i}" for i in range(3000)]})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=700)
    pq.write_table(table.slice(0, 10), tmp_path / "b.parquet")
    assert os.path.getsize(tmp_path / "a.parquet") <= parquet_format.WHOLE_FILE_BYTES
    whole = read_all(ParquetDatasource(str(tmp_path), columns=["name", "id"]))
    monkeypatch.setattr(parquet_format, "WHOLE_FILE_BYTES", 0)
    paged = read_all(ParquetDatasource(str(tmp_path), columns=["name", "id"]))
    assert whole.equals(paged) and whole.num_rows == 3010
    assert whole.column_names == ["name", "id"]


def test_schema_mismatch_between_files_names_the_file_and_column(tmp_path: Path) -> None:
    pq.write_table(_table(10), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": ["x"] * 10, "name": ["y"] * 10}), tmp_path / "b.parquet")
    with pytest.raises(SchemaMismatchError, match=r"b.parquet.*'id' is string here but int64.*a.parquet") as info:
        read_all(ParquetDatasource(str(tmp_path)))
    assert info.value.column == "id"
    # an explicit schema reconciles compatible files
    pq.write_table(
        pa.table({"id": pa.array(range(10), pa.int32()), "name": ["y"] * 10}), tmp_path / "b.parquet"
    )
    out = read_all(ParquetDatasource(str(tmp_path), schema=_table(1).schema))
    assert out.num_rows == 20 and out.schema.field("id").type == pa.int64()
    # ... and one that does not cast is named
    with pytest.raises(SchemaMismatchError, match=r"parquet, column 'name'.*string here, which does not cast to struct<x: int64> in the schema given$"):
        read_all(ParquetDatasource(str(tmp_path), schema=pa.schema([("id", pa.int64()), ("name", pa.struct([("x", pa.int64())]))])))


def test_files_that_differ_are_read_as_their_unified_schema_as_in_ray(tmp_path: Path) -> None:
    """Ray 2.60 unifies the first 16 files' schemas (types promoted, a column some lack
    included) and reads every file as that: a column a file lacks is null."""
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int32())}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": pa.array([3], pa.int64()), "extra": ["x"]}), tmp_path / "b.parquet")
    pq.write_table(pa.table({"id": [4.5]}), tmp_path / "c.parquet")
    source = ParquetDatasource(str(tmp_path))
    assert source.schema() == pa.schema([("id", pa.float64()), ("extra", pa.string())])
    out = read_all(source).sort_by("id")
    assert out.to_pylist() == [{"id": 1.0, "extra": None}, {"id": 2.0, "extra": None},
                               {"id": 3.0, "extra": "x"}, {"id": 4.5, "extra": None}]
    assert read_all(ParquetDatasource(str(tmp_path), columns=["extra"])).column("extra").null_count == 3


def test_a_file_after_the_sampled_ones_with_more_columns_is_named(tmp_path: Path) -> None:
    """Past the files the schema was made from, Ray drops a file's extra columns without a
    word; here the read names the file and the column, and says how to keep or leave them."""
    count = parquet_format.SCHEMA_SAMPLE_FILES
    for i in range(count):
        pq.write_table(_table(3), tmp_path / f"part-{i:03d}.parquet")
    pq.write_table(pa.table({"id": [7]}), tmp_path / f"part-{count:03d}.parquet")  # lacks name: nulls
    assert read_all(ParquetDatasource(str(tmp_path))).column("name").null_count == 1
    pq.write_table(_table(3).append_column("new", pa.array([1, 2, 3])), tmp_path / f"part-{count + 1:03d}.parquet")
    with pytest.raises(SchemaMismatchError, match=rf"part-{count + 1:03d}.parquet.*\['new'\].*columns=.*schema=") as info:
        read_all(ParquetDatasource(str(tmp_path)))
    assert info.value.column == "new"
    assert read_all(ParquetDatasource(str(tmp_path), columns=["id"])).num_rows == 3 * count + 4
    wider = _table(1).schema.append(pa.field("new", pa.int64()))
    assert read_all(ParquetDatasource(str(tmp_path), schema=wider)).column("new").null_count == 3 * count + 1


def test_plain_reads_match_the_dataset_path_whatever_the_column_order(tmp_path: Path) -> None:
    """Without a filter or partitions, row groups are read straight from ``ParquetFile``: the
    columns come in the dataset's order (a file may store them in another), projected, with
    the dataset's schema, the same rows as Arrow's dataset reader gives."""
    first = pa.table({"id": pa.array(range(10), pa.int64()), "name": [f"n{i}" for i in range(10)],
                      "v": pa.array([i / 2 for i in range(10)])})
    pq.write_table(first, tmp_path / "a.parquet", row_group_size=3)
    reordered = first.select(["v", "name", "id"])
    pq.write_table(reordered, tmp_path / "b.parquet", row_group_size=4)
    tables = [t for task in ParquetDatasource(str(tmp_path)).get_read_tasks(4) for t in task()]
    assert all(t.schema == first.schema for t in tables)  # each block, not only their union
    out = pa.concat_tables(tables)
    assert out.sort_by("id").equals(pa.concat_tables([first, first]).sort_by("id"))
    projected = read_all(ParquetDatasource(str(tmp_path), columns=["v", "id"]))
    assert projected.column_names == ["v", "id"] and projected.num_rows == 20
    nullable = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string()),
                          pa.field("v", pa.float64())])
    typed = read_all(ParquetDatasource(str(tmp_path), schema=nullable))  # the dataset path casts
    assert typed.schema.field("id").nullable is False and typed.num_rows == 20
    assert read_all(ParquetDatasource(str(tmp_path), filter=pc.field("id") >= 5)).num_rows == 10


def test_a_projected_column_the_data_lacks_is_named(tmp_path: Path) -> None:
    pq.write_table(_table(10), tmp_path / "a.parquet")
    with pytest.raises(ValueError, match=r"\['nope'\] are not in the data; available: \['id', 'name'\]"):
        read_all(ParquetDatasource(str(tmp_path), columns=["id", "nope"]))


def test_partition_value_of_another_type_is_a_clear_error(tmp_path: Path) -> None:
    for value in ("1", "abc"):
        (tmp_path / f"k={value}").mkdir()
        pq.write_table(_table(3), tmp_path / f"k={value}" / "f.parquet")
    with pytest.raises(SchemaMismatchError, match=r"k=abc.*'abc'"):
        read_all(ParquetDatasource(str(tmp_path), partitioning=pa.schema([("k", pa.int64())])))
    out = read_all(ParquetDatasource(str(tmp_path)))
    assert sorted(set(out["k"].to_pylist())) == ["1", "abc"]


def test_failed_write_leaves_nothing_and_commit_is_atomic(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    sink = ParquetDatasink(str(dest))
    sink.on_write_start()
    first = sink.write(iter([_table(10)]), TaskContext(0))
    assert os.listdir(dest) == [os.path.basename(sink.staging_dir)]  # only the hidden staging folder
    with pytest.raises(FileNotFoundError):
        ParquetDatasource(str(dest))  # readers never see staged files

    def failing_blocks():
        yield _table(10)
        raise RuntimeError("task died")

    with pytest.raises(RuntimeError):
        sink.write(failing_blocks(), TaskContext(1))
    sink.on_write_failed(RuntimeError("task died"))
    assert not dest.exists()  # the job created the folder: it goes with the staging folder
    assert first.num_rows == 10


def test_retried_task_attempt_does_not_duplicate(tmp_path: Path) -> None:
    sink = ParquetDatasink(str(tmp_path / "out"))
    sink.on_write_start()
    sink.write(iter([_table(10)]), TaskContext(0, attempt=0))  # lost attempt: result never reported
    kept = sink.write(iter([_table(10)]), TaskContext(0, attempt=1))
    sink.on_write_complete([kept])
    assert sorted(os.listdir(tmp_path / "out")) == sorted(["_SUCCESS", os.path.basename(kept.files[0])])
    assert read_all(ParquetDatasource(str(tmp_path / "out"))).num_rows == 10


def test_sink_options_and_min_rows(tmp_path: Path) -> None:
    sink = ParquetDatasink(str(tmp_path / "o"), min_rows_per_file=50)
    assert sink.min_rows_per_write == 50
    with pytest.raises(ValueError, match=r"min_rows_per_file"):
        ParquetDatasink(str(tmp_path / "o"), min_rows_per_file=10, max_rows_per_file=5)
    sink = ParquetDatasink(str(tmp_path / "o"), partition_cols=["missing"])
    sink.on_write_start()
    with pytest.raises(ValueError, match=r"missing"):
        sink.write(iter([_table(3)]), TaskContext(0))
    sink.on_write_failed(ValueError())


def test_null_partition_values_round_trip(tmp_path: Path) -> None:
    table = pa.table({"x": [1, 2, 3], "k": ["a", None, "b/c"]})
    _write(table, tmp_path / "p", partition_cols=["k"])
    out = read_all(ParquetDatasource(str(tmp_path / "p")))
    assert sorted(zip(out["x"].to_pylist(), out["k"].to_pylist())) == [(1, "a"), (2, None), (3, "b/c")]


def test_user_filesystem_and_glob(tmp_path: Path) -> None:
    for i in range(3):
        (tmp_path / f"d{i}").mkdir()
        pq.write_table(_table(4, i * 4), tmp_path / f"d{i}" / "x.parquet")
    source = ParquetDatasource(f"{tmp_path}/d*/*.parquet", filesystem=pafs.LocalFileSystem())
    assert read_all(source).num_rows == 12
    expr = pads.field("id") < 2
    assert (
        read_all(ParquetDatasource([str(tmp_path / "d0"), str(tmp_path / "d1")], filter=expr)).num_rows == 2
    )


def test_stats_show_what_the_readers_did_in_every_mode(tmp_path: Path, mode: str) -> None:
    """The workers' I/O counters reach the driver: stats() shows the row groups a filter skipped."""
    pq.write_table(_table(10_000), tmp_path / "f.parquet", row_group_size=1000)
    ds = dataflow.read_parquet(str(tmp_path), filter=pc.field("id") >= 9500).map_batches(lambda b: b)
    assert ds.count() == 500
    text = ds.stats()
    assert "I/O: files read 1, bytes read " in text, text
    assert "row groups read 1, row groups skipped 9" in text, text


def test_partitioned_write_of_many_values_keeps_each_partitions_rows_in_order(tmp_path: Path) -> None:
    n = 6000
    table = pa.table({"id": pa.array(range(n), pa.int64()), "a": [i % 40 for i in range(n)],
                      "b": [None if i % 7 == 0 else f"b{i % 9}" for i in range(n)]})
    _write(table, tmp_path / "p", partition_cols=["a", "b"])
    folders = [f for f in (tmp_path / "p").glob("a=*/b=*")]
    assert len(folders) == len({(i % 40, None if i % 7 == 0 else i % 9) for i in range(n)})
    seen = []
    for folder in folders:
        (file,) = folder.glob("*.parquet")
        ids = pq.read_table(file).column("id").to_pylist()
        assert ids == sorted(ids)  # a partition's rows in the block's order
        a, b = folder.parent.name.split("=")[1], folder.name.split("=")[1]
        assert all(str(i % 40) == a and (("__HIVE_DEFAULT_PARTITION__" if i % 7 == 0 else f"b{i % 9}") == b) for i in ids)
        seen += ids
    assert sorted(seen) == list(range(n))


def test_partition_groups_with_more_combinations_than_an_int64_holds() -> None:
    """The grouping a partitioned write splits its blocks with (``grouped_rows``), on keys
    whose combinations outnumber an int64."""
    from engine.exchange import grouped_rows

    n = 1 << 16
    rng = np.random.default_rng(3)
    columns = {f"c{j}": pa.array(rng.permutation(n)) for j in range(4)}  # 2^64 combinations
    columns["c0"] = pa.array([i // 2 for i in range(n)])  # pairs of rows share c0 only
    table = pa.table(columns)
    grouped, keys, offsets = grouped_rows(table, list(columns))
    assert len(keys) == n and sorted(grouped.column("c1").to_pylist()) == list(range(n))
    for i, key in enumerate(keys):
        rows = grouped.slice(int(offsets[i]), int(offsets[i + 1] - offsets[i])).to_pylist()
        assert all(tuple(row[f"c{j}"] for j in range(4)) == key for row in rows)


def test_partition_columns_without_a_filter_match_the_fragment_reads(tmp_path: Path, mode: str) -> None:
    """Without a filter, files of hive folders are read straight from ``ParquetFile`` and their
    folder values added as columns: the same rows, columns, order and types as the dataset
    scanner gives (with a filter, which still reads through it)."""
    table = pa.table({"id": pa.array(range(300), pa.int64()), "year": [str(2020 + i % 3) for i in range(300)],
                      "k": [None if i % 5 == 0 else f"k{i % 2}" for i in range(300)]})
    _write(table, tmp_path / "p", partition_cols=["year", "k"])
    root = str(tmp_path / "p")

    def arrow(ds: dataflow.Dataset) -> pa.Table:
        return pa.concat_tables(list(ds.iter_batches(batch_size=None, batch_format="pyarrow")))

    everything = pc.field("id") >= 0  # the same rows through the fragment path
    for columns in (None, ["k", "id"], ["year"], ["k"], ["id", "year", "k"]):
        plain = arrow(dataflow.read_parquet(root, columns=columns))
        fragments = arrow(dataflow.read_parquet(root, columns=columns, filter=everything))
        assert plain.schema == fragments.schema, (columns, plain.schema, fragments.schema)
        key = [(c, "ascending") for c in plain.column_names]
        assert plain.sort_by(key).to_pylist() == fragments.sort_by(key).to_pylist(), columns
        assert plain.num_rows == 300
    typed = dataflow.read_parquet(root, partitioning=pa.schema([("year", pa.int32()), ("k", pa.string())]))
    rows = typed.take_all()
    assert sorted((r["id"], r["year"], r["k"]) for r in rows) == [
        (i, 2020 + i % 3, None if i % 5 == 0 else f"k{i % 2}") for i in range(300)]
    assert typed.schema().field("year").type == pa.int32()

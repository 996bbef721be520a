"""read_orc: stripes streamed as bounded blocks, projection pushed into the reader, files split
across tasks by stripes, counts and schema from the footers, errors naming the file."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.orc as orc
import pytest
from connector_testing import read_all

import dataflow
from connectors import file_datasource
from connectors.errors import FileFormatError, SchemaMismatchError
from connectors.orc_format import ORCDatasource
from dataflow.optimizer import optimize
from dataflow.plan import Read, walk

ROWS = 20_000


def _table(start: int = 0, rows: int = ROWS) -> pa.Table:
    ids = pa.array(range(start, start + rows), pa.int64())
    return pa.table({
        "id": ids,
        "name": pa.array([f"name-{i}" for i in range(start, start + rows)]),
        "score": pa.array([i / 8 for i in range(start, start + rows)], pa.float64()),
        "flag": pa.array([i % 3 == 0 for i in range(start, start + rows)]),
    })


def _write(path: Path, table: pa.Table, stripe_size: int = 32 << 10) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    orc.write_table(table, str(path), stripe_size=stripe_size)
    return str(path)


@pytest.fixture
def orc_file(tmp_path: Path) -> str:
    path = _write(tmp_path / "data.orc", _table())
    assert orc.ORCFile(path).nstripes > 4  # the tests below need several stripes
    return path


def test_read_orc_matches_pyarrow(orc_file: str, mode: str) -> None:
    ds = dataflow.read_orc(orc_file)
    assert ds.to_arrow().sort_by("id").equals(orc.read_table(orc_file))
    assert ds.count() == ROWS


def test_columns_are_pushed_into_the_reader_in_the_order_asked(orc_file: str, mode: str) -> None:
    out = dataflow.read_orc(orc_file, columns=["score", "id"]).to_arrow()
    assert out.column_names == ["score", "id"] and out.num_rows == ROWS
    ds = dataflow.read_orc(orc_file).select_columns(["name"])
    reads = [node for node in walk(optimize(ds._plan)) if isinstance(node, Read)]
    assert reads and reads[0].datasource._columns == ["name"]  # the reader decodes only that column
    assert ds.to_arrow().column_names == ["name"]


def test_stripes_stream_as_bounded_blocks(orc_file: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_datasource, "DEFAULT_BLOCK_BYTES", 64 << 10)
    (task,) = ORCDatasource(orc_file).get_read_tasks(1)
    stripe_rows = orc.ORCFile(orc_file).read_stripe(0).num_rows
    blocks = list(task())
    assert len(blocks) > 4
    assert max(b.num_rows for b in blocks) <= 2 * stripe_rows  # a block is one or two stripes, not the file
    assert pa.concat_tables(blocks).equals(orc.read_table(orc_file))


def test_a_big_file_is_split_by_stripes_and_every_row_read_once(orc_file: str) -> None:
    source = ORCDatasource(orc_file, target_task_bytes=Path(orc_file).stat().st_size // 4)
    tasks = list(source.get_read_tasks(8))
    assert len(tasks) >= 3
    ids = [i for task in tasks for block in task() for i in block["id"].to_pylist()]
    assert sorted(ids) == list(range(ROWS))


def test_hive_partitions_paths_and_projection(tmp_path: Path, mode: str) -> None:
    for part in (1, 2):
        _write(tmp_path / "ds" / f"part={part}" / "f.orc", _table(part * 1000, 100))
    root = str(tmp_path / "ds")
    ds = dataflow.read_orc(root, partitioning="hive", include_paths=True, columns=["id", "part", "path"])
    out = ds.to_arrow().sort_by("id")
    assert out.column_names == ["id", "part", "path"]
    assert [str(v) for v in out["part"].to_pylist()] == ["1"] * 100 + ["2"] * 100  # typed as the partitioning says
    assert out["path"][0].as_py().endswith("part=1/f.orc")
    assert ds.schema().names == ["id", "part", "path"]
    only_partitions = dataflow.read_orc(root, partitioning="hive", columns=["part"]).to_arrow()
    assert only_partitions.num_rows == 200 and only_partitions.column_names == ["part"]


def test_count_and_schema_come_from_footers(tmp_path: Path) -> None:
    for i in range(3):
        _write(tmp_path / f"f{i}.orc", _table(i * 100, 100))
    source = ORCDatasource(str(tmp_path))
    assert source.count_rows() == 300
    assert source.schema() == _table(0, 1).schema
    assert source.apply_projection(["flag"]).schema() == pa.schema([("flag", pa.bool_())])


def test_a_missing_column_names_the_file(orc_file: str) -> None:
    with pytest.raises(SchemaMismatchError, match=r"data\.orc.*no column 'nope'"):
        read_all(ORCDatasource(orc_file, columns=["id", "nope"]))


def test_a_corrupt_file_names_the_file(tmp_path: Path, mode: str) -> None:
    bad = tmp_path / "bad.orc"
    bad.write_bytes(b"ORC" + b"\x00" * 200)
    with pytest.raises(FileFormatError, match=r"bad\.orc"):
        ORCDatasource(str(bad)).schema()
    with pytest.raises(FileFormatError, match=r"bad\.orc"):
        dataflow.read_orc(str(bad)).to_arrow()


def test_write_orc_round_trips_with_writer_options(tmp_path: Path, mode: str) -> None:
    dest = tmp_path / "out"
    source = _table(0, 3000)
    dataflow.from_arrow(source).repartition(3).write_orc(
        str(dest), compression="zstd", stripe_size=1 << 16, arrow_orc_args_fn=lambda: {"compression": "snappy"}
    )
    files = sorted(dest.glob("*.orc"))
    assert len(files) == 3 and (dest / "_SUCCESS").exists()
    assert orc.ORCFile(str(files[0])).compression == "SNAPPY"  # the function's options win, as Ray
    assert dataflow.read_orc(str(dest)).to_arrow().sort_by("id").equals(source)


def test_write_orc_refuses_unknown_options(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"\['compresion'\] are not options of pyarrow.orc.write_table"):
        dataflow.range(3).write_orc(str(tmp_path / "x"), compresion="zstd")

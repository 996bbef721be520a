"""read_sql / write_sql on SQLite files and on a real PostgreSQL server.

The server (``postgres_server.py``) is started once per session by the ``postgres`` fixture in
a temporary folder and removed at the end; those tests are skipped, saying why, when the
PostgreSQL binaries or psycopg are missing.
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import logging
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from connector_testing import read_all
from postgres_server import MISSING_REASON, PostgresServer, find_binaries

import dataflow
from connectors import sql as sqlmod
from connectors.base import TaskContext
from connectors.sql import SQLDatasink, SQLDatasource, shard_predicate

ROWS = 1000


def _make_db(path: Path, rows: int = ROWS) -> str:
    """A table ``t(id, name, score, tag, grp)``: ``tag`` NULL on most rows, ``grp`` NULL on some."""
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, score REAL, tag TEXT, grp INTEGER)")
    conn.executemany(
        "INSERT INTO t VALUES (?, ?, ?, ?, ?)",
        [(i, f"name-{i}", i / 4, "x" if i % 7 == 0 else None, None if i % 5 == 0 else i % 3) for i in range(rows)],
    )
    conn.commit()
    conn.close()
    return str(path)


@pytest.fixture
def db(tmp_path: Path) -> str:
    return _make_db(tmp_path / "t.db")


def _factory(path: str) -> Any:
    return functools.partial(sqlite3.connect, path)


def _sorted_rows(table: pa.Table, key: str = "id") -> list[dict[str, Any]]:
    return sorted(table.to_pylist(), key=lambda row: (row[key] is None, row[key]))


# ----- SQLite ---------------------------------------------------------------------------


def test_read_sql_streams_typed_columns(db: str, mode: str) -> None:
    out = dataflow.read_sql("SELECT * FROM t ORDER BY id", _factory(db)).to_arrow()
    assert out.schema == pa.schema(
        [("id", pa.int64()), ("name", pa.string()), ("score", pa.float64()), ("tag", pa.string()), ("grp", pa.int64())]
    )
    assert out.num_rows == ROWS
    assert out.slice(0, 2).to_pylist() == [
        {"id": 0, "name": "name-0", "score": 0.0, "tag": "x", "grp": None},
        {"id": 1, "name": "name-1", "score": 0.25, "tag": None, "grp": 1},
    ]


@pytest.mark.parametrize(
    "keys",
    [["id"], ["name"], ["grp"], ["name", "grp"]],
    ids=["integer-key", "text-key-md5", "integer-key-with-nulls", "two-keys"],
)
def test_sharded_read_returns_exactly_the_unsharded_rows(db: str, mode: str, keys: list[str]) -> None:
    whole = dataflow.read_sql("SELECT * FROM t", _factory(db)).to_arrow()
    sharded = dataflow.read_sql("SELECT * FROM t", _factory(db), shard_keys=keys, override_num_blocks=4)
    assert _sorted_rows(sharded.to_arrow()) == _sorted_rows(whole)
    assert sharded.count() == ROWS


def test_each_row_is_in_exactly_one_shard(db: str) -> None:
    source = SQLDatasource("SELECT * FROM t", _factory(db), shard_keys=["name", "grp"], num_shards=3)
    tasks = source.get_read_tasks(200)
    assert len(tasks) == 3
    seen: list[int] = []
    sizes = []
    for task in tasks:
        ids = [i for table in task() for i in table["id"].to_pylist()]
        sizes.append(len(ids))
        seen.extend(ids)
    assert sorted(seen) == list(range(ROWS))
    assert min(sizes) > ROWS / 3 * 0.7, f"shards far from even: {sizes}"


def test_shards_are_capped_by_rows_and_one_key_shards_natively(tmp_path: Path) -> None:
    path = _make_db(tmp_path / "small.db", rows=120)
    source = SQLDatasource("SELECT * FROM t", _factory(path), shard_keys=["id"], num_shards=10)
    tasks = source.get_read_tasks(10)
    assert len(tasks) == 3  # at least 50 rows per shard, as Ray
    queries = [task.read_fn.args[1] for task in tasks]  # type: ignore[attr-defined]
    assert queries[2].endswith("WHERE COALESCE((ABS(id)) % 3, 0) = 2")  # integers: no hash call per row
    assert "dataflow_md5(name, grp)" in shard_predicate("sqlite", ["name", "grp"], "MD5", 3, 0)
    assert len(SQLDatasource("SELECT * FROM t", _factory(path)).get_read_tasks(10)) == 1


def test_unsupported_shard_hash_falls_back_to_one_task(db: str, caplog: pytest.LogCaptureFixture) -> None:
    source = SQLDatasource("SELECT * FROM t", _factory(db), shard_keys=["name"], shard_hash_fn="NO_SUCH_HASH", num_shards=4)
    with caplog.at_level(logging.WARNING, logger="connectors.sql"):
        tasks = source.get_read_tasks(4)
    assert len(tasks) == 1
    assert "reading in one task" in caplog.text
    assert read_all(source).num_rows == ROWS


def test_sql_params_are_bound_in_every_query(db: str, mode: str) -> None:
    """Ray's ``sql_params``: bound to the placeholders of the query, in its count, its shard
    probe and each shard's query too."""
    query = "SELECT * FROM t WHERE id >= ? AND grp = ?"
    whole = dataflow.read_sql(query, _factory(db), sql_params=(100, 1)).to_arrow()
    expected = dataflow.read_sql("SELECT * FROM t WHERE id >= 100 AND grp = 1", _factory(db)).to_arrow()
    assert whole.num_rows == expected.num_rows > 0 and _sorted_rows(whole) == _sorted_rows(expected)
    sharded = dataflow.read_sql(query, _factory(db), sql_params=(100, 1), shard_keys=["id"], override_num_blocks=3)
    assert sharded.count() == expected.num_rows and _sorted_rows(sharded.to_arrow()) == _sorted_rows(expected)
    named = dataflow.read_sql("SELECT * FROM t WHERE grp = :g", _factory(db), sql_params={"g": 1})
    assert named.count() == len([r for r in _sorted_rows(read_all(SQLDatasource("SELECT * FROM t", _factory(db))))
                                 if r["grp"] == 1])
    with pytest.raises(Exception, match=r"binding|parameter"):
        dataflow.read_sql(query, _factory(db)).take_all()  # placeholders and no params: the driver says


def test_bad_sql_fails_naming_the_query(db: str, mode: str) -> None:
    query = "SELECT * FROM no_such_table"
    with pytest.raises(sqlite3.OperationalError, match=r"no such table.*in the query: SELECT \* FROM no_such_table"):
        dataflow.read_sql(query, _factory(db)).to_arrow()
    # sharded: the driver's count of the query fails first, before any task
    with pytest.raises(sqlite3.OperationalError, match=r"no_such_table"):
        dataflow.read_sql(query, _factory(db), shard_keys=["id"], override_num_blocks=2).to_arrow()


def test_empty_result_keeps_the_columns(db: str, mode: str) -> None:
    ds = dataflow.read_sql("SELECT id, name FROM t WHERE id < 0", _factory(db))
    out = ds.to_arrow()
    assert out.num_rows == 0 and out.column_names == ["id", "name"]


class _FakeCursor:
    """A DB-API cursor over rows in memory that records what ``fetchmany`` was asked for."""

    def __init__(self, rows: list[tuple[Any, ...]], names: list[str]) -> None:
        self._rows = rows
        self._at = 0
        self.description = [(name, None, None, None, None, None, None) for name in names]
        self.asked: list[int] = []

    def fetchmany(self, size: int) -> list[tuple[Any, ...]]:
        self.asked.append(size)
        rows = self._rows[self._at : self._at + size]
        self._at += len(rows)
        return rows


def test_rows_stream_into_bounded_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlmod, "FETCH_BYTES", 64 << 10)
    monkeypatch.setattr(sqlmod, "BLOCK_BYTES", 256 << 10)
    rows = [(i, f"value-{i:08d}", None if i < 5000 else i * 0.5) for i in range(60_000)]
    cursor = _FakeCursor(rows, ["id", "text", "late"])
    blocks = list(sqlmod._blocks(cursor, "sqlite", "SELECT ..."))
    assert sum(b.num_rows for b in blocks) == 60_000
    assert len(blocks) > 5
    assert max(b.nbytes for b in blocks) <= (256 << 10) + (64 << 10)  # a block, plus at most one fetch
    assert max(cursor.asked[1:]) < 10_000  # fetches sized from the bytes per row, not unbounded
    whole = pa.concat_tables(blocks, promote_options="default")  # NULL-only first blocks, then float
    assert whole.schema.field("late").type == pa.float64()
    assert whole["id"].to_pylist() == list(range(60_000))


def test_undeclared_decimals_keep_their_scale_and_grow_in_precision() -> None:
    rows = [(decimal.Decimal("1.25"),)] * 1024 + [(decimal.Decimal("123456789.5"),)]
    blocks = list(sqlmod._blocks(_FakeCursor(rows, ["d"]), "generic", "SELECT d FROM t"))
    assert {b.schema.field("d").type for b in blocks} == {pa.decimal128(38, 2)}
    assert pa.concat_tables(blocks)["d"].to_pylist()[-1] == decimal.Decimal("123456789.50")


def test_a_value_of_another_type_names_the_column_and_the_query() -> None:
    cursor = _FakeCursor([(1,)] * 1024 + [("one",)], ["n"])
    with pytest.raises(TypeError, match=r"column 'n' is int64.*rows 1024 to 1024 hold str.*CAST\(n AS .*in the query: SELECT n FROM t"):
        list(sqlmod._blocks(cursor, "sqlite", "SELECT n FROM t"))
    cursor = _FakeCursor([(1,), ("one",)], ["n"])
    with pytest.raises(TypeError, match=r"column 'n' has values of several types: rows 0 to 1 hold int, str"):
        list(sqlmod._blocks(cursor, "sqlite", "SELECT n FROM t"))


def _new_db(path: Path, ddl: str) -> str:
    conn = sqlite3.connect(path)
    conn.execute(ddl)
    conn.commit()
    conn.close()
    return str(path)


def test_write_sql_inserts_every_row(tmp_path: Path, mode: str) -> None:
    path = _new_db(tmp_path / "out.db", "CREATE TABLE out (id INTEGER, name TEXT, score REAL)")
    ds = dataflow.range(500, override_num_blocks=4).map(lambda r: {"id": r["id"], "name": f"n{r['id']}", "score": r["id"] / 2})
    ds.write_sql("INSERT INTO out VALUES (?, ?, ?)", _factory(path))
    back = sqlite3.connect(path).execute("SELECT id, name, score FROM out ORDER BY id").fetchall()
    assert back == [(i, f"n{i}", i / 2) for i in range(500)]


def test_write_sql_failure_rolls_back_the_task_and_names_the_statement(tmp_path: Path, mode: str) -> None:
    path = _new_db(tmp_path / "out.db", "CREATE TABLE out (id INTEGER PRIMARY KEY)")
    ds = dataflow.from_items([{"id": 1}, {"id": 2}, {"id": 2}], override_num_blocks=1)  # one task, one transaction
    with pytest.raises(sqlite3.IntegrityError, match=r"UNIQUE.*in the statement: INSERT INTO out VALUES \(\?\)"):
        ds.write_sql("INSERT INTO out VALUES (?)", _factory(path))
    assert sqlite3.connect(path).execute("SELECT COUNT(*) FROM out").fetchone() == (0,)


def test_sink_and_source_check_their_arguments(db: str) -> None:
    with pytest.raises(ValueError, match="sql must be"):
        SQLDatasource("  ;", _factory(db))
    with pytest.raises(TypeError, match="connection_factory"):
        SQLDatasource("SELECT 1", "sqlite:///x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shard_hash_fn"):
        SQLDatasource("SELECT 1", _factory(db), shard_keys=["id"], shard_hash_fn="md5(x); DROP TABLE t")
    with pytest.raises(TypeError, match="DB-API 2"):
        SQLDatasink("INSERT INTO t VALUES (?)", lambda: object()).write([], TaskContext(0))


# ----- PostgreSQL -------------------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL server for the session (initdb into a temporary folder, removed after)."""
    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -e '.[sql]')")
    bin_dir = find_binaries()
    if bin_dir is None:
        pytest.skip(MISSING_REASON)
    server = PostgresServer(bin_dir).start()
    yield server
    server.stop()


def _pg_factory(server: PostgresServer, **kwargs: Any) -> Any:
    import psycopg

    return functools.partial(psycopg.connect, server.conninfo, **kwargs)


@pytest.fixture
def pg_table(postgres: PostgresServer) -> Iterator[str]:
    """Table ``items`` of many types, ``ROWS`` rows, dropped after the test."""
    import psycopg

    with psycopg.connect(postgres.conninfo, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS items")
        conn.execute(
            "CREATE TABLE items (id int4 PRIMARY KEY, big int8, name text, price numeric(10, 2), "
            "ok boolean, at timestamptz, day date, uid uuid, ratio float8, note varchar(20))"
        )
        base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO items VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                [
                    (i, i * 10_000_000_000, f"item-{i}", decimal.Decimal(i) / 4, i % 2 == 0,
                     base + dt.timedelta(minutes=i), dt.date(2026, 1, 1) + dt.timedelta(days=i % 30),
                     uuid.UUID(int=i), None if i % 3 == 0 else i / 3, None if i % 4 else f"n{i}")
                    for i in range(ROWS)
                ],
            )
    yield "items"
    with psycopg.connect(postgres.conninfo, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS items")


def test_postgres_read_maps_column_types(postgres: PostgresServer, pg_table: str, mode: str) -> None:
    out = dataflow.read_sql("SELECT * FROM items ORDER BY id", _pg_factory(postgres)).to_arrow()
    assert out.schema == pa.schema([
        ("id", pa.int32()), ("big", pa.int64()), ("name", pa.string()), ("price", pa.decimal128(10, 2)),
        ("ok", pa.bool_()), ("at", pa.timestamp("us", tz="UTC")), ("day", pa.date32()), ("uid", pa.string()),
        ("ratio", pa.float64()), ("note", pa.string()),
    ])
    row = out.slice(5, 1).to_pylist()[0]
    assert row["price"] == decimal.Decimal("1.25") and row["uid"] == str(uuid.UUID(int=5))
    assert row["at"] == dt.datetime(2026, 1, 1, 0, 5, tzinfo=dt.UTC)
    assert out.num_rows == ROWS and out["note"].null_count == ROWS - ROWS // 4


@pytest.mark.parametrize(
    ("keys", "hash_fn"),
    [(["id"], "MD5"), (["name"], "MD5"), (["name", "note"], "MD5"), (["name"], "hash")],
    ids=["integer-key", "md5", "two-keys-with-nulls", "hashtext"],
)
def test_postgres_sharded_read_equals_unsharded(
    postgres: PostgresServer, pg_table: str, mode: str, keys: list[str], hash_fn: str
) -> None:
    factory = _pg_factory(postgres)
    whole = dataflow.read_sql("SELECT id, name, note FROM items", factory).to_arrow()
    source = SQLDatasource("SELECT id, name, note FROM items", factory, shard_keys=keys, shard_hash_fn=hash_fn, num_shards=3)
    assert len(source.get_read_tasks(3)) == 3
    sharded = dataflow.read_sql(
        "SELECT id, name, note FROM items", factory, shard_keys=keys, shard_hash_fn=hash_fn, override_num_blocks=3
    ).to_arrow()
    assert _sorted_rows(sharded) == _sorted_rows(whole)


def test_postgres_autocommit_connection_and_bad_sql(postgres: PostgresServer, pg_table: str, mode: str) -> None:
    import psycopg

    factory = _pg_factory(postgres, autocommit=True)  # the server-side cursor is then WITH HOLD
    assert dataflow.read_sql("SELECT id FROM items", factory).count() == ROWS
    assert dataflow.read_sql("SELECT id FROM items WHERE id < 10", factory).to_arrow().num_rows == 10
    # sql_params in psycopg's style, through the server-side cursor and the shard queries
    bound = dataflow.read_sql("SELECT id, name FROM items WHERE id < %s", factory, sql_params=(40,),
                              shard_keys=["id"], override_num_blocks=2)
    assert sorted(bound.to_arrow()["id"].to_pylist()) == list(range(40))
    with pytest.raises(psycopg.errors.UndefinedTable, match=r"in the query: SELECT \* FROM missing_table"):
        dataflow.read_sql("SELECT * FROM missing_table", factory).to_arrow()


def test_postgres_write_sql(postgres: PostgresServer, mode: str) -> None:
    import psycopg

    with psycopg.connect(postgres.conninfo, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS written")
        conn.execute("CREATE TABLE written (id int8, name text)")
    ds = dataflow.range(300, override_num_blocks=3).map(lambda r: {"id": r["id"], "name": f"w{r['id']}"})
    ds.write_sql("INSERT INTO written VALUES (%s, %s)", _pg_factory(postgres))
    with psycopg.connect(postgres.conninfo) as conn:
        assert conn.execute("SELECT COUNT(*), SUM(id) FROM written").fetchone() == (300, sum(range(300)))
        conn.execute("DROP TABLE written")

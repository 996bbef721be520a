"""SQL databases through any DB-API 2 (PEP 249) connection: ``read_sql`` and ``write_sql``.

``connection_factory`` is a picklable function of no arguments returning a new connection
(``lambda: sqlite3.connect(path)``, ``lambda: psycopg.connect(dsn)``); each task calls it on
its worker, so connections never cross processes.

Reading (``SQLDatasource``), as Ray Data's ``read_sql``:

* without ``shard_keys`` one read task runs the query;
* with ``shard_keys`` the driver counts the rows (``SELECT COUNT(*) FROM (<query>)``, which
  also fails early, naming the query, when it is wrong), then ``N = min(parallelism,
  rows / MIN_ROWS_PER_READ_TASK)`` tasks each run ``SELECT * FROM (<query>) AS dataflow_q WHERE
  <shard of the keys> = i``. The shard is a hash of the keys modulo ``N`` (``shard_predicate``),
  in the database's own SQL: SQLite gets a registered ``dataflow_md5`` function, PostgreSQL
  ``md5`` (or ``hashtext`` for ``shard_hash_fn="hash"``), other databases Ray's
  ``MOD(ABS(<fn>(<keys>)), N)``. With the default ``"MD5"`` and one integer key column the key
  itself is used (``abs(key) mod N``: no hashing, evaluated natively, so a SQLite shard scan
  costs no Python call per row; keys that are all multiples of ``N`` would land in one shard,
  pass another ``shard_hash_fn`` then). A NULL key goes to shard 0, so every row is in exactly
  one shard and the shards together return the rows of the unsharded query, provided the query
  is deterministic (no ``LIMIT`` without ``ORDER BY``, no ``random()``). If the database
  rejects the shard expression, one task reads everything, as in Ray, with a logged warning.

Each task streams its rows: ``fetchmany`` of ``FETCH_BYTES`` worth of rows (1,024 rows first,
then sized from the bytes per row seen, ``MAX_FETCH_ROWS`` at most), each fetch turned into one
Arrow record batch column by column, batches gathered into blocks of at most ``BLOCK_BYTES``. Memory holds one block and one
fetch, whatever the result size. PostgreSQL (psycopg, psycopg2) is read through a server-side
cursor: a plain one loads the whole result into the client on ``execute``.

Column types come from ``cursor.description`` where the driver gives them (PostgreSQL's type
OIDs: ``int4`` is ``int32``, ``numeric(p, s)`` ``decimal128(p, s)``, ``timestamptz``
``timestamp[us, UTC]``, ``uuid`` a string...) and otherwise from the values of the first fetch
that has a non-null one (SQLite), then stay fixed, so every block has the same schema. A value
that does not fit its column's type (SQLite's per-value typing allows it) fails naming the
column and the query, and saying how to cast it.

Writing (``SQLDatasink``), as Ray Data's ``write_sql``: each write task opens one connection,
runs ``cursor.executemany(sql, rows)`` per ``ROWS_PER_EXECUTE`` rows of its blocks, and commits
once at its end (rolling back on error): a task's rows appear all or none, tasks commit
independently. Errors from the database name the statement (or query) and keep their class, so
``except sqlite3.OperationalError`` still catches them.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import logging
import math
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from connectors.base import Block, BlockMetadata, Datasink, Datasource, ReadTask, TaskContext

logger = logging.getLogger(__name__)

MiB = 1 << 20
MIN_ROWS_PER_READ_TASK = 50
"""As Ray: fewer rows than this per shard are not worth a task (and a scan of the query)."""
FIRST_FETCH_ROWS = 1024
FETCH_BYTES = 1 * MiB
"""Arrow bytes one ``fetchmany`` aims at, once the bytes per row are known."""
MAX_FETCH_ROWS = 10_000
"""Larger fetches are slower, not faster: 100,000 small rows at a time cost 30% more than 10,000
(SQLite, 4 columns), the Python tuples of a fetch no longer fitting in the CPU caches."""
BLOCK_BYTES = 64 * MiB
ROWS_PER_EXECUTE = 10_000
"""Rows handed to one ``executemany`` call when writing."""
ALIAS = "dataflow_q"
"""The alias of the user's query when it is wrapped (counted or sharded)."""

ConnectionFactory = Callable[[], Any]

# PostgreSQL type OIDs -> Arrow types (psycopg and psycopg2 report OIDs as ``type_code``)
_PG_TYPES: dict[int, pa.DataType] = {
    16: pa.bool_(),
    17: pa.binary(),
    18: pa.string(),
    19: pa.string(),
    20: pa.int64(),
    21: pa.int16(),
    23: pa.int32(),
    25: pa.string(),
    26: pa.int64(),
    700: pa.float32(),
    701: pa.float64(),
    1042: pa.string(),
    1043: pa.string(),
    1082: pa.date32(),
    1083: pa.time64("us"),
    1114: pa.timestamp("us"),
    1184: pa.timestamp("us", tz="UTC"),
    1186: pa.duration("us"),
    2950: pa.string(),
}
_PG_INTEGERS = frozenset({20, 21, 23})
_PG_NUMERIC = 1700


def dialect_of(connection: Any) -> str:
    """``"sqlite"``, ``"postgresql"`` or ``"generic"``, from the connection's module."""
    module = type(connection).__module__.split(".")[0]
    if module == "sqlite3":
        return "sqlite"
    if module in ("psycopg", "psycopg2"):
        return "postgresql"
    return "generic"


def clean_query(sql: str) -> str:
    """``sql`` without surrounding blanks and trailing semicolons (it is wrapped in a subquery)."""
    return sql.strip().rstrip(";").rstrip()


def shard_predicate(
    dialect: str, keys: Sequence[str], hash_fn: str, num_shards: int, shard: int, *, integer_key: bool = False
) -> str:
    """The SQL condition selecting shard ``shard`` of ``num_shards`` by ``keys``.

    Every row satisfies it for exactly one ``shard``: NULL hashes count as 0.
    """
    fn = hash_fn.lower()
    if integer_key:
        value = f"ABS({keys[0]})"
    elif dialect == "sqlite" and fn == "md5":
        value = f"dataflow_md5({', '.join(keys)})"
    elif dialect == "postgresql" and fn in ("md5", "hash", "hashtext"):
        text = f"CAST({keys[0]} AS text)" if len(keys) == 1 else f"concat_ws('|', {', '.join(keys)})"
        if fn == "md5":
            value = f"CAST(CAST('x' || substr(md5({text}), 1, 8) AS bit(32)) AS bigint)"
        else:
            value = f"ABS(CAST(hashtext({text}) AS bigint))"
    else:  # Ray Data's expression
        joined = keys[0] if len(keys) == 1 else f"CONCAT({', '.join(keys)})"
        value = f"ABS({hash_fn}({joined}))"
    modulo = f"({value}) % {num_shards}" if dialect == "sqlite" else f"MOD({value}, {num_shards})"
    return f"COALESCE({modulo}, 0) = {shard}"


def _md5_shard_hash(*values: Any) -> int:
    """``dataflow_md5`` for SQLite: 63 bits of the MD5 of the keys' text (non-negative)."""
    digest = hashlib.md5(usedforsecurity=False)
    for value in values:
        digest.update(value if isinstance(value, bytes) else str(value).encode())
        digest.update(b"\x1f")
    return int.from_bytes(digest.digest()[:8], "big") >> 1


def connect(connection_factory: ConnectionFactory) -> Any:
    """A new connection from ``connection_factory``, checked for the DB-API methods used here."""
    connection = connection_factory()
    _import_module_of(type(connection))
    for attr in ("cursor", "commit", "close"):
        if not hasattr(connection, attr):
            msg = (
                f"connection_factory returned a {type(connection).__name__} without {attr!r}: it must return a "
                "DB-API 2 (PEP 249) connection, e.g. lambda: sqlite3.connect(path)"
            )
            raise TypeError(msg)
    if dialect_of(connection) == "sqlite":
        connection.create_function("dataflow_md5", -1, _md5_shard_hash, deterministic=True)
    return connection


def _shorten(sql: str, limit: int = 400) -> str:
    flat = " ".join(sql.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _import_module_of(cls: type) -> None:
    """Import the module ``cls`` says it is from, so pickling refers to it by name.

    sqlite3's classes live in ``_sqlite3`` but name ``sqlite3``; a worker that unpickled only
    ``_sqlite3.connect`` has no ``sqlite3`` module, and its errors would be pickled by value,
    arriving on the driver as copies that ``except sqlite3.OperationalError`` does not catch.
    """
    try:
        importlib.import_module(cls.__module__)
    except ImportError:  # a class from a module that cannot be imported: pickled as it can be
        logger.debug("cannot import %s", cls.__module__)


def naming_query(exc: Exception, sql: str, what: str = "query") -> Exception:
    """``exc`` restated with ``sql`` in its message, of the same class when it can be rebuilt."""
    _import_module_of(type(exc))
    message = f"{exc} (in the {what}: {_shorten(sql)})"
    try:
        named = type(exc)(message)
    except Exception:  # a class that wants other arguments: keep it, with a note
        exc.add_note(f"the {what}: {_shorten(sql)}")
        return exc
    return named


def execute(cursor: Any, sql: str, what: str = "query", params: Any = None) -> None:
    """``cursor.execute(sql)`` (with ``params`` bound, when given); a failure names ``sql``."""
    try:
        if params is None:
            cursor.execute(sql)
        else:
            cursor.execute(sql, params)
    except Exception as exc:
        raise naming_query(exc, sql, what) from exc


def _close(thing: Any) -> None:
    try:
        thing.close()
    except Exception:  # closing after an error: the error matters, not the close
        logger.debug("closing %r failed", thing, exc_info=True)


class SQLDatasource(Datasource):
    """The rows of a SQL query, over any DB-API 2 connection; see the module docstring.

    ``num_shards`` fixes the number of shards (else the ``parallelism`` the engine asks for);
    ``shard_keys``/``shard_hash_fn`` as Ray Data's ``read_sql``.
    """

    sizes_own_tasks = True

    def __init__(
        self,
        sql: str,
        connection_factory: ConnectionFactory,
        *,
        shard_keys: Sequence[str] | None = None,
        shard_hash_fn: str = "MD5",
        num_shards: int | None = None,
        sql_params: Any = None,
    ) -> None:
        if not isinstance(sql, str) or not clean_query(sql):
            raise ValueError(f"sql must be a non-empty query string, got {sql!r}")
        if not callable(connection_factory):
            msg = f"connection_factory must be a function returning a DB-API connection, got {type(connection_factory).__name__}"
            raise TypeError(msg)
        if isinstance(shard_keys, str):
            shard_keys = [shard_keys]
        if shard_keys is not None and (not shard_keys or not all(isinstance(k, str) and k for k in shard_keys)):
            raise ValueError(f"shard_keys must be a non-empty list of column names, got {shard_keys!r}")
        if not isinstance(shard_hash_fn, str) or not shard_hash_fn.replace("_", "").isalnum():
            raise ValueError(f"shard_hash_fn must be the name of a SQL function such as 'MD5', got {shard_hash_fn!r}")
        if num_shards is not None and num_shards < 1:
            raise ValueError(f"the number of shards must be at least 1, got {num_shards}")
        self.sql = clean_query(sql)
        self.connection_factory = connection_factory
        self.shard_keys = list(shard_keys) if shard_keys else None
        self.shard_hash_fn = shard_hash_fn
        self.num_shards = num_shards
        self.sql_params = sql_params
        """Bound to the query's placeholders (Ray's ``sql_params``), in every query built on it:
        the query comes first in each, and what is added after it holds no placeholder."""

    def get_name(self) -> str:
        """``ReadSQL``."""
        return "ReadSQL"

    def count_rows(self) -> int | None:
        """``SELECT COUNT(*)`` of the query, run by the database."""
        connection = connect(self.connection_factory)
        try:
            cursor = connection.cursor()
            execute(cursor, f"SELECT COUNT(*) FROM ({self.sql}) AS {ALIAS}", "count of the query", self.sql_params)
            return int(cursor.fetchone()[0])
        finally:
            _close(connection)

    def get_read_tasks(self, parallelism: int) -> list[ReadTask]:
        """One task, or one per shard when ``shard_keys`` are given and there are rows enough."""
        shards = self.num_shards or parallelism
        if self.shard_keys is None or shards <= 1:
            return [self._task(self.sql)]
        predicates = self._plan_shards(shards)
        if predicates is None:
            return [self._task(self.sql)]
        return [self._task(f"SELECT * FROM ({self.sql}) AS {ALIAS} WHERE {p}") for p in predicates]

    def _task(self, query: str) -> ReadTask:
        read = functools.partial(read_query, self.connection_factory, query, self.sql_params)
        return ReadTask(read, BlockMetadata(num_rows=None, size_bytes=None))

    def _plan_shards(self, shards: int) -> list[str] | None:
        """The shard predicates (None: read in one task), from a count of the rows and a probe."""
        assert self.shard_keys is not None
        connection = connect(self.connection_factory)
        try:
            dialect = dialect_of(connection)
            cursor = connection.cursor()
            rows, integer_key = self._count(cursor, dialect)
            shards = min(shards, math.ceil(rows / MIN_ROWS_PER_READ_TASK))
            if shards <= 1:
                return None
            keys, fn = self.shard_keys, self.shard_hash_fn
            predicates = [shard_predicate(dialect, keys, fn, shards, i, integer_key=integer_key) for i in range(shards)]
            try:
                probe = f"SELECT COUNT(*) FROM ({self.sql}) AS {ALIAS} WHERE 1 = 0 AND {predicates[0]}"
                if self.sql_params is None:
                    cursor.execute(probe)
                else:
                    cursor.execute(probe, self.sql_params)
                cursor.fetchall()
            except Exception as exc:  # as Ray: a database without the functions reads in one task
                logger.warning(
                    "read_sql: the database rejected the shard expression %r (%s: %s); reading in one task",
                    predicates[0], type(exc).__name__, exc,
                )
                _rollback(connection)
                return None
            return predicates
        finally:
            _close(connection)

    def _count(self, cursor: Any, dialect: str) -> tuple[int, bool]:
        """Rows of the query, and whether the one shard key is an integer column (default hash only)."""
        assert self.shard_keys is not None
        single = len(self.shard_keys) == 1 and self.shard_hash_fn.lower() == "md5"
        key = self.shard_keys[0]
        if single and dialect == "sqlite":
            # one scan: the count, and how many keys are not integers
            sql = f"SELECT COUNT(*), COUNT({key}) - COALESCE(SUM(typeof({key}) = 'integer'), 0) FROM ({self.sql}) AS {ALIAS}"
            execute(cursor, sql, "count of the query", self.sql_params)
            rows, others = cursor.fetchone()
            return int(rows), int(others) == 0
        execute(cursor, f"SELECT COUNT(*) FROM ({self.sql}) AS {ALIAS}", "count of the query", self.sql_params)
        rows = int(cursor.fetchone()[0])
        if single and dialect == "postgresql":
            execute(cursor, f"SELECT {key} FROM ({self.sql}) AS {ALIAS} LIMIT 0", "shard key probe", self.sql_params)
            cursor.fetchall()
            return rows, cursor.description[0][1] in _PG_INTEGERS
        return rows, False


def _rollback(connection: Any) -> None:
    try:
        connection.rollback()
    except Exception:  # optional in DB-API; nothing to undo for a read anyway
        logger.debug("rollback failed", exc_info=True)


def _open_cursor(connection: Any, dialect: str) -> Any:
    """A cursor that streams: server-side for PostgreSQL, the driver's own otherwise."""
    if dialect == "postgresql":
        kwargs: dict[str, Any] = {"name": f"dataflow_{uuid.uuid4().hex[:12]}"}
        if getattr(connection, "autocommit", False):
            kwargs["withhold"] = True  # a server-side cursor outside a transaction must be WITH HOLD
        return connection.cursor(**kwargs)
    return connection.cursor()


def read_query(connection_factory: ConnectionFactory, sql: str, params: Any = None) -> Iterator[pa.Table]:
    """Run ``sql`` (``params`` bound) on a new connection and yield its rows as Arrow tables of
    at most ``BLOCK_BYTES``."""
    connection = connect(connection_factory)
    cursor = None
    try:
        dialect = dialect_of(connection)
        cursor = _open_cursor(connection, dialect)
        execute(cursor, sql, params=params)
        yield from _blocks(cursor, dialect, sql)
    finally:
        if cursor is not None:
            _close(cursor)
        _close(connection)


def _blocks(cursor: Any, dialect: str, sql: str) -> Iterator[pa.Table]:
    """The cursor's rows as tables of at most ``BLOCK_BYTES``, fetched ``FETCH_BYTES`` at a time."""
    builder: _BatchBuilder | None = None
    pending: list[pa.RecordBatch] = []
    pending_bytes = 0
    size = FIRST_FETCH_ROWS
    while True:
        try:
            rows = cursor.fetchmany(size)
        except Exception as exc:
            raise naming_query(exc, sql) from exc
        if builder is None:
            if cursor.description is None:
                raise ValueError(f"the query returned no rows to read (it must be a SELECT): {_shorten(sql)}")
            builder = _BatchBuilder(cursor.description, dialect, sql)
        if not rows:
            break
        batch = builder.build(rows)
        if pending and not batch.schema.equals(pending[0].schema):
            yield pa.Table.from_batches(pending)  # a column that was all NULL so far got its type
            pending, pending_bytes = [], 0
        pending.append(batch)
        pending_bytes += batch.nbytes
        if pending_bytes >= BLOCK_BYTES:
            yield pa.Table.from_batches(pending)
            pending, pending_bytes = [], 0
        if len(rows) < size:
            break  # PEP 249: fewer rows than asked for only when no more are available
        size = max(1, min(MAX_FETCH_ROWS, FETCH_BYTES * batch.num_rows // max(1, batch.nbytes)))
    if pending:
        yield pa.Table.from_batches(pending)
    elif builder is not None and builder.rows_seen == 0:
        yield builder.empty()


class _BatchBuilder:
    """Rows (tuples) -> Arrow record batches with one schema for the whole result."""

    def __init__(self, description: Sequence[Sequence[Any]], dialect: str, sql: str) -> None:
        self.names = [str(column[0]) for column in description]
        self.types: list[pa.DataType | None] = [_described_type(column, dialect) for column in description]
        self.sql = sql
        self.rows_seen = 0

    def build(self, rows: Sequence[Sequence[Any]]) -> pa.RecordBatch:
        columns = list(zip(*rows, strict=True)) if rows else [() for _ in self.names]
        arrays = [self._array(i, values) for i, values in enumerate(columns)]
        self.rows_seen += len(rows)
        return pa.RecordBatch.from_arrays(arrays, names=self.names)

    def empty(self) -> pa.Table:
        """A table of no rows with the result's columns (types where known, else null)."""
        fields = [pa.field(n, t if t is not None else pa.null()) for n, t in zip(self.names, self.types, strict=True)]
        return pa.schema(fields).empty_table()

    def _array(self, index: int, values: Sequence[Any]) -> pa.Array:
        typ = self.types[index]
        if typ is None:
            array = self._infer(index, values)
            if pa.types.is_decimal128(array.type):
                # the first rows' digits fix the scale; later rows may have more before the point
                array = array.cast(pa.decimal128(38, array.type.scale))
            if array.type != pa.null():
                self.types[index] = array.type
            return array
        try:
            return pa.array(values, type=typ)
        except _CONVERSION_ERRORS as exc:
            if pa.types.is_string(typ):  # uuid, inet, enums...: their text
                return pa.array([None if v is None else str(v) for v in values], type=typ)
            raise self._type_error(index, values, f"is {typ} (from the first rows) but", "REAL") from exc

    def _infer(self, index: int, values: Sequence[Any]) -> pa.Array:
        try:
            return pa.array(values)
        except _CONVERSION_ERRORS as exc:
            raise self._type_error(index, values, "has values of several types:", "TEXT") from exc

    def _type_error(self, index: int, values: Sequence[Any], problem: str, cast: str) -> TypeError:
        kinds = ", ".join(sorted({type(v).__name__ for v in values if v is not None}))
        name = self.names[index]
        first, last = self.rows_seen, self.rows_seen + len(values) - 1
        msg = (
            f"column {name!r} {problem} rows {first} to {last} hold {kinds} values; an Arrow column has one "
            f"type: cast the column in the query, e.g. CAST({name} AS {cast}) (in the query: {_shorten(self.sql)})"
        )
        return TypeError(msg)


_CONVERSION_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError)


def _described_type(column: Sequence[Any], dialect: str) -> pa.DataType | None:
    """The Arrow type of a ``cursor.description`` entry, when the driver's type code says it."""
    if dialect != "postgresql":
        return None
    code = column[1]
    if code == _PG_NUMERIC:
        precision, scale = column[4], column[5]
        if isinstance(precision, int) and isinstance(scale, int) and 0 < precision:
            return pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)
        return None
    return _PG_TYPES.get(code) if isinstance(code, int) else None


class SQLDatasink(Datasink):
    """Rows written with ``executemany(sql, rows)``, one transaction per write task.

    ``sql`` is an INSERT (or any statement) with one placeholder per column, in the column order
    of the dataset, in the driver's parameter style (``?`` for sqlite3, ``%s`` for psycopg).
    """

    def __init__(self, sql: str, connection_factory: ConnectionFactory) -> None:
        if not isinstance(sql, str) or not sql.strip():
            raise ValueError(f"sql must be a non-empty statement, got {sql!r}")
        if not callable(connection_factory):
            msg = f"connection_factory must be a function returning a DB-API connection, got {type(connection_factory).__name__}"
            raise TypeError(msg)
        self.sql = sql
        self.connection_factory = connection_factory

    def get_name(self) -> str:
        """``WriteSQL``."""
        return "WriteSQL"

    def write(self, blocks: Iterable[Block], ctx: TaskContext) -> int:
        """Insert every row of ``blocks`` and commit; returns the number of rows."""
        connection = connect(self.connection_factory)
        written = 0
        try:
            cursor = connection.cursor()
            for block in blocks:
                if isinstance(block, pa.RecordBatch):
                    block = pa.Table.from_batches([block])
                for rows in _row_chunks(block, ROWS_PER_EXECUTE):
                    try:
                        cursor.executemany(self.sql, rows)
                    except Exception as exc:
                        raise naming_query(exc, self.sql, "statement") from exc
                    written += len(rows)
            connection.commit()
        except BaseException:
            _rollback(connection)
            raise
        finally:
            _close(connection)
        return written


def _row_chunks(table: pa.Table, rows_per_chunk: int) -> Iterator[list[tuple[Any, ...]]]:
    """``table``'s rows as Python tuples, ``rows_per_chunk`` at a time."""
    for start in range(0, table.num_rows, rows_per_chunk):
        part = table.slice(start, rows_per_chunk)
        columns = [column.to_pylist() for column in part.columns]
        yield list(zip(*columns, strict=True))

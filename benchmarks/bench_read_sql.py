"""read_sql against a plain DB-API cursor loop, and read_orc against pyarrow.orc, in one run.

Data (made once under ``benchmarks/data/``, git-ignored; ``--rows`` sets the size):

    sql<rows>.db    SQLite table t(id INTEGER PRIMARY KEY, k INTEGER, x REAL, s TEXT), 1,000,000 rows
    orc<rows>.orc   the same columns, 4x the rows, ORC with pyarrow's default stripes (64 MiB)
    PostgreSQL      the same table in a throwaway server (tests/connectors/postgres_server.py),
                    loaded with COPY; skipped with --no-postgres or when the binaries are missing

Each case is timed ``--runs`` times, the cases of a source interleaved round by round so that
load from other processes on the machine hits them alike; the medians of wall time and of CPU
time (this process and its children, the engine's workers) are reported, with their ratios to
the baseline of that source:

    cursor loop     cursor.execute(sql); fetchmany(10,000) until empty; each fetch turned into an
                    Arrow record batch column by column; one table at the end (the fastest plain
                    Python way to get Arrow out of a DB-API driver, and what read_sql does per task)
    read_sql local  dataflow.read_sql(sql, factory) drained as Arrow blocks, in-process mode
    read_sql        the same on the multi-process engine (one task: no shard keys)
    read_sql x2     the same with shard_keys=["id"], two shards on two workers

    pyarrow.orc     pyarrow.orc.ORCFile(path).read()
    read_orc local  dataflow.read_orc(path) drained, in-process mode; read_orc on the engine

Run: ``.venv/bin/python benchmarks/bench_read_sql.py [--rows N] [--runs R] [--no-postgres]``.
"""

from __future__ import annotations

import argparse
import functools
import json
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import benchcommon as bc
import pyarrow as pa

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
QUERY = "SELECT id, k, x, s FROM t"
FETCH = 10_000


def make_sqlite(rows: int) -> Path:
    path = DATA / f"sql{rows}.db"
    if path.exists():
        return path
    DATA.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    conn = sqlite3.connect(tmp)
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, k INTEGER, x REAL, s TEXT)")
    conn.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", ((i, i % 1000, i * 0.5, f"row-{i:09d}") for i in range(rows)))
    conn.commit()
    conn.close()
    tmp.rename(path)
    return path


def make_orc(rows: int) -> Path:
    import pyarrow.orc as orc

    path = DATA / f"orc{rows}.orc"
    if path.exists():
        return path
    DATA.mkdir(parents=True, exist_ok=True)
    ids = pa.array(range(rows), pa.int64())
    table = pa.table({
        "id": ids,
        "k": pa.compute.bit_wise_and(ids, pa.scalar(1023, pa.int64())),
        "x": pa.compute.multiply(ids.cast(pa.float64()), 0.5),
        "s": pa.array([f"row-{i:09d}" for i in range(rows)]),
    })
    orc.write_table(table, str(path.with_suffix(".tmp")), compression="zstd")
    path.with_suffix(".tmp").rename(path)
    return path


def cursor_loop(factory: Callable[[], Any]) -> int:
    """The baseline: fetchmany into Arrow record batches, one table."""
    conn = factory()
    try:
        cur = conn.cursor()
        cur.execute(QUERY)
        names = [d[0] for d in cur.description]
        batches = []
        while rows := cur.fetchmany(FETCH):
            columns = list(zip(*rows, strict=True))
            batches.append(pa.RecordBatch.from_arrays([pa.array(c) for c in columns], names=names))
        return pa.Table.from_batches(batches).num_rows
    finally:
        conn.close()


def drain(ds: Any) -> int:
    return sum(b.num_rows for b in ds.iter_batches(batch_size=None, batch_format="pyarrow"))


def time_cases(cases: dict[str, Callable[[], int]], runs: int, expect: int) -> dict[str, dict[str, float]]:
    """Median wall and CPU seconds per case; the cases of one round run one after the other.

    CPU is this process's and its children's (the engine's workers), user + system: on a machine
    shared with other work it moves less than the wall time does.
    """
    wall: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    for fn in cases.values():  # warm-up: page cache, imports, first engine start
        fn()
    for _ in range(runs):
        for name, fn in cases.items():
            c0, t0 = bc.tree_cpu_s() or 0.0, time.perf_counter()
            rows = fn()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append((bc.tree_cpu_s() or 0.0) - c0)
            if rows != expect:
                raise AssertionError(f"{name} returned {rows} rows, expected {expect}")
    return {name: {"wall_s": statistics.median(wall[name]), "cpu_s": statistics.median(cpu[name])} for name in cases}


def show(title: str, medians: dict[str, dict[str, float]], rows: int) -> None:
    base = next(iter(medians.values()))
    print(f"\n{title} ({rows:,} rows)")
    print(f"  {'case':<22}{'wall s':>9}{'Mrows/s':>9}{'vs base':>9}{'CPU s':>8}{'vs base':>9}")
    for name, m in medians.items():
        print(
            f"  {name:<22}{m['wall_s']:>9.3f}{rows / m['wall_s'] / 1e6:>9.2f}{m['wall_s'] / base['wall_s']:>8.2f}x"
            f"{m['cpu_s']:>8.2f}{m['cpu_s'] / max(base['cpu_s'], 1e-9):>8.2f}x"
        )


def sql_cases(dataflow: Any, factory: Callable[[], Any]) -> dict[str, Callable[[], int]]:
    def local() -> int:
        with dataflow.options(execution_mode="local"):
            return drain(dataflow.read_sql(QUERY, factory))

    return {
        "cursor loop": lambda: cursor_loop(factory),
        "read_sql local": local,
        "read_sql": lambda: drain(dataflow.read_sql(QUERY, factory)),
        "read_sql x2 shards": lambda: drain(dataflow.read_sql(QUERY, factory, shard_keys=["id"], override_num_blocks=2)),
    }


def postgres_factory(rows: int, db: Path) -> tuple[Any, Callable[[], Any]] | None:
    sys.path.insert(0, str(HERE.parent / "tests" / "connectors"))
    from postgres_server import PostgresServer, find_binaries

    bin_dir = find_binaries()
    if bin_dir is None:
        print("PostgreSQL binaries not found: PostgreSQL skipped", file=sys.stderr)
        return None
    import psycopg

    server = PostgresServer(bin_dir).start()
    t0 = time.perf_counter()
    src = sqlite3.connect(db)
    with psycopg.connect(server.conninfo) as conn:
        conn.execute("CREATE TABLE t (id int8 PRIMARY KEY, k int8, x float8, s text)")
        with conn.cursor().copy("COPY t FROM STDIN") as copy:
            for row in src.execute(QUERY):
                copy.write_row(row)
        conn.execute("ANALYZE t")
    src.close()
    print(f"PostgreSQL loaded {rows:,} rows in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return server, functools.partial(psycopg.connect, server.conninfo)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-postgres", action="store_true")
    args = ap.parse_args()

    import dataflow

    dataflow.init(num_cpus=2)
    results: dict[str, Any] = {"rows": args.rows, "runs": args.runs}
    try:
        db = make_sqlite(args.rows)
        factory = functools.partial(sqlite3.connect, str(db))
        medians = time_cases(sql_cases(dataflow, factory), args.runs, args.rows)
        show("SQLite", medians, args.rows)
        results["sqlite"] = medians

        if not args.no_postgres:
            found = postgres_factory(args.rows, db)
            if found is not None:
                server, pg = found
                try:
                    medians = time_cases(sql_cases(dataflow, pg), args.runs, args.rows)
                finally:
                    server.stop()
                show("PostgreSQL", medians, args.rows)
                results["postgresql"] = medians

        orc_rows = 4 * args.rows
        path = str(make_orc(orc_rows))

        def orc_local() -> int:
            with dataflow.options(execution_mode="local"):
                return drain(dataflow.read_orc(path))

        import pyarrow.orc as orc

        medians = time_cases({
            "pyarrow.orc": lambda: orc.ORCFile(path).read().num_rows,
            "read_orc local": orc_local,
            "read_orc": lambda: drain(dataflow.read_orc(path)),
        }, args.runs, orc_rows)
        show("ORC", medians, orc_rows)
        results["orc"] = medians
    finally:
        dataflow.shutdown()
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Hive-partitioned Parquet: a partitioned write, a filter on a partition value, a full drain.

Three columns of the 4M-row dataset (``i64, f64, short``), partitioned by ``short`` (1,000
values):

    write   read the 32 input files, write_parquet(out, partition_cols=["short"]): one file per
            write task and folder (dataflow: 32,000 files, as Spark and Ray Data write them)
    filter  read_parquet(folder, filter=short == <one value>).count(): a filter the folder
            names decide, so the other 999 folders need not be opened
    drain   read_parquet(folder) drained as blocks: 32,000 files of ~125 rows

The ``filter`` and ``drain`` cases read a folder generated once by pyarrow
(``benchmarks/data/partitioned32k/``: each input file written with ``pq.write_to_dataset``, so
each of the 1,000 folders holds 32 files). Sides:

    raw:      pyarrow.dataset: write_dataset(partitioning=["short"], hive) / dataset(...).count_rows(filter)
              / to_batches() (C++, multi-threaded)
    dataflow: read_parquet / write_parquet as above
    ray:      the same calls on Ray Data 2.60 (partition values are strings there too; its
              read_parquet takes no filter=: ``.filter(expr="short == '<value>'")``, which it
              pushes into the read)
    daft:     read_parquet(glob, hive_partitioning=True) / write_parquet(partition_cols=...)

Each side runs in its own process: per case one untimed run, then ``--runs`` timed ones
(median). Rows are checked against the dataset (the filter's against pyarrow's count).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import benchcommon as bc

COLUMNS = ["i64", "f64", "short"]
CASES = ("write", "filter", "drain")


def ensure_partitioned(data: Path) -> Path:
    """The 1,000-folder copy of ``data`` the read cases use (written once)."""
    import pyarrow.parquet as pq

    out = bc.DATA_DIR / f"partitioned32k-{data.name}"
    done = out / "_DONE"
    if done.exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    for i, path in enumerate(sorted(data.glob("*.parquet"))):
        table = pq.read_table(path, columns=COLUMNS)
        pq.write_to_dataset(table, out, partition_cols=["short"], basename_template=f"part-{i:03d}-{{i}}.parquet")
    done.write_text("ok")
    return out


def _value(folder: Path) -> str:
    return sorted(p.name for p in folder.glob("short=*"))[500].split("=", 1)[1]


def _measure(fn, runs: int) -> dict:
    fn()  # untimed: imports, workers, the page cache
    times, rows = bc.timed_runs(fn, runs)
    return {"times": times, "rows": rows}


def _measure_write(write, runs: int) -> dict:
    """``write(out)`` into a fresh folder per run, timed alone; then the rows in the files it
    wrote are counted from their footers (32,000 footers take seconds: not part of the write)."""
    import pyarrow.parquet as pq

    times, rows, files = [], 0, 0
    for run in range(runs + 1):  # the first untimed
        out = tempfile.mkdtemp(prefix="bench-partitioned-")
        shutil.rmtree(out)
        try:
            start = time.perf_counter()
            write(out)
            elapsed = time.perf_counter() - start
            written = list(Path(out).rglob("*.parquet"))
            rows, files = sum(pq.ParquetFile(f).metadata.num_rows for f in written), len(written)
        finally:
            shutil.rmtree(out, ignore_errors=True)
        if run:
            times.append(elapsed)
    return {"times": times, "rows": rows, "files": files}


def _run_cases(a: dict, write, filtered, drain) -> dict:
    out = {}
    for case in a["cases"]:
        if case == "write":
            out[case] = _measure_write(write, a["runs"])
        elif case == "filter":
            out[case] = _measure(filtered, a["runs"])
        else:
            out[case] = _measure(drain, a["runs"])
    return {"cases": out}


def run_raw(a: dict) -> dict:
    import pyarrow.compute as pc
    import pyarrow.dataset as pads

    def write(out: str) -> None:
        source = pads.dataset(a["data"], format="parquet").to_batches(columns=COLUMNS)
        schema = pads.dataset(a["data"], format="parquet").schema
        import pyarrow as pa

        schema = pa.schema([schema.field(c) for c in COLUMNS])
        pads.write_dataset(source, out, schema=schema, format="parquet", partitioning=["short"],
                           partitioning_flavor="hive")

    def dataset():
        return pads.dataset(a["folder"], format="parquet", partitioning="hive")

    return _run_cases(a, write, lambda: dataset().count_rows(filter=pc.field("short") == a["value"]),
                      lambda: sum(b.num_rows for b in dataset().to_batches()))


def run_dataflow(a: dict) -> dict:
    import pyarrow.compute as pc

    dataflow = bc.maybe_init_dataflow()
    out = _run_cases(
        a,
        lambda o: dataflow.read_parquet(a["data"], columns=COLUMNS).write_parquet(o, partition_cols=["short"]),
        lambda: dataflow.read_parquet(a["folder"], filter=pc.field("short") == a["value"]).count(),
        lambda: sum(b.num_rows for b in dataflow.read_parquet(a["folder"]).iter_batches(
            batch_size=None, batch_format="pyarrow")),
    )
    bc.maybe_shutdown(dataflow)
    return out


def run_ray(a: dict) -> dict:
    ray = bc.init_ray()
    out = _run_cases(
        a,
        lambda o: ray.data.read_parquet(a["data"], columns=COLUMNS).write_parquet(o, partition_cols=["short"]),
        lambda: ray.data.read_parquet(a["folder"]).filter(expr=f"short == '{a['value']}'").count(),
        lambda: sum(len(b) for b in ray.data.read_parquet(a["folder"]).iter_batches(
            batch_size=None, batch_format="pyarrow")),
    )
    ray.shutdown()
    return {**out, "version": ray.__version__}


def run_daft(a: dict) -> dict:
    import daft

    glob = a["folder"] + "/**/*.parquet"
    out = _run_cases(
        a,
        lambda o: daft.read_parquet(a["data"] + "/*.parquet").select(*COLUMNS).write_parquet(o, partition_cols=["short"]),
        lambda: daft.read_parquet(glob, hive_partitioning=True).where(daft.col("short") == a["value"]).count_rows(),
        lambda: sum(b.num_rows for b in daft.read_parquet(glob, hive_partitioning=True).to_arrow_iter()),
    )
    return {**out, "version": daft.__version__}


IMPLS = {"raw": run_raw, "dataflow": run_dataflow, "ray": run_ray, "daft": run_daft}


def main() -> int:
    if bc.is_worker():
        return bc.worker_main(IMPLS)
    import peers
    import pyarrow.compute as pc
    import pyarrow.dataset as pads

    ap = bc.base_parser(__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--ray-cases", default="write,filter",
                    help="cases run on Ray (its drain of the 32,000 files ran as one task for 10+ minutes)")
    args = ap.parse_args()
    data = bc.dataset(args)
    folder = ensure_partitioned(data)
    value = _value(folder)
    rows = pads.dataset(data, format="parquet").count_rows()
    want = {"write": rows, "drain": rows,
            "filter": pads.dataset(folder, format="parquet", partitioning="hive").count_rows(
                filter=pc.field("short") == value)}
    cases = [c for c in args.cases.split(",") if c]
    by_case: dict[str, dict[str, dict]] = {c: {} for c in cases}
    for side in bc.sides(args):
        side_cases = [c for c in cases if side != "ray" or c in args.ray_cases.split(",")]
        wargs = {"data": str(data), "folder": str(folder), "value": value, "runs": args.runs, "cases": side_cases}
        print(f"[partitioned] {side} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        res = peers.run_side(__file__, side, wargs, timeout=args.timeout)
        for case in cases:
            one = dict(res.get("cases", {}).get(case) or {})
            if case not in side_cases:
                one["status"] = "not run (--ray-cases)"
            elif not one:
                one = {k: v for k, v in res.items() if k in ("status", "error", "tail")}
            if one.get("times"):
                one["status"] = "ok"
                one["median_s"] = bc.median(one["times"])
                if one.get("rows") != want[case]:
                    one["status"] = f"PROBLEM: {one.get('rows')} rows, expected {want[case]}"
            one["process_s"] = time.perf_counter() - t0
            by_case[case][side] = one
    bc.report_cases("partitioned", by_case, metric="median_s",
                    columns=[("rows", "rows", "int"), ("files", "files", "int")],
                    extra={"data": str(data), "folder": str(folder), "value": value, "runs": args.runs},
                    json_out=args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

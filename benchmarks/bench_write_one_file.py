"""The 4M-row dataset written as one Parquet file: time and the process tree's peak memory.

``repartition(1)`` before a write is how Ray Data users get one output file. The job reads four
columns of the tabular dataset (``i64, f64, short, text``: ~370 MB in memory, 32 files) and writes
them into one file:

    dataflow: dataflow.read_parquet(path, columns).repartition(1).write_parquet(out)
    ray:      ray.data.read_parquet(path, columns).repartition(1).write_parquet(out)
    daft:     daft.read_parquet(glob).select(columns).into_partitions(1).write_parquet(out)
    raw:      one pyarrow ParquetWriter, each input file's table written into it in turn (the
              memory floor: one input file in memory at a time)

Each side runs in its own process: one untimed run, then ``--runs`` timed ones (median); ``peak
RSS+shm`` is the process tree's peak over the timed runs (``benchcommon.TreeMemorySampler``).
Every run reads the written footers back: ``rows`` must be the dataset's, and ``files`` is how
many Parquet files the job wrote (one is what was asked for).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import benchcommon as bc

COLUMNS = ["i64", "f64", "short", "text"]


def _written(out: str) -> tuple[int, int]:
    """(rows in the Parquet files under ``out``, number of files)."""
    import pyarrow.parquet as pq

    files = sorted(Path(out).rglob("*.parquet"))
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files), len(files)


def _measured(write, runs: int) -> dict:
    """``write(out)`` into a fresh folder each run; the rows and files of the last one."""
    files = [0]

    def job() -> int:
        out = tempfile.mkdtemp(prefix="bench-one-file-")
        shutil.rmtree(out)  # (the writers create it)
        try:
            write(out)
            rows, files[0] = _written(out)
            return rows
        finally:
            shutil.rmtree(out, ignore_errors=True)

    job()  # untimed: imports, workers, the page cache
    with bc.TreeMemorySampler() as mem:
        times, rows = bc.timed_runs(job, runs)
    return {"times": times, "rows": rows, "files": files[0], **mem.peaks()}


def run_raw(a: dict) -> dict:
    import pyarrow.parquet as pq

    paths = sorted(Path(a["data"]).glob("*.parquet"))

    def write(out: str) -> None:
        Path(out).mkdir(parents=True)
        writer = None
        for path in paths:
            table = pq.read_table(path, columns=COLUMNS)
            if writer is None:
                writer = pq.ParquetWriter(f"{out}/part-0.parquet", table.schema)
            writer.write_table(table)
        assert writer is not None
        writer.close()

    return _measured(write, a["runs"])


def run_dataflow(a: dict) -> dict:
    dataflow = bc.maybe_init_dataflow()
    out = _measured(lambda o: dataflow.read_parquet(a["data"], columns=COLUMNS).repartition(1).write_parquet(o),
                    a["runs"])
    bc.maybe_shutdown(dataflow)
    return out


def run_ray(a: dict) -> dict:
    ray = bc.init_ray()
    out = _measured(lambda o: ray.data.read_parquet(a["data"], columns=COLUMNS).repartition(1).write_parquet(o),
                    a["runs"])
    ray.shutdown()
    return {**out, "version": ray.__version__}


def run_daft(a: dict) -> dict:
    import daft

    glob = str(Path(a["data"]) / "*.parquet")
    out = _measured(lambda o: daft.read_parquet(glob).select(*COLUMNS).into_partitions(1).write_parquet(o),
                    a["runs"])
    return {**out, "version": daft.__version__}


IMPLS = {"raw": run_raw, "dataflow": run_dataflow, "ray": run_ray, "daft": run_daft}


def main() -> int:
    if bc.is_worker():
        return bc.worker_main(IMPLS)
    import peers
    import pyarrow.parquet as pq

    args = bc.base_parser(__doc__.splitlines()[0]).parse_args()
    data = bc.dataset(args)
    bc.warm_page_cache(data)
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in sorted(data.glob("*.parquet")))
    wargs = {"data": str(data), "runs": args.runs}
    results = {}
    for side in bc.sides(args):
        print(f"[write_one_file] {side} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        res = peers.run_side(__file__, side, wargs, timeout=args.timeout)
        res["process_s"] = time.perf_counter() - t0
        if res.get("times"):
            res["median_s"] = bc.median(res["times"])
            if res.get("rows") != rows:
                res["status"] = f"PROBLEM: {res.get('rows')} rows written, the dataset has {rows}"
            res["peak_gb"] = res.get("peak_rss_shm_bytes", 0) / 1e9
        results[side] = res
    bc.report("write_one_file", results, metric="median_s", extra={"data": str(data), "rows": rows, "runs": args.runs},
              columns=[("rows", "rows", "int"), ("files", "files", "int"), ("peak RSS+shm GB", "peak_gb", "")],
              json_out=args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

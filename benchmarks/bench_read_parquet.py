"""Read the Parquet dataset and drain it as numpy batches.

    dataflow: dataflow.read_parquet(path).iter_batches(batch_size=B, batch_format="numpy")
    ray:      ray.data.read_parquet(path).iter_batches(batch_size=B, batch_format="numpy")
    daft:     daft.read_parquet(glob).into_batches(B).to_arrow_iter(), each batch -> numpy
              (Daft has no numpy iter_batches; conversion is the same code as the raw side)
    raw:      2 processes, each reading half of the files with pq.ParquetFile.iter_batches(B)
              and converting every column to numpy (fixed_size_list -> 2-D float32 via
              flatten+reshape, strings -> object arrays via to_numpy(zero_copy_only=False))

B defaults to 4096 rows (Ray's own iter_batches default is 256; 4096 is the size the project
quotes and keeps per-batch overhead from dominating; ``--batch-size 256`` gives Ray's default).
The page cache is warmed before the first side, so this measures decode + conversion + engine
overhead, not the disk. Engines are started (``init``, and dataflow's worker processes up) before
the timed runs; the median of
``--runs`` timed drains is reported. Target: dataflow <= 1.4x raw.
"""

from __future__ import annotations

import sys
import time

import benchcommon as bc


def _files(path: str) -> list[str]:
    from pathlib import Path

    return sorted(str(p) for p in Path(path).glob("*.parquet"))


def _read_files_numpy(args: tuple[list[str], int]) -> int:
    import pyarrow.parquet as pq

    files, batch_size = args
    rows = 0
    for f in files:
        for batch in pq.ParquetFile(f).iter_batches(batch_size=batch_size):
            cols = bc.arrow_batch_to_numpy(batch)
            rows += bc.batch_len(cols)
    return rows


def run_raw(a: dict) -> dict:
    import multiprocessing as mp

    import pyarrow  # noqa: F401  (imported before fork so children share it)

    files = _files(a["data"])
    procs = a.get("procs", 2)
    parts = [(files[k::procs], a["batch_size"]) for k in range(procs)]
    with mp.get_context("fork").Pool(procs) as pool:
        pool.map(abs, range(procs))  # start the workers before timing
        times, rows = bc.timed_runs(lambda: sum(pool.map(_read_files_numpy, parts)), a["runs"])
    return {"times": times, "rows": rows, "procs": procs}


def run_dataflow(a: dict) -> dict:
    t0 = time.perf_counter()
    dataflow = bc.maybe_init_dataflow()
    init_s = time.perf_counter() - t0

    def drain() -> int:
        ds = dataflow.read_parquet(a["data"])
        return sum(bc.batch_len(b) for b in ds.iter_batches(batch_size=a["batch_size"],
                                                            batch_format="numpy"))

    times, rows = bc.timed_runs(drain, a["runs"])
    bc.maybe_shutdown(dataflow)
    return {"times": times, "rows": rows, "init_s": init_s}


def run_ray(a: dict) -> dict:
    t0 = time.perf_counter()
    ray = bc.init_ray()
    init_s = time.perf_counter() - t0

    def drain() -> int:
        ds = ray.data.read_parquet(a["data"])
        return sum(bc.batch_len(b) for b in ds.iter_batches(batch_size=a["batch_size"],
                                                            batch_format="numpy"))

    times, rows = bc.timed_runs(drain, a["runs"])
    ray.shutdown()
    return {"times": times, "rows": rows, "init_s": init_s, "version": ray.__version__}


def run_daft(a: dict) -> dict:
    import daft

    def drain() -> int:
        df = daft.read_parquet(a["data"].rstrip("/") + "/*.parquet").into_batches(a["batch_size"])
        return sum(bc.batch_len(bc.arrow_batch_to_numpy(b)) for b in df.to_arrow_iter())

    times, rows = bc.timed_runs(drain, a["runs"])
    return {"times": times, "rows": rows, "version": daft.__version__}


IMPLS = {"raw": run_raw, "dataflow": run_dataflow, "ray": run_ray, "daft": run_daft}


def main() -> int:
    if bc.is_worker():
        return bc.worker_main(IMPLS)
    import peers

    ap = bc.base_parser(__doc__.splitlines()[0])
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--procs", type=int, default=2, help="processes for the raw baseline")
    args = ap.parse_args()
    data = bc.dataset(args)
    nbytes = bc.warm_page_cache(data)
    wargs = {"data": str(data), "runs": args.runs, "batch_size": args.batch_size, "procs": args.procs}
    results = {}
    for side in bc.sides(args):
        print(f"[read_parquet] {side} ...", file=sys.stderr, flush=True)
        res = peers.run_side(__file__, side, wargs, timeout=args.timeout)
        if res.get("times"):
            res["median_s"] = bc.median(res["times"])
            res["mrows_per_s"] = res["rows"] / 1e6 / res["median_s"]
            res["disk_mb_per_s"] = nbytes / 1e6 / res["median_s"]
        results[side] = res
    bc.report("read_parquet", results, metric="median_s",
              target={"text": "dataflow <= 1.4x raw", "kind": "ratio", "max": 1.4, "baseline": "raw"},
              extra={"dataset": str(data), "dataset_bytes": nbytes, "batch_size": args.batch_size,
                     "runs": args.runs},
              columns=[("Mrows/s", "mrows_per_s", ""), ("MB/s (on disk)", "disk_mb_per_s", "")],
              json_out=args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""100,000 small Parquet files in one folder: time to the first row, and to the last.

Data (generated once under ``benchmarks/data/files100k/``, git-ignored, deterministic): 100,000
files of 10 rows each (``id`` int64, ``x`` float64, ``s`` string; about 1 KB per file, footer
included). ``--small``: 1,000 files.

    dataflow: dataflow.read_parquet(dir).iter_batches(batch_size=None, batch_format="pyarrow")
    ray:      ray.data.read_parquet(dir).iter_batches(batch_size=None, batch_format="pyarrow")
    daft:     daft.read_parquet(glob).to_arrow_iter()
    raw:      pyarrow.dataset.dataset(dir).to_batches() (pyarrow lists the whole folder first,
              then reads with its own thread pool)

``first_s`` is the time from the call that names the folder to the first batch; ``median_s`` the
time to drain every row (median of ``--runs``). Listing is part of both: nothing is cached
between runs except the page cache (warmed first) and the OS's directory cache.
"""

from __future__ import annotations

import sys
import time

import benchcommon as bc

FILES = 100_000
ROWS_PER_FILE = 10


def ensure_data(small: bool):
    """Write the files if the manifest is missing; return the folder."""
    import json

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = FILES // 100 if small else FILES
    out = bc.DATA_DIR / ("files1k" if small else "files100k")
    manifest = out / "_MANIFEST.json"
    want = {"files": files, "rows_per_file": ROWS_PER_FILE}
    if manifest.exists() and json.loads(manifest.read_text()) == want:
        return out
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    for i in range(files):
        ids = np.arange(i * ROWS_PER_FILE, (i + 1) * ROWS_PER_FILE, dtype=np.int64)
        table = pa.table({"id": ids, "x": rng.standard_normal(ROWS_PER_FILE),
                          "s": [f"r{v}" for v in ids]})
        pq.write_table(table, out / f"part-{i:06d}.parquet")
    manifest.write_text(json.dumps(want))
    return out


def _drain(make_iter) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    it = make_iter()
    first = next(it)
    t_first = time.perf_counter() - t0
    rows = first.num_rows + sum(b.num_rows for b in it)
    return t_first, time.perf_counter() - t0, rows


def _runs(make_iter, runs: int) -> dict:
    firsts, totals, rows = [], [], 0
    for _ in range(runs):
        f, t, rows = _drain(make_iter)
        firsts.append(f)
        totals.append(t)
    return {"first_times": firsts, "times": totals, "rows": rows}


def run_raw(a: dict) -> dict:
    import pyarrow.dataset as pads

    return _runs(lambda: iter(pads.dataset(a["data"], format="parquet").to_batches()), a["runs"])


def run_dataflow(a: dict) -> dict:
    t0 = time.perf_counter()
    dataflow = bc.maybe_init_dataflow()
    init_s = time.perf_counter() - t0
    out = _runs(lambda: iter(dataflow.read_parquet(a["data"]).iter_batches(batch_size=None,
                                                                           batch_format="pyarrow")),
                a["runs"])
    bc.maybe_shutdown(dataflow)
    return {**out, "init_s": init_s}


def run_ray(a: dict) -> dict:
    ray = bc.init_ray()
    out = _runs(lambda: iter(ray.data.read_parquet(a["data"]).iter_batches(batch_size=None,
                                                                           batch_format="pyarrow")),
                a["runs"])
    ray.shutdown()
    return {**out, "version": ray.__version__}


def run_daft(a: dict) -> dict:
    import daft

    out = _runs(lambda: iter(daft.read_parquet(a["data"].rstrip("/") + "/*.parquet").to_arrow_iter()),
                a["runs"])
    return {**out, "version": daft.__version__}


IMPLS = {"raw": run_raw, "dataflow": run_dataflow, "ray": run_ray, "daft": run_daft}


def main() -> int:
    if bc.is_worker():
        return bc.worker_main(IMPLS)
    import peers

    ap = bc.base_parser(__doc__.splitlines()[0])
    args = ap.parse_args()
    t0 = time.perf_counter()
    data = ensure_data(args.small)
    print(f"[many_files] data ready in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    nbytes = bc.warm_page_cache(data)
    wargs = {"data": str(data), "runs": args.runs}
    results = {}
    for side in bc.sides(args):
        print(f"[many_files] {side} ...", file=sys.stderr, flush=True)
        res = peers.run_side(__file__, side, wargs, timeout=args.timeout)
        if res.get("times"):
            res["median_s"] = bc.median(res["times"])
            res["first_s"] = bc.median(res["first_times"])
        results[side] = res
    bc.report("many_files", results, metric="median_s",
              extra={"dataset": str(data), "dataset_bytes": nbytes, "runs": args.runs},
              columns=[("first row", "first_s", "s"), ("rows", "rows", "int")], json_out=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())

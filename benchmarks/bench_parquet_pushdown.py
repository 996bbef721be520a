"""read_parquet with and without projection and a selective filter: time and bytes read.

Four variants over ``benchmarks/data/parquet4m`` (4M rows, 32 files of one row group each):

    full       every column
    project    columns=["i64", "f64"]
    prune      filter i64 < rows / 100 (1% of rows; row-group statistics rule out 31 of 32 files)
    scan       columns=["i64", "f32"], filter f32 < 0.01 (1% of rows, spread over every row group:
               nothing can be skipped, the filter runs on the decoded column)

    dataflow: dataflow.read_parquet(path, columns=..., filter=...) drained as pyarrow blocks
    ray:      ray.data.read_parquet(path, columns=...).filter(expr="...") drained as pyarrow batches
              (Ray 2.60 refuses ``filter=`` in read_parquet and pushes ``filter(expr=)`` down)
    daft:     daft.read_parquet(glob).where(...).select(...) drained with to_arrow_iter()
    raw:      pyarrow.dataset.dataset(path).to_batches(columns=..., filter=...) (pyarrow's threads)

Time: median of ``--runs`` drains (page cache warm). Bytes read: ``rchar`` from
``/proc/self/io`` around one extra drain, i.e. the bytes the process got from ``read``/``pread``
calls (files, page cache hits included; not the shared-memory store, which is mapped). For
dataflow that drain runs with ``execution_mode="local"`` so every read happens in the measured
process (the engine does not ship workers' I/O counters to the driver). Ray and Daft read in
other processes/threads pools that ``/proc/self/io`` of the driver does not see for Ray, so their
bytes are not reported.
"""

from __future__ import annotations

import sys
import time

import benchcommon as bc

VARIANTS = ("full", "project", "prune", "scan")


def _spec(variant: str, rows: int):
    """(columns, filter expression) for a variant over a dataset of ``rows`` rows."""
    import pyarrow.compute as pc

    if variant == "full":
        return None, None
    if variant == "project":
        return ["i64", "f64"], None
    if variant == "prune":
        return None, pc.field("i64") < rows // 100
    if variant == "scan":
        return ["i64", "f32"], pc.field("f32") < 0.01
    raise ValueError(variant)


def _rchar() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    return 0


def _measure(drain, runs: int) -> dict:
    times, rows = bc.timed_runs(drain, runs)
    return {"times": times, "rows": rows, "median_s": bc.median(times)}


def run_raw(a: dict) -> dict:
    import pyarrow.dataset as pads

    out = {}
    for variant in a["variants"]:
        columns, expr = _spec(variant, a["rows"])

        def drain(columns=columns, expr=expr) -> int:
            ds = pads.dataset(a["data"], format="parquet")
            return sum(b.num_rows for b in ds.to_batches(columns=columns, filter=expr))

        res = _measure(drain, a["runs"])
        before = _rchar()
        drain()
        res["bytes_read"] = _rchar() - before
        out[variant] = res
    return {"variants": out}


def run_dataflow(a: dict) -> dict:
    t0 = time.perf_counter()
    dataflow = bc.maybe_init_dataflow()
    init_s = time.perf_counter() - t0
    out = {}
    for variant in a["variants"]:
        columns, expr = _spec(variant, a["rows"])

        def drain(columns=columns, expr=expr) -> int:
            ds = dataflow.read_parquet(a["data"], columns=columns, filter=expr)
            return sum(b.num_rows for b in ds.iter_batches(batch_size=None, batch_format="pyarrow"))

        res = _measure(drain, a["runs"])
        with dataflow.options(execution_mode="local"):
            before = _rchar()
            drain()
            res["bytes_read"] = _rchar() - before
        out[variant] = res
    bc.maybe_shutdown(dataflow)
    return {"variants": out, "init_s": init_s}


def run_ray(a: dict) -> dict:
    ray = bc.init_ray()
    out = {}
    for variant in a["variants"]:
        columns, _ = _spec(variant, a["rows"])
        # Ray 2.60 refuses read_parquet(filter=...); its expression filter is pushed down instead
        predicate = {"prune": f"i64 < {a['rows'] // 100}", "scan": "f32 < 0.01"}.get(variant)

        def drain(columns=columns, predicate=predicate) -> int:
            ds = ray.data.read_parquet(a["data"], columns=columns)
            if predicate is not None:
                ds = ds.filter(expr=predicate)
            return sum(len(b) for b in ds.iter_batches(batch_size=None, batch_format="pyarrow"))

        out[variant] = _measure(drain, a["runs"])
    ray.shutdown()
    return {"variants": out, "version": ray.__version__}


def run_daft(a: dict) -> dict:
    import daft

    predicates = {"prune": daft.col("i64") < a["rows"] // 100, "scan": daft.col("f32") < 0.01}
    out = {}
    for variant in a["variants"]:
        columns, _ = _spec(variant, a["rows"])

        def drain(columns=columns, variant=variant) -> int:
            df = daft.read_parquet(a["data"].rstrip("/") + "/*.parquet")
            if variant in predicates:
                df = df.where(predicates[variant])
            if columns:
                df = df.select(*columns)
            return sum(b.num_rows for b in df.to_arrow_iter())

        out[variant] = _measure(drain, a["runs"])
    return {"variants": out, "version": daft.__version__}


IMPLS = {"raw": run_raw, "dataflow": run_dataflow, "ray": run_ray, "daft": run_daft}


def main() -> int:
    if bc.is_worker():
        return bc.worker_main(IMPLS)
    import peers

    ap = bc.base_parser(__doc__.splitlines()[0])
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    data = bc.dataset(args)
    nbytes = bc.warm_page_cache(data)
    variants = [v for v in args.variants.split(",") if v]
    import pyarrow.parquet as pq

    rows = sum(pq.read_metadata(p).num_rows for p in sorted(data.glob("*.parquet")))
    wargs = {"data": str(data), "runs": args.runs, "variants": variants, "rows": rows}
    by_side = {}
    for side in bc.sides(args):
        print(f"[parquet_pushdown] {side} ...", file=sys.stderr, flush=True)
        by_side[side] = peers.run_side(__file__, side, wargs, timeout=args.timeout)
    for variant in variants:
        results = {}
        for side, res in by_side.items():
            one = dict(res.get("variants", {}).get(variant, {}))
            one["status"] = res.get("status", "?")
            if res.get("error"):
                one["error"] = res["error"]
            if one.get("bytes_read") is not None:
                one["mb_read"] = one["bytes_read"] / 1e6
            results[side] = one
        bc.report(f"parquet_pushdown/{variant}", results, metric="median_s",
                  extra={"dataset": str(data), "dataset_bytes": nbytes, "runs": args.runs,
                         "variant": variant},
                  columns=[("rows", "rows", "int"), ("MB read", "mb_read", "")],
                  json_out=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())

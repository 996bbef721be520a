"""Row-level map + filter over N rows (default 1,000,000) then count.

    dataflow: dataflow.range(N).map(add_field).filter(keep).count()
    ray:      ray.data.range(N).map(add_field).filter(keep).count()
    daft:     daft.range(N) with @daft.func row-wise UDFs for the same two functions
              (Daft has no dict-row map; this is its closest per-row Python path)
    raw:      a plain Python loop: for i in range(N): r = add_field({"id": i}); count += keep(r)

``add_field`` returns {"id": id, "sq": id * 2}; ``keep`` keeps rows whose sq % 4 == 0 (half).
The rows are built inside the timed loop on every side. Median of ``--runs``; target:
dataflow <= 2x the plain loop.
"""

from __future__ import annotations

import sys
import time

import benchcommon as bc


def add_field(row):
    return {"id": row["id"], "sq": row["id"] * 2}


def keep(row):
    return row["sq"] % 4 == 0


def run_raw(a: dict) -> dict:
    n = a["rows"]

    def loop() -> int:
        count = 0
        for i in range(n):
            r = add_field({"id": i})
            if keep(r):
                count += 1
        return count

    times, count = bc.timed_runs(loop, a["runs"])
    return {"times": times, "count": count}


def run_dataflow(a: dict) -> dict:
    t0 = time.perf_counter()
    dataflow = bc.maybe_init_dataflow()
    init_s = time.perf_counter() - t0
    times, count = bc.timed_runs(
        lambda: dataflow.range(a["rows"]).map(add_field).filter(keep).count(), a["runs"])
    bc.maybe_shutdown(dataflow)
    return {"times": times, "count": count, "init_s": init_s}


def run_ray(a: dict) -> dict:
    t0 = time.perf_counter()
    ray = bc.init_ray()
    init_s = time.perf_counter() - t0
    times, count = bc.timed_runs(
        lambda: ray.data.range(a["rows"]).map(add_field).filter(keep).count(), a["runs"])
    ray.shutdown()
    return {"times": times, "count": count, "init_s": init_s, "version": ray.__version__}


def run_daft(a: dict) -> dict:
    import daft
    from daft import col

    @daft.func
    def sq(x: int) -> int:
        return add_field({"id": x})["sq"]

    @daft.func
    def keep_sq(s: int) -> bool:
        return keep({"sq": s})

    def go() -> int:
        df = daft.range(a["rows"]).with_column("sq", sq(col("id")))
        return df.where(keep_sq(col("sq"))).count_rows()

    times, count = bc.timed_runs(go, a["runs"])
    return {"times": times, "count": count, "version": daft.__version__}


IMPLS = {"raw": run_raw, "dataflow": run_dataflow, "ray": run_ray, "daft": run_daft}


def main() -> int:
    if bc.is_worker():
        return bc.worker_main(IMPLS)
    import peers

    ap = bc.base_parser(__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=None, help="default 1,000,000 (100,000 with --small)")
    args = ap.parse_args()
    rows = args.rows or (100_000 if args.small else 1_000_000)
    wargs = {"rows": rows, "runs": args.runs}
    results = {}
    for side in bc.sides(args):
        print(f"[map_filter] {side} ...", file=sys.stderr, flush=True)
        res = peers.run_side(__file__, side, wargs, timeout=args.timeout)
        if res.get("times"):
            res["median_s"] = bc.median(res["times"])
            res["mrows_per_s"] = rows / 1e6 / res["median_s"]
            if res.get("count") != rows // 2:
                res["warning"] = f"count {res.get('count')} != expected {rows // 2}"
        results[side] = res
    bc.report("map_filter", results, metric="median_s",
              target={"text": "dataflow <= 2x plain Python loop", "kind": "ratio", "max": 2.0,
                      "baseline": "raw"},
              extra={"rows": rows, "runs": args.runs},
              columns=[("Mrows/s", "mrows_per_s", "")], json_out=args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

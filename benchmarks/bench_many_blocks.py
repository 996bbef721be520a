"""Per-block overhead: range(2,000,000, override_num_blocks=2000).map_batches(identity).count().

    dataflow: dataflow.range(N, override_num_blocks=B).map_batches(lambda b: b).count()
    ray:      ray.data.range(N, override_num_blocks=B).map_batches(lambda b: b).count()
    daft:     daft.range(N, partitions=B) -> identity @daft.func.batch UDF -> count of its output
              (aggregating the UDF's output column so the optimizer cannot prune the UDF)
    raw:      numpy: for each of B blocks, arange slice -> {"id": arr} -> identity -> sum lengths
              (the no-engine floor)

Two numbers per side:

* ``warm``: the engine is already started (``init()`` outside the timing), median of
  ``--runs`` executions in one process. Target: dataflow < 0.5 s.
* ``cold``: a fresh process per run, timed from before ``import`` through ``count()``
  (interpreter start excluded; ``process_wall_s`` in the JSON includes it and the shutdown).
"""

from __future__ import annotations

import sys
import time

import benchcommon as bc


def identity(batch):
    return batch


def _raw_once(rows: int, blocks: int) -> int:
    import numpy as np

    edges = np.linspace(0, rows, blocks + 1).astype(np.int64)
    total = 0
    for k in range(blocks):
        batch = identity({"id": np.arange(edges[k], edges[k + 1], dtype=np.int64)})
        total += len(batch["id"])
    return total


def run_raw(a: dict) -> dict:
    t0 = time.perf_counter()
    import numpy  # noqa: F401

    if a["mode"] == "cold":
        count = _raw_once(a["rows"], a["blocks"])
        return {"times": [time.perf_counter() - t0], "count": count}
    times, count = bc.timed_runs(lambda: _raw_once(a["rows"], a["blocks"]), a["runs"])
    return {"times": times, "count": count}


def run_dataflow(a: dict) -> dict:
    t0 = time.perf_counter()
    dataflow = bc.maybe_init_dataflow()
    init_s = time.perf_counter() - t0

    def go() -> int:
        ds = dataflow.range(a["rows"], override_num_blocks=a["blocks"])
        return ds.map_batches(identity).count()

    if a["mode"] == "cold":
        count = go()
        times = [time.perf_counter() - t0]
    else:
        times, count = bc.timed_runs(go, a["runs"])
    bc.maybe_shutdown(dataflow)
    return {"times": times, "count": count, "init_s": init_s}


def run_ray(a: dict) -> dict:
    t0 = time.perf_counter()
    ray = bc.init_ray()
    init_s = time.perf_counter() - t0

    def go() -> int:
        ds = ray.data.range(a["rows"], override_num_blocks=a["blocks"])
        return ds.map_batches(identity).count()

    if a["mode"] == "cold":
        count = go()
        times = [time.perf_counter() - t0]
    else:
        times, count = bc.timed_runs(go, a["runs"])
    ray.shutdown()
    return {"times": times, "count": count, "init_s": init_s, "version": ray.__version__}


def run_daft(a: dict) -> dict:
    t0 = time.perf_counter()
    import daft
    from daft import DataType, col

    @daft.func.batch(return_dtype=DataType.int64())
    def ident(s):
        return identity(s)

    def go() -> int:
        df = daft.range(a["rows"], partitions=a["blocks"]).select(ident(col("id")).alias("x"))
        return df.agg(col("x").count()).to_pydict()["x"][0]

    if a["mode"] == "cold":
        count = go()
        times = [time.perf_counter() - t0]
    else:
        times, count = bc.timed_runs(go, a["runs"])
    return {"times": times, "count": count, "version": daft.__version__}


IMPLS = {"raw": run_raw, "dataflow": run_dataflow, "ray": run_ray, "daft": run_daft}


def main() -> int:
    if bc.is_worker():
        return bc.worker_main(IMPLS)
    import peers

    ap = bc.base_parser(__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--blocks", type=int, default=None, help="default 2000 (200 with --small)")
    ap.add_argument("--no-cold", action="store_true", help="skip the fresh-process runs")
    args = ap.parse_args()
    blocks = args.blocks or (200 if args.small else 2000)
    rows = args.rows if not args.small or args.rows != 2_000_000 else 200_000
    results = {}
    for side in bc.sides(args):
        print(f"[many_blocks] {side} warm ...", file=sys.stderr, flush=True)
        wargs = {"rows": rows, "blocks": blocks, "runs": args.runs, "mode": "warm"}
        res = peers.run_side(__file__, side, wargs, timeout=args.timeout)
        if res.get("times"):
            res["median_s"] = bc.median(res["times"])
            res["us_per_block"] = res["median_s"] / blocks * 1e6
            if res.get("count") != rows:
                res["warning"] = f"count {res.get('count')} != {rows}"
        if not args.no_cold and res.get("status") == "ok":
            cold_times, walls = [], []
            for _ in range(args.runs):
                print(f"[many_blocks] {side} cold ...", file=sys.stderr, flush=True)
                c = peers.run_side(__file__, side, dict(wargs, mode="cold"), timeout=args.timeout)
                if c.get("status") != "ok":
                    res["cold_error"] = c.get("error", c.get("status"))
                    break
                cold_times.append(c["times"][0])
                walls.append(c["process_wall_s"])
            res["cold_times"], res["cold_process_walls"] = cold_times, walls
            res["cold_median_s"] = bc.median(cold_times)
            res["cold_process_wall_median_s"] = bc.median(walls)
        results[side] = res
    bc.report("many_blocks", results, metric="median_s",
              target={"text": "dataflow warm < 0.5 s", "kind": "abs", "max": 0.5},
              extra={"rows": rows, "blocks": blocks, "runs": args.runs},
              columns=[("us/block", "us_per_block", ""), ("cold (import..count)", "cold_median_s", "s"),
                       ("cold process wall", "cold_process_wall_median_s", "s")],
              json_out=args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A few slow rows: work items (prompts, paths, configs) through a CPU-heavy row function.

Cases (``--cases``, default all), each ``--items`` items (default 16) whose function burns
``--ms`` milliseconds of CPU (default 200) in a pure-Python loop and returns a number:

    from_items:  dataflow.from_items(items).map(work).take_all()   (Ray: ray.data....)
    range:       dataflow.range(n).map(work).take_all()
    many:        dataflow.from_items(items * 8, a tenth of the work each).map(work).take_all():
                 small items bundled into tasks, to show that a slow function's tasks stay
                 short enough to keep both workers busy to the end

raw is ``multiprocessing.Pool(cpus).map(work, items)``, the floor on this machine (the work
split evenly over the cores). Every side's results are checked (the sum of the returned
values). dataflow's workers and Ray's cluster are started before the clock. Before this case
had a benchmark, 16 items of 200 ms took ~3.2 s on dataflow's 2 workers: the items were one
block (``from_items`` and ``range`` cut by bytes, ~1 MiB a block) and ran one after another;
Ray Data makes a block per item (up to 200) and runs them ~2 at a time.
"""

from __future__ import annotations

import sys
import time

import benchcommon as bc

CASES = ("from_items", "range", "many")


def _work(item: int, ms: float) -> int:
    end = time.thread_time() + ms / 1000
    x = 0
    while time.thread_time() < end:
        x += 1
    return item


def _plan(case: str, a: dict) -> tuple[list[int], float]:
    n, ms = a["items"], a["ms"]
    if case == "many":
        return list(range(n * 8)), ms / 10
    return list(range(n)), ms


def _measure(job, a: dict) -> dict:
    out = {}
    for case in a["cases"]:
        items, ms = _plan(case, a)
        job(case, items[:2], ms)  # untimed: imports, the first task on each worker
        times, total = bc.timed_runs(lambda case=case, items=items, ms=ms: job(case, items, ms), a["runs"])
        want = sum(items)
        out[case] = {"times": times, "status": "ok" if total == want else f"PROBLEM: {total} != {want}"}
    return out


def _row_job(data):
    def job(case: str, items: list[int], ms: float) -> int:
        def work(row):
            return {"v": _work(row["id"] if "id" in row else row["item"], ms)}

        ds = data.range(len(items)) if case == "range" else data.from_items(items)
        return sum(r["v"] for r in ds.map(work).take_all())

    return job


def run_raw(a: dict) -> dict:
    import functools
    import multiprocessing
    import os

    with multiprocessing.get_context("fork").Pool(os.cpu_count()) as pool:
        def job(case: str, items: list[int], ms: float) -> int:
            return sum(pool.map(functools.partial(_work, ms=ms), items, chunksize=1))

        return {"cases": _measure(job, a)}


def run_dataflow(a: dict) -> dict:
    dataflow = bc.maybe_init_dataflow()
    bc.wait_for_dataflow_workers()
    out = _measure(_row_job(dataflow), a)
    bc.maybe_shutdown(dataflow)
    return {"cases": out}


def run_ray(a: dict) -> dict:
    ray = bc.init_ray()
    out = _measure(_row_job(ray.data), a)
    ray.shutdown()
    return {"cases": out, "version": ray.__version__}


IMPLS = {"raw": run_raw, "dataflow": run_dataflow, "ray": run_ray}


def main() -> int:
    if bc.is_worker():
        return bc.worker_main(IMPLS)
    import peers

    parser = bc.base_parser(__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--items", type=int, default=16)
    parser.add_argument("--ms", type=float, default=200.0)
    args = parser.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    wargs = {"cases": cases, "items": 4 if args.small else args.items, "ms": args.ms, "runs": args.runs}
    per_side = {}
    for side in bc.sides(args):
        if side == "daft":
            continue
        print(f"[slow_rows] {side} ...", file=sys.stderr, flush=True)
        per_side[side] = peers.run_side(__file__, side, wargs, timeout=args.timeout)
    table: dict[str, dict[str, dict]] = {}
    for case in cases:
        results = {}
        for side, res in per_side.items():
            one = dict(res.get("cases", {}).get(case, {})) or {"status": res.get("status", "no result")}
            if one.get("times"):
                one["median_s"] = bc.median(one["times"])
            results[side] = one
        table[case] = results
    bc.report_cases("slow_rows", table, extra={"items": wargs["items"], "ms": args.ms, "runs": args.runs},
                    json_out=args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

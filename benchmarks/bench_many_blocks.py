"""Per-task cost: 2,000 blocks, or 2,000 small Parquet files, one task each.

Cases (``--cases``, default all four); ``B`` = ``--blocks`` (2000; 200 with ``--small``):

* ``blocks``: a materialized dataset of B blocks of 1,000 rows (``range(B * 1000,
  override_num_blocks=B).materialize()``, built before the clock), then
  ``ds.map_batches(identity).count()``: one task per block.
* ``blocks_iter``: the same, drained to the driver with
  ``ds.map_batches(identity).iter_batches(batch_size=None, batch_format="pyarrow")``.
* ``files``: a folder of B Parquet files of 1,000 rows (``id`` int64, ``x`` float64, ~17 KB
  each; ``benchmarks/data/smallfiles<B>/``, generated once), then
  ``read_parquet(folder, override_num_blocks=B).map_batches(identity).count()``: one read task
  per file.
* ``bundled``: the old measurement, ``range(B * 1000, override_num_blocks=B)
  .map_batches(identity).count()`` with the engine's defaults: it bundles the small read tasks
  into a few tasks (printed in ``tasks``), so it measures per-block, not per-task, cost.

In the first three cases dataflow runs under ``dataflow.options(min_task_input_bytes=1)``:
blocks this small (8-17 KB) are otherwise bundled into ~4 MiB tasks. The dataflow side reads
the operators' ``tasks`` from ``ds._last_handle.stats()`` and **fails** when a case that must
run one task per block ran fewer than 90 % of B tasks (it would not measure what it says).

Per side, warm (engine started and one untimed run done, so the workers are up; median of
``--runs``): ``median_s``, ``tasks``, ``tasks/s`` (tasks / median_s), ``us/block``,
``driver CPU/task`` (``time.process_time()`` of the driver process, all its threads, around
the run / tasks), ``tree CPU/task`` (user+system CPU of the driver and every descendant process,
psutil, / tasks) and, for dataflow, ``task CPU/task`` (the operators' ``task_cpu_s`` / tasks).

    raw:      the same per-block function in a plain loop: over B pyarrow tables built before the
              clock (``blocks*``), ``pq.read_table`` per file (``files``), numpy slices
              (``bundled``). ``pool`` (the raw side's extra column) is the same work sent item by
              item to a ``multiprocessing`` pool of ``num_cpus`` forked processes
              (``imap_unordered``, chunksize 1): Python's own floor for one task per item.
    ray:      ray.data.range(...).materialize() / read_parquet(dir, override_num_blocks=B), then
              map_batches(identity, batch_size=None) (a block per call) and count()/iter_batches.
    daft:     daft.range(N, partitions=B).collect() / daft.read_parquet(glob), an identity
              @daft.func.batch UDF, then a count of its output (or to_arrow_iter()).

``--cold``: also one fresh process per run, timed from before ``import`` through the result
(setup included: materializing the blocks, listing the files). Target: >= 5,000 tasks/s
(<= 200 us per task) end to end on 2 cores for the one-task-per-block cases.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

import benchcommon as bc

ROWS_PER_BLOCK = 1000
UNBUNDLED = ("blocks", "blocks_iter", "files")
ALL_CASES = ("blocks", "blocks_iter", "files", "bundled")


def identity(batch):
    return batch


def ensure_files(n: int):
    """``n`` Parquet files of ROWS_PER_BLOCK rows under data/smallfiles<n>/ (once)."""
    import json

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = bc.DATA_DIR / f"smallfiles{n}"
    manifest = out / "_MANIFEST.json"
    want = {"files": n, "rows_per_file": ROWS_PER_BLOCK, "columns": ["id", "x"]}
    if manifest.exists() and json.loads(manifest.read_text()) == want:
        return out
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(11)
    for i in range(n):
        ids = np.arange(i * ROWS_PER_BLOCK, (i + 1) * ROWS_PER_BLOCK, dtype=np.int64)
        pq.write_table(pa.table({"id": ids, "x": rng.standard_normal(ROWS_PER_BLOCK)}),
                       out / f"part-{i:05d}.parquet")
    manifest.write_text(json.dumps(want))
    return out


def _files(folder: str) -> list[str]:
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".parquet"))


def _measure(go, a: dict, t_start: float) -> dict:
    """Run ``go`` (returns (rows, tasks or None, extra dict)) warm or cold; CPU per run."""

    def once():
        c0, tc0, t0 = time.process_time(), bc.tree_cpu_s(), time.perf_counter()
        rows, tasks, extra = go()
        wall = time.perf_counter() - t0
        c1, tc1 = time.process_time(), bc.tree_cpu_s()
        return {"wall": wall, "driver_cpu": c1 - c0,
                "tree_cpu": tc1 - tc0 if tc0 is not None and tc1 is not None else None,
                "rows": rows, "tasks": tasks, **extra}

    if a["mode"] == "cold":
        r = once()
        return {"times": [time.perf_counter() - t_start], "runs": [r], "count": r["rows"]}
    first = once()  # workers start, caches fill: not timed
    runs = [once() for _ in range(a["runs"])]
    return {"times": [r["wall"] for r in runs], "runs": runs, "first_s": first["wall"],
            "count": runs[-1]["rows"]}


# ---------------------------------------------------------------------------------------------- raw


def _raw_bundled(rows: int, blocks: int) -> int:
    import numpy as np

    edges = np.linspace(0, rows, blocks + 1).astype(np.int64)
    total = 0
    for k in range(blocks):
        batch = identity({"id": np.arange(edges[k], edges[k + 1], dtype=np.int64)})
        total += len(batch["id"])
    return total


def _pool_table(t) -> int:
    return identity(t).num_rows


def _pool_file(path: str) -> int:
    import pyarrow.parquet as pq

    return identity(pq.read_table(path)).num_rows


def run_raw(a: dict) -> dict:
    t_start = time.perf_counter()
    import multiprocessing

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    case, rows, blocks = a["case"], a["rows"], a["blocks"]
    tables = []
    if case in ("blocks", "blocks_iter"):
        edges = np.linspace(0, rows, blocks + 1).astype(np.int64)
        tables = [pa.table({"id": np.arange(edges[k], edges[k + 1], dtype=np.int64)}) for k in range(blocks)]

    def go():
        if case == "bundled":
            return _raw_bundled(rows, blocks), blocks, {}
        if case == "files":
            n = 0
            paths = _files(a["files"])
            for p in paths:
                n += identity(pq.read_table(p)).num_rows
            return n, len(paths), {}
        return sum(identity(t).num_rows for t in tables), len(tables), {}

    out = _measure(go, a, t_start)
    if a["mode"] == "warm" and case != "bundled":
        fn, items = (_pool_file, _files(a["files"])) if case == "files" else (_pool_table, tables)
        with multiprocessing.get_context("fork").Pool(a["num_cpus"]) as pool:
            sum(pool.imap_unordered(fn, items[:64], chunksize=1))  # warm-up
            pool_times = []
            for _ in range(a["runs"]):
                t0 = time.perf_counter()
                n = sum(pool.imap_unordered(fn, items, chunksize=1))
                pool_times.append(time.perf_counter() - t0)
        out["pool_times"], out["pool_count"] = pool_times, n
    return out


# ----------------------------------------------------------------------------------------- dataflow


def run_dataflow(a: dict) -> dict:
    t_start = time.perf_counter()
    import dataflow

    dataflow.init(num_cpus=a["num_cpus"])
    case, rows, blocks = a["case"], a["rows"], a["blocks"]
    # blocks of 8-17 KB are bundled into ~4 MiB tasks unless told otherwise
    unbundled = dataflow.options(min_task_input_bytes=1) if case in UNBUNDLED else contextlib.nullcontext()
    with unbundled:
        src = None
        if case in ("blocks", "blocks_iter"):
            src = dataflow.range(rows, override_num_blocks=blocks).materialize()
            if src.num_blocks() < 0.9 * blocks:
                raise RuntimeError(f"materialized {src.num_blocks()} blocks, asked for {blocks}: "
                                   "the input is bundled, this case would not measure one task per block")

        def go():
            if case == "bundled":
                ds = dataflow.range(rows, override_num_blocks=blocks).map_batches(identity)
            elif case == "files":
                ds = dataflow.read_parquet(a["files"], override_num_blocks=blocks).map_batches(identity)
            else:
                ds = src.map_batches(identity)
            if case == "blocks_iter":
                n = sum(b.num_rows for b in ds.iter_batches(batch_size=None, batch_format="pyarrow"))
            else:
                n = ds.count()
            st = ds._last_handle.stats()
            tasks = sum(op.tasks for op in st.operators)
            if case in UNBUNDLED and tasks < 0.9 * blocks:
                raise RuntimeError(f"case {case}: {tasks} tasks for {blocks} blocks; the engine bundled "
                                   "them, so this would not measure the cost of one task per block")
            return n, tasks, {"task_cpu": sum(op.task_cpu_s for op in st.operators),
                              "task_wall": sum(op.task_wall_s for op in st.operators),
                              "operators": [(op.name, op.tasks) for op in st.operators],
                              "stats_wall": st.wall_s}

        out = _measure(go, a, t_start)
    dataflow.shutdown()
    return out


# ---------------------------------------------------------------------------------------------- ray


def run_ray(a: dict) -> dict:
    t_start = time.perf_counter()
    ray = bc.init_ray()
    case, rows, blocks = a["case"], a["rows"], a["blocks"]
    src = ray.data.range(rows, override_num_blocks=blocks).materialize() if case in ("blocks", "blocks_iter") else None

    def go():
        if case == "bundled":
            return ray.data.range(rows, override_num_blocks=blocks).map_batches(identity).count(), None, {}
        if case == "files":
            ds = ray.data.read_parquet(a["files"], override_num_blocks=blocks)
        else:
            ds = src
        ds = ds.map_batches(identity, batch_size=None)
        if case == "blocks_iter":
            return sum(b.num_rows for b in ds.iter_batches(batch_size=None, batch_format="pyarrow")), None, {}
        return ds.count(), None, {}

    out = _measure(go, a, t_start)
    out["version"] = ray.__version__
    ray.shutdown()
    return out


# --------------------------------------------------------------------------------------------- daft


def run_daft(a: dict) -> dict:
    t_start = time.perf_counter()
    import daft
    from daft import DataType, col

    case, rows, blocks = a["case"], a["rows"], a["blocks"]

    @daft.func.batch(return_dtype=DataType.int64())
    def ident(s):
        return identity(s)

    src = daft.range(rows, partitions=blocks).collect() if case in ("blocks", "blocks_iter") else None

    def go():
        if case == "bundled":
            df = daft.range(rows, partitions=blocks)
        elif case == "files":
            df = daft.read_parquet(a["files"].rstrip("/") + "/*.parquet")
        else:
            df = src
        df = df.select(ident(col("id")).alias("x"))
        if case == "blocks_iter":
            return sum(b.num_rows for b in df.to_arrow_iter()), None, {}
        return df.agg(col("x").count()).to_pydict()["x"][0], None, {}

    out = _measure(go, a, t_start)
    out["version"] = daft.__version__
    return out


IMPLS = {"raw": run_raw, "dataflow": run_dataflow, "ray": run_ray, "daft": run_daft}


# ------------------------------------------------------------------------------------- orchestrator


def _summarise(res: dict, blocks: int, rows: int) -> None:
    runs = res.get("runs") or []
    if not res.get("times"):
        return
    res["median_s"] = bc.median(res["times"])
    res["us_per_block"] = res["median_s"] / blocks * 1e6
    tasks = runs[-1].get("tasks") if runs else None
    res["tasks"] = tasks
    if tasks:
        res["tasks_per_s"] = tasks / res["median_s"]
        res["driver_us_per_task"] = bc.median([r["driver_cpu"] for r in runs]) / tasks * 1e6
        tree = [r["tree_cpu"] for r in runs if r.get("tree_cpu") is not None]
        res["tree_us_per_task"] = bc.median(tree) / tasks * 1e6 if tree else None
        tc = [r["task_cpu"] for r in runs if r.get("task_cpu") is not None]
        res["task_cpu_us_per_task"] = bc.median(tc) / tasks * 1e6 if tc else None
    if res.get("pool_times"):
        res["pool_median_s"] = bc.median(res["pool_times"])
        res["pool_us_per_task"] = res["pool_median_s"] / blocks * 1e6
    if res.get("count") != rows:
        res["warning"] = f"count {res.get('count')} != {rows}"


def main() -> int:
    if bc.is_worker():
        return bc.worker_main(IMPLS)
    import peers

    ap = bc.base_parser(__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=None, help="blocks / files / tasks (default 2000; 200 with --small)")
    ap.add_argument("--cases", default=",".join(ALL_CASES), help=f"subset of {','.join(ALL_CASES)}")
    ap.add_argument("--num-cpus", type=int, default=os.cpu_count() or 2,
                    help="dataflow.init(num_cpus=...) and the raw pool's size")
    ap.add_argument("--cold", action="store_true", help="also time fresh processes (import -> result)")
    args = ap.parse_args()
    blocks = args.blocks or (200 if args.small else 2000)
    rows = blocks * ROWS_PER_BLOCK
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if bad := [c for c in cases if c not in ALL_CASES]:
        raise SystemExit(f"unknown cases {bad}")
    files = ensure_files(blocks) if "files" in cases else None
    if files:
        bc.warm_page_cache(files)
    out: dict[str, dict[str, dict]] = {}
    failed = []
    for case in cases:
        out[case] = {}
        for side in bc.sides(args):
            print(f"[many_blocks] {case} {side} ...", file=sys.stderr, flush=True)
            wargs = {"case": case, "rows": rows, "blocks": blocks, "runs": args.runs, "mode": "warm",
                     "files": str(files) if files else None, "num_cpus": args.num_cpus}
            res = peers.run_side(__file__, side, wargs, timeout=args.timeout)
            _summarise(res, blocks, rows)
            if side == "dataflow" and res.get("status") != "ok":
                failed.append(f"{case}: {bc.status_text(res)}")
            if args.cold and res.get("status") == "ok":
                cold = []
                for _ in range(args.runs):
                    c = peers.run_side(__file__, side, dict(wargs, mode="cold"), timeout=args.timeout)
                    if c.get("status") != "ok":
                        res["cold_error"] = c.get("error", c.get("status"))
                        break
                    cold.append(c["times"][0])
                res["cold_times"], res["cold_median_s"] = cold, bc.median(cold)
            out[case][side] = res
    target = {"text": ">= 5,000 tasks/s (<= 200 us per block, one task each)", "kind": "abs",
              "max": 200.0, "metric": "us_per_block"}
    targets = {c: target for c in cases if c in UNBUNDLED}
    if "bundled" in cases:
        targets["bundled"] = {"text": "warm < 0.5 s for the whole job", "kind": "abs", "max": 0.5,
                              "metric": "median_s"}
    notes = [f"dataflow per-run walls, {c}: " + ", ".join(f"{t:.3f}" for t in r["dataflow"]["times"])
             + f" (untimed first run {r['dataflow'].get('first_s', 0):.3f} s)"
             for c, r in out.items() if r.get("dataflow", {}).get("times")]
    notes += [f"FAILED dataflow {f}" for f in failed]
    bc.report_cases("many_blocks", out, metric="us_per_block", unit="n", targets=targets,
                    columns=[("median", "median_s", "s"), ("tasks", "tasks", "int"),
                             ("tasks/s", "tasks_per_s", "n"), ("driver CPU us/task", "driver_us_per_task", "n"),
                             ("tree CPU us/task", "tree_us_per_task", "n"),
                             ("task CPU us/task", "task_cpu_us_per_task", "n"),
                             ("raw pool us/task", "pool_us_per_task", "n"),
                             ("cold", "cold_median_s", "s")],
                    extra={"rows": rows, "blocks": blocks, "runs": args.runs, "num_cpus": args.num_cpus},
                    json_out=args.json_out, notes=notes)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

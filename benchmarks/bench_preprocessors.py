"""Preprocessors: fit + transform of a StandardScaler and a OneHotEncoder over N rows of Parquet.

The data (``benchmarks/data/prep<N>/``, generated once): N rows (default 2,000,000; 200,000
with ``--small``) in 8 files, four float64 columns ``a``-``d`` and a string column ``cat`` of 20
categories. Each side times, per run: reading the files, fitting both preprocessors (the means,
standard deviations and categories) and transforming every row, ending with the result in memory.

    raw:      pyarrow + numpy in one process: pq.read_table, column means and population stds
              with numpy, the scaled columns, the sorted categories and each row's code with
              pyarrow.compute (unique, index_in), a one-hot matrix built with numpy.
    dataflow: Chain(StandardScaler(a-d), OneHotEncoder(cat)).fit_transform(read_parquet(dir))
              .materialize()
    ray:      the same with ray.data and ray.data.preprocessors.

Median of ``--runs``; every side's result is checked (row count; the mean of the scaled ``a``
within 1e-6 of 0 and its variance of 1; exactly one 1 in each one-hot row): a wrong result is a
``PROBLEM:`` line and exit code 1. Target: dataflow <= 2x raw.
"""

from __future__ import annotations

import json
import sys
import time

import benchcommon as bc

FILES = 8
CATEGORIES = 20
NUMERIC = ["a", "b", "c", "d"]


def ensure_data(rows: int):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = bc.DATA_DIR / f"prep{rows}"
    manifest = out / "_MANIFEST.json"
    want = {"rows": rows, "files": FILES, "columns": [*NUMERIC, "cat"]}
    if manifest.exists() and json.loads(manifest.read_text()) == want:
        return out
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(5)
    per = rows // FILES
    for i in range(FILES):
        cols = {name: rng.normal(10 * k, k + 1, per) for k, name in enumerate(NUMERIC)}
        cols["cat"] = pa.array([f"c{v:02d}" for v in rng.integers(0, CATEGORIES, per)])
        pq.write_table(pa.table(cols), out / f"part-{i}.parquet")
    manifest.write_text(json.dumps(want))
    return out


def _check(a_values, one_hot_rows) -> dict:
    import numpy as np

    a = np.asarray(a_values, dtype=np.float64)
    return {"rows": len(a), "a_mean": float(a.mean()), "a_var": float(a.var()),
            "one_hot_ok": bool(one_hot_rows)}


def run_raw(args: dict) -> dict:
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    def go():
        table = pq.read_table(args["path"])
        out = {}
        for name in NUMERIC:
            x = table.column(name).to_numpy()
            out[name] = (x - x.mean()) / x.std()
        column = table.column("cat")
        cats = pc.unique(column).sort()
        codes = pc.index_in(column, cats).to_numpy()
        one_hot = np.zeros((len(codes), len(cats)), dtype=np.uint8)
        one_hot[np.arange(len(codes)), codes] = 1
        out["cat"] = one_hot
        return out

    times, out = bc.timed_runs(go, args["runs"])
    return {"times": times, **_check(out["a"], bool((out["cat"].sum(axis=1) == 1).all()))}


def run_dataflow(args: dict) -> dict:
    dataflow = bc.maybe_init_dataflow()
    from dataflow.preprocessors import Chain, OneHotEncoder, StandardScaler

    def go():
        chain = Chain(StandardScaler(NUMERIC), OneHotEncoder(["cat"]))
        return chain.fit_transform(dataflow.read_parquet(str(args["path"]))).materialize()

    times, ds = bc.timed_runs(go, args["runs"])
    table = ds.to_arrow()
    hot = table.column("cat").combine_chunks().flatten().to_numpy().reshape(table.num_rows, -1)
    bc.maybe_shutdown(dataflow)
    return {"times": times, **_check(table.column("a").to_numpy(), bool((hot.sum(axis=1) == 1).all()))}


def run_ray(args: dict) -> dict:
    ray = bc.init_ray()
    from ray.data.preprocessors import Chain, OneHotEncoder, StandardScaler

    def go():
        chain = Chain(StandardScaler(NUMERIC), OneHotEncoder(["cat"]))
        return chain.fit_transform(ray.data.read_parquet(str(args["path"]))).materialize()

    times, ds = bc.timed_runs(go, args["runs"])
    import numpy as np

    frame = ds.to_pandas()
    hot = np.stack([np.asarray(v) for v in frame["cat"]])
    result = {"times": times, "version": ray.__version__,
              **_check(frame["a"].to_numpy(), bool((hot.sum(axis=1) == 1).all()))}
    ray.shutdown()
    return result


IMPLS = {"raw": run_raw, "dataflow": run_dataflow, "ray": run_ray}


def main() -> int:
    if bc.is_worker():
        return bc.worker_main(IMPLS)
    import peers

    ap = bc.base_parser(__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=None, help="default 2,000,000 (200,000 with --small)")
    args = ap.parse_args()
    rows = args.rows or (200_000 if args.small else 2_000_000)
    path = ensure_data(rows)
    wargs = {"path": str(path), "runs": args.runs}
    results = {}
    for side in bc.sides(args):
        if side == "daft":
            results[side] = {"status": "not run (Daft has no preprocessors module)"}
            continue
        print(f"[preprocessors] {side} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        res = peers.run_side(__file__, side, wargs, timeout=args.timeout)
        res["process_s"] = time.perf_counter() - t0
        if res.get("times"):
            res["median_s"] = bc.median(res["times"])
            res["mrows_per_s"] = rows / 1e6 / res["median_s"]
            wrong = (res.get("rows") != rows or abs(res.get("a_mean", 1)) > 1e-6
                     or abs(res.get("a_var", 0) - 1) > 1e-6 or not res.get("one_hot_ok"))
            if wrong:
                res["warning"] = (f"wrong result: rows {res.get('rows')}, mean(a) {res.get('a_mean')}, "
                                  f"var(a) {res.get('a_var')}, one-hot rows ok {res.get('one_hot_ok')}")
        results[side] = res
    bc.report("preprocessors", results, metric="median_s",
              target={"text": "dataflow <= 2x raw numpy", "kind": "ratio", "max": 2.0, "baseline": "raw"},
              extra={"rows": rows, "runs": args.runs},
              columns=[("Mrows/s", "mrows_per_s", "")], json_out=args.json_out)
    problems = [f"PROBLEM: {side}: {res['warning']}" for side, res in results.items() if res.get("warning")]
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""Memory while a slow consumer drains the 1.3 GB dataset via iter_batches(batch_size=4096).

The consumer sleeps ``--sleep-ms`` (40) after every ``--sleep-every``-th (1st) batch, i.e. it is
slower than the reader, so an engine without backpressure buffers the dataset. The whole
process tree (the worker and every descendant: Ray's raylet/GCS/workers, dataflow's workers) is
sampled every ``--interval`` (0.25) s with psutil ``memory_full_info().pss`` from outside.
``--max-seconds`` caps the drain (the JSON says whether it was hit and how many rows were read).

    dataflow: dataflow.read_parquet(path).iter_batches(batch_size=4096, batch_format="numpy")
    ray:      ray.data.read_parquet(path).iter_batches(batch_size=4096, batch_format="numpy")
    daft:     daft.read_parquet(glob).into_batches(4096).to_arrow_iter(), each batch -> numpy
    raw:      one process, pq.ParquetFile.iter_batches(4096) file after file -> numpy

Reported per side (median over ``--runs`` fresh processes): ``peak_gb`` (max PSS sum, 1e9
bytes), ``steady_slope_mb_s`` (least-squares slope of PSS between the first batch and the end of
the drain), ``late_slope_mb_s`` (same over the second half of that window), and ``flat`` (the
late slope times the late window is below max(50 MB, 5 % of peak)). Target: dataflow peak < 0.8 GB.
"""

from __future__ import annotations

import sys
import time

import benchcommon as bc


def _consume(batches, a: dict, convert=None) -> dict:
    sleep_s, every, cap = a["sleep_ms"] / 1000.0, a["sleep_every"], a["max_seconds"]
    t_start = time.time()
    t_first = None
    rows = nb = sleeps = 0
    capped = False
    for b in batches:
        if convert is not None:
            b = convert(b)
        if t_first is None:
            t_first = time.time()
        rows += bc.batch_len(b)
        nb += 1
        if every and nb % every == 0:
            time.sleep(sleep_s)
            sleeps += 1
        if cap and time.time() - t_start > cap:
            capped = True
            break
    t_end = time.time()
    return {"rows": rows, "batches": nb, "sleeps": sleeps, "slept_s": sleeps * sleep_s,
            "capped": capped, "t_start": t_start, "t_first_batch": t_first, "t_end": t_end,
            "drain_s": t_end - t_start}


def run_raw(a: dict) -> dict:
    from pathlib import Path

    import pyarrow.parquet as pq

    files = sorted(Path(a["data"]).glob("*.parquet"))

    def gen():
        for f in files:
            yield from pq.ParquetFile(f).iter_batches(batch_size=a["batch_size"])

    return _consume(gen(), a, convert=bc.arrow_batch_to_numpy)


def run_dataflow(a: dict) -> dict:
    dataflow = bc.maybe_init_dataflow()
    ds = dataflow.read_parquet(a["data"])
    out = _consume(ds.iter_batches(batch_size=a["batch_size"], batch_format="numpy"), a)
    bc.maybe_shutdown(dataflow)
    return out


def run_ray(a: dict) -> dict:
    ray = bc.init_ray()
    ds = ray.data.read_parquet(a["data"])
    out = _consume(ds.iter_batches(batch_size=a["batch_size"], batch_format="numpy"), a)
    out["version"] = ray.__version__
    ray.shutdown()
    return out


def run_daft(a: dict) -> dict:
    import daft

    df = daft.read_parquet(a["data"].rstrip("/") + "/*.parquet").into_batches(a["batch_size"])
    out = _consume(df.to_arrow_iter(), a, convert=bc.arrow_batch_to_numpy)
    out["version"] = daft.__version__
    return out


IMPLS = {"raw": run_raw, "dataflow": run_dataflow, "ray": run_ray, "daft": run_daft}


def _slope(points: list[tuple[float, float]]) -> float | None:
    if len(points) < 3:
        return None
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (v - mv) for t, v in points) / den if den else None


def analyse(res: dict) -> dict:
    """Peak, slopes and flatness from one worker result carrying ``pss_samples``."""
    samples = res.get("pss_samples") or []
    if not samples:
        return {}
    t0 = res["t_spawn"]
    series = [(t, b / 1e6) for t, b, _ in samples]  # (s since spawn, MB)
    first = (res.get("t_first_batch") or t0) - t0
    end = res.get("t_end", t0) - t0
    steady = [(t, v) for t, v in series if first <= t <= end]
    mid = first + (end - first) / 2
    late = [(t, v) for t, v in steady if t >= mid]
    peak_mb = max(v for _, v in series)
    late_slope = _slope(late)
    flat = None
    if late_slope is not None:
        flat = abs(late_slope) * (end - mid) < max(50.0, 0.05 * peak_mb)
    return {"peak_gb": peak_mb / 1e3, "max_procs": max(n for _, _, n in samples),
            "steady_slope_mb_s": _slope(steady), "late_slope_mb_s": late_slope, "flat": flat,
            "steady_window_s": [round(first, 2), round(end, 2)],
            "series_mb": [(round(t, 2), round(v, 1)) for t, v in series]}


def main() -> int:
    if bc.is_worker():
        return bc.worker_main(IMPLS)
    import peers

    ap = bc.base_parser(__doc__.splitlines()[0])
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--sleep-ms", type=float, default=40.0)
    ap.add_argument("--sleep-every", type=int, default=1, help="sleep after every k-th batch")
    ap.add_argument("--max-seconds", type=float, default=300.0, help="cap on the drain (0 = none)")
    ap.add_argument("--interval", type=float, default=0.25, help="PSS sampling period (s)")
    args = ap.parse_args()
    data = bc.dataset(args)
    nbytes = bc.warm_page_cache(data)
    wargs = {"data": str(data), "batch_size": args.batch_size, "sleep_ms": args.sleep_ms,
             "sleep_every": args.sleep_every, "max_seconds": args.max_seconds}
    results = {}
    for side in bc.sides(args):
        runs = []
        for k in range(args.runs):
            print(f"[memory] {side} run {k + 1}/{args.runs} ...", file=sys.stderr, flush=True)
            r = peers.run_side(__file__, side, wargs, timeout=args.timeout, sample_pss=True,
                               interval=args.interval)
            if r.get("status") != "ok":
                break
            r.update(analyse(r))
            r.pop("pss_samples", None)
            runs.append(r)
        if not runs:
            r.pop("pss_samples", None)
            results[side] = r
            continue
        runs.sort(key=lambda x: x["peak_gb"])
        med = dict(runs[len(runs) // 2])  # the median-peak run, with its own series
        med["peak_gb_runs"] = [x["peak_gb"] for x in runs]
        med["peak_gb"] = bc.median(med["peak_gb_runs"])
        results[side] = med
    notes = [f"  {side}: flat={r.get('flat')} capped={r.get('capped')} batches={r.get('batches')} "
             f"slept {r.get('slept_s', 0):.1f} s, max processes {r.get('max_procs')}"
             for side, r in results.items() if r.get("status") == "ok"]
    bc.report("memory", results, metric="peak_gb", unit="GB",
              target={"text": "dataflow peak PSS < 0.8 GB", "kind": "abs", "max": 0.8,
                      "metric": "peak_gb"},
              extra={"dataset": str(data), "dataset_bytes": nbytes, "params": wargs,
                     "interval_s": args.interval, "runs": args.runs},
              columns=[("late slope", "late_slope_mb_s", "MB/s"),
                       ("drain", "drain_s", "s"), ("rows", "rows", "int")],
              json_out=args.json_out, notes=notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())

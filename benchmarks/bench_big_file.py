"""One big file per format, read and drained: time and the process tree's peak memory.

Data (generated once, deterministically, under ``benchmarks/data/bigfile/``, git-ignored; with
``--small`` a twentieth of each):

    csv     3,000,000 rows (int, float, two strings), ~237 MB
    json    2,000,000 rows of JSON Lines (the same columns), ~215 MB
    jsonarray  1,000,000 rows as one JSON array of objects (the same columns), ~105 MB
    text    3,000,000 lines of 12 words, ~205 MB
    npy     1,600,000 x 64 float32, ~410 MB

    dataflow: dataflow.read_<format>(file) drained as blocks (``iter_batches(batch_size=None)``)
    raw:      the library's own one-call read into memory: pyarrow.csv.read_csv / pyarrow.json.
              read_json (threaded: both cores), the file's text split into Arrow lines
              (``pc.split_pattern``), np.load; for a JSON array (which pyarrow cannot read)
              Python's json.load, then pa.Table.from_pylist
    ray:      ray.data.read_<format>(file) drained the same way
    daft:     daft.read_csv / read_json (no text or NumPy reader) drained with to_arrow_iter()

``--formats`` picks them (default: csv,json,text,npy; ``jsonarray`` on request).

Each side runs in its own process, one untimed run first, then ``--runs`` timed ones (median);
``peak RSS+shm`` is the process tree's peak over the timed runs (``benchcommon.TreeMemorySampler``:
RSS of the process and its children plus the dataflow session's shared memory). A file well over
a read task's bytes is read by dataflow as byte ranges (rows for ``.npy``), one task each, every
task streaming ~16 MiB blocks; Ray reads each file in one task.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import benchcommon as bc

FORMATS = {"csv": ("big.csv", 3_000_000), "json": ("big.jsonl", 2_000_000), "text": ("big.txt", 3_000_000),
           "npy": ("big.npy", 1_600_000), "jsonarray": ("big.json", 1_000_000)}
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]


def ensure_file(fmt: str, small: bool) -> tuple[Path, int]:
    """The file for ``fmt`` (written once) and its row count."""
    import numpy as np
    import pyarrow as pa

    name, rows = FORMATS[fmt]
    rows = rows // 20 if small else rows
    folder = bc.DATA_DIR / ("bigfile-small" if small else "bigfile")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    done = folder / (name + ".done")
    if done.exists() and done.read_text() == str(rows):
        return path, rows
    rng = np.random.default_rng(5)
    if fmt == "npy":
        np.save(path, rng.standard_normal((rows, 64), dtype=np.float32))
    elif fmt == "text":
        picks = np.array(WORDS)[rng.integers(0, len(WORDS), (rows, 12))]
        path.write_text("\n".join(" ".join(line) for line in picks) + "\n")
    else:
        table = pa.table({"i64": rng.integers(0, 1 << 40, rows), "f64": rng.standard_normal(rows),
                          "short": np.array(WORDS)[rng.integers(0, len(WORDS), rows)],
                          "text": [f"row {i} text with some words {i * 7 % 1000}" for i in range(rows)]})
        if fmt == "csv":
            import pyarrow.csv as pacsv

            pacsv.write_csv(table, path)
        elif fmt == "jsonarray":
            import polars as pl

            pl.from_arrow(table).write_json(path)  # [{...},{...},...]
        else:
            import polars as pl

            pl.from_arrow(table).write_ndjson(path)
    done.write_text(str(rows))
    return path, rows


def _measured(fn, runs: int) -> dict:
    fn()  # untimed: imports, workers, the page cache
    with bc.TreeMemorySampler() as mem:
        times, rows = bc.timed_runs(fn, runs)
    return {"times": times, "rows": rows, **mem.peaks()}


def run_raw(a: dict) -> dict:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv
    import pyarrow.json as pajson

    path, fmt = a["path"], a["format"]

    def read() -> int:
        if fmt == "csv":
            return pacsv.read_csv(path).num_rows
        if fmt == "json":
            return pajson.read_json(path).num_rows
        if fmt == "jsonarray":
            import json

            with open(path, "rb") as f:
                return pa.Table.from_pylist(json.load(f)).num_rows
        if fmt == "npy":
            return len(np.load(path))
        data = Path(path).read_bytes()
        lines = pc.split_pattern(pa.array([data], pa.large_binary()).cast(pa.large_string()), "\n").flatten()
        return len(lines) - 1  # (the empty string after the last newline)

    return _measured(read, a["runs"])


def run_dataflow(a: dict) -> dict:
    dataflow = bc.maybe_init_dataflow()
    reader = {"csv": dataflow.read_csv, "json": dataflow.read_json, "text": dataflow.read_text,
              "npy": dataflow.read_numpy, "jsonarray": dataflow.read_json}[a["format"]]

    def drain() -> int:
        ds = reader(a["path"])
        return sum(b.num_rows for b in ds.iter_batches(batch_size=None, batch_format="pyarrow"))

    out = _measured(drain, a["runs"])
    ds = reader(a["path"])
    ds.materialize()
    out["tasks"] = sum(op.tasks for op in ds._last_stats.operators)
    bc.maybe_shutdown(dataflow)
    return out


def run_ray(a: dict) -> dict:
    ray = bc.init_ray()
    reader = {"csv": ray.data.read_csv, "json": ray.data.read_json, "text": ray.data.read_text,
              "npy": ray.data.read_numpy, "jsonarray": ray.data.read_json}[a["format"]]

    def drain() -> int:
        ds = reader(a["path"])
        return sum(len(b) for b in ds.iter_batches(batch_size=None, batch_format="pyarrow"))

    out = _measured(drain, a["runs"])
    ray.shutdown()
    return {**out, "version": ray.__version__}


def run_daft(a: dict) -> dict:
    import daft

    if a["format"] not in ("csv", "json", "jsonarray"):
        return {"not_run": "not run: Daft has no such reader"}
    reader = daft.read_csv if a["format"] == "csv" else daft.read_json

    def drain() -> int:
        return sum(b.num_rows for b in reader(a["path"]).to_arrow_iter())

    return {**_measured(drain, a["runs"]), "version": daft.__version__}


IMPLS = {"raw": run_raw, "dataflow": run_dataflow, "ray": run_ray, "daft": run_daft}


def main() -> int:
    if bc.is_worker():
        return bc.worker_main(IMPLS)
    import peers

    ap = bc.base_parser(__doc__.splitlines()[0])
    ap.add_argument("--formats", default="csv,json,text,npy")
    args = ap.parse_args()
    for fmt in [f for f in args.formats.split(",") if f]:
        path, rows = ensure_file(fmt, args.small)
        nbytes = len(path.read_bytes())  # (warms the page cache too)
        wargs = {"path": str(path), "runs": args.runs, "format": fmt}
        results = {}
        for side in bc.sides(args):
            print(f"[big_file {fmt}] {side} ...", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            res = peers.run_side(__file__, side, wargs, timeout=args.timeout)
            res["process_s"] = time.perf_counter() - t0
            if res.get("not_run"):
                res["status"] = res["not_run"]
            if res.get("times"):
                res["median_s"] = bc.median(res["times"])
                res["mb_per_s"] = nbytes / 1e6 / res["median_s"]
                if res.get("rows") != rows:
                    res["status"] = f"PROBLEM: {res.get('rows')} rows, the file has {rows}"
                res["peak_gb"] = res.get("peak_rss_shm_bytes", 0) / 1e9
            results[side] = res
        bc.report(f"big_file_{fmt}", results, metric="median_s",
                  extra={"file": str(path), "file_bytes": nbytes, "runs": args.runs},
                  columns=[("rows", "rows", "int"), ("MB/s", "mb_per_s", ""), ("peak RSS+shm GB", "peak_gb", ""),
                           ("tasks", "tasks", "int")],
                  json_out=args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

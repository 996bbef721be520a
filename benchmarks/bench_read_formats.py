"""CSV and JSON Lines read throughput: dataflow.read_csv / read_json against pyarrow directly.

Data (generated once, deterministically, under ``benchmarks/data/``, git-ignored): the columns
``i64, f64, f32, short, text`` of the tabular set (``datagen.py``; ``emb`` left out), written as

    csv3m    3,000,000 rows in 16 CSV files (about 330 MB)
    json2m   2,000,000 rows in 16 JSON Lines files (about 300 MB)

(``--small``: 30,000 / 20,000 rows in 4 files each.)

    dataflow: dataflow.read_csv(dir) / read_json(dir) drained as pyarrow blocks
    ray:      ray.data.read_csv(dir) / read_json(dir) drained as pyarrow batches
    daft:     daft.read_csv(glob) / read_json(glob) drained with to_arrow_iter()
    raw:      pyarrow.csv.read_csv / pyarrow.json.read_json on each file in turn, in one process
              (pyarrow parses each file with its own thread pool: both cores busy)

The page cache is warmed first; the median of ``--runs`` drains is reported, in MB/s of files.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import benchcommon as bc

FORMATS = {"csv": ("csv3m", 3_000_000, ".csv"), "json": ("json2m", 2_000_000, ".jsonl")}
FILES = 16


def _files(folder: str, suffix: str) -> list[str]:
    return sorted(str(p) for p in Path(folder).glob(f"*{suffix}"))


def ensure_data(fmt: str, small: bool) -> Path:
    """Write the dataset for ``fmt`` if its manifest is missing; return its folder."""
    import json

    import pyarrow.parquet as pq

    name, rows, suffix = FORMATS[fmt]
    files = FILES
    if small:
        name, rows, files = name + "-small", rows // 100, 4
    out = bc.DATA_DIR / name
    manifest = out / "_MANIFEST.json"
    want = {"format": fmt, "rows": rows, "files": files, "source": "parquet4m i64,f64,f32,short,text"}
    if manifest.exists() and json.loads(manifest.read_text()) == want:
        return out
    source = bc.dataset(bc.base_parser("").parse_args(["--small"] if small else []))
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"*{suffix}"):
        old.unlink()
    table = pq.read_table(source, columns=["i64", "f64", "f32", "short", "text"]).slice(0, rows)
    step = -(-rows // files)
    for i in range(files):
        part = table.slice(i * step, step)
        path = out / f"part-{i:03d}{suffix}"
        if fmt == "csv":
            import pyarrow.csv as pacsv

            pacsv.write_csv(part, path)
        else:
            part.to_pandas().to_json(path, orient="records", lines=True)
    manifest.write_text(json.dumps(want))
    return out


def run_raw(a: dict) -> dict:
    import pyarrow.csv as pacsv
    import pyarrow.json as pajson

    read = pacsv.read_csv if a["format"] == "csv" else pajson.read_json
    files = _files(a["data"], a["suffix"])
    times, rows = bc.timed_runs(lambda: sum(read(f).num_rows for f in files), a["runs"])
    return {"times": times, "rows": rows}


def run_dataflow(a: dict) -> dict:
    t0 = time.perf_counter()
    dataflow = bc.maybe_init_dataflow()
    init_s = time.perf_counter() - t0
    read = dataflow.read_csv if a["format"] == "csv" else dataflow.read_json

    def drain() -> int:
        ds = read(a["data"], file_extensions=[a["suffix"]])
        return sum(b.num_rows for b in ds.iter_batches(batch_size=None, batch_format="pyarrow"))

    times, rows = bc.timed_runs(drain, a["runs"])
    bc.maybe_shutdown(dataflow)
    return {"times": times, "rows": rows, "init_s": init_s}


def run_ray(a: dict) -> dict:
    ray = bc.init_ray()
    read = ray.data.read_csv if a["format"] == "csv" else ray.data.read_json

    def drain() -> int:
        ds = read(a["data"], file_extensions=[a["suffix"].lstrip(".")])
        return sum(len(b) for b in ds.iter_batches(batch_size=None, batch_format="pyarrow"))

    times, rows = bc.timed_runs(drain, a["runs"])
    ray.shutdown()
    return {"times": times, "rows": rows, "version": ray.__version__}


def run_daft(a: dict) -> dict:
    import daft

    read = daft.read_csv if a["format"] == "csv" else daft.read_json

    def drain() -> int:
        df = read(a["data"].rstrip("/") + "/*" + a["suffix"])
        return sum(b.num_rows for b in df.to_arrow_iter())

    times, rows = bc.timed_runs(drain, a["runs"])
    return {"times": times, "rows": rows, "version": daft.__version__}


IMPLS = {"raw": run_raw, "dataflow": run_dataflow, "ray": run_ray, "daft": run_daft}


def main() -> int:
    if bc.is_worker():
        return bc.worker_main(IMPLS)
    import peers

    ap = bc.base_parser(__doc__.splitlines()[0])
    ap.add_argument("--formats", default="csv,json")
    args = ap.parse_args()
    for fmt in [f for f in args.formats.split(",") if f]:
        data = ensure_data(fmt, args.small)
        suffix = FORMATS[fmt][2]
        nbytes = 0
        for path in _files(str(data), suffix):
            nbytes += len(Path(path).read_bytes())  # warms the page cache too
        wargs = {"data": str(data), "runs": args.runs, "format": fmt, "suffix": suffix}
        results = {}
        for side in bc.sides(args):
            print(f"[read_{fmt}] {side} ...", file=sys.stderr, flush=True)
            res = peers.run_side(__file__, side, wargs, timeout=args.timeout)
            if res.get("times"):
                res["median_s"] = bc.median(res["times"])
                res["mb_per_s"] = nbytes / 1e6 / res["median_s"]
            results[side] = res
        bc.report(f"read_{fmt}", results, metric="median_s",
                  extra={"dataset": str(data), "dataset_bytes": nbytes, "runs": args.runs},
                  columns=[("rows", "rows", "int"), ("MB/s (files)", "mb_per_s", "")],
                  json_out=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())

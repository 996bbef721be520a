"""Training ingest: Parquet -> normalize the 64-float column -> torch batches -> a trivial step.

    dataflow: read_parquet(path, columns=["emb"]).map_batches(normalize)
              .iter_torch_batches(batch_size=B) drained by step(batch["emb"])
    ray:      the same pipeline with ray.data (needs torch in Ray's venv)
    daft:     not comparable without torch in Daft's venv (reported as not run)
    raw:      1 process: pq.ParquetFile(f).iter_batches(B, columns=["emb"]) -> numpy (flatten +
              reshape) -> normalize -> torch.from_numpy -> step

normalize scales each row to unit L2 norm (numpy); step is ``x.sum()`` (a stand-in for a
training step that costs nothing, so this measures the ingest path only). B = 1024. The page
cache is warmed first; engines are started and torch is imported before the timed runs.
Target: dataflow <= 1.2x raw.
"""

from __future__ import annotations

import sys
import time

import benchcommon as bc


def _files(path: str) -> list[str]:
    from pathlib import Path

    return sorted(str(p) for p in Path(path).glob("*.parquet"))


def normalize(batch: dict) -> dict:
    import numpy as np

    emb = batch["emb"]
    if emb.dtype == object:  # Ray Data gives a list column as an array of 1-d arrays (dataflow: 2-d)
        emb = np.stack(emb)
    return {"emb": emb / np.linalg.norm(emb, axis=1, keepdims=True)}


def run_raw(a: dict) -> dict:
    import pyarrow.parquet as pq
    import torch

    def drain() -> int:
        rows, total = 0, 0.0
        for f in _files(a["data"]):
            for batch in pq.ParquetFile(f).iter_batches(batch_size=a["batch_size"], columns=["emb"]):
                emb = normalize(bc.arrow_batch_to_numpy(batch))["emb"]
                x = torch.from_numpy(emb)
                total += float(x.sum())
                rows += len(x)
        return rows

    times, rows = bc.timed_runs(drain, a["runs"])
    return {"times": times, "rows": rows, "procs": 1}


def run_dataflow(a: dict) -> dict:
    import torch  # noqa: F401  (as on the raw side: the import is not part of the timed work)

    t0 = time.perf_counter()
    dataflow = bc.maybe_init_dataflow()
    init_s = time.perf_counter() - t0

    def drain() -> int:
        ds = dataflow.read_parquet(a["data"], columns=["emb"]).map_batches(normalize)
        rows, total = 0, 0.0
        for batch in ds.iter_torch_batches(batch_size=a["batch_size"]):
            total += float(batch["emb"].sum())
            rows += len(batch["emb"])
        return rows

    times, rows = bc.timed_runs(drain, a["runs"])
    bc.maybe_shutdown(dataflow)
    return {"times": times, "rows": rows, "init_s": init_s}


def run_ray(a: dict) -> dict:
    try:
        import torch  # noqa: F401
    except ImportError:
        return bc.no_torch("ray")
    ray = bc.init_ray()

    def drain() -> int:
        ds = ray.data.read_parquet(a["data"], columns=["emb"]).map_batches(normalize)
        rows = 0
        for batch in ds.iter_torch_batches(batch_size=a["batch_size"]):
            float(batch["emb"].sum())
            rows += len(batch["emb"])
        return rows

    times, rows = bc.timed_runs(drain, a["runs"])
    ray.shutdown()
    return {"times": times, "rows": rows, "version": ray.__version__}


def run_daft(a: dict) -> dict:
    return bc.no_torch("daft")


IMPLS = {"raw": run_raw, "dataflow": run_dataflow, "ray": run_ray, "daft": run_daft}


def main() -> int:
    if bc.is_worker():
        return bc.worker_main(IMPLS)

    ap = bc.base_parser(__doc__.splitlines()[0])
    ap.add_argument("--batch-size", type=int, default=1024)
    args = ap.parse_args()
    data = bc.dataset(args)
    bc.warm_page_cache(data)
    wargs = {"data": str(data), "runs": args.runs, "batch_size": args.batch_size}
    results = bc.run_timed_sides("torch_ingest", __file__, args, wargs, "mrows_per_s", 1e6)
    bc.report("torch_ingest", results, metric="median_s",
              target={"text": "dataflow <= 1.2x raw", "kind": "ratio", "max": 1.2, "baseline": "raw"},
              extra={"dataset": str(data), "batch_size": args.batch_size, "runs": args.runs},
              columns=[("Mrows/s", "mrows_per_s", "")], json_out=args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

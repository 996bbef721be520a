"""Image training ingest: 20,000 32x32x3 uint8 images (raw bytes in Parquet) -> decode, normalize,
flip -> torch batches -> a small convolution step.

    dataflow: read_parquet(path, columns=["image", "label"]).map_batches(preprocess, batch_size=1000)
              .iter_torch_batches(batch_size=B) -> step(batch["image"])
    ray:      the same pipeline with ray.data (needs torch in Ray's venv)
    daft:     not comparable without torch in Daft's venv (reported as not run)
    raw:      1 process: pq.ParquetFile(f).iter_batches(B) -> preprocess -> torch.from_numpy -> step

preprocess: bytes -> uint8 (N, 32, 32, 3) (np.frombuffer over the joined bytes), to float32 in
[0, 1], per-channel mean/std normalization, horizontal flip, HWC -> CHW (contiguous).
step: conv2d(3 -> 16, 3x3) + ReLU + mean under ``torch.no_grad`` (a stand-in for a small model).
B = 256. Target: dataflow <= 1.1x raw.
"""

from __future__ import annotations

import sys
import time

import benchcommon as bc

IMAGES = bc.DATA_DIR / "images20k"
MEAN = (0.5, 0.5, 0.5)
STD = (0.25, 0.25, 0.25)


def _files(path: str) -> list[str]:
    from pathlib import Path

    return sorted(str(p) for p in Path(path).glob("*.parquet"))


def preprocess(batch: dict) -> dict:
    import numpy as np

    images = batch["image"]
    raw = np.frombuffer(b"".join(images), dtype=np.uint8).reshape(len(images), 32, 32, 3)
    x = raw.astype(np.float32) * np.float32(1 / 255)
    x = (x - np.array(MEAN, np.float32)) / np.array(STD, np.float32)
    x = np.ascontiguousarray(x[:, :, ::-1, :].transpose(0, 3, 1, 2))  # flip width, HWC -> CHW
    return {"image": x, "label": np.asarray(batch["label"])}


class Step:
    def __init__(self) -> None:
        import torch

        torch.manual_seed(0)
        self.torch = torch
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)

    def __call__(self, x) -> float:
        with self.torch.no_grad():
            return float(self.torch.relu(self.conv(x)).mean())


def run_raw(a: dict) -> dict:
    import pyarrow.parquet as pq
    import torch

    step = Step()

    def drain() -> int:
        rows = 0
        for f in _files(a["data"]):
            for batch in pq.ParquetFile(f).iter_batches(batch_size=a["batch_size"], columns=["image", "label"]):
                out = preprocess({"image": batch.column(0).to_numpy(zero_copy_only=False),
                                  "label": batch.column(1).to_numpy()})
                step(torch.from_numpy(out["image"]))
                rows += len(out["label"])
        return rows

    times, rows = bc.timed_runs(drain, a["runs"])
    return {"times": times, "rows": rows, "procs": 1}


def run_dataflow(a: dict) -> dict:
    t0 = time.perf_counter()
    dataflow = bc.maybe_init_dataflow()
    init_s = time.perf_counter() - t0
    step = Step()

    def drain() -> int:
        ds = dataflow.read_parquet(a["data"], columns=["image", "label"]).map_batches(preprocess, batch_size=1000)
        rows = 0
        for batch in ds.iter_torch_batches(batch_size=a["batch_size"]):
            step(batch["image"])
            rows += len(batch["label"])
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
    step = Step()

    def drain() -> int:
        ds = ray.data.read_parquet(a["data"], columns=["image", "label"]).map_batches(preprocess, batch_size=1000)
        rows = 0
        for batch in ds.iter_torch_batches(batch_size=a["batch_size"]):
            step(batch["image"])
            rows += len(batch["label"])
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
    ap.add_argument("--batch-size", type=int, default=256)
    args = ap.parse_args()
    data = args.data or IMAGES
    if not data.exists():
        raise SystemExit(f"{data} is missing: generate it with benchmarks/datagen.py")
    bc.warm_page_cache(data)
    wargs = {"data": str(data), "runs": args.runs, "batch_size": args.batch_size}
    results = bc.run_timed_sides("images", __file__, args, wargs, "images_per_s", 1)
    bc.report("images", results, metric="median_s",
              target={"text": "dataflow <= 1.1x raw", "kind": "ratio", "max": 1.1, "baseline": "raw"},
              extra={"dataset": str(data), "batch_size": args.batch_size, "runs": args.runs},
              columns=[("images/s", "images_per_s", "int")], json_out=args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""GPU: batch inference and training ingest with the model on CUDA (run where a GPU exists).

    inference, dataflow: read_parquet(path, columns=["i64", "emb"]).map_batches(Model, num_gpus=1,
                         concurrency=1, batch_size=B).count()  (the model lives on the actor's GPU)
    inference, raw:      1 process: pq.ParquetFile(f).iter_batches(B) -> torch.from_numpy ->
                         .to(device) -> model -> .cpu()
    ingest, dataflow:    read_parquet(path, columns=["emb"]).iter_torch_batches(batch_size=B,
                         device=DEVICE) -> one SGD step of the model on each batch
    ingest, raw:         1 process: pq iter_batches(B) -> torch.from_numpy -> pin_memory ->
                         .to(device, non_blocking=True) -> the same step

The model is an MLP 64 -> 1024 -> 1024 -> 10 (big enough that the GPU has work). For each side
the script reports rows/s and the GPU's utilisation while that side ran (``nvidia-smi`` sampled
every 200 ms: mean and max, in %). ``--device cpu`` runs everything on the CPU: a dry run of the
script where there is no GPU (its figures say nothing about GPUs). Ray Data and Daft are not run
(no torch in their venvs). B = 8192 (inference), 1024 (ingest).
"""

from __future__ import annotations

import subprocess
import sys
import threading

import benchcommon as bc

DIM = 64


def _files(path: str) -> list[str]:
    from pathlib import Path

    return sorted(str(p) for p in Path(path).glob("*.parquet"))


def _model(device: str):
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(DIM, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                              torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    return net.to(device)


class Scorer:
    """The inference UDF: built once per actor, on the GPU the actor was given."""

    def __init__(self, device: str) -> None:
        import torch

        self.torch = torch
        self.device = device
        self.model = _model(device).eval()

    def __call__(self, batch: dict) -> dict:
        with self.torch.inference_mode():
            x = self.torch.as_tensor(batch["emb"]).to(self.device, non_blocking=True)
            scores = self.model(x).argmax(dim=1).cpu().numpy()
        return {"i64": batch["i64"], "label": scores}


class Trainer:
    """One SGD step per batch; the loss is read back every 50 steps (as a loop would log it)."""

    def __init__(self, device: str) -> None:
        import torch

        self.torch = torch
        self.model = _model(device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.steps = 0

    def step(self, x) -> None:
        loss = self.model(x).pow(2).mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.steps += 1
        if self.steps % 50 == 0:
            float(loss)

    def sync(self) -> None:
        if self.torch.cuda.is_available():
            self.torch.cuda.synchronize()


class GpuSampler:
    """Samples ``nvidia-smi`` utilisation every 200 ms while running; None where it is absent."""

    def __init__(self) -> None:
        self.samples: list[int] = []
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuSampler:
        try:
            self._proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "200"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except FileNotFoundError:
            return self
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            first = line.strip().split(",")[0].strip()
            if first.isdigit():
                self.samples.append(int(first))

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(5)
        if self._thread is not None:
            self._thread.join(5)

    def summary(self) -> dict:
        if not self.samples:
            return {"gpu_util_mean": None, "gpu_util_max": None}
        return {"gpu_util_mean": sum(self.samples) / len(self.samples), "gpu_util_max": max(self.samples)}


def _check_device(device: str) -> str | None:
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        return f"not run: device {device!r} asked for but torch sees no CUDA device (use --device cpu for a dry run)"
    return None


def run_raw(a: dict) -> dict:
    import pyarrow.parquet as pq
    import torch

    problem = _check_device(a["device"])
    if problem:
        return {"not_run": problem}
    device, files = a["device"], _files(a["data"])
    if a["workload"] == "inference":
        scorer = Scorer(device)

        def job() -> int:
            rows = 0
            for f in files:
                for batch in pq.ParquetFile(f).iter_batches(batch_size=a["batch_size"], columns=["i64", "emb"]):
                    rows += len(scorer(bc.arrow_batch_to_numpy(batch))["label"])
            return rows
    else:
        trainer = Trainer(device)
        pin = device.startswith("cuda")

        def job() -> int:
            rows = 0
            for f in files:
                for batch in pq.ParquetFile(f).iter_batches(batch_size=a["batch_size"], columns=["emb"]):
                    x = torch.from_numpy(bc.arrow_batch_to_numpy(batch)["emb"])
                    x = (x.pin_memory() if pin else x).to(device, non_blocking=True)
                    trainer.step(x)
                    rows += len(x)
            trainer.sync()
            return rows

    with GpuSampler() as sampler:
        times, rows = bc.timed_runs(job, a["runs"])
    return {"times": times, "rows": rows, **sampler.summary()}


def run_dataflow(a: dict) -> dict:
    import torch  # noqa: F401  (as on the raw side: before the clock)

    problem = _check_device(a["device"])
    if problem:
        return {"not_run": problem}
    dataflow = bc.maybe_init_dataflow()
    device = a["device"]
    if a["workload"] == "inference":
        gpus = {"num_gpus": 1} if device.startswith("cuda") else {}

        def job() -> int:
            return dataflow.read_parquet(a["data"], columns=["i64", "emb"]).map_batches(
                Scorer, fn_constructor_kwargs={"device": "cuda" if gpus else device}, concurrency=1,
                batch_size=a["batch_size"], **gpus,
            ).count()
    else:
        trainer = Trainer(device)

        def job() -> int:
            rows = 0
            ds = dataflow.read_parquet(a["data"], columns=["emb"])
            for batch in ds.iter_torch_batches(batch_size=a["batch_size"], device=device):
                trainer.step(batch["emb"])
                rows += len(batch["emb"])
            trainer.sync()
            return rows

    with GpuSampler() as sampler:
        times, rows = bc.timed_runs(job, a["runs"])
    bc.maybe_shutdown(dataflow)
    return {"times": times, "rows": rows, **sampler.summary()}


def run_ray(a: dict) -> dict:
    return bc.no_torch("ray")


def run_daft(a: dict) -> dict:
    return bc.no_torch("daft")


IMPLS = {"raw": run_raw, "dataflow": run_dataflow, "ray": run_ray, "daft": run_daft}


def main() -> int:
    if bc.is_worker():
        return bc.worker_main(IMPLS)

    ap = bc.base_parser(__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu for a dry run")
    ap.add_argument("--workloads", default="inference,ingest")
    args = ap.parse_args()
    data = bc.dataset(args)
    bc.warm_page_cache(data)
    for workload in [w.strip() for w in args.workloads.split(",") if w.strip()]:
        batch_size = 8192 if workload == "inference" else 1024
        wargs = {"data": str(data), "runs": args.runs, "batch_size": batch_size, "device": args.device,
                 "workload": workload}
        results = bc.run_timed_sides(f"gpu_{workload}", __file__, args, wargs, "krows_per_s", 1e3)
        bc.report(f"gpu_{workload} ({args.device})", results, metric="median_s",
                  extra={"dataset": str(data), "batch_size": batch_size, "runs": args.runs, "device": args.device},
                  columns=[("krows/s", "krows_per_s", ""), ("GPU util mean %", "gpu_util_mean", ""),
                           ("GPU util max %", "gpu_util_max", "")], json_out=args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

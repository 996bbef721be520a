"""Batch inference with a torch model: Parquet in, an MLP on an actor pool, Parquet out.

    python -m dataflow.examples.batch_inference [--rows N] [--batch-size B] [--out DIR]
    python -m dataflow.examples.batch_inference --runner ray --address auto \
        --source s3://bucket/embeddings/ --out s3://bucket/scores/


The model is a callable class, so ``map_batches`` runs it on a pool of ``concurrency`` actors,
each constructing it once; every call gets ``batch_size`` rows (the last of a task may be
short) as numpy views of the block, turned into a tensor without a copy. With CUDA each actor
asks for ``num_gpus=1`` and gets its own GPU; without, it runs on the CPU.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import dataflow

DIM = 64


def generate(folder: str, rows: int, files: int = 4) -> None:
    """``files`` Parquet files with an ``id`` and a 64-float ``embedding`` column."""
    rng = np.random.default_rng(0)
    os.makedirs(folder, exist_ok=True)
    bounds = np.linspace(0, rows, files + 1).astype(int)
    for i in range(files):
        n = int(bounds[i + 1] - bounds[i])
        table = pa.table({
            "id": np.arange(bounds[i], bounds[i + 1], dtype=np.int64),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(n * DIM, dtype=np.float32)), DIM),
        })
        pq.write_table(table, os.path.join(folder, f"part-{i:03d}.parquet"), row_group_size=65_536)


class TorchModel:
    """An MLP 64 -> 256 -> 10, built (or, in real life, loaded) once per actor."""

    def __init__(self, seed: int = 0, threads: int = 1) -> None:
        import torch

        torch.set_num_threads(threads)  # one actor per core: no oversubscription
        torch.manual_seed(seed)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = torch.nn.Sequential(
            torch.nn.Linear(DIM, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
        ).to(self.device).eval()
        self.pid = os.getpid()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        from dataflow.torch_batches import tensor_view

        with torch.inference_mode():
            x = tensor_view(batch["embedding"]).to(self.device, non_blocking=True)  # no copy on the CPU
            scores = self.model(x).float().cpu().numpy()
        return {"id": batch["id"], "label": scores.argmax(axis=1), "scores": scores,
                "pid": np.full(len(scores), self.pid)}


def run(source: str, out: str, *, batch_size: int = 1024, concurrency: int = 2) -> int:
    """Score every row of ``source`` into ``out``; returns the rows written."""
    import torch

    gpus = 1 if torch.cuda.is_available() else None
    ds = dataflow.read_parquet(source).map_batches(
        TorchModel, batch_size=batch_size, concurrency=concurrency, num_gpus=gpus,
        fn_constructor_args=(0,), fn_constructor_kwargs={"threads": 1},
    )
    ds.write_parquet(out)
    return dataflow.read_parquet(out).count()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--out", default=None, help="output folder (default: a temporary one)")
    parser.add_argument("--source", default=None, help="input Parquet (default: generated)")
    parser.add_argument("--runner", default=None, choices=["streaming", "local", "ray"])
    parser.add_argument("--address", default=None, help='with --runner ray: "auto", "ray://host:10001"...')
    args = parser.parse_args()
    if args.runner is not None:
        dataflow.init(runner=args.runner, address=args.address)
    with tempfile.TemporaryDirectory() as tmp:
        source = args.source or os.path.join(tmp, "in")
        out = args.out or os.path.join(tmp, "out")
        if args.source is None:
            generate(source, args.rows)
        else:
            args.rows = dataflow.read_parquet(source).count()
        start = time.perf_counter()
        written = run(source, out, batch_size=args.batch_size)
        elapsed = time.perf_counter() - start
        assert written == args.rows, f"wrote {written} rows, expected {args.rows}"
        labels = dataflow.read_parquet(out, columns=["label"]).to_numpy("label")
        print(f"scored {written} rows in {elapsed:.2f} s ({written / elapsed:,.0f} rows/s); "
              f"label counts: {np.bincount(labels, minlength=10).tolist()}")
    dataflow.shutdown()


if __name__ == "__main__":
    main()

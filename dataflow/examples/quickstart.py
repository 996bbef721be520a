"""The quickstart pipeline, on data it generates: Parquet in, transforms, batches and Parquet out.

    python -m dataflow.examples.quickstart [--rows N] [--out DIR]

No cluster to start: the first consuming call starts worker processes for this script, and
they stop when it ends.
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


def generate(folder: str, rows: int, files: int = 8) -> None:
    rng = np.random.default_rng(0)
    per_file = rows // files
    for i in range(files):
        ids = np.arange(i * per_file, (i + 1) * per_file)
        table = pa.table(
            {
                "id": ids,
                "price": rng.gamma(2.0, 10.0, per_file),
                "category": rng.choice(["books", "games", "music", "tools"], per_file),
                "embedding": pa.FixedSizeListArray.from_arrays(
                    pa.array(rng.standard_normal(per_file * 16, dtype=np.float32)), 16
                ),
            }
        )
        pq.write_table(table, os.path.join(folder, f"part-{i:03d}.parquet"), row_group_size=50_000)


class Normalize:
    """A callable class: constructed once per actor, like a model."""

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        emb = batch["embedding"]
        batch["embedding"] = emb / np.linalg.norm(emb, axis=1, keepdims=True) * self.scale
        return batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--out", default=None, help="where to write the result (default: a temporary folder)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="dataflow-quickstart-") as tmp:
        source = os.path.join(tmp, "input")
        os.makedirs(source)
        generate(source, args.rows)
        out = args.out or os.path.join(tmp, "output")

        ds = (
            dataflow.read_parquet(source)
            .filter(expr=dataflow.col("price") > 5.0)
            .map(lambda row: {**row, "price_with_tax": row["price"] * 1.2})
            .map_batches(Normalize, fn_constructor_args=(2.0,), batch_size=4096, concurrency=2)
        )
        print(f"rows in the input (from Parquet footers, nothing read): {dataflow.read_parquet(source).count()}")
        start = time.perf_counter()
        rows = 0
        for batch in ds.iter_batches(batch_size=1024, batch_format="numpy"):
            rows += len(batch["id"])
        print(f"streamed {rows} rows in batches of 1024 in {time.perf_counter() - start:.2f} s")
        print(ds.stats())

        ds.write_parquet(out)
        written = dataflow.read_parquet(out)
        print(f"wrote {written.count()} rows to {out}; mean price with tax {written.mean('price_with_tax'):.2f}")
    dataflow.shutdown()


if __name__ == "__main__":
    main()

"""``map_batches(fn, batch_size=n)`` with a function: batches of n rows, as Ray gives them.

Tasks bundle blocks smaller than the batch until they hold n rows (a remainder only at a
task's end), whether the function runs after another operator or fused into the read; a read
task that does not say its rows (a CSV file) is bundled by bytes as before.
"""

from __future__ import annotations

import numpy as np

import dataflow


def _sizes(batch):
    return {"n": np.array([len(batch["id"])])}


def _shape(sizes: list[int], batch: int, rows: int) -> None:
    assert sum(sizes) == rows
    short = [n for n in sizes if n != batch]
    # at most one remainder per task, and a task has a full batch before it (as Ray's bundles)
    assert len(short) <= len(sizes) - len(short) + 1, sizes


def test_small_blocks_are_bundled_into_full_batches(mode):
    # read tasks of 10 rows, fused with the function: Ray gives [50, 50]; these were [10, 10, 20...]
    sizes = [r["n"] for r in dataflow.range(100, override_num_blocks=10).map_batches(_sizes, batch_size=50).take_all()]
    assert sorted(sizes) == [50, 50]
    after_map = dataflow.range(100, override_num_blocks=10).map(lambda r: r).map_batches(_sizes, batch_size=50)
    assert sorted(r["n"] for r in after_map.take_all()) == [50, 50]
    blocks = dataflow.range(1000, override_num_blocks=10).materialize()  # blocks of 100, an operator of their own
    _shape([r["n"] for r in blocks.map_batches(_sizes, batch_size=256).take_all()], 256, 1000)
    # blocks bigger than the batch: cut into batches
    _shape([r["n"] for r in blocks.map_batches(_sizes, batch_size=40).take_all()], 40, 1000)


def test_reads_that_do_not_say_their_rows_are_bundled_as_before(mode, tmp_path):
    for i in range(6):
        (tmp_path / f"{i}.csv").write_text("id\n" + "".join(f"{i * 10 + j}\n" for j in range(10)))
    ds = dataflow.read_csv(str(tmp_path)).map_batches(lambda b: {"id": b["id"], "n": np.full(len(b["id"]), len(b["id"]))},
                                                      batch_size=25)
    rows = ds.take_all()
    assert sorted(r["id"] for r in rows) == list(range(60))
    assert all(r["n"] <= 25 for r in rows)


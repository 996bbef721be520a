"""on_error="skip" inside a task: which rows are dropped, how often a batch function is called."""

from __future__ import annotations

import datetime
import json

import numpy as np
import pyarrow as pa

from engine import row_errors
from engine.transform import BlockTransform, Stage


def run(stage: Stage, table: pa.Table) -> tuple[list[dict], dict[str, int]]:
    log = row_errors.start(0)
    try:
        out = [r for t in BlockTransform([stage])([table]) for r in t.to_pylist()]
    finally:
        row_errors.stop()
    return out, log.counts


def test_bisection_costs_a_logarithmic_number_of_calls():
    calls = []

    def udf(batch):
        calls.append(len(batch["id"]))
        if {10, 700} & set(batch["id"].tolist()):
            raise ValueError("bad")
        return batch

    out, counts = run(Stage("b", "batches", udf, batch_size=1024, on_error="skip"), pa.table({"id": np.arange(1024)}))
    assert [r["id"] for r in out] == [i for i in range(1024) if i not in (10, 700)]  # order kept
    assert counts == {"ValueError": 2}
    assert len(calls) <= 4 * 10 + 1
    assert calls.count(1) == 4  # each bad row's sibling, and the bad rows themselves


def test_partial_outputs_of_a_failing_generator_are_not_kept():
    def udf(batch):
        yield {"id": batch["id"]}
        if 3 in batch["id"]:
            raise RuntimeError("late")

    out, counts = run(Stage("g", "batches", udf, on_error="skip"), pa.table({"id": np.arange(8)}))
    assert [r["id"] for r in out] == [0, 1, 2, 4, 5, 6, 7]
    assert counts == {"RuntimeError": 1}


def test_keyboard_interrupt_is_not_a_skipped_row():
    def udf(row):
        raise KeyboardInterrupt

    try:
        run(Stage("m", "rows", udf, on_error="skip"), pa.table({"id": [1]}))
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("KeyboardInterrupt was swallowed")


def test_row_json_writes_any_cell():
    row = {
        "vec": np.arange(3),
        "n": np.int64(4),
        "raw": b"\x00\x01",
        "when": datetime.datetime(2024, 1, 2, 3, 4, 5),
        "other": {1, 2},
    }
    assert json.loads(row_errors.row_json(row)) == {
        "vec": [0, 1, 2], "n": 4, "raw": "AAE=", "when": "2024-01-02T03:04:05", "other": "{1, 2}",
    }

"""The fused transform: row stages share one row pass, batches are exact, errors name the UDF."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from engine.transform import BlockTransform, Stage, UDFFailure


def blocks(*sizes):
    start = 0
    for n in sizes:
        yield pa.table({"id": np.arange(start, start + n)})
        start += n


def rows_of(tables):
    return [r for t in tables for r in t.to_pylist()]


def test_row_stages_fuse_map_filter_flat_map():
    t = BlockTransform(
        [
            Stage("m", "rows", lambda r: {"id": r["id"], "x": r["id"] * 2}),
            Stage("f", "rows", lambda r: r["id"] % 3 == 0, row_mode="filter"),
            Stage("fm", "rows", lambda r: [r, r], row_mode="flat_map"),
        ]
    )
    out = rows_of(t(blocks(10, 5)))
    assert out == [r for i in range(0, 15, 3) for r in [{"id": i, "x": 2 * i}] * 2]


def test_batches_have_exact_size_across_blocks_in_a_task():
    seen = []

    def f(batch):
        seen.append(len(batch["id"]))
        return batch

    t = BlockTransform([Stage("b", "batches", f, batch_size=4)])
    out = rows_of(t(blocks(3, 3, 3)))
    assert seen == [4, 4, 1]
    assert [r["id"] for r in out] == list(range(9))


def test_small_outputs_are_coalesced_and_big_ones_split():
    t = BlockTransform([Stage("b", "batches", lambda b: b, batch_size=2)], target_block_bytes=1 << 20)
    assert len(list(t(blocks(100)))) == 1
    t = BlockTransform([], target_block_bytes=800)
    out = list(t(blocks(1000)))
    assert len(out) == 10 and sum(o.num_rows for o in out) == 1000


def test_callable_class_constructed_once():
    class Counter:
        made = 0

        def __init__(self, start):
            Counter.made += 1
            self.n = start

        def __call__(self, batch):
            self.n += 1
            return {"n": np.full(len(batch["id"]), self.n)}

    t = BlockTransform([Stage("c", "batches", Counter, fn_constructor_args=(10,), batch_size=1)])
    list(t(blocks(3)))
    list(t(blocks(2)))
    assert Counter.made == 1


def test_udf_failure_names_the_stage_and_keeps_the_exception():
    def boom(row):
        raise ZeroDivisionError("x")

    t = BlockTransform([Stage("Map(boom)", "rows", boom)])
    with pytest.raises(UDFFailure) as info:
        list(t(blocks(1)))
    assert info.value.udf_name == "Map(boom)"
    assert isinstance(info.value.error, ZeroDivisionError)


def test_generator_udf_yields_several_batches():
    def gen(batch):
        yield {"a": batch["id"]}
        yield {"a": batch["id"] + 100}

    out = rows_of(BlockTransform([Stage("g", "batches", gen)])(blocks(2)))
    assert [r["a"] for r in out] == [0, 1, 100, 101]

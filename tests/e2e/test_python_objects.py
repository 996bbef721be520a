"""Values Arrow cannot hold are kept as pickled Python objects, as Ray Data keeps them
(``ArrowPythonObjectType``), unless ``enable_fallback_to_arrow_object_ext_type`` is False. On
both execution modes."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import dataflow
from dataflow.context import DataContext
from engine import python_objects
from engine.python_objects import is_python_object


class Point:
    def __init__(self, x: int) -> None:
        self.x = x

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Point) and other.x == self.x


def test_udf_outputs_arrow_cannot_hold(mode, tmp_path):
    ds = dataflow.range(20, override_num_blocks=4).map(
        lambda r: {"id": r["id"], "p": Point(int(r["id"])), "pair": (np.full(2, r["id"]), "label")})
    assert is_python_object(ds.schema().base_schema.field("p").type)
    rows = ds.random_shuffle(seed=1).sort("id").take_all()
    assert [r["p"] for r in rows] == [Point(i) for i in range(20)]
    assert rows[3]["pair"][1] == "label" and (rows[3]["pair"][0] == 3).all()
    batch = ds.take_batch(5)  # blocks may finish in any order: the rows are checked by their ids
    assert batch["p"].dtype == object and [p.x for p in batch["p"]] == list(batch["id"])
    frame = ds.to_pandas()
    assert sorted(p.x for p in frame["p"]) == list(range(20)) and all(frame["p"][i].x == frame["id"][i] for i in range(20))
    # batches a UDF returns, and Parquet files written and read back
    ds.map_batches(lambda b: {"id": b["id"], "p": [Point(int(i) * 2) for i in b["id"]]}).write_parquet(
        str(tmp_path / "out"))
    back = sorted(dataflow.read_parquet(str(tmp_path / "out")).take_all(), key=lambda r: r["id"])
    assert [r["p"] for r in back] == [Point(i * 2) for i in range(20)]


def test_from_items_and_from_torch_keep_tuples(mode):
    torch = pytest.importorskip("torch")

    class Pairs(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 3

        def __getitem__(self, i: int):
            return torch.full((2, 2), float(i)), f"label-{i}"

    rows = dataflow.from_torch(Pairs()).take_all()
    assert [r["item"][1] for r in rows] == ["label-0", "label-1", "label-2"]
    assert all(isinstance(r["item"], tuple) and (r["item"][0] == i).all() for i, r in enumerate(rows))
    assert dataflow.from_items([{"p": Point(1)}, {"p": None}]).take_all() == [{"p": Point(1)}, {"p": None}]


def test_warned_once_and_refused_when_the_fallback_is_off(mode, caplog):
    ctx = DataContext.get_current()
    python_objects._warned = False
    with caplog.at_level(logging.WARNING, logger="dataflow"):
        dataflow.from_items([{"p": Point(1)}])
        dataflow.from_items([{"p": Point(2)}])
    warnings = [r.getMessage() for r in caplog.records if "pickled Python objects" in r.getMessage()]
    assert len(warnings) == 1 and "column 'p'" in warnings[0]
    old = ctx.enable_fallback_to_arrow_object_ext_type
    try:
        ctx.enable_fallback_to_arrow_object_ext_type = False
        with pytest.raises(TypeError, match="column 'p': cannot convert values to Arrow"):
            dataflow.from_items([{"p": Point(1)}])
        ds = dataflow.range(3).map(lambda r: {"p": Point(1)})
        with pytest.raises(TypeError, match="column 'p': cannot convert values to Arrow"):
            ds.take_all()
    finally:
        ctx.enable_fallback_to_arrow_object_ext_type = old


def test_ints_past_64_bits_and_mixed_pandas_columns_are_objects(mode):
    import pandas as pd

    # both failed: OverflowError from pyarrow, and ArrowInvalid converting the frame; Ray keeps them
    assert dataflow.from_items([{"a": 2**64}, {"a": 1}]).take_all() == [{"a": 2**64}, {"a": 1}]
    frame = pd.DataFrame({"m": [1, "x", None], "f": [1.5, 2.0, 3.0], "t": [np.zeros(2), np.ones(2), np.ones(2)]})
    rows = dataflow.from_pandas(frame).take_all()
    assert [(r["m"], r["f"]) for r in rows] == [(1, 1.5), ("x", 2.0), (None, 3.0)]
    assert [r["t"].tolist() for r in rows] == [[0, 0], [1, 1], [1, 1]]
    out = dataflow.range(3, override_num_blocks=1).map_batches(
        lambda df: df.assign(o=[1, "x", None]), batch_format="pandas").take_all()
    assert [r["o"] for r in out] == [1, "x", None]

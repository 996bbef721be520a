"""Small programs whose answers Ray Data 2.60 gives, pinned: the values, and their Python
and numpy types, dtypes and shapes, of batches, rows and torch tensors.

``python tests/e2e/ray_answers.py --pin`` (in a venv with ``ray[data]==2.60.0`` and torch, as
``benchmarks/.venvs/ray``) runs every case on Ray and writes ``ray_answers_2_60.json``;
``tests/e2e/test_ray_answers.py`` runs the same cases on dataflow and compares. Only cases
whose answer is a value (not an error) and equal on both when pinned are kept here: the ones
where dataflow differs on purpose are in the README ("Where it differs from Ray Data").
"""

from __future__ import annotations

import datetime
import decimal
import importlib
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

PINNED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ray_answers_2_60.json")


def typed(v: Any) -> Any:
    """``v`` as JSON that keeps what a user sees of its type: numpy dtypes and shapes, pandas
    dtypes, torch dtypes, Arrow schemas, NaN."""
    if isinstance(v, np.ndarray):
        return {"ndarray": str(v.dtype), "shape": list(v.shape),
                "v": typed(v.tolist()) if v.dtype != object else [typed(x) for x in v]}
    if isinstance(v, np.generic):
        return {"np": type(v).__name__, "v": typed(v.item())}
    if isinstance(v, pd.DataFrame):
        return {"df": {c: str(t) for c, t in v.dtypes.items()}, "v": typed(v.to_dict("list"))}
    if isinstance(v, pd.Series):
        return {"series": str(v.dtype), "v": typed(v.tolist())}
    if type(v).__module__.startswith("torch"):
        return {"tensor": str(v.dtype), "shape": list(v.shape), "v": typed(v.tolist())}
    if isinstance(v, pa.Table):
        return {"table": str(v.schema), "v": typed(v.to_pylist())}
    if isinstance(v, float):
        return "NaN" if math.isnan(v) else v
    if isinstance(v, dict):
        return {str(k): typed(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [typed(x) for x in v]
    if v is None or isinstance(v, (int, str, bool)):
        return v
    return {type(v).__name__: repr(v)}


def _rows(ds: Any) -> Any:
    return typed(ds.take_all())


def _first_batch(ds: Any, fmt: str, n: int = 100) -> Any:
    return typed(next(iter(ds.iter_batches(batch_size=n, batch_format=fmt))))


def _type_cases(rd: Any, tmp: Callable[[], str]) -> dict[str, Callable[[], Any]]:
    """Every Arrow type with nulls through batches, rows, pandas and files; tensors."""
    rows, first_batch = _rows, _first_batch
    dt = datetime.datetime(2024, 1, 2, 3, 4, 5, 6000)
    items = [
        {"i": 1, "f": 1.5, "s": "a", "b": True, "l": [1, 2], "d": {"x": 1, "y": "p"}, "t": dt, "by": b"\x00a", "dd": datetime.date(2024, 1, 2)},
        {"i": None, "f": None, "s": None, "b": None, "l": None, "d": None, "t": None, "by": None, "dd": None},
        {"i": 3, "f": 2.5, "s": "c", "b": False, "l": [], "d": {"x": 2, "y": None}, "t": dt, "by": b"", "dd": datetime.date(2020, 2, 29)},
    ]
    tensors = np.arange(24, dtype=np.float32).reshape(4, 2, 3)
    return {
        "items_rows": lambda: rows(rd.from_items(items)),
        "items_map_batches_pandas_identity": lambda: rows(rd.from_items(items).map_batches(lambda b: b, batch_format="pandas")),
        "from_numpy_rows": lambda: rows(rd.from_numpy(tensors)),
        "from_numpy_1d": lambda: rows(rd.from_numpy(np.arange(3))),
        "from_numpy_numpy_batch": lambda: first_batch(rd.from_numpy(tensors), "numpy"),
        "from_numpy_pandas_batch": lambda: first_batch(rd.from_numpy(tensors), "pandas"),
        "from_numpy_to_pandas": lambda: typed(rd.from_numpy(tensors).to_pandas()),
        "range_tensor": lambda: rows(rd.range_tensor(3, shape=(2, 2))),
        "range_rows": lambda: rows(rd.range(3)),
        "items_ndarray": lambda: rows(rd.from_items([{"a": np.zeros((2, 2)), "b": 1}, {"a": np.ones((2, 2)), "b": 2}])),
        "items_ragged": lambda: rows(rd.from_items([{"a": np.zeros((2,))}, {"a": np.ones((3,))}])),
        "items_ragged_numpy": lambda: first_batch(rd.from_items([{"a": np.zeros((2,))}, {"a": np.ones((3,))}]), "numpy"),
        "map_returns_ndarray": lambda: rows(rd.range(3).map(lambda r: {"a": np.full((2,), r["id"]), "s": str(r["id"])})),
        "map_returns_ragged": lambda: rows(rd.range(3).map(lambda r: {"a": np.arange(r["id"])})),
        "map_batches_2d": lambda: first_batch(rd.range(4).map_batches(lambda b: {"t": np.ones((len(b["id"]), 2, 3), dtype=np.int16)}), "numpy"),
        "map_batches_2d_rows": lambda: rows(rd.range(2).map_batches(lambda b: {"t": np.ones((len(b["id"]), 2), dtype=np.int16)})),
        "map_batches_list_col": lambda: rows(rd.range(3).map_batches(lambda b: {"l": [[1] * int(i) for i in b["id"]]})),
        "map_batches_object_col": lambda: rows(rd.range(3).map_batches(lambda b: {"o": np.array([{"k": int(i)} for i in b["id"]])})),
        "map_batches_str_ndarray": lambda: rows(rd.range(3).map_batches(lambda b: {"s": b["id"].astype(str)})),
        "map_batches_pandas_out": lambda: rows(rd.range(3).map_batches(lambda b: pd.DataFrame({"x": b["id"] * 2.0}))),
        "map_batches_arrow_out": lambda: rows(rd.range(3).map_batches(lambda t: t.append_column("y", pa.array([1] * t.num_rows)), batch_format="pyarrow")),
        "pandas_in_nullable": lambda: rows(rd.from_pandas(pd.DataFrame({"a": pd.array([1, None], dtype="Int64"), "c": pd.Categorical(["x", "y"])}))),
        "pandas_roundtrip": lambda: typed(rd.from_pandas(pd.DataFrame({"a": [1, 2], "t": pd.to_datetime(["2024-01-01", None]), "s": ["x", None]})).to_pandas()),
        "arrow_in": lambda: rows(rd.from_arrow(pa.table({"a": pa.array([1, None], pa.int8()), "u": pa.array([1, 2], pa.uint32()), "h": pa.array([1.5, None], pa.float16())}))),
        "arrow_in_numpy": lambda: first_batch(rd.from_arrow(pa.table({"a": pa.array([1, None], pa.int8()), "u": pa.array([1, 2], pa.uint32())})), "numpy"),
        "torch_batches": lambda: first_batch(rd.from_items([{"i": 1, "f": 1.5, "b": True}, {"i": 2, "f": 2.5, "b": False}]), "numpy") and typed(next(iter(rd.from_items([{"i": 1, "f": 1.5, "b": True}, {"i": 2, "f": 2.5, "b": False}]).iter_torch_batches(batch_size=2)))),
        "torch_batches_tensor": lambda: typed(next(iter(rd.from_numpy(tensors).iter_torch_batches(batch_size=2)))),
        "to_numpy_refs_like": lambda: typed(rd.from_items(items).select_columns(["i", "f"]).take_batch(3, batch_format="numpy")),
        "parquet_roundtrip_tensor": lambda: (lambda p: (rd.from_numpy(tensors).write_parquet(p), rows(rd.read_parquet(p)))[1])(tmp()),
        "numpy_roundtrip": lambda: (lambda p: (rd.from_numpy(tensors).write_numpy(p, column="data"), rows(rd.read_numpy(p)))[1])(tmp()),
        "sort_tensor": lambda: rows(rd.from_items([{"k": 2, "a": np.zeros(2)}, {"k": 1, "a": np.ones(2)}]).sort("k")),
        "groupby_tensor_map_groups": lambda: rows(rd.from_items([{"k": 1, "a": np.zeros(2)}, {"k": 1, "a": np.ones(2)}]).groupby("k").map_groups(lambda b: {"k": b["k"][:1], "s": [b["a"].sum()]})),
        "empty_items": lambda: [rd.from_items([]).count()],
        "count_rows_of_strings": lambda: rd.from_items(["a", "b"]).take_all(),
        "items_scalars": lambda: rows(rd.from_items([1, 2, 3])),
        "union_tensor": lambda: rows(rd.from_numpy(tensors[:1]).union(rd.from_numpy(tensors[1:2]))),
        "add_column_arrow": lambda: rows(rd.range(2).add_column("z", lambda t: pa.compute.multiply(t["id"], 2), batch_format="pyarrow")),
        "add_column_numpy": lambda: rows(rd.range(2).add_column("z", lambda b: b["id"] * 2, batch_format="numpy")),
        "timestamps_tz": lambda: rows(rd.from_arrow(pa.table({"t": pa.array([0, 10**9], pa.timestamp("ms", tz="UTC"))}))),
        "timestamps_tz_numpy": lambda: first_batch(rd.from_arrow(pa.table({"t": pa.array([0, 10**9], pa.timestamp("ms", tz="UTC"))})), "numpy"),
        "timestamps_tz_pandas": lambda: first_batch(rd.from_arrow(pa.table({"t": pa.array([0, 10**9], pa.timestamp("ms", tz="UTC"))})), "pandas"),
        "decimal": lambda: rows(rd.from_arrow(pa.table({"d": pa.array([decimal.Decimal("1.25"), None], pa.decimal128(5, 2))}))),
        "decimal_numpy": lambda: first_batch(rd.from_arrow(pa.table({"d": pa.array([decimal.Decimal("1.25"), None], pa.decimal128(5, 2))})), "numpy"),
        "dictionary_col": lambda: first_batch(rd.from_arrow(pa.table({"c": pa.array(["x", "y", "x"]).dictionary_encode()})), "numpy"),
        "struct_numpy": lambda: first_batch(rd.from_arrow(pa.table({"d": pa.array([{"x": 1}, {"x": 2}])})), "numpy"),
        "nested_list_numpy": lambda: first_batch(rd.from_items([{"l": [[1, 2], [3]]}, {"l": [[4]]}]), "numpy"),
    }


def _gen_batches(b: dict) -> Any:
    yield {"x": b["id"]}
    yield {"x": b["id"] + 100}


class _Adder:
    def __init__(self, k: int) -> None:
        self.k = k

    def __call__(self, b: dict) -> dict:
        return {"x": b["id"] + self.k}


def _row_cases(rd: Any, tmp: Callable[[], str]) -> dict[str, Callable[[], Any]]:
    """What row and batch functions may return, batch sizes, column steps, aggregations,
    sorts of every key type, splits, unions, zips, every ``from_*``."""
    rows, gen_batches, Adder = _rows, _gen_batches, _Adder

    def bsizes(it: Any) -> list[int]:
        return [len(next(iter(b.values()))) if isinstance(b, dict) else len(b) for b in it]

    return {
        "map_varying_keys": lambda: rows(rd.range(4, override_num_blocks=1).map(lambda r: {"a": 1} if r["id"] % 2 else {"a": 1, "b": 2})),
        "map_varying_keys_blocks": lambda: sorted(map(json.dumps, rows(rd.range(4, override_num_blocks=4).map(lambda r: {"a": 1} if r["id"] % 2 else {"a": 1, "b": 2})))),
        "map_varying_types": lambda: rows(rd.range(4, override_num_blocks=1).map(lambda r: {"a": 1 if r["id"] % 2 else "x"})),
        "map_int_then_float": lambda: rows(rd.range(4, override_num_blocks=1).map(lambda r: {"a": 1 if r["id"] % 2 else 1.5})),
        "map_none_then_int": lambda: rows(rd.range(4, override_num_blocks=1).map(lambda r: {"a": None if r["id"] < 2 else 3})),
        "filter_returns_int": lambda: rows(rd.range(4).filter(lambda r: r["id"] % 2)),
        "filter_returns_none": lambda: rows(rd.range(4).filter(lambda r: None)),
        "filter_returns_str": lambda: rows(rd.range(4).filter(lambda r: "x")),
        "map_batches_generator": lambda: rows(rd.range(3, override_num_blocks=1).map_batches(gen_batches)),
        "map_batches_class": lambda: rows(rd.range(3).map_batches(Adder, fn_constructor_args=(10,), concurrency=1)),
        "map_batches_class_no_concurrency": lambda: rows(rd.range(3).map_batches(Adder, fn_constructor_args=(10,))),
        "map_batches_empty_out": lambda: rows(rd.range(3).map_batches(lambda b: {"x": b["id"][:0]})),
        "map_batches_mismatched_lengths": lambda: rows(rd.range(3).map_batches(lambda b: {"x": b["id"], "y": [1]})),
        "map_batches_batch_size_none": lambda: bsizes(rd.range(10, override_num_blocks=2).map_batches(lambda b: {"n": [len(b["id"])]}, batch_size=None).iter_batches(batch_size=None)),
        "map_batches_batch_size_big": lambda: sorted(r["n"] for r in rd.range(10, override_num_blocks=2).map_batches(lambda b: {"n": [len(b["id"])]}, batch_size=100).take_all()),
        "map_batches_batch_size_3": lambda: sorted(r["n"] for r in rd.range(10, override_num_blocks=2).map_batches(lambda b: {"n": [len(b["id"])]}, batch_size=3).take_all()),
        "iter_batches_sizes": lambda: bsizes(rd.range(10, override_num_blocks=3).iter_batches(batch_size=4)),
        "iter_batches_drop_last": lambda: bsizes(rd.range(10, override_num_blocks=3).iter_batches(batch_size=4, drop_last=True)),
        "iter_batches_local_shuffle": lambda: sorted(x for b in rd.range(10, override_num_blocks=3).iter_batches(batch_size=4, local_shuffle_buffer_size=5, local_shuffle_seed=1) for x in b["id"]),
        "iter_rows_types": lambda: typed(list(rd.range(2).iter_rows())),
        "take_batch_pandas": lambda: typed(rd.range(3).take_batch(2, batch_format="pandas")),
        "take_batch_pyarrow": lambda: typed(rd.range(3).take_batch(2, batch_format="pyarrow")),
        "show": lambda: rd.range(3).show(2),
        "count_after_filter": lambda: rd.range(100).filter(lambda r: r["id"] % 3 == 0).count(),
        "columns_after_map": lambda: rd.range(3).map(lambda r: {"z": 1, "a": 2}).columns(),
        "select_str": lambda: rows(rd.from_items([{"a": 1, "b": 2}]).select_columns("a")),
        "add_column_existing": lambda: rows(rd.from_items([{"a": 1}]).add_column("a", lambda df: df["a"] + 1)),
        "with_column_existing": lambda: rows(rd.from_items([{"a": 1}]).with_column("a", rd.expressions.col("a") + 1)),
        "sum_empty": lambda: [rd.range(0).sum("id") if hasattr(rd, "range") else None],
        "min_of_strings": lambda: rd.from_items([{"s": "a"}, {"s": "b"}]).min("s"),
        "std_one_row": lambda: rd.from_items([{"v": 1.0}]).std("v"),
        "groupby_std_one_row": lambda: rows(rd.from_items([{"k": 1, "v": 1.0}]).groupby("k").std("v")),
        "groupby_mean_ints": lambda: rows(rd.from_items([{"k": 1, "v": 1}, {"k": 1, "v": 2}]).groupby("k").mean("v")),
        "groupby_sum_bool": lambda: rows(rd.from_items([{"k": 1, "v": True}, {"k": 1, "v": True}]).groupby("k").sum("v")),
        "sum_bool": lambda: rd.from_items([{"v": True}, {"v": True}]).sum("v"),
        "groupby_count_column_name": lambda: rd.from_items([{"k": 1}]).groupby("k").count().columns(),
        "groupby_multiple_aggs_same": lambda: rows(rd.from_items([{"k": 1, "v": 2}]).groupby("k").sum(["v", "v"])),
        "groupby_float_key": lambda: rows(rd.from_items([{"k": 1.5, "v": 2}, {"k": float("nan"), "v": 1}, {"k": float("nan"), "v": 3}]).groupby("k").sum("v")),
        "groupby_bool_key": lambda: rows(rd.from_items([{"k": True, "v": 2}, {"k": None, "v": 1}]).groupby("k").count()),
        "sort_bool": lambda: rows(rd.from_items([{"k": True}, {"k": False}, {"k": None}]).sort("k")),
        "sort_desc_nulls": lambda: rows(rd.from_items([{"k": 1}, {"k": None}, {"k": 3}]).sort("k", descending=True)),
        "sort_nan": lambda: rows(rd.from_items([{"k": 1.0}, {"k": float("nan")}, {"k": None}, {"k": -1.0}]).sort("k")),
        "sort_nan_desc": lambda: rows(rd.from_items([{"k": 1.0}, {"k": float("nan")}, {"k": None}, {"k": -1.0}]).sort("k", descending=True)),
        "sort_mixed_case": lambda: rows(rd.from_items([{"k": "b"}, {"k": "B"}, {"k": "a"}, {"k": "é"}]).sort("k")),
        "sort_timestamp": lambda: rows(rd.from_arrow(pa.table({"t": pa.array([3, None, 1], pa.timestamp("s"))})).sort("t")),
        "unique_float_nan": lambda: sorted(map(repr, rd.from_items([{"k": 1.5}, {"k": float("nan")}, {"k": float("nan")}]).unique("k"))),
        "unique_list": lambda: rd.from_items([{"k": [1]}, {"k": [1]}]).unique("k"),
        "split_more_than_rows_equal": lambda: [d.count() for d in rd.range(3).split(5, equal=True)],
        "zip_self": lambda: rows(rd.range(3).zip(rd.range(3))),
        "zip_three": lambda: rows(rd.range(2).zip(rd.range(2), rd.range(2))),
        "union_schema_mismatch": lambda: sorted(map(json.dumps, rows(rd.range(2).union(rd.from_items([{"id": "x"}]))))),
        "limit_then_map_count": lambda: rd.range(100).limit(7).map(lambda r: r).count(),
        "size_bytes": lambda: rd.range(100).materialize().size_bytes(),
        "stats_type": lambda: type(rd.range(3).materialize().stats()).__name__,
        "input_files_items": lambda: rd.range(3).input_files(),
        "schema_empty": lambda: str(rd.range(3).filter(lambda r: False).schema()),
        "iter_torch_batches_ints": lambda: typed(next(iter(rd.range(3).iter_torch_batches(batch_size=3)))),
        "iter_torch_batches_nulls": lambda: typed(next(iter(rd.from_items([{"a": 1}, {"a": None}]).iter_torch_batches(batch_size=3)))),
        "iter_torch_batches_bool": lambda: typed(next(iter(rd.from_items([{"a": True}, {"a": False}]).iter_torch_batches(batch_size=3)))),
        "iter_torch_batches_list": lambda: typed(next(iter(rd.from_items([{"a": [1, 2]}, {"a": [3, 4]}]).iter_torch_batches(batch_size=3)))),
        "iter_torch_batches_uint8": lambda: typed(next(iter(rd.from_numpy(np.ones((2, 2), np.uint8)).iter_torch_batches(batch_size=3)))),
        "to_torch_exists": lambda: hasattr(rd.range(3), "to_torch"),
        "from_items_dicts_with_missing_keys": lambda: rows(rd.from_items([{"a": 1}, {"b": 2}], override_num_blocks=1)),
        "from_items_nested_none": lambda: rows(rd.from_items([{"a": {"x": None}}, {"a": {"x": 1}}])),
        "from_items_mixed_int_str": lambda: rows(rd.from_items([{"a": 1}, {"a": "x"}], override_num_blocks=1)),
        "from_items_big_int": lambda: rows(rd.from_items([{"a": 2**64}])),
        "from_items_tuple": lambda: rows(rd.from_items([(1, 2), (3, 4)])),
        "from_items_set": lambda: rows(rd.from_items([{"a": {1, 2}}])),
        "from_pandas_index": lambda: rows(rd.from_pandas(pd.DataFrame({"a": [1, 2]}, index=[5, 6]))),
        "from_pandas_object_mixed": lambda: rows(rd.from_pandas(pd.DataFrame({"a": [1, "x"]}))),
        "from_pandas_nan": lambda: rows(rd.from_pandas(pd.DataFrame({"a": [1.0, float("nan")]}))),
        "from_pandas_list": lambda: rows(rd.from_pandas([pd.DataFrame({"a": [1]}), pd.DataFrame({"a": [2]})])),
        "from_numpy_list": lambda: rows(rd.from_numpy([np.arange(2), np.arange(3)])),
        "from_arrow_list": lambda: rows(rd.from_arrow([pa.table({"a": [1]}), pa.table({"a": [2]})])),
    }


def _torch_cases(rd: Any, tmp: Callable[[], str]) -> dict[str, Callable[[], Any]]:
    """``iter_torch_batches``: dtypes, collate functions of each batch format, tensors."""
    import torch

    collate = importlib.import_module(rd.__name__ + ".collate_fn")

    class NC(collate.NumpyBatchCollateFn):
        def __call__(self, batch: Any) -> Any:
            return torch.as_tensor(batch["i"]) * 10

    class AC(collate.ArrowBatchCollateFn):
        def __call__(self, batch: Any) -> Any:
            return torch.as_tensor(batch["i"].to_numpy()) + 1

    class PC(collate.PandasBatchCollateFn):
        def __call__(self, batch: Any) -> Any:
            return torch.as_tensor(batch["f"].to_numpy())

    def first(it: Any) -> Any:
        return typed(next(iter(it)))

    items = [{"i": i, "f": i * 0.5, "b": i % 2 == 0, "t": np.full((2, 3), i, np.float32), "l": [i, i + 1]} for i in range(10)]
    ds = rd.from_items(items, override_num_blocks=3)
    num = ds.select_columns(["i", "f", "b", "t"])
    return {
        "default": lambda: first(num.iter_torch_batches(batch_size=4)),
        "iter_torch_batches_dtype_single": lambda: typed(next(iter(rd.range(3).iter_torch_batches(batch_size=3, dtypes=torch.float32)))),
        "dtypes_one": lambda: first(num.iter_torch_batches(batch_size=4, dtypes=torch.float16)),
        "dtypes_all": lambda: first(num.iter_torch_batches(batch_size=4, dtypes={"i": torch.int32, "f": torch.float32, "b": torch.bool, "t": torch.float64})),
        "list_column": lambda: first(ds.select_columns(["l"]).iter_torch_batches(batch_size=4)),
        "collate_numpy": lambda: first(num.iter_torch_batches(batch_size=4, collate_fn=NC())),
        "collate_arrow": lambda: first(num.iter_torch_batches(batch_size=4, collate_fn=AC())),
        "collate_pandas": lambda: first(num.iter_torch_batches(batch_size=4, collate_fn=PC())),
        "collate_plain_fn": lambda: first(num.iter_torch_batches(batch_size=4, collate_fn=lambda b: {k: torch.as_tensor(v) for k, v in b.items() if k != "t"})),
        "collate_tuple": lambda: first(num.iter_torch_batches(batch_size=4, collate_fn=lambda b: (torch.as_tensor(b["i"]), torch.as_tensor(b["f"])))),
        "drop_last_sizes": lambda: [len(b["i"]) for b in num.iter_torch_batches(batch_size=4, drop_last=True)],
        "sizes": lambda: [len(b["i"]) for b in num.iter_torch_batches(batch_size=4)],
        "device_cpu": lambda: str(next(iter(num.iter_torch_batches(batch_size=4, device="cpu")))["i"].device),
        "local_shuffle": lambda: sorted(int(x) for b in num.iter_torch_batches(batch_size=4, local_shuffle_buffer_size=5, local_shuffle_seed=3) for x in b["i"]),
        "to_torch_exists": lambda: hasattr(ds, "to_torch"),
        "iterator_torch": lambda: first(num.iterator().iter_torch_batches(batch_size=3)),
        "numpy_batch_tensor": lambda: first(num.select_columns(["t"]).iter_batches(batch_size=2)),
        "pandas_batch_tensor": lambda: typed(next(iter(num.select_columns(["t"]).iter_batches(batch_size=2, batch_format="pandas")))["t"].tolist()),
        "take_batch_tensor_shape": lambda: list(num.take_batch(5)["t"].shape),
        "random_shuffle_then_torch": lambda: sorted(int(x) for b in num.random_shuffle(seed=1).iter_torch_batches(batch_size=3) for x in b["i"]),
    }


GROUPS = {"types": _type_cases, "rows": _row_cases, "torch": _torch_cases}


def cases(rd: Any, tmp: Callable[[], str]) -> dict[str, Callable[[], Any]]:
    """group.name -> a thunk giving the case's answer on ``rd`` (``ray.data`` or dataflow)."""
    return {f"{group}.{name}": thunk for group, make in GROUPS.items() for name, thunk in make(rd, tmp).items()}


def answer(thunk: Callable[[], Any]) -> dict[str, Any]:
    try:
        return {"value": typed(thunk())}
    except Exception as err:  # an error is an answer too (never pinned)
        return {"error": f"{type(err).__name__}: {err}"[:300]}


def _pin() -> None:
    import ray
    import ray.data as rd

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    rd.DataContext.get_current().enable_progress_bars = False
    base = tempfile.mkdtemp()
    answers = {name: answer(thunk) for name, thunk in cases(rd, lambda: tempfile.mkdtemp(dir=base)).items()}
    with open(PINNED, "w") as f:
        json.dump({"ray": ray.__version__, "answers": answers}, f, indent=0, sort_keys=True)
        f.write("\n")


if __name__ == "__main__" and "--pin" in sys.argv:
    _pin()

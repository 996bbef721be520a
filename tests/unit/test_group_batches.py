"""map_groups' batches: the whole reduce input grouped once and converted once where no rows
change the conversion must give each group exactly the batch a table of that group alone
gives (dtypes, shapes, values, index)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from dataflow.aggregate import grouped_rows
from dataflow.grouped import group_batches
from engine.block_format import tensor_array, to_batch


def _table() -> pa.Table:
    n = 60
    k = np.arange(n) % 7
    ints = pa.array(np.arange(n), mask=(np.arange(n) % 7 == 3) & (np.arange(n) > 30))  # nulls in one group
    lists = pa.array([[i, i] if i % 7 == 1 else [i] * (1 + i % 2) for i in range(n)])  # equal lengths in one group
    return pa.table({
        "k": pa.array(np.where(np.arange(n) % 11 == 0, None, k), type=pa.int64()),
        "i": pa.array(np.arange(n) * 3),
        "f": pa.array(np.arange(n) / 4),
        "b": pa.array(np.arange(n) % 3 == 0),
        "s": pa.array([None if i % 5 == 0 else f"s{i}" for i in range(n)]),
        "ints_with_nulls": ints,
        "lists": lists,
        "tensor": tensor_array(np.arange(n * 4, dtype=np.float32).reshape(n, 2, 2)),
        "d": pa.array([f"c{i % 3}" for i in range(n)]).dictionary_encode(),
        "ts": pa.array(np.arange(n), type=pa.timestamp("s")),
    })


def _same(got, expected) -> None:
    if isinstance(expected, pd.DataFrame):
        pd.testing.assert_frame_equal(got, expected)
        return
    assert list(got) == list(expected)
    for name in expected:
        a, b = got[name], expected[name]
        assert (a.dtype, a.shape) == (b.dtype, b.shape), name
        if a.dtype == object:
            assert [np.asarray(x).tolist() if x is not None else None for x in a] == [
                np.asarray(x).tolist() if x is not None else None for x in b], name
        else:
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("batch_format", "arrow_backed"), [("numpy", True), ("default", True), ("pandas", True),
                                                            ("pandas", False), ("pyarrow", True)])
@pytest.mark.parametrize("columns", [None, ["k", "i", "f", "b", "s"]])
def test_each_groups_batch_is_the_batch_of_the_group_alone(batch_format, arrow_backed, columns):
    table = _table() if columns is None else _table().select(columns)
    grouped, keys, offsets = grouped_rows(table, ["k"])
    assert keys == [0, 1, 2, 3, 4, 5, 6, None]  # key order, nulls last
    batches = list(group_batches(grouped, offsets, batch_format, arrow_backed))
    assert len(batches) == len(keys)
    for key, batch in zip(keys, batches, strict=True):
        rows = [i for i, k in enumerate(table.column("k").to_pylist()) if k == key]  # input order
        alone = table.take(pa.array(rows, type=pa.int64()))
        expected = to_batch(alone, batch_format, arrow_backed)
        if batch_format == "pyarrow":
            assert batch.equals(expected)
        else:
            _same(batch, expected)


def test_a_table_from_pandas_keeps_its_dtypes_group_by_group():
    table = pa.Table.from_pandas(pd.DataFrame({"k": [1, 2, 1], "v": [1.5, None, 2.5]}), preserve_index=False)
    grouped, keys, offsets = grouped_rows(table, ["k"])
    got = list(group_batches(grouped, offsets, "pandas", True))
    for key, batch in zip(keys, got, strict=True):
        rows = [i for i, k in enumerate(table.column("k").to_pylist()) if k == key]
        pd.testing.assert_frame_equal(batch, to_batch(table.take(pa.array(rows)), "pandas", True))


def test_no_keys_is_one_group():
    table = _table()
    grouped, keys, offsets = grouped_rows(table, [])
    assert keys == [None] and offsets.tolist() == [0, table.num_rows] and grouped is table

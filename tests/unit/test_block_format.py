"""Blocks <-> batches: zero-copy numpy where Arrow allows, tensors as n-d arrays."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from engine.block_format import (
    column_from_values,
    column_to_numpy,
    iter_rows,
    rows_to_block,
    tensor_array,
    to_batch,
    to_block,
)


def test_numeric_columns_are_zero_copy():
    values = np.arange(1000, dtype=np.float64)
    table = pa.table({"x": values})
    out = to_batch(table, "numpy")["x"]
    assert out.ctypes.data == table.column("x").chunk(0).buffers()[1].address


def test_fixed_size_list_becomes_2d_without_copy():
    flat = np.arange(12, dtype=np.float32)
    arr = pa.FixedSizeListArray.from_arrays(pa.array(flat), 4)
    out = column_to_numpy(pa.chunked_array([arr]))
    assert out.shape == (3, 4)
    assert out.ctypes.data == arr.values.buffers()[1].address


def test_tensors_round_trip():
    images = np.arange(2 * 3 * 4 * 2, dtype=np.uint8).reshape(2, 3, 4, 2)
    table = to_block({"img": images})
    np.testing.assert_array_equal(to_batch(table, "numpy")["img"], images)
    np.testing.assert_array_equal(column_to_numpy(tensor_array(images[:, 0, 0, :])), images[:, 0, 0, :])


def test_equal_length_lists_become_2d():
    table = pa.table({"v": pa.array([[1.0, 2.0], [3.0, 4.0]])})
    assert to_batch(table, "numpy")["v"].shape == (2, 2)


def test_to_block_accepts_the_usual_return_types():
    assert to_block({"a": [1, 2]}).num_rows == 2
    assert to_block(pd.DataFrame({"a": [1, 2]})).column_names == ["a"]
    with pytest.raises(ValueError, match="same length"):
        to_block({"a": [1, 2], "b": [1]})
    with pytest.raises(TypeError, match="must return a dict"):
        to_block(42)


def test_rows_round_trip():
    rows = [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]
    assert list(iter_rows(rows_to_block(rows))) == rows
    ragged = [{"a": 1}, {"a": 2, "b": 3}]
    assert rows_to_block(ragged).to_pylist() == [{"a": 1, "b": None}, {"a": 2, "b": 3}]  # as Ray 2.60's
    assert rows_to_block([{"a": 1, "b": 2}, {"b": 4, "a": 3}]).to_pylist() == [{"a": 1, "b": 2}, {"a": 3, "b": 4}]


def test_timestamps_keep_their_nanoseconds_through_rows():
    """A row UDF returning ``r["t"]`` of a ``timestamp[ns]`` column (a pandas ``Timestamp``)
    made a ``timestamp[us]`` column (Arrow's inference): the nanoseconds were dropped and two
    distinct times became one. Ray keeps them; ``datetime`` values stay microseconds."""
    stamps = [pd.Timestamp("2024-01-01 00:00:00.000000001"), pd.Timestamp("2024-01-01 00:00:00.000000002")]
    table = rows_to_block([{"t": t} for t in stamps])
    assert table.schema.field("t").type == pa.timestamp("ns")
    assert [r["t"] for r in iter_rows(table)] == stamps
    zoned = rows_to_block([{"t": stamps[0].tz_localize("UTC")}])
    assert zoned.schema.field("t").type == pa.timestamp("ns", "UTC")
    whole = rows_to_block([{"t": pd.Timestamp("2024-01-01 00:00:01")}])
    assert whole.schema.field("t").type == pa.timestamp("us")  # nothing to lose: as before


def test_arrays_with_no_values_per_row_become_columns():
    # Arrow has no fixed-size list of size 0: these failed ("list_size needs to be a strict
    # positive integer"), or, with no rows, on an empty list of arrays
    for shape in [(3, 0), (3, 0, 2), (0, 0), (0, 0, 3)]:
        column = column_from_values("a", np.zeros(shape, dtype=np.float32))
        assert len(column) == shape[0]
        back = column_to_numpy(column)
        assert [cell.shape for cell in back] == [shape[1:]] * shape[0]
    rows = column_from_values("a", np.empty((2, 0), dtype=object))
    assert rows.to_pylist() == [[], []]

"""Variable-shape tensor columns (``arrow.variable_shape_tensor``): built from arrays, from
fixed-shape columns of different shapes, sliced, with nulls, and through IPC and Parquet."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.block_format import column_from_values, concat_blocks, to_batch, to_block
from engine.ragged_tensors import fixed_to_ragged, is_ragged, ragged_array, ragged_to_numpy


def _arrays() -> list[np.ndarray]:
    return [np.arange(i * 3, dtype=np.int16).reshape(i, 3) for i in (1, 3, 2)]


def test_arrays_round_trip_with_nulls_and_slices():
    values = [*_arrays(), None, np.zeros((0, 3), np.int16)]
    column = ragged_array(values)
    assert is_ragged(column.type) and str(column.type) == (
        "extension<arrow.variable_shape_tensor[value_type=int16, ndim=2]>")
    back = ragged_to_numpy(column)
    assert back.dtype == object and len(back) == 5 and back[3] is None
    for got, want in zip(back, values, strict=True):
        if want is not None:
            np.testing.assert_array_equal(got, want)
            assert got.dtype == np.int16
    cut = ragged_to_numpy(column.slice(1, 2))
    np.testing.assert_array_equal(cut[0], values[1])
    np.testing.assert_array_equal(cut[1], values[2])


def test_common_dtype_when_arrays_differ():
    column = ragged_array([np.ones(2, np.int32), np.ones(3, np.float64)])
    assert column.type.storage_type.field("data").type.value_type == pa.float64()


def test_fixed_shape_columns_become_ragged_when_concatenated():
    a = pa.table({"x": pa.FixedShapeTensorArray.from_numpy_ndarray(np.ones((2, 4, 5), np.uint8)), "k": [1, 2]})
    b = pa.table({"x": pa.FixedShapeTensorArray.from_numpy_ndarray(np.zeros((3, 6, 3), np.uint8)), "k": [3, 4, 5]})
    table = concat_blocks([a.slice(1), b])
    assert is_ragged(table.schema.field("x").type) and table.column("k").to_pylist() == [2, 3, 4, 5]
    cells = to_batch(table, "numpy")["x"]
    assert [c.shape for c in cells] == [(4, 5), (6, 3), (6, 3), (6, 3)]
    assert cells[0].sum() == 20 and cells[1].sum() == 0
    # a sliced fixed column keeps its rows
    np.testing.assert_array_equal(ragged_to_numpy(fixed_to_ragged(b.column("x").chunk(0).slice(2)))[0],
                                  np.zeros((6, 3), np.uint8))
    # same shapes stay fixed-shape; other mismatches still fail as pyarrow's
    assert isinstance(concat_blocks([a, a]).schema.field("x").type, pa.FixedShapeTensorType)
    with pytest.raises(pa.ArrowTypeError, match="incompatible types"):
        concat_blocks([pa.table({"x": [1]}), pa.table({"x": ["s"]})])


def test_tensors_of_different_ndims_are_led_by_ones_as_in_ray():
    """A grayscale ``(h, w)`` image beside ``(h, w, 3)`` ones: concatenating failed ("Unable to
    merge"); Ray gives the grayscale one as ``(1, h, w)``, and so does this, fixed or ragged."""
    gray = pa.table({"x": pa.FixedShapeTensorArray.from_numpy_ndarray(np.arange(48, dtype=np.uint8).reshape(2, 4, 6))})
    rgb = pa.table({"x": pa.FixedShapeTensorArray.from_numpy_ndarray(np.ones((1, 4, 6, 3), np.uint8))})
    ragged = pa.table({"x": ragged_array([np.ones((2, 2), np.uint8), np.ones((3, 1), np.uint8), None])})
    table = concat_blocks([gray.slice(1), rgb, ragged])
    assert is_ragged(table.schema.field("x").type) and table.schema.field("x").type.ndim == 3
    cells = to_batch(table, "numpy")["x"]
    assert [c.shape if c is not None else None for c in cells] == [(1, 4, 6), (4, 6, 3), (1, 2, 2), (1, 3, 1), None]
    np.testing.assert_array_equal(cells[0][0], np.arange(24, 48, dtype=np.uint8).reshape(4, 6))
    with pytest.raises(pa.ArrowTypeError, match="incompatible types"):  # another value type: as pyarrow's
        concat_blocks([gray, pa.table({"x": pa.FixedShapeTensorArray.from_numpy_ndarray(np.ones((1, 2), np.float32))})])


def test_a_batch_of_arrays_of_different_shapes_is_a_ragged_column():
    table = to_block({"t": _arrays(), "o": np.array(_arrays(), dtype=object)})
    assert is_ragged(table.schema.field("t").type) and is_ragged(table.schema.field("o").type)
    equal = column_from_values("e", [np.ones((2, 2)), np.zeros((2, 2))])
    assert isinstance(equal.type, pa.FixedShapeTensorType)  # one shape: a fixed-shape tensor, as before
    frame = to_batch(table, "pandas")
    assert frame["t"].dtype == object and frame["t"][1].shape == (3, 3)


def test_ipc_and_parquet_keep_the_type(tmp_path):
    table = pa.table({"t": ragged_array(_arrays())})
    pq.write_table(table, tmp_path / "r.parquet")
    back = pq.read_table(tmp_path / "r.parquet")
    assert back.schema == table.schema
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    streamed = pa.ipc.open_stream(sink.getvalue()).read_all()
    for got, want in zip(ragged_to_numpy(streamed.column("t").chunk(0)), _arrays(), strict=True):
        np.testing.assert_array_equal(got, want)


def test_fixed_column_with_null_rows_keeps_the_others_in_place():
    storage = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(12, dtype=np.int32)), 4)
    with_null = pa.FixedSizeListArray.from_arrays(storage.values, 4, mask=pa.array([False, True, False]))
    column = pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(pa.int32(), [2, 2]), with_null)
    cells = ragged_to_numpy(fixed_to_ragged(column))
    assert cells[1] is None
    np.testing.assert_array_equal(cells[2], np.arange(8, 12).reshape(2, 2))
    np.testing.assert_array_equal(ragged_to_numpy(fixed_to_ragged(column.slice(2)))[0], cells[2])


def test_npy_files_take_ragged_rows_of_one_shape_only():
    from connectors.numpy_format import column_to_ndarray

    assert column_to_ndarray(ragged_array([np.ones((2, 3)), np.ones((2, 3))]), "t").shape == (2, 2, 3)
    with pytest.raises(TypeError, match=r"column 't'.*cannot be written to \.npy"):
        column_to_ndarray(ragged_array(_arrays()), "t")


def test_blocks_with_ragged_and_object_columns_pickle():
    import pickle

    table = to_block({"t": _arrays(), "o": [(1, "a"), (2, "b"), None]})
    back = pickle.loads(pickle.dumps(table))  # read tasks and the Ray runner pickle blocks
    assert back.equals(table) and back.schema == table.schema
    assert list(to_batch(back, "numpy")["o"]) == [(1, "a"), (2, "b"), None]

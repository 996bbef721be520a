"""Ray's ``tensor_column_schema`` for ``read_parquet``: binary columns holding raw ndarrays.

Each value of such a column is the bytes of one C-ordered array (``arr.tobytes()``) of a known
dtype and shape; ``decode`` turns the column into a tensor column (one row per array) without a
copy per value: the column's data buffer is viewed as one ``(rows, *shape)`` array.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.errors import FileFormatError
from engine.block_format import fixed_shape_tensor_array

TensorSchema = dict[str, tuple[np.dtype, tuple[int, ...]]]


def check(spec: Mapping[str, Any] | None) -> TensorSchema:
    """``{column: (dtype, shape)}``, checked: a ``TypeError``/``ValueError`` naming the column."""
    if spec is None:
        return {}
    if not isinstance(spec, Mapping):
        raise TypeError(f"tensor_column_schema must be a dict of column -> (dtype, shape), got {type(spec).__name__}")
    out: TensorSchema = {}
    for name, value in spec.items():
        try:
            dtype, shape = value
            dtype = np.dtype(dtype)
            shape = tuple(int(d) for d in shape)
        except (TypeError, ValueError) as err:
            raise TypeError(f"tensor_column_schema[{name!r}] must be (dtype, shape), got {value!r}: {err}") from None
        if dtype.hasobject or any(d < 0 for d in shape):
            raise ValueError(f"tensor_column_schema[{name!r}]: an object dtype or a negative dimension cannot be "
                             f"read from raw bytes ({dtype}, {shape})")
        out[str(name)] = (dtype, shape)
    return out


def decode(table: pa.Table, spec: TensorSchema, path: str) -> pa.Table:
    """``table`` (read from ``path``) with each column of ``spec`` it has decoded into tensors;
    a ``FileFormatError`` naming the file and column when the bytes do not fit."""
    for name, (dtype, shape) in spec.items():
        index = table.schema.get_field_index(name)
        if index < 0:
            continue  # projected away
        try:
            column = _decode_column(table.column(index), dtype, shape)
        except ValueError as err:
            raise FileFormatError(f"tensor_column_schema: {err}", path=path, column=name) from None
        table = table.set_column(index, name, column)
    return table


def check_stored_type(name: str, stored: pa.DataType) -> None:
    """A ``ValueError`` when column ``name`` is not stored as bytes (found from the schema)."""
    if not _is_binary(stored):
        raise ValueError(f"tensor_column_schema names column {name!r}, which is {stored}, not binary: "
                         "it reads arrays stored as their raw bytes")


def _is_binary(stored: pa.DataType) -> bool:
    return pa.types.is_binary(stored) or pa.types.is_large_binary(stored) or pa.types.is_fixed_size_binary(stored)


def decoded_type(spec: TensorSchema, name: str) -> pa.DataType:
    """The type ``decode`` gives column ``name`` (the one the engine gives n-d numpy columns)."""
    dtype, shape = spec[name]
    return _type(dtype, shape)


def _type(dtype: np.dtype, shape: tuple[int, ...]) -> pa.DataType:
    value = pa.from_numpy_dtype(dtype)
    if not shape:
        return value
    return pa.fixed_shape_tensor(value, shape)


def _decode_column(column: pa.ChunkedArray, dtype: np.dtype, shape: tuple[int, ...]) -> pa.Array:
    if not _is_binary(column.type):
        raise ValueError(f"the column is {column.type}, not binary")
    if column.null_count:
        raise ValueError(f"{column.null_count} null values: a tensor column needs an array in every row")
    width = dtype.itemsize * math.prod(shape)
    array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if len(array) == 0:
        return pa.array([], type=_type(dtype, shape))
    if pa.types.is_fixed_size_binary(array.type):
        lengths_ok = array.type.byte_width == width
        start, data = array.offset * width, array.buffers()[1]
    else:
        bounds = pc.min_max(pc.binary_length(array))
        lengths_ok = bounds["min"].as_py() == width and bounds["max"].as_py() == width
        offsets = np.frombuffer(array.buffers()[1], dtype=np.int64 if pa.types.is_large_binary(array.type) else np.int32)
        start, data = int(offsets[array.offset]), array.buffers()[2]
    if not lengths_ok:
        raise ValueError(f"values are not all {width} bytes, the size of a {dtype} array of shape {shape}")
    raw = np.frombuffer(data, dtype=np.uint8, count=width * len(array), offset=start)
    return _tensors(raw.view(dtype).reshape((len(array), *shape)))


def _tensors(values: np.ndarray) -> pa.Array:
    """One row per entry of the first axis, typed as ``_type`` says (the engine's tensor
    columns: a scalar or a fixed-shape tensor)."""
    if values.ndim == 1:
        return pa.array(values)
    if values.dtype.kind in "iuf":
        return fixed_shape_tensor_array(values)  # the engine's builder, over the storage
    return pa.FixedShapeTensorArray.from_numpy_ndarray(np.ascontiguousarray(values))

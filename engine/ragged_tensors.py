"""Tensor columns whose rows have different shapes (images of different sizes, token arrays of
different lengths), as Arrow's canonical ``arrow.variable_shape_tensor`` extension type.

Its storage is ``struct<data: list<T>, shape: fixed_size_list<int32>[ndim]>``: each row's values
flattened in C order, and the row's shape. Parquet, Arrow IPC and any Arrow reader keep the type.

A batch holds such a column as a 1-d ``object`` array of n-d arrays (each a view of the
column's data, no copy), as Ray's variable-shaped tensors are. It comes from:
- a UDF returning a list (or object array) of arrays of one ndim and different shapes;
- concatenating blocks whose fixed-shape tensor columns differ in shape (``unify_tensors``):
  ``read_images`` of images of different sizes, batched (of different ndims too: a grayscale
  ``(h, w)`` image beside ``(h, w, 3)`` ones is ``(1, h, w)``, as in Ray).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

NAME = "arrow.variable_shape_tensor"


class VariableShapeTensorType(pa.ExtensionType):
    """``arrow.variable_shape_tensor`` as a Python extension type. pyarrow's C++ library
    registers the canonical type under this name but has no Python class for it, and its
    instances cannot be pickled (a block travelling to a worker inside a read task, or through
    Ray, failed). This class replaces that registration: same name, same storage, so files and
    streams are the same for every Arrow reader; dimension names and permutations in files from
    elsewhere are not kept."""

    def __init__(self, value_type: pa.DataType, ndim: int) -> None:
        self.value_type, self.ndim = value_type, ndim
        storage = pa.struct([("data", pa.list_(value_type)), ("shape", pa.list_(pa.int32(), ndim))])
        super().__init__(storage, NAME)

    def __arrow_ext_serialize__(self) -> bytes:
        return b"{}"

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type: pa.DataType, serialized: bytes) -> VariableShapeTensorType:
        return cls(storage_type.field("data").type.value_type, storage_type.field("shape").type.list_size)

    def __reduce__(self) -> tuple[object, ...]:
        return VariableShapeTensorType, (self.value_type, self.ndim)

    def __hash__(self) -> int:  # (a set of a column's types across blocks: ``unify_tensors``)
        return hash((NAME, self.value_type, self.ndim))

    def __str__(self) -> str:
        return f"extension<{NAME}[value_type={self.value_type}, ndim={self.ndim}]>"


with contextlib.suppress(pa.ArrowKeyError):  # pyarrow's own registration (see the class)
    pa.unregister_extension_type(NAME)
with contextlib.suppress(pa.ArrowKeyError):  # registered already (this module loaded twice)
    pa.register_extension_type(VariableShapeTensorType(pa.int8(), 1))


@functools.cache
def ragged_type(value_type: pa.DataType, ndim: int) -> VariableShapeTensorType:
    """The ``arrow.variable_shape_tensor`` type of ``ndim`` dimensions of ``value_type``."""
    return VariableShapeTensorType(value_type, ndim)


def is_ragged(typ: pa.DataType) -> bool:
    return isinstance(typ, VariableShapeTensorType)


def can_be_ragged(values: Sequence[object]) -> bool:
    """Arrays (or None) of one number of dimensions, and numeric or boolean values."""
    arrays = [v for v in values if v is not None]
    return (bool(arrays) and all(isinstance(v, np.ndarray) for v in arrays)
            and len({v.ndim for v in arrays}) == 1 and all(v.dtype.kind in "biuf" for v in arrays))  # type: ignore[union-attr]


def ragged_array(values: Sequence[np.ndarray | None]) -> pa.Array:
    """Arrays of one ndim (None: a null row) as one column; values cast to their common dtype."""
    arrays = [v for v in values if v is not None]
    ndim = arrays[0].ndim
    dtype = np.result_type(*arrays)
    flat = np.concatenate([np.ascontiguousarray(a, dtype=dtype).reshape(-1) for a in arrays])
    sizes = np.array([0 if v is None else v.size for v in values], dtype=np.int64)
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum(sizes, out=offsets[1:])
    shapes = np.array([(0,) * ndim if v is None else v.shape for v in values], dtype=np.int32).reshape(-1)
    nulls = pa.array([v is None for v in values]) if len(arrays) < len(values) else None
    data = pa.ListArray.from_arrays(_arrow(offsets), _arrow(flat))
    shape = pa.FixedSizeListArray.from_arrays(_arrow(shapes), ndim)
    storage = pa.StructArray.from_arrays([data, shape], names=["data", "shape"], mask=nulls)
    return pa.ExtensionArray.from_storage(ragged_type(data.type.value_type, ndim), storage)


def ragged_to_numpy(column: pa.Array) -> np.ndarray:
    """A 1-d object array of each row's n-d array (views of the column's data; None for nulls)."""
    data, shape = column.storage.flatten()  # the children, cut to the column's slice
    values = data.values.to_numpy(zero_copy_only=False)
    offsets = data.offsets.to_numpy()
    ndim = shape.type.list_size
    dims = shape.values.to_numpy(zero_copy_only=False)[shape.offset * ndim:(shape.offset + len(column)) * ndim]
    shapes = dims.reshape(len(column), ndim)
    out = np.empty(len(column), dtype=object)
    valid = column.is_valid().to_numpy(zero_copy_only=False) if column.null_count else None
    for i in range(len(column)):
        if valid is None or valid[i]:
            out[i] = values[offsets[i]:offsets[i + 1]].reshape(shapes[i])
    return out


def fixed_to_ragged(column: pa.Array, ndim: int | None = None) -> pa.Array:
    """A fixed-shape tensor column as the ragged type (no per-row work: the data is shared);
    ``ndim``: that many dimensions, the shape's leading ones 1 (as Ray unifies tensors of
    different ndims: a ``(4, 6)`` grayscale image beside ``(4, 6, 3)`` ones is ``(1, 4, 6)``)."""
    typ = column.type
    size = int(np.prod(typ.shape))
    ndim = ndim or len(typ.shape)
    storage = column.storage  # .values, not .flatten(): that drops the values of null rows
    flat = storage.values.slice(storage.offset * size, len(column) * size)
    offsets = _arrow(np.arange(len(column) + 1, dtype=np.int32) * size)
    row_shape = (1,) * (ndim - len(typ.shape)) + tuple(typ.shape)
    shapes = np.tile(np.array(row_shape, dtype=np.int32), len(column))
    nulls = column.is_null() if column.null_count else None
    data = pa.ListArray.from_arrays(offsets, flat)
    shape = pa.FixedSizeListArray.from_arrays(_arrow(shapes), ndim)
    storage = pa.StructArray.from_arrays([data, shape], names=["data", "shape"], mask=nulls)
    return pa.ExtensionArray.from_storage(ragged_type(typ.value_type, ndim), storage)


def _with_ndim(column: pa.Array, ndim: int) -> pa.Array:
    """A ragged column of fewer dimensions with ``ndim``, its rows' shapes led by ones."""
    if column.type.ndim == ndim:
        return column
    data, shape = column.storage.flatten()
    old = column.type.ndim
    dims = shape.values.to_numpy(zero_copy_only=False)[shape.offset * old:(shape.offset + len(column)) * old]
    shapes = np.hstack([np.ones((len(column), ndim - old), dtype=np.int32), dims.reshape(len(column), old)])
    nulls = column.is_null() if column.null_count else None
    shape = pa.FixedSizeListArray.from_arrays(_arrow(shapes.reshape(-1)), ndim)
    storage = pa.StructArray.from_arrays([data, shape], names=["data", "shape"], mask=nulls)
    return pa.ExtensionArray.from_storage(ragged_type(column.type.value_type, ndim), storage)


def _arrow(values: np.ndarray) -> pa.Array:
    """A 1-d numeric array as Arrow, sharing its memory (``pa.array`` imports pandas)."""
    if values.dtype.kind in "iuf":
        return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), [None, pa.py_buffer(values)])
    return pa.array(values)


def _tensor_key(typ: pa.DataType) -> tuple[pa.DataType, int] | None:
    if isinstance(typ, pa.FixedShapeTensorType):
        return typ.value_type, len(typ.shape)
    if is_ragged(typ):
        return typ.value_type, typ.ndim
    return None


def unify_tensors(tables: Sequence[pa.Table]) -> list[pa.Table] | None:
    """``tables`` with each column that is a tensor of one value type in every table, but not
    of one shape, made ragged in all of them, of the most dimensions any has (fewer are led by
    ones, as Ray's); None when no column needs it."""
    changed = False
    out = list(tables)
    typed = [{field.name: field.type for field in t.schema} for t in tables]  # (once: .column_names builds a list)
    for name in typed[0]:
        types = {fields[name] for fields in typed if name in fields}
        keys = [_tensor_key(t) for t in types]
        tensors = [key for key in keys if key is not None]
        if len(types) < 2 or len(tensors) < len(keys) or len({value_type for value_type, _ in tensors}) != 1:
            continue
        value_type, ndim = tensors[0][0], max(n for _, n in tensors)
        changed = True
        for i, table in enumerate(out):
            if name not in typed[i]:
                continue
            column = table.column(name)
            if is_ragged(typed[i][name]):
                chunks = [_with_ndim(chunk, ndim) for chunk in column.chunks]
            else:
                chunks = [fixed_to_ragged(chunk, ndim) for chunk in column.chunks]
            ragged = pa.chunked_array(chunks, type=ragged_type(value_type, ndim))
            out[i] = table.set_column(table.column_names.index(name), name, ragged)
    return out if changed else None

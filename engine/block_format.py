"""Converting blocks (Arrow tables) to and from what user functions see.

Batch formats: "pyarrow", "numpy" (dict of arrays; n-d for tensor and fixed-size list
columns, zero-copy where Arrow allows), "pandas", "polars"; "default" is "numpy" as in Ray Data.
Rows are dicts. Results coming back from a UDF (dicts of arrays or lists, DataFrames, tables,
lists of rows) become Arrow tables through ``to_block``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sized
from typing import Any

import numpy as np
import pyarrow as pa

from engine.errors import UDFOutputError
from engine.python_objects import is_python_object, object_array, objects_to_numpy
from engine.ragged_tensors import can_be_ragged, is_ragged, ragged_array, ragged_to_numpy, ragged_type, unify_tensors

BATCH_FORMATS = ("default", "numpy", "pandas", "pyarrow", "polars")


def column_to_numpy(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """One column as a numpy array: numbers zero-copy when contiguous, tensors as n-d arrays."""
    if isinstance(column, pa.ChunkedArray):
        if column.num_chunks == 1:
            column = column.chunk(0)
        elif column.num_chunks == 0:
            return np.empty(0, dtype=column.type.to_pandas_dtype() if _is_numeric(column.type) else object)
        else:
            column = column.combine_chunks() if not _is_extension(column.type) else pa.concat_arrays(column.chunks)
    typ = column.type
    if isinstance(typ, pa.FixedShapeTensorType):
        return column.to_numpy_ndarray()  # type: ignore[attr-defined,no-any-return]
    if is_ragged(typ):
        return ragged_to_numpy(column)
    if is_python_object(typ):
        return objects_to_numpy(column)
    if pa.types.is_fixed_size_list(typ) and column.null_count == 0:
        inner = column_to_numpy(column.flatten())
        return inner.reshape(len(column), typ.list_size, *inner.shape[1:])
    if (pa.types.is_list(typ) or pa.types.is_large_list(typ)) and column.null_count == 0 and len(column):
        offsets = column.offsets.to_numpy()
        lengths = np.diff(offsets)
        if lengths.size and lengths[0] and (lengths == lengths[0]).all() and _is_numeric(typ.value_type):
            inner = column.flatten().to_numpy(zero_copy_only=False)
            return inner.reshape(len(column), int(lengths[0]))
    if _is_numeric(typ) and column.null_count == 0:
        return column.to_numpy(zero_copy_only=False)
    return column.to_numpy(zero_copy_only=False)


def _is_numeric(typ: pa.DataType) -> bool:
    return bool(pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_boolean(typ))


def _is_extension(typ: pa.DataType) -> bool:
    return isinstance(typ, pa.ExtensionType)


def to_batch(table: pa.Table, batch_format: str | None, arrow_backed_pandas: bool = True) -> Any:
    """``table`` in the requested batch format (None: as it is, a ``pyarrow.Table``, as Ray's
    native format). A pandas batch has Ray 2.60's dtypes: ``pd.ArrowDtype`` columns unless
    ``arrow_backed_pandas`` is False (``DataContext.enable_arrow_backed_pandas_conversion``)."""
    if batch_format in ("default", "numpy"):
        return {name: column_to_numpy(table.column(i)) for i, name in enumerate(table.column_names)}
    if batch_format == "pyarrow" or batch_format is None:
        return table
    if batch_format == "pandas":
        return table_to_pandas(table, arrow_backed_pandas)
    if batch_format == "polars":
        import polars as pl

        return pl.from_arrow(table, rechunk=False)
    msg = f"batch_format must be one of {BATCH_FORMATS}, got {batch_format!r}"
    raise ValueError(msg)


def numeric_array(values: np.ndarray) -> pa.Array | None:
    """A 1-d contiguous int/float array as an Arrow array sharing its memory, else None.

    ``pa.array`` would do the same but imports pandas on first use (0.4 s), which a small
    job's first result cannot afford.
    """
    if values.ndim != 1 or values.dtype.kind not in "iuf" or not values.flags.c_contiguous:
        return None
    typ = pa.from_numpy_dtype(values.dtype)
    return pa.Array.from_buffers(typ, len(values), [None, pa.py_buffer(values)])


def tensor_array(values: np.ndarray, name: str = "", objects: bool | None = None) -> pa.Array:
    """An n-d numpy array (first axis = rows) as an Arrow column. ``objects``: what to do with
    values Arrow cannot hold (``python_objects.object_array``)."""
    if values.ndim > 1 and (values.dtype == object or 0 in values.shape[1:]):
        # Rows of objects, or of nothing (an Arrow fixed-size list cannot be empty): rows of
        # numbers keep their shapes as a ragged tensor, others become nested lists.
        if values.dtype.kind in "biuf":
            if not len(values):
                typ = ragged_type(pa.from_numpy_dtype(values.dtype), values.ndim - 1)
                return pa.ExtensionArray.from_storage(typ, pa.array([], type=typ.storage_type))
            return ragged_array(list(values))
        return column_from_values(name, values.tolist(), objects)
    if values.dtype == object:  # of strings, of arrays (tensors, ragged or not), of objects
        return column_from_values(name, list(values), objects)
    if values.ndim == 1:
        fast = numeric_array(values)
        return fast if fast is not None else pa.array(values)
    if values.dtype.kind not in "iuf":  # (Arrow's tensors are numbers: booleans, say, cannot be one)
        if values.ndim == 2:
            flat = tensor_array(np.ascontiguousarray(values).reshape(-1))
            return pa.FixedSizeListArray.from_arrays(flat, values.shape[1])
        return pa.FixedShapeTensorArray.from_numpy_ndarray(np.ascontiguousarray(values))
    return fixed_shape_tensor_array(values)


def fixed_shape_tensor_array(values: np.ndarray) -> pa.Array:
    """An n-d (n >= 2) numpy array as Arrow's ``fixed_shape_tensor`` column (Ray prints it as
    ``ArrowTensorTypeV2``), one row per entry of the first axis, sharing the array's memory
    when it is C-contiguous; ints and floats only. Built over its storage: ``FixedShapeTensorArray.from_numpy_ndarray``
    costs 60-250 us a call, this 30."""
    values = np.ascontiguousarray(values)
    width = math.prod(values.shape[1:])
    flat = tensor_array(values.reshape(-1))
    storage = pa.FixedSizeListArray.from_arrays(flat, width)
    typ = pa.fixed_shape_tensor(flat.type, list(values.shape[1:]))
    return pa.ExtensionArray.from_storage(typ, storage)


def _torch_to_numpy(value: Any) -> Any:
    """A torch tensor as a numpy array (on the CPU, without grad), as Ray converts what a UDF
    returns; anything else as it is. torch is never imported here: a tensor's type says."""
    if type(value).__module__.split(".")[0] == "torch" and hasattr(value, "numpy"):
        return value.numpy(force=True)
    return value


_NOT_ARROW = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError)
"""What Arrow raises for values it cannot hold: mixed types, ints past 64 bits, objects."""


def column_from_values(name: str, values: Any, objects: bool | None = None) -> pa.Array | pa.ChunkedArray:
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values
    _check_column(name, values)
    values = _torch_to_numpy(values)
    if isinstance(values, np.ndarray):
        return tensor_array(values, name, objects)
    if hasattr(values, "to_arrow") and hasattr(values, "dtype"):  # polars Series
        return values.to_arrow()
    if hasattr(values, "to_numpy") and hasattr(values, "dtype"):  # pandas Series
        return pa.Array.from_pandas(values)
    values = list(values)
    if values and type(values[0]).__module__.split(".")[0] == "torch":  # rows of tensors
        values = [_torch_to_numpy(v) for v in values]
    if values and isinstance(values[0], np.ndarray):
        try:
            return tensor_array(np.stack(values))
        except ValueError:  # arrays of different shapes
            if can_be_ragged(values):
                return ragged_array(values)
    try:
        column = pa.array(values)
    except _NOT_ARROW as err:
        msg = f"column {name!r}: cannot convert values to Arrow ({err})"
        return object_array(values, objects, TypeError(msg))
    if pa.types.is_timestamp(column.type) and column.type.unit == "us" and _has_nanoseconds(values):
        return pa.array(values, type=pa.timestamp("ns", column.type.tz))
    return column


def _has_nanoseconds(values: list[Any]) -> bool:
    """Whether a pandas ``Timestamp`` among ``values`` has nanoseconds, which Arrow's inference
    (microseconds, as for ``datetime``) would drop: a row UDF returning ``r["t"]`` of a
    ``timestamp[ns]`` column lost them, and distinct times became equal."""
    return any(getattr(v, "nanosecond", 0) for v in values if type(v).__name__ == "Timestamp")


def to_block(batch: Any, objects: bool | None = None) -> pa.Table:
    """Whatever a batch UDF returned, as an Arrow table; ``objects``: what to do with values
    Arrow cannot hold (``python_objects.object_array``). Two columns of one name are refused."""
    return _one_name_each(_to_table(batch, objects))


def _one_name_each(table: pa.Table) -> pa.Table:
    """``table``, unless two of its columns share a name: no step could select either (Arrow:
    'Field "b" exists 2 times in schema'), and Ray cannot ship such a block between processes."""
    names = table.column_names
    twice = repeated_names(names)
    if twice:
        msg = f"the batch function returned two columns named {twice[0]!r} (its columns: {names}); give each a name of its own"
        raise UDFOutputError(msg)
    return table


def repeated_names(names: list[str]) -> list[str]:
    """The names that occur more than once in ``names``, in order of first occurrence."""
    if len(set(names)) == len(names):
        return []
    return [n for n in dict.fromkeys(names) if names.count(n) > 1]


def _to_table(batch: Any, objects: bool | None) -> pa.Table:
    if isinstance(batch, pa.Table):
        return batch
    if isinstance(batch, pa.RecordBatch):
        return pa.Table.from_batches([batch])
    if isinstance(batch, Mapping):
        names = list(batch.keys())
        columns = [column_from_values(str(n), batch[n], objects) for n in names]
        lengths = {len(c) for c in columns}
        if len(lengths) > 1:
            sizes = {str(n): len(c) for n, c in zip(names, columns, strict=True)}
            msg = f"a batch's columns must all have the same length, got {sizes}"
            raise ValueError(msg)
        return pa.Table.from_arrays(columns, names=[str(n) for n in names])
    module = type(batch).__module__.split(".")[0]
    if module == "pandas":
        # without pandas' metadata: as in Ray, what a UDF returns is an Arrow block, whose
        # pandas batches and to_pandas have Arrow dtypes (only from_pandas keeps pandas')
        table = frame_to_table(batch, objects)
        return table.replace_schema_metadata(None) if table.schema.metadata else table
    if module == "polars":
        return batch.to_arrow()  # type: ignore[no-any-return]
    msg = (
        "a batch function must return a dict of columns, a pyarrow Table, a pandas or polars "
        f"DataFrame; got {type(batch).__name__}"
    )
    raise UDFOutputError(msg)


def _check_column(name: str, values: Any) -> None:
    """Refuse a column that is one value rather than one value per row: a number, a string
    (which would become one row per character), None, a dict, a numpy scalar or 0-d array; and a
    set, whose rows would come in no order. Ray refuses these too (``ValueError``)."""
    shape = getattr(values, "shape", None)
    if (isinstance(values, (str, bytes, bytearray, Mapping, set, frozenset)) or (shape is not None and len(shape) == 0)
            or not (isinstance(values, Sized) and isinstance(values, Iterable))):
        msg = (
            f"the batch function's column {name!r} is one {type(values).__name__}, not a column: a batch's "
            "columns are lists, numpy arrays, pyarrow arrays or pandas/polars Series with one value per row "
            "(to return one value, wrap it: [value])"
        )
        raise UDFOutputError(msg)


def frame_to_table(frame: Any, objects: bool | None = None) -> pa.Table:
    """A pandas DataFrame as a table (its index dropped). An ``object`` column whose cells are
    numpy arrays (a tensor column of a pandas batch, images a UDF made) becomes a tensor column,
    as Ray casts such columns to its tensor type whenever it builds a block; pyarrow alone makes
    lists of 1-d cells and cannot convert n-d ones."""
    arrays = [name for name, column in frame.items() if column.dtype == object and _holds_arrays(column)]
    try:
        plain = pa.Table.from_pandas(frame.drop(columns=arrays) if arrays else frame, preserve_index=False)
    except _NOT_ARROW:  # an object column Arrow cannot hold (ints and strings, say) is Python objects
        arrays += [name for name, column in frame.items()
                   if name not in arrays and column.dtype == object and not _converts(column)]
        plain = pa.Table.from_pandas(frame.drop(columns=arrays), preserve_index=False)
    if not arrays:
        return plain
    columns = [column_from_values(str(name), list(frame[name]), objects) if name in arrays else plain.column(str(name))
               for name in frame.columns]
    return pa.Table.from_arrays(columns, names=[str(n) for n in frame.columns], metadata=plain.schema.metadata)


def _converts(column: Any) -> bool:
    try:
        pa.Array.from_pandas(column)
    except _NOT_ARROW:
        return False
    return True


def _holds_arrays(column: Any) -> bool:
    """Whether the first cell of a pandas column that is not None is a numpy array."""
    for value in column:
        if value is not None:
            return isinstance(value, np.ndarray)
    return False


def table_to_pandas(table: pa.Table, arrow_backed: bool = True) -> Any:
    """``table`` as a pandas DataFrame, as Ray Data 2.60's ``to_pandas`` makes it.

    With ``arrow_backed`` (Ray's default since 2.56), standard Arrow types become
    ``pd.ArrowDtype`` columns (``int64[pyarrow]``, ``string[pyarrow]``...); tensor columns are
    ``object`` columns of n-d numpy arrays, one per row; dictionary, null and other extension
    types convert as pyarrow converts them. A table made from pandas frames (its schema keeps
    pandas' metadata, as Ray keeps pandas blocks) gets its pandas dtypes back.
    """
    import pandas as pd

    tensors = [i for i, f in enumerate(table.schema) if isinstance(f.type, pa.FixedShapeTensorType)
               or is_ragged(f.type) or is_python_object(f.type) or pa.types.is_fixed_size_list(f.type)]
    from_pandas = bool(table.schema.metadata and b"pandas" in table.schema.metadata)

    def mapper(typ: pa.DataType) -> Any:
        if isinstance(typ, pa.BaseExtensionType) or pa.types.is_dictionary(typ) or pa.types.is_null(typ):
            return None
        if pa.types.is_fixed_size_list(typ):
            return None
        return pd.ArrowDtype(typ)

    plain = table.drop_columns([table.column_names[i] for i in tensors]) if tensors else table
    frame = plain.to_pandas(types_mapper=mapper if arrow_backed and not from_pandas else None)
    for i in tensors:
        cells = np.empty(table.num_rows, dtype=object)
        for row, cell in enumerate(column_to_numpy(table.column(i)) if table.num_rows else []):
            cells[row] = cell
        frame.insert(i, table.column_names[i], cells)
    return frame


def _python_column(column: pa.ChunkedArray) -> list[Any]:
    typ = column.type
    if (isinstance(typ, pa.FixedShapeTensorType) or is_ragged(typ) or is_python_object(typ)
            or pa.types.is_fixed_size_list(typ)):
        return list(column_to_numpy(column))
    if pa.types.is_list(typ) and isinstance(typ.value_type, pa.FixedShapeTensorType):  # lists of tensors
        return [None if cell is None else list(cell) for cell in column.to_numpy(zero_copy_only=False)]
    return column.to_pylist()  # type: ignore[no-any-return]


_row_builders: dict[tuple[str, ...], Any] = {}


def _row_builder(names: tuple[str, ...]) -> Any:
    """A compiled ``columns -> [dict, ...]``: a dict display per row is ~3x faster than dict(zip())."""
    builder = _row_builders.get(names)
    if builder is None:
        if len(set(names)) != len(names):
            def builder(cols: list[list[Any]]) -> list[dict[str, Any]]:
                return [dict(zip(names, vals, strict=True)) for vals in zip(*cols, strict=True)]
        else:
            items = ", ".join(f"{name!r}: v{i}" for i, name in enumerate(names))
            loop_vars = ", ".join(f"v{i}" for i in range(len(names)))
            source = (
                f"def build(cols):\n    return [{{{items}}} for {loop_vars} in cols[0]]"
                if len(names) == 1
                else f"def build(cols):\n    return [{{{items}}} for {loop_vars} in zip(*cols)]"
            )
            namespace: dict[str, Any] = {}
            exec(compile(source, "<dataflow rows>", "exec"), namespace)
            builder = namespace["build"]
        if len(_row_builders) < 1024:
            _row_builders[names] = builder
    return builder


def rows_of(table: pa.Table) -> list[dict[str, Any]]:
    """Rows of ``table`` as dicts (tensor cells as numpy arrays)."""
    if table.num_columns == 0:
        return [{} for _ in range(table.num_rows)]
    return _row_builder(tuple(table.column_names))([_python_column(c) for c in table.columns])  # type: ignore[no-any-return]


def concat_blocks(tables: list[pa.Table]) -> pa.Table:
    """One table of ``tables``' rows. Blocks whose schemas differ are unified as Ray's are:
    tensor columns of different shapes become one variable-shape tensor column (images of
    different sizes), other types are promoted (a null-typed column, int widths)."""
    if len(tables) == 1:
        return tables[0]
    if all(t.num_columns == 0 for t in tables):  # pyarrow's concat of these has no rows
        return pa.table({"_": pa.nulls(sum(t.num_rows for t in tables))}).select([])
    try:
        return pa.concat_tables(tables)
    except pa.ArrowInvalid:
        tables = unify_tensors(tables) or tables
        return pa.concat_tables(tables, promote_options="permissive")


def slice_rows(table: pa.Table, offset: int, length: int) -> pa.Table:
    """``table.slice(offset, length)`` clamped to the table's rows. pyarrow does not clamp a table
    without columns (``select_columns([])``): its slice has ``length`` rows whatever it holds."""
    return table.slice(offset, max(0, min(length, table.num_rows - offset)))


def iter_rows(table: pa.Table) -> Iterable[dict[str, Any]]:
    """Rows of ``table`` as dicts, a chunk at a time."""
    for start in range(0, table.num_rows, 16384):
        yield from rows_of(slice_rows(table, start, 16384))


def rows_to_block(rows: list[Any], objects: bool | None = None) -> pa.Table:
    """Rows (dicts) back into a table; one pass per column when every row has the same keys.

    A key some rows lack is a null in those rows, as Ray 2.60's ``TableBlockBuilder`` fills
    them (whatever the block layout: raising here made the same function fail or not
    depending on which rows shared a block); columns in the order keys first appear."""
    if not rows:
        return pa.table({})
    first = rows[0]
    if not isinstance(first, Mapping):
        msg = f"a row function must return a dict, got {type(first).__name__}"
        raise UDFOutputError(msg)
    keys = list(first.keys())
    try:  # fast path: every row has exactly the first row's keys
        columns = {k: [r[k] for r in rows] for k in keys}
        if len(set(map(len, rows))) == 1:
            return to_block(columns, objects)
    except (KeyError, TypeError, IndexError):
        pass
    all_keys: dict[Any, None] = {}
    for r in rows:
        if not isinstance(r, Mapping):
            msg = f"a row function must return a dict, got {type(r).__name__}"
            raise UDFOutputError(msg)
        all_keys.update(dict.fromkeys(r))
    return to_block({k: [r.get(k) for r in rows] for k in all_keys}, objects)  # missing keys are nulls

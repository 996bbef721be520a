"""TensorFlow ingest: ``iter_tf_batches``, ``to_tf`` (a ``tf.data.Dataset``) and the type specs
of a schema; the one module importing tensorflow.

It is imported only when one of them is first used, so ``import dataflow`` never imports
tensorflow. The stages continue ``DataIterator.iter_batches``:

    fetch -> rebatch -> shuffle -> format (numpy) -> prefetch (``dataflow.iterator``)
    -> to tensors (here, on the consuming thread, as in Ray Data)

For ``to_tf`` the consuming thread is the one TensorFlow runs the generator of
``tf.data.Dataset.from_generator`` on; ``.prefetch(tf.data.AUTOTUNE)`` on the result overlaps
the conversion with the training step.

**Columns to tensors.** Numbers and booleans keep their dtype; strings and binary become
``tf.string``; fixed-size-list and tensor columns become ``(N, *shape)`` tensors. Columns whose
rows have different lengths (``list<...>`` columns, variable-shape tensors) become
``tf.RaggedTensor``s: ``to_tf`` declares a ``tf.RaggedTensorSpec`` for them, as Ray Data does,
and, unlike Ray Data, also makes them; ``iter_tf_batches`` gives a dense tensor when a batch's
rows happen to have one shape (Ray Data's conversion) and a ragged one otherwise (where Ray Data
fails).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from dataflow.iterator import DataIterator, check_batch_size
from dataflow.schema import Schema, type_name
from engine.ragged_tensors import is_ragged

try:
    import tensorflow as tf
except ImportError as exc:  # pragma: no cover - depends on the environment
    msg = (
        "iter_tf_batches, to_tf and TensorFlow type specs need TensorFlow: install dataflow's "
        "'tensorflow' extra (pip install 'dataflow[tensorflow]'), or tensorflow / tensorflow-cpu"
    )
    raise ImportError(msg) from exc


# ----- dtypes and type specs ------------------------------------------------------------------


def check_dtypes(dtypes: Any) -> Any:
    """``dtypes`` as ``tf.DType``s: None, one dtype for every column, or ``{column: dtype}``.
    Anything ``tf.as_dtype`` takes is accepted (``tf.float32``, ``np.float32``, ``"float32"``)."""
    if dtypes is None:
        return None
    if isinstance(dtypes, Mapping):
        return {name: _as_dtype(value) for name, value in dtypes.items()}
    return _as_dtype(dtypes)


def _as_dtype(value: Any) -> tf.DType | None:
    if value is None:
        return None
    try:
        return tf.as_dtype(value)
    except TypeError as err:
        msg = f"dtypes must be a tf.DType or a dict of column -> tf.DType, got {value!r}"
        raise TypeError(msg) from err


def get_type_spec(schema: Schema | pa.Schema, columns: str | Sequence[str]) -> Any:
    """The type spec of ``columns`` (one column: its ``tf.TypeSpec``; a list: ``{column: spec}``,
    in the schema's order), as Ray Data's ``get_type_spec``: the batch dimension is ``None``."""
    types = dict(zip(schema.names, schema.types, strict=True))
    if isinstance(columns, str):
        return column_type_spec(columns, types[columns])
    return {name: column_type_spec(name, typ) for name, typ in types.items() if name in columns}


def column_type_spec(name: str, typ: pa.DataType) -> Any:
    """``tf.TensorSpec((None, *shape), dtype, name)`` of a column, or a ``tf.RaggedTensorSpec``
    when its rows differ in length (lists, variable-shape tensors)."""
    shape: list[int | None] = [None]
    ragged_rank = 0
    base = typ
    while True:
        if isinstance(base, pa.FixedShapeTensorType):
            shape += list(base.shape)
            base = base.value_type
            break
        if is_ragged(base):
            if len(shape) > ragged_rank + 1:
                break  # a ragged tensor inside a fixed-size list: refused below
            shape += [None] * base.ndim
            ragged_rank += base.ndim
            base = base.value_type
            break
        if pa.types.is_list(base) or pa.types.is_large_list(base):
            if len(shape) > ragged_rank + 1:
                break  # a list inside a fixed-size list: refused below
            shape.append(None)
            ragged_rank += 1
            base = base.value_type
            continue
        if pa.types.is_fixed_size_list(base):
            shape.append(base.list_size)
            base = base.value_type
            continue
        break
    dtype = _arrow_tf_dtype(base)
    if dtype is None:
        msg = (
            f"column {name!r} has type {type_name(typ)}, which has no TensorFlow type spec: "
            "give its tf.TypeSpec (feature_type_spec / label_type_spec / additional_type_spec), "
            "or convert or drop the column first (map_batches, drop_columns)"
        )
        raise TypeError(msg)
    if ragged_rank:
        return tf.RaggedTensorSpec(shape, dtype, ragged_rank=ragged_rank)
    return tf.TensorSpec(shape, dtype=dtype, name=name)


def _arrow_tf_dtype(typ: pa.DataType) -> tf.DType | None:
    if pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_boolean(typ):
        return tf.as_dtype(typ.to_pandas_dtype())
    if (pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_binary(typ)
            or pa.types.is_large_binary(typ) or pa.types.is_string_view(typ) or pa.types.is_binary_view(typ)):
        return tf.string
    return None


# ----- numpy columns -> tensors ---------------------------------------------------------------


def to_tensors(batch: Mapping[str, np.ndarray], dtypes: Any = None) -> dict[str, Any]:
    """Each column of a numpy batch as a tensor; ``dtypes``: one ``tf.DType`` or a dict per
    column (columns it does not name keep their dtype)."""
    out = {}
    for name, array in batch.items():
        dtype = dtypes.get(name) if isinstance(dtypes, Mapping) else dtypes
        out[name] = column_tensor(name, array, dtype=dtype)
    return out


def column_tensor(name: str, array: Any, *, dtype: tf.DType | None = None, type_spec: Any = None) -> Any:
    """One column as a ``tf.Tensor`` (a ``tf.RaggedTensor`` for a ragged spec or ragged rows).

    ``dtype`` wins over the spec's, as in Ray Data's ``convert_ndarray_to_tf_tensor``.
    """
    if dtype is None and type_spec is not None:
        dtype = type_spec.dtype
    if not isinstance(array, np.ndarray):
        array = np.asarray(array)
    if isinstance(type_spec, tf.RaggedTensorSpec):
        return ragged_tensor(name, array, dtype, type_spec.ragged_rank)
    if array.dtype == object:
        cells = _array_cells(name, array)
        if cells is not None:
            shapes = {c.shape for c in cells}
            stacked = np.stack(cells) if len(shapes) == 1 else None
            if stacked is not None and not _nested(stacked):
                array = stacked  # rows of one shape (Ray Data's conversion)
            elif type_spec is None:
                return ragged_tensor(name, array, dtype, None)
            else:
                listed = ", ".join(str(s) for s in sorted(shapes)[:4])
                msg = (
                    f"column {name!r} holds arrays of different shapes ({listed}), which do not make one dense "
                    f"tensor as its type spec {type_spec} says: give a tf.RaggedTensorSpec for it, or resize "
                    "or pad the arrays first (map_batches)"
                )
                raise ValueError(msg)
    _check_no_nulls(name, array, dtype)
    try:
        return tf.convert_to_tensor(array, dtype=dtype)
    except (TypeError, ValueError) as err:
        raise type(err)(_conversion_error(name, array, dtype, err)) from err


def ragged_tensor(name: str, array: np.ndarray, dtype: tf.DType | None, ragged_rank: int | None) -> Any:
    """A ``tf.RaggedTensor`` with ``ragged_rank`` ragged dimensions (None: as many as the rows
    have) from a batch column: an object array of the rows' arrays, or an n-d array (rows of
    one shape)."""
    if array.dtype != object:
        _check_no_nulls(name, array, dtype)
        return tf.RaggedTensor.from_tensor(tf.convert_to_tensor(array, dtype=dtype), ragged_rank=ragged_rank or 1)
    cells = _array_cells(name, array) or []
    numeric = bool(cells) and all(c.dtype.kind in "biuf" for c in cells)
    if numeric and ragged_rank is None and len({c.ndim for c in cells}) == 1:
        ragged_rank = cells[0].ndim
    try:
        if numeric and ragged_rank is not None and all(c.ndim >= ragged_rank for c in cells):
            return _ragged_from_arrays(cells, dtype, ragged_rank)
        return tf.ragged.constant([_nested_list(cell) for cell in array], dtype=dtype, ragged_rank=ragged_rank)
    except (TypeError, ValueError) as err:
        raise type(err)(_conversion_error(name, array, dtype, err, "tf.RaggedTensor")) from err


def _ragged_from_arrays(cells: list[np.ndarray], dtype: tf.DType | None, ragged_rank: int) -> Any:
    """The rows' numeric arrays as one ragged tensor: their values concatenated (one copy) and
    a row-lengths vector per ragged dimension."""
    values = np.concatenate([c.reshape((-1, *c.shape[ragged_rank:])) for c in cells])
    tensor = tf.convert_to_tensor(values, dtype=dtype)
    for level in reversed(range(ragged_rank)):  # innermost ragged dimension first
        lengths = np.concatenate([np.full(int(np.prod(c.shape[:level])), c.shape[level], np.int64) for c in cells])
        tensor = tf.RaggedTensor.from_row_lengths(tensor, lengths, validate=False)
    return tensor


def _nested(array: np.ndarray) -> bool:
    """An object array whose elements are arrays again (a list of lists)."""
    return array.dtype == object and array.size > 0 and isinstance(array.flat[0], np.ndarray)


def _conversion_error(name: str, array: np.ndarray, dtype: tf.DType | None, err: Exception,
                      kind: str = "tf.Tensor") -> str:
    of_dtype = f" of dtype {dtype.name}" if dtype is not None else ""
    return f"column {name!r} ({array.dtype}, shape {array.shape}) cannot be converted to a {kind}{of_dtype}: {err}"


def _array_cells(name: str, array: np.ndarray) -> list[np.ndarray] | None:
    """The rows of an object column when every one is an array (a tensor or list column), else
    None (strings, Python objects); a null row among arrays is an error."""
    cells = list(array)
    if not cells or not all(c is None or isinstance(c, np.ndarray) for c in cells):
        return None
    if any(c is None for c in cells):
        msg = f"column {name!r} has null rows, which a tensor cannot hold; fill or filter them first"
        raise ValueError(msg)
    return cells


def _nested_list(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return [_nested_list(v) for v in value] if value.dtype == object else value.tolist()
    if isinstance(value, (list, tuple)):
        return [_nested_list(v) for v in value]
    return value


def _check_no_nulls(name: str, array: np.ndarray, dtype: tf.DType | None) -> None:
    """An integer or boolean column with nulls arrives as floats with NaN: say so, rather than
    let the cast turn them into arbitrary numbers."""
    if dtype is None or not (dtype.is_integer or dtype.is_bool) or array.dtype.kind != "f":
        return
    if np.isnan(array).any():
        msg = (
            f"column {name!r} has nulls, which a {dtype.name} tensor cannot hold; fill them first "
            "(map_batches), or give a floating-point type spec or dtype for it"
        )
        raise ValueError(msg)


# ----- iter_tf_batches ------------------------------------------------------------------------


def iter_tf_batches(
    iterator: DataIterator,
    *,
    prefetch_batches: int = 1,
    batch_size: int | None = 256,
    dtypes: Any = None,
    drop_last: bool = False,
    local_shuffle_buffer_size: int | None = None,
    local_shuffle_seed: int | None = None,
) -> Iterator[dict[str, Any]]:
    """Batches of ``batch_size`` rows as ``{column: tf.Tensor}``, as Ray Data's.

    * ``dtypes``: one dtype for every column or ``{column: dtype}`` (the others keep theirs).
    * ``drop_last``, ``local_shuffle_buffer_size``, ``local_shuffle_seed``, ``prefetch_batches``:
      as ``iter_batches``.

    Arguments are checked here, when called, not at the first batch.
    """
    dtypes = check_dtypes(dtypes)
    batches = iterator.iter_batches(
        prefetch_batches=prefetch_batches, batch_size=batch_size, batch_format="numpy", drop_last=drop_last,
        local_shuffle_buffer_size=local_shuffle_buffer_size, local_shuffle_seed=local_shuffle_seed,
    )
    return _converted(batches, lambda batch: to_tensors(batch, dtypes))


def _converted(batches: Iterator[Any], convert: Any) -> Iterator[Any]:
    """``convert(batch)`` for each batch; closing this closes ``batches`` at once (which
    releases their blocks and stops the prefetch thread)."""
    try:
        for batch in batches:
            yield convert(batch)
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()


# ----- to_tf --------------------------------------------------------------------------------


def to_tf(
    iterator: DataIterator,
    feature_columns: str | list[str],
    label_columns: str | list[str],
    *,
    additional_columns: str | list[str] | None = None,
    prefetch_batches: int = 1,
    batch_size: int = 1,
    drop_last: bool = False,
    local_shuffle_buffer_size: int | None = None,
    local_shuffle_seed: int | None = None,
    feature_type_spec: Any = None,
    label_type_spec: Any = None,
    additional_type_spec: Any = None,
) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of ``(features, labels)`` batches (``(features, labels, additional)``
    with ``additional_columns``), as Ray Data's ``to_tf``.

    Each part is one tensor when its columns are a string, a ``{column: tensor}`` dict when a
    list. Type specs not given are derived from the dataset's schema (which may run the
    dataset, as ``schema()`` does); each epoch of the result is one epoch of ``iterator``.
    """
    check_batch_size(batch_size)
    parts = [("feature", feature_columns, feature_type_spec), ("label", label_columns, label_type_spec)]
    if additional_columns is not None:
        parts.append(("additional", additional_columns, additional_type_spec))
    parts = [(kind, _columns_arg(kind, columns), spec) for kind, columns, spec in parts]
    if any(spec is None for _, _, spec in parts):
        schema = iterator.schema()
        if schema is None:
            msg = (
                "to_tf derives type specs from the dataset's schema, which this iterator does not know "
                "before it runs; give feature_type_spec and label_type_spec (and additional_type_spec)"
            )
            raise ValueError(msg)
        valid_columns = set(schema.names)
        for _, columns, spec in parts:
            if spec is None:
                _validate_columns(columns, valid_columns)
        parts = [(kind, columns, get_type_spec(schema, columns) if spec is None else spec)
                 for kind, columns, spec in parts]
    for kind, columns, spec in parts:
        _check_type_spec(kind, columns, spec)

    epochs = _Epochs(iterator, {
        "prefetch_batches": prefetch_batches, "batch_size": batch_size, "batch_format": "numpy",
        "drop_last": drop_last, "local_shuffle_buffer_size": local_shuffle_buffer_size,
        "local_shuffle_seed": local_shuffle_seed,
    })
    epochs_ref = weakref.ref(epochs)

    def generator() -> Iterator[tuple[Any, ...]]:
        source = epochs_ref()
        if source is None:
            msg = (
                "the tf.data.Dataset made by to_tf() was garbage collected while TensorFlow still reads "
                "it; keep a reference to it (or to a dataset derived from it) while iterating"
            )
            raise RuntimeError(msg)
        batches = source.batches()  # holds the dataset until this epoch ends
        del source
        yield from _converted(batches, lambda batch: tuple(_part(batch, c, s) for _, c, s in parts))

    signature = tuple(spec for _, _, spec in parts)
    dataset = tf.data.Dataset.from_generator(generator, output_signature=signature)
    dataset._dataflow_epochs = epochs  # see _Epochs
    options = tf.data.Options()
    # every worker reads the whole generator: sharding is the dataset's business (streaming_split)
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options)


class _Epochs:
    """What each epoch of a ``to_tf`` dataset reads, owned by that ``tf.data.Dataset`` object.

    TensorFlow keeps the generator of every ``from_generator`` dataset for the life of the
    process (eager ``py_func``s are held by the global graph), so a generator holding the
    iterator would keep the dataflow dataset, and the blocks of a materialized one, forever.
    The generator holds this object weakly instead; the ``tf.data.Dataset`` holds it, and so
    does everything TensorFlow derives from that dataset (derived datasets, iterators, Keras's
    and tf.distribute's handles keep their input dataset).
    """

    def __init__(self, iterator: DataIterator, options: dict[str, Any]) -> None:
        self.iterator, self.options = iterator, options

    def batches(self) -> Iterator[dict[str, np.ndarray]]:
        return self.iterator.iter_batches(**self.options)


def _columns_arg(kind: str, columns: Any) -> str | list[str]:
    if isinstance(columns, str):
        return columns
    if isinstance(columns, (list, tuple)) and columns and all(isinstance(c, str) for c in columns):
        return list(columns)
    msg = f"{kind}_columns must be a column name or a non-empty list of them, got {columns!r}"
    raise (ValueError if isinstance(columns, (list, tuple)) else TypeError)(msg)


def _validate_columns(columns: str | list[str], valid_columns: set[str]) -> None:
    for column in [columns] if isinstance(columns, str) else columns:
        if column not in valid_columns:
            msg = (
                f"You specified '{column}' in `feature_columns`, `label_columns`, or `additional_columns`, "
                f"but there's no column named '{column}' in the dataset. Valid column names are: {valid_columns}."
            )
            raise ValueError(msg)


def _check_type_spec(kind: str, columns: str | list[str], spec: Any) -> None:
    """One ``tf.TypeSpec`` for one column, a dict of them keyed by exactly the columns for a list."""
    if isinstance(columns, str):
        if not isinstance(spec, tf.TypeSpec):
            msg = f"{kind}_columns is one column ({columns!r}), so {kind}_type_spec must be a tf.TypeSpec, got {spec!r}"
            raise TypeError(msg)
        return
    if not isinstance(spec, Mapping) or not all(isinstance(s, tf.TypeSpec) for s in spec.values()):
        msg = f"{kind}_columns is a list, so {kind}_type_spec must be a dict of column -> tf.TypeSpec, got {spec!r}"
        raise TypeError(msg)
    if set(spec) != set(columns):
        msg = f"{kind}_type_spec must have one entry per column of {kind}_columns {columns}, got {sorted(spec)}"
        raise ValueError(msg)


def _part(batch: Mapping[str, np.ndarray], columns: str | list[str], spec: Any) -> Any:
    if isinstance(columns, str):
        return column_tensor(columns, batch[columns], type_spec=spec)
    return {column: column_tensor(column, batch[column], type_spec=spec[column]) for column in columns}


__all__ = ["check_dtypes", "column_tensor", "get_type_spec", "iter_tf_batches", "to_tensors", "to_tf"]

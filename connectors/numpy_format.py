"""NumPy ``.npy`` files: one row per element of the first axis, in a column named ``data``.

A ``(n, ...)`` array gives ``n`` rows; rows of more than one dimension are stored as a fixed-shape
tensor column (``pa.fixed_shape_tensor``), zero-copy to NumPy. Pickled object arrays are refused
unless the caller passes ``allow_pickle=True`` (as Ray): a data file must not run code unasked.

``NumpyDatasink`` writes one column back: one ``.npy`` file per write task (the rows of the blocks
that task received, or ``max_rows_per_file`` at most), staged and committed by ``file_datasink``.
Numbers and booleans, strings (a fixed-width unicode array), and tensors (fixed-shape tensor,
fixed-size list or equal-length list columns, as an ``(n, ...)`` array) can be written; anything
that would need pickling (ragged arrays, structs) is refused with the column's name and type.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from connectors.errors import FileFormatError
from connectors.file_datasink import FileDatasink, combine
from connectors.file_datasource import FileDatasource, FilePiece
from connectors.filesystem import read_file_bytes
from connectors.retry import Retrier
from engine.block_format import tensor_array
from engine.ragged_tensors import is_ragged, ragged_to_numpy


def tensor_column(array: np.ndarray) -> pa.Array:
    """``array`` (rows along axis 0) as an Arrow column: plain for 1-D, fixed-shape tensor otherwise."""
    array = np.ascontiguousarray(array)
    if array.ndim == 1:
        return pa.array(array)
    return pa.FixedShapeTensorArray.from_numpy_ndarray(array)


NUMPY_LOAD_ARGS = ("fix_imports", "encoding", "max_header_size")
"""What ``np.load`` takes besides the file and ``allow_pickle`` (Ray's ``**numpy_load_args``;
``mmap_mode`` needs a local file, and files are read as bytes here)."""


class NumpyDatasource(FileDatasource):
    """Rows of ``.npy`` arrays (column ``data``).

    ``allow_pickle`` (Ray's, default False): an object-dtype ``.npy`` holds pickled Python
    objects, and unpickling can run code: only for files you trust. Its rows become a column of
    Arrow values where Arrow can hold them, else of Python objects. ``numpy_load_args``: more
    arguments of ``np.load``.
    """

    FILE_EXTENSIONS = (".npy",)

    def __init__(
        self, paths: Any, *, allow_pickle: bool = False, numpy_load_args: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        unknown = sorted(set(numpy_load_args or ()) - set(NUMPY_LOAD_ARGS))
        if unknown:
            raise TypeError(f"read_numpy() got an unexpected keyword argument {unknown[0]!r} "
                            f"(np.load's arguments taken here: {', '.join(NUMPY_LOAD_ARGS)})")
        super().__init__(paths, **kwargs)
        self._allow_pickle = bool(allow_pickle)
        self._load_args = dict(numpy_load_args or {})

    def _read_file(self, fs: Any, piece: FilePiece, display: str, retrier: Retrier) -> Iterator[pa.Table]:
        data = read_file_bytes(fs, piece.entry.path, retrier, display, args=self._stream_args)
        try:
            array = np.load(io.BytesIO(data), allow_pickle=self._allow_pickle, **self._load_args)
        except (ValueError, OSError, EOFError) as exc:
            hint = "; pass allow_pickle=True if you trust it" if "allow_pickle" in str(exc) else ""
            raise FileFormatError(f"not a readable .npy file: {exc}{hint}", path=display) from exc
        if not isinstance(array, np.ndarray):  # an .npz archive: several named arrays
            array.close()
            raise FileFormatError("an .npz archive holds several arrays; read_numpy reads .npy files", path=display)
        if array.ndim == 0:
            array = array.reshape(1)
        if array.dtype == object:  # only loaded with allow_pickle=True
            yield pa.table({"data": tensor_array(array, "data", objects=True)})
            return
        yield pa.table({"data": tensor_column(array)})


def column_to_ndarray(column: pa.ChunkedArray | pa.Array, name: str) -> np.ndarray:
    """``column`` as one NumPy array without object dtype: rows along axis 0, tensors n-d.

    Raises ``TypeError`` naming the column for values that only an object array (pickled in a
    ``.npy``) could hold: ragged lists, structs, maps, or strings with nulls.
    """
    if isinstance(column, pa.ChunkedArray):
        column = pa.concat_arrays(column.chunks) if column.num_chunks != 1 else column.chunk(0)
    typ = column.type
    if isinstance(typ, pa.FixedShapeTensorType):
        return column.to_numpy_ndarray()  # type: ignore[attr-defined,no-any-return]
    if is_ragged(typ) and column.null_count == 0:
        cells = list(ragged_to_numpy(column))
        if len({c.shape for c in cells}) <= 1:  # one row (an image to write), or rows of one shape
            return np.stack(cells) if cells else np.empty(0)
    if pa.types.is_fixed_size_list(typ) and column.null_count == 0:
        inner = column_to_ndarray(column.flatten(), name)
        return inner.reshape(len(column), typ.list_size, *inner.shape[1:])
    if (pa.types.is_list(typ) or pa.types.is_large_list(typ)) and column.null_count == 0:
        lengths = np.diff(column.offsets.to_numpy())
        if lengths.size and (lengths == lengths[0]).all():
            inner = column_to_ndarray(column.flatten(), name)
            return inner.reshape(len(column), int(lengths[0]), *inner.shape[1:])
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        if column.null_count == 0:
            return np.array(column.to_pylist(), dtype=str)
    elif pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        if column.null_count == 0:
            return np.array(column.to_pylist(), dtype=bytes)
    else:
        array = column.to_numpy(zero_copy_only=False)
        if array.dtype != object:
            return array
    msg = (
        f"column {name!r} ({typ}) cannot be written to .npy without pickling: write numbers, strings "
        "or equal-shaped tensors (nulls only in number columns, where they become NaN)"
    )
    raise TypeError(msg)


class NumpyDatasink(FileDatasink):
    """One column as ``.npy`` files under ``path`` (local or ``s3://``), committed atomically.

    ``column``: the column to write. One file per write task; ``min_rows_per_file`` makes the
    engine bundle blocks; ``max_rows_per_file`` caps each file; ``file_options`` go to
    ``FileDatasink``.
    """

    EXTENSION = ".npy"

    def __init__(
        self,
        path: str,
        *,
        column: str,
        min_rows_per_file: int | None = None,
        max_rows_per_file: int | None = None,
        filesystem: Any = None,
        **file_options: Any,
    ) -> None:
        super().__init__(
            path,
            min_rows_per_file=min_rows_per_file,
            max_rows_per_file=max_rows_per_file,
            filesystem=filesystem,
            **file_options,
        )
        self._column = column

    def get_name(self) -> str:
        """``WriteNumpy``."""
        return "WriteNumpy"

    def _encode(self, tables: list[pa.Table]) -> pa.Buffer:
        table = combine(tables)
        if self._column not in table.column_names:
            raise ValueError(f"write_numpy: no column {self._column!r}; the data has {table.column_names}")
        array = column_to_ndarray(table.column(self._column), self._column)
        out = io.BytesIO()
        np.save(out, array, allow_pickle=False)
        return pa.py_buffer(out.getvalue())

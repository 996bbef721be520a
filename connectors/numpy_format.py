"""NumPy ``.npy`` files: one row per element of the first axis, in a column named ``data``.

A ``(n, ...)`` array gives ``n`` rows; rows of more than one dimension are stored as a fixed-shape
tensor column (``pa.fixed_shape_tensor``), zero-copy to NumPy. Pickled object arrays are refused
(``allow_pickle=False``): a data file must not be able to run code.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from connectors.errors import FileFormatError
from connectors.file_datasource import FileDatasource, FilePiece
from connectors.filesystem import read_file_bytes
from connectors.retry import Retrier


def tensor_column(array: np.ndarray) -> pa.Array:
    """``array`` (rows along axis 0) as an Arrow column: plain for 1-D, fixed-shape tensor otherwise."""
    array = np.ascontiguousarray(array)
    if array.ndim == 1:
        return pa.array(array)
    return pa.FixedShapeTensorArray.from_numpy_ndarray(array)


class NumpyDatasource(FileDatasource):
    """Rows of ``.npy`` arrays (column ``data``)."""

    FILE_EXTENSIONS = (".npy",)

    def _read_file(self, fs: Any, piece: FilePiece, display: str, retrier: Retrier) -> Iterator[pa.Table]:
        data = read_file_bytes(fs, piece.entry.path, retrier, display)
        try:
            array = np.load(io.BytesIO(data), allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise FileFormatError(f"not a readable .npy file: {exc}", path=display) from exc
        if array.ndim == 0:
            array = array.reshape(1)
        yield pa.table({"data": tensor_column(array)})

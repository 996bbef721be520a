"""NumPy ``.npy`` files: one row per element of the first axis, in a column named ``data``.

A ``(n, ...)`` array gives ``n`` rows; rows of more than one dimension are stored as a fixed-shape
tensor column (``pa.fixed_shape_tensor``), zero-copy to NumPy. Pickled object arrays are refused
unless the caller passes ``allow_pickle=True`` (as Ray): a data file must not run code unasked.

An uncompressed array of plain values in C order (what ``np.save`` writes for numbers, strings
and tensors) is read from its header and then ``block_bytes`` (16 MiB) of rows at a time: a file
of 20 GB of embeddings never needs more than a block or two in memory, and one well over a read
task's bytes is cut into ranges of rows, one task each. Other files (pickled objects, Fortran
order, compressed) are loaded whole with ``np.load``.

``NumpyDatasink`` writes one column back: one ``.npy`` file per write task (the rows of the blocks
that task received, or ``max_rows_per_file`` at most), staged and committed by ``file_datasink``.
Numbers and booleans, strings (a fixed-width unicode array), and tensors (fixed-shape tensor,
fixed-size list or equal-length list columns, as an ``(n, ...)`` array) can be written; anything
that would need pickling (ragged arrays, structs) is refused with the column's name and type.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from connectors.errors import FileFormatError
from connectors.file_datasink import FileDatasink, combine
from connectors.file_datasource import FileDatasource, FilePiece, coalesce
from connectors.filesystem import STREAM_BLOCK_BYTES, FileEntry, compression_of, iter_stream, read_file_bytes
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

    REUSED_BY_WORKERS = True  # its reads never change it (connectors.base.SharedSource)

    FILE_EXTENSIONS = (".npy",)

    def __init__(
        self,
        paths: Any,
        *,
        allow_pickle: bool = False,
        numpy_load_args: dict[str, Any] | None = None,
        block_bytes: int = STREAM_BLOCK_BYTES,
        **kwargs: Any,
    ) -> None:
        unknown = sorted(set(numpy_load_args or ()) - set(NUMPY_LOAD_ARGS))
        if unknown:
            raise TypeError(f"read_numpy() got an unexpected keyword argument {unknown[0]!r} "
                            f"(np.load's arguments taken here: {', '.join(NUMPY_LOAD_ARGS)})")
        super().__init__(paths, **kwargs)
        self._allow_pickle = bool(allow_pickle)
        self._load_args = dict(numpy_load_args or {})
        self._block_bytes = block_bytes

    def _read_pieces(self, pieces: tuple[FilePiece, ...], part_schema: pa.Schema | None) -> Iterator[pa.Table]:
        retrier = Retrier(self._retry_policy)
        yield from coalesce(self._iter_piece_tables(pieces, part_schema, retrier), self._block_bytes)

    def _split_files(self) -> bool | Callable[[FileEntry], bool]:
        """A big uncompressed file is cut into ranges of rows (a file that turns out not to be
        plain values in C order is loaded whole by its first range)."""
        return self._plain

    def _plain(self, entry: FileEntry) -> bool:
        return self._stream_args.compression is None and compression_of(entry.path) is None

    def _read_file(self, fs: Any, piece: FilePiece, display: str, retrier: Retrier) -> Iterator[pa.Table]:
        if self._plain(piece.entry):

            def parse(file: pa.NativeFile) -> Iterator[pa.Table]:
                return _plain_rows(file, piece, self._block_bytes, self._load_args.get("max_header_size"), display)

            def opener() -> pa.NativeFile:
                return fs.open_input_file(piece.entry.path)

            plain = True
            for table in iter_stream(fs, piece.entry.path, retrier, display, parse, opener=opener):
                if table is _NOT_PLAIN:
                    plain = False
                    break
                yield table
            if plain or piece.index > 0:  # (a file that is not plain values: its first range loads it whole)
                return
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


_NOT_PLAIN = pa.table({})
"""What ``_plain_rows`` yields for a file it cannot stream (it is then loaded whole)."""


def _plain_rows(
    file: pa.NativeFile,
    piece: FilePiece,
    block_bytes: int,
    max_header_size: int | None,
    display: str,
) -> Iterator[pa.Table]:
    """The rows of ``piece`` (all of the file, or the ``index``-th of ``count`` equal ranges of
    its rows) of a plain C-order ``.npy`` file, ``block_bytes`` at a time; nothing but
    ``_NOT_PLAIN`` when the file is not one (pickled objects, Fortran order, a 0-d array, a
    header version this NumPy reads only whole, or no ``.npy`` header at all)."""
    try:
        version = np.lib.format.read_magic(file)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(file, max_header_size=max_header_size or 10_000)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(file, max_header_size=max_header_size or 10_000)
        else:
            yield _NOT_PLAIN
            return
    except ValueError:  # (an .npz archive, not NumPy at all: np.load says which, loading it whole)
        yield _NOT_PLAIN
        return
    if fortran or dtype.hasobject or not shape:
        yield _NOT_PLAIN
        return
    start = file.tell()
    row_shape = tuple(shape[1:])
    row_bytes = dtype.itemsize * int(np.prod(row_shape, dtype=np.int64))
    n = shape[0]
    lo, hi = n * piece.index // piece.count, n * (piece.index + 1) // piece.count
    step = max(1, block_bytes // max(1, row_bytes))
    if row_bytes == 0 or lo == hi:  # (rows of no bytes: nothing to read)
        yield pa.table({"data": tensor_column(np.zeros((hi - lo, *row_shape), dtype=dtype))})
        return
    file.seek(start + lo * row_bytes)
    for first in range(lo, hi, step):
        count = min(step, hi - first)
        data = file.read(count * row_bytes)
        if len(data) != count * row_bytes:
            msg = f"the file ends after {first + len(data) // row_bytes} of the {n} rows its header announces"
            raise FileFormatError(msg, path=display)
        yield pa.table({"data": tensor_column(np.frombuffer(data, dtype=dtype).reshape(count, *row_shape))})


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

"""Images decoded with Pillow into tensors, ``np.asarray(image)`` as Ray's: ``(height, width,
channels)``, ``(height, width)`` for one channel, in the mode's own dtype.

Column ``image`` is a fixed-shape tensor column (``pa.fixed_shape_tensor``), which reaches NumPy
and torch without a copy. Images of different shapes go to different blocks (each block's column
has one shape); batched together they become one variable-shape tensor column
(``engine.ragged_tensors``), an object array of arrays in a numpy batch. Pass ``size=(h, w)`` to
resize every image to one shape, and ``mode="RGB"`` (any Pillow mode) to convert colours.

``ImageDatasink`` writes one image file per row from a column of ``uint8`` arrays (``(h, w)``,
``(h, w, 1)``, ``(h, w, 3)`` or ``(h, w, 4)``; fixed-shape tensors or nested lists), encoded by
Pillow in ``file_format``, staged and committed by ``file_datasink`` as every file sink.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from connectors.errors import FileFormatError
from connectors.file_datasink import FileDatasink
from connectors.file_datasource import FileDatasource, FilePiece
from connectors.filesystem import read_file_bytes
from connectors.numpy_format import column_to_ndarray
from connectors.retry import Retrier

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".gif", ".webp")


class ImageDatasource(FileDatasource):
    """Image files as ``image`` tensors; ``include_paths=True`` adds a ``path`` column."""

    FILE_EXTENSIONS = IMAGE_EXTENSIONS

    def __init__(
        self, paths: Any, *, size: tuple[int, int] | None = None, mode: str | None = None, **kwargs: Any
    ) -> None:
        if size is not None and (len(size) != 2 or min(size) <= 0):
            raise ValueError(f"size must be (height, width) with positive values, got {size!r}")
        super().__init__(paths, **kwargs)
        self._size = tuple(size) if size is not None else None
        self._mode = mode

    def _read_file(self, fs: Any, piece: FilePiece, display: str, retrier: Retrier) -> Iterator[pa.Table]:
        from PIL import Image, UnidentifiedImageError

        data = read_file_bytes(fs, piece.entry.path, retrier, display, decompress=False,
                               args=self._stream_args)
        try:
            with Image.open(io.BytesIO(data)) as image:
                if self._mode is not None and image.mode != self._mode:
                    image = image.convert(self._mode)
                if self._size is not None:
                    height, width = self._size
                    image = image.resize((width, height))
                array = np.asarray(image)  # as Ray: (h, w) for one channel, the mode's own dtype
        except (UnidentifiedImageError, OSError, ValueError) as exc:
            raise FileFormatError(f"not a readable image: {exc}", path=display) from exc
        column = pa.FixedShapeTensorArray.from_numpy_ndarray(np.stack([array]))
        yield pa.table({"image": column})


_PILLOW_FORMATS = {"jpg": "JPEG", "tif": "TIFF"}
"""File extensions whose Pillow format name is not the extension in capitals."""


def pillow_format(file_format: str) -> str:
    """Pillow's name for ``file_format`` (``"png"`` -> ``"PNG"``, ``"jpg"`` -> ``"JPEG"``); ValueError if it cannot write it."""
    from PIL import Image

    name = _PILLOW_FORMATS.get(file_format.lower(), file_format.upper())
    Image.init()
    if name not in Image.SAVE:
        writable = sorted(f.lower() for f in Image.SAVE)
        raise ValueError(f"file_format {file_format!r} is not one Pillow can write; choose one of {writable}")
    return name


def encode_image(array: np.ndarray, pillow_name: str) -> bytes:
    """One ``(h, w)`` / ``(h, w, channels)`` array encoded as an image file's bytes."""
    from PIL import Image

    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    out = io.BytesIO()
    Image.fromarray(array).save(out, format=pillow_name)
    return out.getvalue()


class ImageDatasink(FileDatasink):
    """One image file per row of ``column`` under ``path`` (local or ``s3://``), committed atomically."""

    NUMBERS_EVERY_FILE = True  # a file per row: a ``filename_provider`` name gets each row's number

    def __init__(
        self, path: str, *, column: str, file_format: str = "png", filesystem: Any = None, **file_options: Any
    ) -> None:
        self._pillow_format = pillow_format(file_format)
        super().__init__(path, max_rows_per_file=1, filesystem=filesystem, **file_options)
        self._column = column
        self.EXTENSION = "." + file_format.lower()

    def get_name(self) -> str:
        """``WriteImages``."""
        return "WriteImages"

    def _encode(self, tables: list[pa.Table]) -> pa.Buffer:
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)  # max_rows_per_file=1: one row
        if self._column not in table.column_names:
            raise ValueError(f"write_images: no column {self._column!r}; the data has {table.column_names}")
        column = table.column(self._column)
        try:
            array = column_to_ndarray(column, self._column)[0]
            return pa.py_buffer(encode_image(array, self._pillow_format))
        except (TypeError, ValueError, OSError, KeyError) as exc:
            msg = (
                f"write_images: column {self._column!r} ({column.type}) cannot be encoded as "
                f"{self._pillow_format}: {exc}; it must hold uint8 arrays of shape (h, w) or (h, w, 1|3|4)"
            )
            raise TypeError(msg) from exc

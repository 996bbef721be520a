"""Images decoded with Pillow into ``uint8`` tensors of shape ``(height, width, channels)``.

Column ``image`` is a fixed-shape tensor column (``pa.fixed_shape_tensor``), which reaches NumPy
and torch without a copy. Grayscale images keep a channel axis of 1. Images of different shapes
go to different blocks (each block's column has one shape); pass ``size=(h, w)`` to resize every
image to one shape, and ``mode="RGB"`` (any Pillow mode) to convert colours.
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

        data = read_file_bytes(fs, piece.entry.path, retrier, display, decompress=False)
        try:
            with Image.open(io.BytesIO(data)) as image:
                if self._mode is not None and image.mode != self._mode:
                    image = image.convert(self._mode)
                if self._size is not None:
                    height, width = self._size
                    image = image.resize((width, height))
                array = np.asarray(image, dtype=np.uint8)
        except (UnidentifiedImageError, OSError, ValueError) as exc:
            raise FileFormatError(f"not a readable image: {exc}", path=display) from exc
        if array.ndim == 2:
            array = array[:, :, np.newaxis]
        column = pa.FixedShapeTensorArray.from_numpy_ndarray(np.stack([array]))
        yield pa.table({"image": column})

"""Binary files: one row per file, its contents in a column named ``bytes``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from connectors.file_datasource import FileDatasource, FilePiece
from connectors.filesystem import read_file_bytes
from connectors.retry import Retrier


class BinaryDatasource(FileDatasource):
    """Whole files as bytes (not decompressed); ``include_paths=True`` adds a ``path`` column."""

    FILE_EXTENSIONS = None

    def _read_file(self, fs: Any, piece: FilePiece, display: str, retrier: Retrier) -> Iterator[pa.Table]:
        data = read_file_bytes(fs, piece.entry.path, retrier, display, decompress=False,
                               args=self._stream_args)
        yield pa.table({"bytes": pa.array([data], pa.large_binary())})

"""Binary files: one row per file, its contents in a column named ``bytes``.

The column is Arrow ``binary``, as Ray Data's; a file of 2 GiB or more, past what ``binary``'s
32-bit offsets reach, comes as ``large_binary`` in a block of its own."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from connectors.file_datasource import FileDatasource, FilePiece
from connectors.filesystem import read_file_bytes
from connectors.retry import Retrier

BINARY_LIMIT = 2**31 - 1
"""The most bytes a ``binary`` array's 32-bit offsets reach."""


class BinaryDatasource(FileDatasource):
    """Whole files as bytes (not decompressed); ``include_paths=True`` adds a ``path`` column."""

    REUSED_BY_WORKERS = True  # its reads never change it (connectors.base.SharedSource)

    FILE_EXTENSIONS = None

    def _read_file(self, fs: Any, piece: FilePiece, display: str, retrier: Retrier) -> Iterator[pa.Table]:
        data = read_file_bytes(fs, piece.entry.path, retrier, display, decompress=False,
                               args=self._stream_args)
        kind = pa.binary() if len(data) < BINARY_LIMIT else pa.large_binary()
        yield pa.table({"bytes": pa.array([data], kind)})

"""Text files: one row per line, in a column named ``text``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from connectors.file_datasource import FileDatasource, FilePiece
from connectors.filesystem import read_file_bytes
from connectors.retry import Retrier


class TextDatasource(FileDatasource):
    """Lines of text files (``\\n`` or ``\\r\\n``), decoded with ``encoding``.

    ``drop_empty_lines`` (default True, as in Ray Data) leaves out lines that are empty or only
    whitespace.
    """

    FILE_EXTENSIONS = None

    def __init__(
        self, paths: Any, *, encoding: str = "utf-8", drop_empty_lines: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(paths, **kwargs)
        self._encoding = encoding
        self._drop_empty_lines = drop_empty_lines

    def _read_file(self, fs: Any, piece: FilePiece, display: str, retrier: Retrier) -> Iterator[pa.Table]:
        data = read_file_bytes(fs, piece.entry.path, retrier, display, args=self._stream_args)
        # lines end at "\n" only, as Ray's split("\n"): str.splitlines also breaks at \r, \f,
        # \x1c-\x1e, \x85, U+2028 and U+2029, which text holds inside lines. A "\r\n" ending loses
        # its "\r" (Ray keeps it), and the end of the file is no extra empty line (Ray's is)
        text = data.decode(self._encoding)
        lines = text.split("\n")
        if lines and lines[-1] == "" and text:
            lines.pop()
        lines = [line[:-1] if line.endswith("\r") else line for line in lines]
        if self._drop_empty_lines:  # blank ones too (only spaces), as Ray's
            lines = [line for line in lines if line.strip()]
        yield pa.table({"text": pa.array(lines, pa.string())})

"""Text files: one row per line, in a column named ``text``.

A UTF-8 file is read as a stream, about ``block_bytes`` (16 MiB) of whole lines at a time, each
piece cut into lines by Arrow (its bytes checked as UTF-8 there): a 10 GB file never needs more
than a few such pieces in memory. One well over a read task's bytes (uncompressed) is read as
byte ranges, one task each (``connectors.line_ranges``). A file in another encoding is decoded
whole, as Python decodes it.
"""

from __future__ import annotations

import codecs
import functools
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from connectors import line_ranges
from connectors.file_datasource import FileDatasource, FilePiece, coalesce
from connectors.filesystem import STREAM_BLOCK_BYTES, FileEntry, iter_stream, read_file_bytes
from connectors.retry import Retrier


class TextDatasource(FileDatasource):
    """Lines of text files (``\\n`` or ``\\r\\n``), decoded with ``encoding``.

    ``drop_empty_lines`` (default True, as in Ray Data) leaves out lines that are empty or only
    whitespace. Lines end at ``\\n`` only, as Ray's ``split("\\n")``: ``str.splitlines`` also
    breaks at ``\\r``, ``\\f``, ``\\x1c``-``\\x1e``, ``\\x85``, U+2028 and U+2029, which text holds
    inside lines. A ``\\r\\n`` ending loses its ``\\r`` (Ray keeps it), and the end of the file is
    no extra empty line (Ray's is).
    """

    REUSED_BY_WORKERS = True  # its reads never change it (connectors.base.SharedSource)

    FILE_EXTENSIONS = None

    def __init__(
        self,
        paths: Any,
        *,
        encoding: str = "utf-8",
        drop_empty_lines: bool = True,
        block_bytes: int = STREAM_BLOCK_BYTES,
        **kwargs: Any,
    ) -> None:
        codecs.lookup(encoding)  # (an unknown one raises LookupError here, not in every task)
        super().__init__(paths, **kwargs)
        self._encoding = encoding
        self._drop_empty_lines = drop_empty_lines
        self._block_bytes = block_bytes

    def _read_pieces(self, pieces: tuple[FilePiece, ...], part_schema: pa.Schema | None) -> Iterator[pa.Table]:
        retrier = self._retrier()
        yield from coalesce(self._iter_piece_tables(pieces, part_schema, retrier), self._block_bytes)

    def _streams(self) -> bool:
        """UTF-8: a newline byte is a newline, and Arrow checks and splits the bytes itself."""
        return codecs.lookup(self._encoding).name == "utf-8"

    def _split_files(self) -> bool | Callable[[FileEntry], bool]:
        if not self._streams():
            return False
        return lambda entry: line_ranges.splittable(entry.path, self._stream_args)

    def _read_file(self, fs: Any, piece: FilePiece, display: str, retrier: Retrier) -> Iterator[pa.Table]:
        if not self._streams():
            data = read_file_bytes(fs, piece.entry.path, retrier, display, args=self._stream_args)
            text = data.decode(self._encoding)
            lines = text.split("\n")
            if lines and lines[-1] == "" and text:
                lines.pop()
            yield _table(pa.array(lines, pa.large_string()), self._drop_empty_lines)
            return
        parse = functools.partial(_parse_lines, block_bytes=self._block_bytes, drop_empty=self._drop_empty_lines,
                                  whole_file=piece.count == 1)
        if piece.count == 1:
            yield from iter_stream(fs, piece.entry.path, retrier, display, parse, args=self._stream_args)
            return
        path, size = piece.entry.path, piece.entry.size or 0

        def opener() -> pa.NativeFile:
            return line_ranges.open_lines(fs, path, size, piece.index, piece.count)

        yield from iter_stream(fs, path, retrier, display, parse, opener=opener)


def _parse_lines(stream: pa.NativeFile, *, block_bytes: int, drop_empty: bool, whole_file: bool) -> Iterator[pa.Table]:
    """Tables of the lines of ``stream`` (UTF-8), about ``block_bytes`` of them at a time. An
    empty file is one empty line, as Ray's (a range with no line in it is none)."""
    yielded = False
    for chunk in line_ranges.whole_lines(stream, block_bytes):
        yield _table(_split(chunk, len(chunk) if chunk.endswith(b"\n") else 0), drop_empty)
        yielded = True
    if not yielded:
        lines = _split(b"", 0) if whole_file else pa.array([], pa.large_string())
        yield _table(lines, drop_empty)


def _split(data: bytes, cut: int) -> pa.Array:
    """The lines of ``data[:cut]`` (all of ``data`` when ``cut`` is 0), which end at ``\\n``
    (the last one's ending, if any, is no extra line); raises for bytes that are not UTF-8."""
    end = cut - 1 if cut else len(data)
    offsets = pa.array([0, end], pa.int64()).buffers()[1]
    whole = pa.Array.from_buffers(pa.large_binary(), 1, [None, offsets, pa.py_buffer(data)]).cast(pa.large_string())
    return pc.split_pattern(whole, "\n").flatten()


def _table(lines: pa.Array, drop_empty: bool) -> pa.Table:
    """The ``text`` column: a ``\\r`` ending dropped, blank lines too when asked."""
    ends = pc.ends_with(lines, "\r")
    if pc.any(ends).as_py():
        lines = pc.if_else(ends, pc.utf8_slice_codeunits(lines, 0, -1), lines)
    if drop_empty:  # (utf8_is_space is str.isspace, code point for code point)
        blank = pc.or_(pc.equal(pc.binary_length(lines), 0), pc.utf8_is_space(lines))
        lines = lines.filter(pc.invert(blank))
    return pa.table({"text": lines.cast(pa.string())})

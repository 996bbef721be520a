"""A big line-oriented file (CSV, JSON lines) read as byte ranges, one read task each.

Piece ``i`` of ``n`` covers the lines that start in the ``i``-th of ``n`` equal byte ranges of
the file: it starts at the first line start at or after its range's first byte and stops at the
next piece's start. The pieces hold every line exactly once, in order, whatever the line
lengths, and each task reads only its own bytes (plus a line on each side to find the edges).

Only where a newline byte always ends a row: an uncompressed file, in UTF-8 (or ASCII), whose
values hold no newline (CSV with ``newlines_in_values=False``, pyarrow's default, which reads
such a value as a broken row anyway; JSON lines, where a newline inside a string is escaped).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from connectors.filesystem import StreamArgs, compression_of

_SCAN_BYTES = 64 << 10
LINE_ENCODINGS = frozenset({"utf8", "utf-8", "ascii"})


def splittable(path: str, stream_args: StreamArgs, encoding: str = "utf8") -> bool:
    """Can ``path`` be read as byte ranges: no compression (by extension or by ``stream_args``),
    an encoding in which a newline byte is a newline."""
    return (stream_args.compression is None and compression_of(path) is None
            and encoding.lower() in LINE_ENCODINGS)


def piece_bounds(size: int, index: int, count: int) -> tuple[int, int]:
    """The byte range ``[lo, hi)`` of piece ``index`` of ``count`` in a file of ``size`` bytes."""
    return size * index // count, size * (index + 1) // count


def line_start(file: pa.NativeFile, position: int, size: int) -> int:
    """The first position at or after ``position`` where a line starts (``size`` if none does)."""
    if position <= 0:
        return 0
    if position >= size:
        return size
    file.seek(position - 1)
    offset = position - 1
    while offset < size:
        chunk = file.read(_SCAN_BYTES)
        if not chunk:
            break
        newline = chunk.find(b"\n")
        if newline >= 0:
            return offset + newline + 1
        offset += len(chunk)
    return size


def open_lines(fs: Any, path: str, size: int, index: int, count: int) -> pa.NativeFile:
    """Piece ``index`` of ``count`` of ``path`` (``size`` bytes) as a stream of its lines."""
    file = fs.open_input_file(path)
    try:
        lo, hi = piece_bounds(size, index, count)
        start = line_start(file, lo, size)
        end = line_start(file, hi, size)
        file.seek(start)
    except BaseException:
        file.close()
        raise
    return pa.PythonFile(_Range(file, end - start), mode="r")


def range_start(fs: Any, path: str, size: int, index: int, count: int) -> int:
    """Where piece ``index`` of ``count`` of ``path`` starts: the first byte of its first line."""
    with fs.open_input_file(path) as file:
        return line_start(file, piece_bounds(size, index, count)[0], size)


def whole_lines(stream: Any, chunk_bytes: int, head: bytes = b"") -> Iterator[bytes]:
    """``head`` and the rest of ``stream`` cut after a newline every ``chunk_bytes`` or so (the
    first chunk is ``head``'s whole lines), then what follows the last newline, if anything.
    A line longer than a chunk is gathered in pieces and joined once it ends, not re-copied on
    every read."""
    pending: list[bytes] = []
    more = head
    while True:
        cut = more.rfind(b"\n") + 1
        if cut:
            data = b"".join([*pending, more]) if pending else more
            cut += len(data) - len(more)
            pending = [data[cut:]] if cut < len(data) else []
            yield data[:cut]
        elif more:
            pending.append(more)
        more = stream.read(chunk_bytes)
        if not more:
            if pending:
                yield b"".join(pending)
            return


class _Range:
    """The next ``length`` bytes of ``file``, as a read-only Python file."""

    def __init__(self, file: pa.NativeFile, length: int) -> None:
        self._file = file
        self._left = length
        self.closed = False

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0 or n > self._left:
            n = self._left
        data = self._file.read(n) if n else b""
        self._left -= len(data)
        return data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._file.close()

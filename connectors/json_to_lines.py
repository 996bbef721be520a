"""JSON that is not one object a line, cut into pieces that ``pyarrow.json`` parses a piece at a time.

Two shapes of file are read this way, in bounded memory and at the speed of Arrow's parser, as
JSON Lines are, instead of whole (through Python objects for an array: 7.5x the file's size):

* one JSON array of objects (``array_lines``): each piece's objects become lines, one each;
* objects one after another, any of them over several lines (pretty-printed, or JSON Lines
  with ``newlines_in_values``; ``object_pieces``): each piece ends where an object does, and
  is parsed with ``newlines_in_values=True``.

Nothing is parsed here; a piece is only scanned, with numpy, for the characters that give the
text its shape:

* the quotes that open and close strings (a quote after an odd run of backslashes is inside
  one), so that brackets and commas within strings are left alone;
* the brackets and braces around them, whose running count is the nesting depth;
* in an array, the commas at depth 1, which separate its elements: each becomes a newline.
  Every other newline is whitespace between values (JSON allows no raw newline inside a
  string) and becomes a space, so a pretty-printed object stays on its own line.

A piece ends after the last separator (or object) it holds; what it cut is carried into the
next. In an array, elements that are not objects, a missing or trailing comma, text after the
array or an array that never closes raise ``FileFormatError``; what is malformed inside an
object is the parser's to find.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from connectors.errors import FileFormatError

_DEPTH = np.zeros(256, np.int8)
_DEPTH[[ord("{"), ord("[")]] = 1
_DEPTH[[ord("}"), ord("]")]] = -1
_SPACES = bytes.maketrans(b"\r\n", b"  ")
_COMMA, _OPEN_OBJECT, _NEWLINE, _SPACE = ord(","), ord("{"), ord("\n"), ord(" ")


PIECE_BYTES = 4 << 20
"""The most of a file scanned and parsed at a time (unless one object is bigger): the scan's
arrays and the parser's buffers are a few times a piece, so a smaller piece keeps the read's
memory near its blocks'."""


def array_lines(read: Callable[[int], bytes], head: bytes, chunk_bytes: int, display: str) -> Iterator[bytearray]:
    """The objects of the array that ``head`` starts (its first non-blank byte is ``[``) and
    ``read(n)`` continues, one per line, in chunks of about ``chunk_bytes`` (at most
    ``PIECE_BYTES``) or more (a chunk holds at least one whole object). An empty array gives
    no chunk."""
    piece_bytes = max(1, min(chunk_bytes, PIECE_BYTES))
    buffer = head.lstrip()
    opened = False  # a chunk went out: ``buffer`` starts after a separator (depth 1, no string)
    want = piece_bytes
    ended = False
    while True:
        if not ended:
            buffer, ended = _fill(read, buffer, want, piece_bytes)
        window = buffer[:want] if len(buffer) > want else buffer
        at, shape, depth = _scan(window, 1 if opened else 0)
        first = 0 if opened else 1  # (the "[" itself: depth 0 -> 1)
        closes = np.flatnonzero(depth[first:] <= 0)
        if closes.size:
            end = first + int(closes[0])
            if depth[end] < 0 or shape[end] != ord("]"):
                msg = f"invalid JSON: an unbalanced {chr(shape[end])!r} at the array's top level"
                raise FileFormatError(msg, path=display)
            _check_rest(buffer[at[end] + 1 :], read, chunk_bytes, display)
            piece = _lines(buffer[: at[end]], at[:end], shape[:end], depth[:end], opened, True, display)
            if piece is not None:
                yield piece
            return
        if ended and len(window) == len(buffer):
            raise FileFormatError("invalid JSON: the array does not end (no closing ']')", path=display)
        separators = np.flatnonzero((shape == _COMMA) & (depth == 1))
        if not separators.size:  # not one whole element yet: look further
            want = len(window) * 2
            continue
        cut = int(separators[-1]) + 1
        piece = _lines(buffer[: at[cut - 1] + 1], at[:cut], shape[:cut], depth[:cut], opened, False, display)
        assert piece is not None
        yield piece
        buffer = buffer[at[cut - 1] + 1 :]
        opened = True
        want = piece_bytes


def object_pieces(read: Callable[[int], bytes], head: bytes, chunk_bytes: int, display: str) -> Iterator[tuple[bytes, int]]:
    """Pieces of about ``chunk_bytes`` (at most ``PIECE_BYTES``, or one whole object) of the
    objects that ``head`` and ``read(n)`` hold one after another, each with how many objects
    it holds; each piece ends where an object does."""
    piece_bytes = max(1, min(chunk_bytes, PIECE_BYTES))
    buffer = head
    want = piece_bytes
    ended = False
    while True:
        if not ended:
            buffer, ended = _fill(read, buffer, want, piece_bytes)
        if not buffer.strip():  # (whitespace between objects)
            if ended:
                return
            buffer = b""
            continue
        window = buffer[:want] if len(buffer) > want else buffer
        at, shape, depth = _scan(window, 0)
        if depth.size and depth.min() < 0:
            where = int(np.flatnonzero(depth < 0)[0])
            raise FileFormatError(f"invalid JSON: an unbalanced {chr(shape[where])!r}", path=display)
        ends = np.flatnonzero((depth == 0) & (shape == ord("}")))
        if not ends.size:
            if ended and len(window) == len(buffer):
                raise FileFormatError("invalid JSON: an object that does not end", path=display)
            want = len(window) * 2  # not one whole object yet: look further
            continue
        cut = int(at[ends[-1]]) + 1
        yield buffer[:cut], int(ends.size)
        buffer = buffer[cut:]
        want = piece_bytes


def _fill(read: Callable[[int], bytes], buffer: bytes, want: int, piece_bytes: int) -> tuple[bytes, bool]:
    """``buffer`` with what ``read`` gives appended until it holds ``want`` bytes, and whether
    the text ended first."""
    while len(buffer) < want:
        more = read(piece_bytes)
        if not more:
            return buffer, True
        buffer += more
    return buffer, False


def _scan(buffer: bytes, depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The positions of ``{}[],`` outside strings in ``buffer`` (which starts outside any string
    at nesting ``depth``), those characters, and the depth after each."""
    data = np.frombuffer(buffer, np.uint8)
    # (five comparisons: a quarter of the time of a lookup table indexed by every byte)
    at = np.flatnonzero((data == ord("{")) | (data == ord("}")) | (data == ord("[")) | (data == ord("]"))
                        | (data == _COMMA))
    quotes = np.flatnonzero(data == ord('"'))
    if quotes.size and at.size:
        slashes = np.flatnonzero(data == ord("\\"))
        if slashes.size:  # a character after an odd run of backslashes is escaped
            breaks = np.flatnonzero(np.diff(slashes) != 1)
            firsts = np.concatenate(([0], breaks + 1))
            lasts = np.concatenate((breaks, [slashes.size - 1]))
            escaped = slashes[lasts[(lasts - firsts) % 2 == 0]] + 1
            quotes = quotes[~np.isin(quotes, escaped, assume_unique=True)]
        at = at[np.searchsorted(quotes, at) % 2 == 0]  # an even number of quotes before: outside
    shape = data[at]
    return at, shape, depth + np.cumsum(_DEPTH[shape], dtype=np.int64)


def _lines(
    text: bytes, at: np.ndarray, shape: np.ndarray, depth: np.ndarray, opened: bool, last: bool, display: str
) -> bytearray | None:
    """``text`` (whole elements: up to a separator, or the array's last ones) one element a
    line; None when it holds no element (``[]``)."""
    separators = at[(shape == _COMMA) & (depth == 1)]
    elements = separators.size
    if last:
        tail = text[int(separators[-1]) + 1 :] if separators.size else text[(0 if opened else 1) :]
        if tail.strip():
            elements += 1
        elif separators.size or opened:
            raise FileFormatError("invalid JSON: a comma with no element after it in the array", path=display)
    if int(np.count_nonzero((shape == _OPEN_OBJECT) & (depth == 2))) != elements:
        raise FileFormatError("a JSON array must hold objects (one per row)", path=display)
    if not elements:
        return None
    out = bytearray(text.translate(_SPACES))
    view = np.frombuffer(out, np.uint8)
    view[separators] = _NEWLINE
    if not opened:
        view[0] = _SPACE
    return out


def _check_rest(rest: bytes, read: Callable[[int], bytes], chunk_bytes: int, display: str) -> None:
    """Only whitespace may follow the array."""
    while True:
        if rest.strip():
            raise FileFormatError("invalid JSON: extra data after the array", path=display)
        rest = read(chunk_bytes)
        if not rest:
            return

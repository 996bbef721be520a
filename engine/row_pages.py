"""The pages of a spilled block file that hold only a slice's rows, given back once it is read.

An exchange's map output is one file read by many reduce tasks, each a slice of its rows; it
is freed when the last of them is done. For a sort, every reduce task reads a slice of every
map output, so all of them live until the last reduce task ends: through a 256 MiB store, a
sort of 1.4 GB keeps its 1.4 GB of spilled map outputs in the page cache while it writes its
1.4 GB result past the store, 2.8 GB of page cache at the peak. Writing into page cache costs
more when the memory behind it is memory the machine has not used lately (on a virtual machine
whose host takes freed memory back: 0.25 ms a MB while a job's files fit in what it used
recently, 0.6-2.5 ms past it, measured here). So once a reduce task has read its slice and is
done, the pages only that slice's rows occupy are punched out of the file
(``fallocate(PUNCH_HOLE)``): the map outputs shrink as the result grows, and the result is
written into the pages they gave back.

Which pages: for each column, the bytes of the slice's rows in each of its buffers, rounded
inwards to whole pages, so a page shared with another slice's rows (or the file's metadata)
is never one of them. Only columns whose rows own their bytes outright are looked at:
fixed-width values, strings and binaries (offsets and data), and lists and fixed-size lists of
those (tensors); validity bitmaps, booleans, dictionaries and structs are left for the unlink.
Only buffers of at least ``MIN_RANGE_BYTES`` count: a punch is a system call and a journal
entry. The worker that read the slice computes the pages (it has the file mapped); the driver
punches them once the task's result is in (a task that failed or was lost runs again over the
whole slice), by a thread of its own (``engine.file_reaper``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.types as pat

PAGE = mmap.PAGESIZE
MIN_RANGE_BYTES = 64 << 10
"""Byte ranges smaller than this are left for the unlink."""

Ranges = tuple[tuple[int, int], ...]
"""(file offset, length) pairs, page-aligned."""


def slice_pages(table: pa.Table, base: int, size: int) -> Ranges:
    """The whole pages of a file mapped at ``base`` (``size`` bytes) that hold bytes of
    ``table``'s rows only; ``table`` is a slice of the block read zero-copy from the mapping."""
    ranges: list[tuple[int, int]] = []
    for column in table.columns:
        for chunk in column.chunks:
            if len(chunk):
                _array_spans(chunk, chunk.offset, chunk.offset + len(chunk), ranges)
    out = []
    for start, end in ranges:
        if not (base <= start and end <= base + size):  # a buffer not in the mapping (made by the reader)
            continue
        lo = -(-(start - base) // PAGE) * PAGE
        hi = (end - base) // PAGE * PAGE
        if hi - lo >= MIN_RANGE_BYTES:
            out.append((lo, hi - lo))
    return tuple(out)


def _array_spans(array: pa.Array, lo: int, hi: int, out: list[tuple[int, int]]) -> None:
    """Append the address ranges of rows ``[lo, hi)`` (counted in ``array``'s buffers, its
    own offset included) in the buffers that hold those rows alone."""
    kind = array.type
    if isinstance(kind, pa.BaseExtensionType):
        _array_spans(array.storage, lo, hi, out)
        return
    buffers = array.buffers()
    if pat.is_fixed_size_list(kind):
        child = _whole_child(array)
        if child is not None:
            n = kind.list_size
            _array_spans(child, child.offset + lo * n, child.offset + hi * n, out)
        return
    if pat.is_list(kind) or pat.is_large_list(kind):
        offsets = _offsets(buffers[1], 8 if pat.is_large_list(kind) else 4, lo, hi)
        child = _whole_child(array)
        if offsets is not None and child is not None:
            width = 8 if pat.is_large_list(kind) else 4
            out.append((buffers[1].address + lo * width, buffers[1].address + (hi + 1) * width))
            _array_spans(child, child.offset + offsets[0], child.offset + offsets[1], out)
        return
    if pat.is_string(kind) or pat.is_binary(kind) or pat.is_large_string(kind) or pat.is_large_binary(kind):
        width = 8 if pat.is_large_string(kind) or pat.is_large_binary(kind) else 4
        offsets = _offsets(buffers[1], width, lo, hi)
        if offsets is not None and buffers[2] is not None:
            out.append((buffers[1].address + lo * width, buffers[1].address + (hi + 1) * width))
            out.append((buffers[2].address + offsets[0], buffers[2].address + offsets[1]))
        return
    if len(buffers) == 2 and buffers[1] is not None and not pat.is_boolean(kind) and not pat.is_dictionary(kind):
        bits = getattr(kind, "bit_width", 0)
        if bits and bits % 8 == 0:
            width = bits // 8
            out.append((buffers[1].address + lo * width, buffers[1].address + hi * width))


def _whole_child(array: pa.Array) -> pa.Array | None:
    """A list's or fixed-size list's child array, whole (not cut to the parent's offset)."""
    values = getattr(array, "values", None)
    return values if isinstance(values, pa.Array) else None


def _offsets(buffer: pa.Buffer | None, width: int, lo: int, hi: int) -> tuple[int, int] | None:
    """Offsets ``lo`` and ``hi`` of an offsets buffer of ``width``-byte integers."""
    if buffer is None or buffer.size < (hi + 1) * width:
        return None
    values = np.frombuffer(buffer, dtype=np.int64 if width == 8 else np.int32)
    return int(values[lo]), int(values[hi])


# punching ----------------------------------------------------------------------------------

_FALLOC_FL_KEEP_SIZE = 1
_FALLOC_FL_PUNCH_HOLE = 2
_fallocate = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _fallocate = _libc.fallocate
        _fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        _fallocate.restype = ctypes.c_int
    except (OSError, AttributeError):
        _fallocate = None


def can_punch() -> bool:
    """Whether this system can punch holes in files (Linux)."""
    return _fallocate is not None


def punch(path: str, ranges: Ranges) -> int:
    """Give back the pages of ``ranges`` of the file at ``path`` (its size stays); the bytes
    given back. A file that is gone (unlinked since) or a file system that cannot punch is left
    as it is."""
    if _fallocate is None or not ranges:
        return 0
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return 0
    done = 0
    try:
        for offset, length in ranges:
            if _fallocate(fd, _FALLOC_FL_KEEP_SIZE | _FALLOC_FL_PUNCH_HOLE, offset, length) != 0:
                break  # (EOPNOTSUPP: a file system without holes)
            done += length
    finally:
        os.close(fd)
    return done

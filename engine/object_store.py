"""Shared-memory block store: one Arrow IPC file per block in a per-session 0700 folder.

Writers (workers, or the driver in inline mode) write the file with write(2), so a full
``/dev/shm`` is a clean ``ENOSPC`` we answer by spilling to disk, never a SIGBUS. Readers map
the file copy-on-write: the batches they get are views into the mapping, zero-copy. The driver
owns every reference and calls ``free`` when a block is consumed; unlinking a mapped file is
safe (pages live until unmapped). Blocks of at most ``INLINE_BLOCK_BYTES`` have no file: their
bytes travel in the ref.

Lifetime: the session folder is created and removed by ``engine.session``; a session that died
is detected by its unlocked ``lock`` file and swept by the next one.
"""

from __future__ import annotations

import errno
import itertools
import mmap
import operator
import os
import threading
from dataclasses import dataclass, field, fields
from typing import Any

import pyarrow as pa

from engine.errors import ObjectStoreFullError
from engine.file_reaper import FileReaper, unlink_freed, unlink_quietly
from engine.row_pages import Ranges, punch, slice_pages
from engine.spare_files import SPARE_MIN_BYTES


@dataclass(frozen=True, slots=True)
class BlockRef:
    """Where a block lives and what it holds. Small and picklable: this is what moves around."""

    block_id: str
    path: str | None
    """The IPC file; None for blocks held in the driver's memory (local mode)."""
    num_rows: int
    size_bytes: int
    """Bytes of Arrow data (what budgets count)."""
    spilled: bool = False
    partitions: bytes | None = None
    """For an exchange's map output: the rows of each partition, as little-endian uint32
    counts (the block's rows are grouped by partition, in partition order)."""
    node: str | None = None
    """The cluster node holding it (the Ray backend); None on one machine."""
    unit: int | None = None
    """The input unit (a read task of a resumable write) its rows came from; None otherwise.
    Set by the execution when the task that made it finishes (``engine.units``)."""
    sample: Any = field(default=None, compare=False)
    """For a block feeding a sort: a few of its sort-key values (or the exception sampling
    raised), taken by the task that made it (``TaskSpec.sampler``), so the driver fits the
    range boundaries without reading the block; None otherwise."""
    data: bytes | None = field(default=None, compare=False, repr=False)
    """A small block's Arrow IPC stream, carried in the ref itself (``path`` is then None): it
    travels in the reply and the next task's spec, and lives as long as the ref does."""

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # the constructor with every field in order: half the time of the slots dataclass's
        # __getstate__/__setstate__, and a ref crosses a process boundary twice per task
        return BlockRef, _REF_FIELDS(self)


_REF_FIELDS = operator.attrgetter(*(f.name for f in fields(BlockRef)))


@dataclass(frozen=True, slots=True)
class BlockSlice:
    """Rows ``[offset, offset + length)`` of a block: how a task gets an exact number of rows."""

    ref: BlockRef
    offset: int
    length: int

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return BlockSlice, (self.ref, self.offset, self.length)

    @property
    def num_rows(self) -> int:
        return self.length

    @property
    def size_bytes(self) -> int:
        return self.ref.size_bytes * self.length // max(1, self.ref.num_rows)


class BlockStore:
    """Interface shared by the shared-memory store and the in-process one."""

    private_views = False
    """True when what ``get`` returns may be written in place without changing the block
    (copy-on-write mappings); False when it is the block itself (in-process tables)."""

    def put(self, table: pa.Table, spill: bool = False, sliced: bool = False) -> BlockRef:
        """Store ``table``; ``spill``: on disk; ``sliced``: many tasks will each read a slice of
        it (an exchange's map output)."""
        raise NotImplementedError

    def get(self, ref: BlockRef) -> pa.Table:
        raise NotImplementedError

    def free(self, ref: BlockRef) -> None:
        raise NotImplementedError

    def get_slice_pages(self, piece: BlockSlice) -> tuple[pa.Table, Ranges]:
        """A slice's rows, and the pages of its block's file that hold them alone
        (``engine.row_pages``): none here, where blocks are not files."""
        return self.get(piece.ref).slice(piece.offset, piece.length), ()


class SharedMemoryStore(BlockStore):
    """Blocks as files under ``shm_dir`` (tmpfs), spilled to ``spill_dir`` when asked or full."""

    private_views = True

    def __init__(self, shm_dir: str, spill_dir: str, owner: str, reaper: FileReaper | None = None) -> None:
        self.shm_dir = shm_dir
        self.spill_dir = spill_dir
        self.reaper = reaper
        """Unlinks freed blocks' files off the caller's thread (the driver's store); None: in place."""
        self._prefix = owner
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self.spares: list[tuple[str, int]] = []
        """Freed block files (path, size) the running task may write its blocks over (a
        worker's store: set for each task from ``TaskSpec.spare_files``)."""

    def _next_id(self) -> str:
        with self._lock:
            return f"{self._prefix}-{next(self._counter)}"

    def put(self, table: pa.Table, spill: bool = False, sliced: bool = False) -> BlockRef:
        """``table`` in the ref itself when small, else as one IPC file: in shared memory, or on
        disk when ``spill`` or when shared memory is full. A ``sliced`` block is always a file:
        every task reading a slice of it would carry all its bytes."""
        block_id = self._next_id()
        nbytes = table.nbytes  # (once: pyarrow walks every column, ~2 us each, to compute it)
        if not spill and not sliced and nbytes <= INLINE_BLOCK_BYTES:
            return BlockRef(block_id, None, table.num_rows, nbytes, data=ipc_stream_bytes(table))
        if not spill:
            path = os.path.join(self.shm_dir, block_id + ".arrow")
            spare = self._pick_spare(nbytes)
            try:
                if spare is None:
                    self._write_file(path, table, nbytes)
                else:
                    write_over(spare, path, table)
                return BlockRef(block_id, path, table.num_rows, nbytes, False)
            except OSError as err:
                if err.errno not in (errno.ENOSPC, errno.ENOMEM):
                    raise
        os.makedirs(self.spill_dir, mode=0o700, exist_ok=True)
        path = os.path.join(self.spill_dir, block_id + ".arrow")
        try:
            write_ipc_file(path, table, nbytes, piecewise=True)
        except OSError as err:
            unlink_quietly(path)
            msg = f"object store is full and spilling to {self.spill_dir} failed: {err}"
            raise ObjectStoreFullError(msg) from err
        return BlockRef(block_id, path, table.num_rows, nbytes, True)

    def _pick_spare(self, nbytes: int) -> str | None:
        """The spare file to write a block of ``nbytes`` over: the smallest that holds it, else
        the biggest; None when there is none or the block is too small to gain from one."""
        if not self.spares or nbytes < SPARE_MIN_BYTES:
            return None
        fits = [s for s in self.spares if s[1] >= nbytes]
        best = min(fits, key=lambda s: s[1]) if fits else max(self.spares, key=lambda s: s[1])
        self.spares.remove(best)
        return best[0]

    @staticmethod
    def _write_file(path: str, table: pa.Table, nbytes: int | None = None) -> None:
        """Write the block with write(2), not through a mapping.

        tmpfs answers a full store with ENOSPC from write(2) (a store through a mapping would
        be a SIGBUS instead, which is why a mapping needs posix_fallocate first), and the kernel
        copies straight into fresh pages: 20 ms per 32 MiB block against 40 ms for fallocate
        (which zeroes every page) plus writes through a mapping.
        """
        try:
            write_ipc_file(path, table, nbytes)
        except BaseException:
            unlink_quietly(path)
            raise

    def get(self, ref: BlockRef) -> pa.Table:
        """Map the block's file and return its table (views into the mapping, no copy).

        The mapping is copy-on-write (MAP_PRIVATE): a consumer that writes into a batch in place
        (``tensor += 1`` on a zero-copy torch tensor) gets private pages, never a SIGSEGV and
        never a change other readers could see.
        """
        return read_block(ref)

    def get_slice_pages(self, piece: BlockSlice) -> tuple[pa.Table, Ranges]:
        return read_slice_pages(piece)

    def punch(self, path: str, ranges: Ranges) -> None:
        """Give back the pages of ``ranges`` of a block file nobody will read them from again."""
        if self.reaper is not None:
            self.reaper.punch(path, ranges)
        else:
            punch(path, ranges)

    def free(self, ref: BlockRef) -> None:
        if ref.path is not None:  # (a block held in its ref goes with the ref)
            unlink_freed(ref.path, ref.size_bytes, self.reaper)


SMALL_BLOCK_BYTES = 64 << 10
"""Block files up to this size are read into private memory rather than mapped, and tables up
to this size written with one system call."""

INLINE_BLOCK_BYTES = 64 << 10
"""Blocks of at most this many bytes of Arrow data travel in their ``BlockRef`` (``data``),
not as a file, as Ray returns small objects in the task's reply. A file costs its writer an
open, a write and a close, its reader an open, a stat, a read and a close, and its owner an
unlink: more than moving 64 KiB through a socket twice."""


IPC_WRITE_OPTIONS = pa.ipc.IpcWriteOptions(allow_64bit=True)
"""Block files are written with 64-bit array lengths allowed: one column of a big block can hold
2^31 values or more (2,048 rows of a 1 MiB tensor are 2^31 bytes in one child array:
``repartition(1)`` of such rows, or an exchange's map output), which Arrow's IPC writer refuses
otherwise. So a block is one record batch per chunk it has, whatever its size. (Cutting blocks
into 128 MiB batches instead, as before, made every reader of a bigger block copy it whole to
turn a column into one numpy array: 512 MiB more in a driver reading 256 MiB blocks.)"""


def ipc_stream_bytes(table: pa.Table) -> bytes:
    """``table`` as an Arrow IPC stream, in memory."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def write_ipc_file(path: str, table: pa.Table, nbytes: int | None = None, piecewise: bool = False) -> None:
    """``table`` as an Arrow IPC file at ``path``, with write(2); ``nbytes``: its ``nbytes``
    when the caller has it.

    A table of at most ``SMALL_BLOCK_BYTES`` is serialized in memory and written with one
    call: the IPC writer's own writes (magic, schema, batch, footer) are a system call each,
    which for an 8 KiB block costs more than the data (26 against 42 us a block). A bigger one
    streams to the file, without a second copy in memory; with ``piecewise`` (spill files, on
    disk), in writes of at most ``DISK_WRITE_BYTES``.
    """
    nbytes = table.nbytes if nbytes is None else nbytes
    if nbytes > SMALL_BLOCK_BYTES and piecewise:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            _stream_ipc_file(pa.PythonFile(_PiecewiseWriter(fd), mode="w"), table)
        finally:
            os.close(fd)
        return
    if nbytes > SMALL_BLOCK_BYTES:
        with pa.OSFile(path, "wb") as sink:
            _stream_ipc_file(sink, table)
        return
    buffer = pa.BufferOutputStream()
    with pa.ipc.new_file(buffer, table.schema) as writer:
        writer.write_table(table)
    view = memoryview(buffer.getvalue())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


DISK_WRITE_BYTES = 256 << 10
"""Spill files are written at most this many bytes per write(2).

Linux (6.x) caches a file in page-cache folios as large as each write where the file system
allows it (ext4, xfs; not tmpfs by default): up to 2 MiB. Large folios come from the kernel's
large free blocks, and on a virtual machine that hands its free memory back to the host (virtio
free page reporting, as Firecracker and other VMs use) those are the memory the host took back:
filling one waits for the host. Measured there, writing 2 GB of new files in a fresh process:
pieces of 1 MiB cost 0.17 ms per MB for the first 0.5-1 GB, then 4.6-10 ms per MB; pieces of
128, 256 and 512 KiB 0.16-0.26 ms per MB throughout (64 KiB 0.19-0.25, 16 KiB 0.31-0.40: the
system calls show). A 70 MB block in pieces of 32 MiB took 1.3-1.9 ms per MB (tmpfs: 0.4 ms
whatever the size). Elsewhere a write(2) per 256 KiB costs nothing that shows."""


class _PiecewiseWriter:
    """A write-only file for ``pa.PythonFile``: write(2) on ``fd``, ``DISK_WRITE_BYTES`` at a
    time (the caller closes ``fd``)."""

    closed = False

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.position = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        size, done = len(view), 0
        while done < size:
            done += os.write(self.fd, view[done : done + DISK_WRITE_BYTES])
        self.position += size
        return size

    def tell(self) -> int:
        return self.position

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def _stream_ipc_file(sink: Any, table: pa.Table) -> None:
    """``table`` as an Arrow IPC file into ``sink``: a record batch per chunk."""
    with pa.ipc.new_file(sink, table.schema, options=IPC_WRITE_OPTIONS) as writer:
        writer.write_table(table)


def write_over(spare: str, path: str, table: pa.Table) -> None:
    """``table`` as an Arrow IPC file at ``path``, written over the pages of the freed block
    file ``spare`` (renamed to ``path``; cut to its new length): no page to allocate and zero
    where the old file had one. Unlinked on any failure, as a new file is."""
    os.rename(spare, path)
    try:
        with open(path, "r+b") as file:  # (buffered: it writes every byte or raises)
            _stream_ipc_file(pa.PythonFile(file, mode="w"), table)
            file.truncate(file.tell())
    except BaseException:
        unlink_quietly(path)
        raise


def read_block(ref: BlockRef) -> pa.Table:
    """A block's table, from any process of the session (see ``get``).

    A block held in its ref is read from a private copy of its bytes. A file is mapped
    copy-on-write, zero-copy; one of at most ``SMALL_BLOCK_BYTES`` is read into a private buffer
    instead, which is as writable and as private. Mapping a small file costs more than copying
    it: the mapping's page faults and, when it is unmapped in a process with other threads, a
    TLB shootdown on every CPU they run on. Measured for 8 KiB blocks with a second thread busy:
    32 us a block read against 52 us mapped.
    """
    if ref.data is not None:  # a copy: the ref's bytes are shared and must not be written
        return pa.ipc.open_stream(pa.py_buffer(bytearray(ref.data))).read_all()
    if ref.path is None:
        msg = (
            f"block {ref.block_id} is held in another process's memory: it was made in the in-process "
            "(execution_mode='local') mode, which alone can read it; make or materialize the dataset "
            "under the mode that reads it"
        )
        raise KeyError(msg)
    return pa.ipc.RecordBatchFileReader(_file_buffer(ref.path)).read_all()


def read_slice_pages(piece: BlockSlice) -> tuple[pa.Table, Ranges]:
    """A slice's rows (as ``read_block(piece.ref).slice(...)``) and the pages of its block's
    file that hold those rows alone (``engine.row_pages``; none for a block not in a mapped file)."""
    ref = piece.ref
    if ref.data is not None or ref.path is None:
        return read_block(ref).slice(piece.offset, piece.length), ()
    buffer = _file_buffer(ref.path)
    rows = pa.ipc.RecordBatchFileReader(buffer).read_all().slice(piece.offset, piece.length)
    if buffer.size <= SMALL_BLOCK_BYTES:  # read into private memory, not mapped: nothing to give back
        return rows, ()
    return rows, slice_pages(rows, buffer.address, buffer.size)


def _file_buffer(path: str) -> pa.Buffer:
    """A block file's bytes: mapped copy-on-write, or read into private memory when small."""
    fd = os.open(path, os.O_RDONLY)  # (not open(): a buffered file object costs more than the read)
    try:
        size = os.fstat(fd).st_size
        if size <= SMALL_BLOCK_BYTES:
            data = bytearray(size)
            view, done = memoryview(data), 0
            while done < size:
                n = os.readv(fd, [view[done:]])
                if n == 0:
                    raise OSError(f"block file {path} ended after {done} of {size} bytes")
                done += n
            return pa.py_buffer(data)
        return pa.py_buffer(mmap.mmap(fd, 0, access=mmap.ACCESS_COPY))
    finally:
        os.close(fd)


class MemoryStore(BlockStore):
    """Blocks kept as Python objects in the driver (the synchronous in-process mode)."""

    def __init__(self) -> None:
        self._blocks: dict[str, pa.Table] = {}
        self._counter = itertools.count()
        self._lock = threading.Lock()

    def put(self, table: pa.Table, spill: bool = False, sliced: bool = False) -> BlockRef:
        with self._lock:
            block_id = f"mem-{next(self._counter)}"
            self._blocks[block_id] = table
        return BlockRef(block_id, None, table.num_rows, table.nbytes)

    def get(self, ref: BlockRef) -> pa.Table:
        if ref.path is not None or ref.data is not None:
            return read_block(ref)  # a shared-memory store's block (a parent's, in a forked process)
        return self._blocks[ref.block_id]

    def free(self, ref: BlockRef) -> None:
        with self._lock:
            self._blocks.pop(ref.block_id, None)

    def __len__(self) -> int:
        return len(self._blocks)


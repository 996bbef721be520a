"""Freed block files kept to be written over, so a new block reuses pages the kernel already gave.

A block's file in shared memory is tmpfs pages. Unlinking it gives them back to the kernel, and
the next block of the same size has to get new ones: the kernel allocates and zeroes each page
on the first write, which costs more than the copy itself. Measured here, 32 MiB blocks:
11.5 ms a block written into a new file against 4.2 ms over the pages of a freed one; on a
virtual machine whose host takes freed memory back, pages not touched for a few seconds cost
several times more again. Ray's object store keeps its pages for the same reason (one arena
mapped for the session).

A file may be written over only when nobody can still read it. Batches handed out zero-copy
are views of the file's mapping, in the driver (a batch the user kept), a worker (a UDF that
kept one), or another process (a ``streaming_split`` rank). The kernel knows who maps or opens a
file, so that is who is asked: a write lease (``F_SETLEASE``) is granted only when no other
open file and no mapping of it exists, in any process, the caller's own mappings included.
The file is renamed to a name only this pool knows when it is freed, so nobody opens it anew;
when a task would take it, it is leased and let go at once. One still mapped (a consumer's
batch of it not dropped yet) stays for a later task, and is unlinked as before if it never
comes free (its readers keep their pages until they let go of them).

The executor's loop owns the pool (no lock): ``offer`` on free, ``take`` when it sends a task
(the task's worker writes its outputs over them, ``object_store.SharedMemoryStore.put``),
``reclaim`` when the task ends or its worker dies (files it did not use come back), ``expire``
on every turn. The pool holds at most ``SPARE_SHARE`` of the store and forgets a file unused for
``SPARE_IDLE_S``; its bytes count against the store's room like blocks'.
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import os
import signal
from collections import deque
from collections.abc import Iterable

from engine.file_reaper import FileReaper, unlink_freed

SPARE_MIN_BYTES = 1 << 20
"""Smaller blocks are not kept: the rename and the lease cost more than their pages."""
SPARE_SHARE = 0.125
"""The most of the store's capacity the pool may hold."""
SPARE_IDLE_S = 5.0
"""A file nobody took for this long is unlinked: an idle session gives its memory back."""
MAX_SPARES_PER_TASK = 8
MAX_PROBES = 16
"""Files asked about for one task at most (each ask is four system calls, ~10 us)."""


BREAK_SIGNAL = signal.SIGURG
"""What the kernel sends this process if something opens a file while it holds the lease: by
default SIGIO, which ends a process; SIGURG is ignored unless a program asks for it. (Nothing
opens a spare by name, and the lease is held for microseconds; this is for what does anyway.)"""


def nobody_else_opens(fd: int) -> bool | None:
    """Whether the file behind ``fd`` is open or mapped nowhere but through ``fd`` (any process);
    None when the kernel cannot say (leases turned off, a file system without them).

    Asks the kernel for a write lease and gives it back at once; the lease is refused while any
    other open file or mapping of the file exists.
    """
    try:
        fcntl.fcntl(fd, fcntl.F_SETSIG, BREAK_SIGNAL)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
    except OSError as err:
        return False if err.errno in (errno.EAGAIN, errno.EBUSY) else None
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    except OSError:
        pass
    return True


def on_tmpfs(path: str) -> bool:
    """Whether ``path`` is on a tmpfs mount (``/proc/self/mounts``: the longest mount point that
    holds it). Elsewhere (an overlay file system in a container without ``/dev/shm``) a mapping
    may hold a file the lease does not see, so the pool keeps nothing there."""
    path = os.path.realpath(path)
    best, kind = "", ""
    try:
        with open("/proc/self/mounts") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = fields[1].replace("\\040", " ")
                inside = path == point or path.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, kind = point, fields[2]
    except OSError:
        return False
    return kind == "tmpfs"


class SpareFiles:
    """Freed block files under ``folder`` kept for writing over (see the module docstring)."""

    def __init__(self, folder: str, capacity: int, idle_s: float = SPARE_IDLE_S,
                 reaper: FileReaper | None = None) -> None:
        self.folder = os.path.normpath(folder)
        self._reaper = reaper
        """Where the files it lets go are unlinked (off the loop); None: in place."""
        self.capacity = capacity if on_tmpfs(self.folder) else 0
        self.idle_s = idle_s
        self._files: deque[tuple[str, int, float]] = deque()
        """(path, size, since), oldest first."""
        self.bytes = 0
        self._ids = itertools.count()
        self.kept = 0
        """Files kept so far."""
        self.refused = 0
        """Times a file was passed over because something still opened or mapped it."""
        self.reused = 0
        """Kept files a task took and did not give back (it wrote a block over them; or, rarely,
        the block failed and was removed, or its worker died and its files were swept)."""

    def __len__(self) -> int:
        return len(self._files)

    def offer(self, path: str, now: float) -> bool:
        """Keep the freed block file ``path`` (renamed: nobody opens it anew) if there is room;
        else unlink it. True when kept. Whether something still maps it is asked when a task
        would take it (``take``): a batch of it may be in a consumer's hands for a while yet."""
        try:
            size = os.stat(path).st_size
        except OSError:
            return False
        if size < SPARE_MIN_BYTES or self.bytes + size > self.capacity or os.path.dirname(path) != self.folder:
            unlink_freed(path, size, self._reaper)
            return False
        spare = os.path.join(self.folder, f"spare-{next(self._ids)}")
        try:
            os.rename(path, spare)
        except OSError:
            unlink_freed(path, size, self._reaper)
            return False
        self._files.append((spare, size, now))
        self.bytes += size
        self.kept += 1
        return True

    def take(self, want_bytes: float) -> tuple[tuple[str, int], ...]:
        """Files nobody opens or maps any more, for a task expected to write ``want_bytes``
        (none below ``SPARE_MIN_BYTES``), the longest freed first, until they hold that much.
        Files still mapped stay (``expire`` unlinks them in the end)."""
        if want_bytes < SPARE_MIN_BYTES or not self._files:
            return ()
        out: list[tuple[str, int]] = []
        got = 0
        for entry in list(itertools.islice(self._files, MAX_PROBES)):
            if got >= want_bytes or len(out) >= MAX_SPARES_PER_TASK:
                break
            path, size, _ = entry
            unused = _unused(path)
            if unused is None:  # the kernel cannot tell: keep nothing from now on
                self.capacity = 0
                self.drop()
                break
            if not unused:
                self.refused += 1
                continue
            self._files.remove(entry)
            self.bytes -= size
            out.append((path, size))
            got += size
        return tuple(out)

    def reclaim(self, spares: Iterable[tuple[str, int]], now: float) -> None:
        """A task that was given ``spares`` ended (or its worker died): those it did not write
        over (still under their names) come back."""
        for path, _ in spares:
            try:
                size = os.stat(path).st_size
            except OSError:  # written over: it is a block now
                self.reused += 1
                continue
            if self.bytes + size > self.capacity:
                unlink_freed(path, size, self._reaper)
                continue
            self._files.append((path, size, now))
            self.bytes += size

    def expire(self, now: float) -> None:
        """Unlink the files nobody took for ``idle_s``."""
        while self._files and now - self._files[0][2] >= self.idle_s:
            path, size, _ = self._files.popleft()
            self.bytes -= size
            unlink_freed(path, size, self._reaper)

    def next_expiry(self, now: float) -> float | None:
        """Seconds until the oldest file expires, or None when there is none."""
        return max(0.0, self._files[0][2] + self.idle_s - now) if self._files else None

    def drop(self) -> None:
        """Unlink every file (the store needs the room)."""
        while self._files:
            path, size, _ = self._files.popleft()
            self.bytes -= size
            unlink_freed(path, size, self._reaper)


def _unused(path: str) -> bool | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        return nobody_else_opens(fd)
    finally:
        os.close(fd)


"""Freed block files unlinked by a thread of their own, off the executor's loop (and the pages
of spilled map outputs that their reduce tasks are done with punched out, ``engine.row_pages``).

Unlinking a file gives its pages back, and the kernel frees them one by one before ``unlink``
returns: ~0.1 ms a MiB of page cache or shared memory here. A sort of 1.4 GB through a 256 MiB
store frees 2.5 GB of files a run: its 1.4 GB of map outputs when the last reduce task ends,
the result when the user drops it. Unlinked by the loop, that was 160 ms between the last task
and the result reaching the caller, and 100 ms before the next job's first task (11% and 7% of
the run), with both CPUs idle. Here the loop hands the path over and goes on; the thread
unlinks while the loop dispatches (``unlink`` releases the GIL).

Nothing reads a freed block's file by name any more (block names are never reused; a reader
that mapped or opened it keeps its pages until it lets go, as with an unlink in place), so the
only change is when the pages come back. Files under ``BACKGROUND_MIN_BYTES`` are unlinked in
place: a hand-over costs more than their unlink. ``close`` unlinks what is left and stops the
thread (a session's shutdown, before it removes its folders).
"""

from __future__ import annotations

import os
import queue
import threading

from engine.row_pages import Ranges, punch

BACKGROUND_MIN_BYTES = 1 << 20
"""Smaller files are unlinked by the caller."""


class FileReaper:
    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[str | tuple[str, Ranges] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pending = 0
        self._idle = threading.Condition(self._lock)
        self._closed = False

    def unlink(self, path: str, size: int) -> None:
        """Unlink ``path`` (of ``size`` bytes) soon: now when small or after ``close``."""
        if size < BACKGROUND_MIN_BYTES or not self._hand_over(path):
            unlink_quietly(path)

    def punch(self, path: str, ranges: Ranges) -> None:
        """Give back the pages of ``ranges`` of the file at ``path`` soon (``engine.row_pages``):
        they cost as much to free as an unlink of as many pages. Done before any later
        ``unlink`` of the file (one thread, in order); after ``close``, not at all."""
        self._hand_over((path, ranges))

    def _hand_over(self, job: str | tuple[str, Ranges]) -> bool:
        with self._lock:  # (so that no job lands behind the stop ``close`` queues)
            if self._closed:
                return False
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="dataflow-file-reaper", daemon=True)
                self._thread.start()
            self._pending += 1
            self._queue.put(job)
            return True

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:  # (close)
                return
            if isinstance(job, tuple):
                punch(*job)
            else:
                unlink_quietly(job)
            with self._lock:
                self._pending -= 1
                if not self._pending:
                    self._idle.notify_all()

    def flush(self, timeout: float) -> bool:
        """Wait until every file handed over so far is unlinked; False when ``timeout`` ran out."""
        with self._lock:
            return self._idle.wait_for(lambda: not self._pending, timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Unlink what is left, then stop the thread; later files are unlinked in place."""
        with self._lock:
            self._closed = True
            thread = self._thread
            if thread is not None:
                self._queue.put(None)
        if thread is not None:
            thread.join(timeout)

    @property
    def pending(self) -> int:
        """Files handed over and not unlinked yet."""
        return self._pending


def unlink_freed(path: str, size: int, reaper: FileReaper | None) -> None:
    """A freed file of ``size`` bytes unlinked by ``reaper`` (the driver's), or here and now
    when there is none (a worker's store)."""
    if reaper is not None:
        reaper.unlink(path, size)
    else:
        unlink_quietly(path)


def unlink_quietly(path: str) -> None:
    """Unlink ``path``; one that is gone or cannot be unlinked is left to the session's sweep."""
    try:
        os.unlink(path)
    except (OSError, ValueError):  # (ValueError: a path with a NUL in it)
        pass

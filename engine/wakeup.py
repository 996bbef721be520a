"""WakeupPipe: how other threads rouse a loop that sleeps in ``zmq.Poller.poll``.

Any thread calls ``wake``; the loop polls ``fileno`` and calls ``drain`` when it is readable.
Writing and closing happen under one lock, so a thread that wakes the loop after it closed the
pipe never writes into a descriptor number the process has since reused for something else.

A wake while one is pending (written, not yet drained) writes nothing: the loop has not yet
looked at its commands, so it will see whatever the caller queued before waking it. A consumer
that releases thousands of small blocks a second then costs one system call per loop turn,
not one per block.
"""

from __future__ import annotations

import os
import threading


class WakeupPipe:
    def __init__(self) -> None:
        self.fileno, self._w = os.pipe()
        os.set_blocking(self.fileno, False)
        os.set_blocking(self._w, False)
        self._lock = threading.Lock()
        self._closed = False
        self._pending = False

    def wake(self) -> None:
        """Any thread: make the loop look again (a no-op once closed)."""
        with self._lock:
            if self._closed or self._pending:
                return
            self._pending = True
            try:
                os.write(self._w, b"x")
            except (BlockingIOError, OSError):
                pass  # full: the loop has wake-ups pending anyway

    def drain(self) -> None:
        """The loop's thread: empty the pipe after poll said it is readable, before it looks at
        its commands. The flag is cleared after the read: a wake from then on writes a byte this
        drain cannot have taken, and one skipped before it queued its command in time."""
        try:
            while os.read(self.fileno, 4096):
                pass
        except BlockingIOError:
            pass
        with self._lock:
            self._pending = False

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self.fileno)
                os.close(self._w)

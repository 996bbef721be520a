"""BackgroundSource: a lazy source of read tasks pulled on its own thread.

Listing a bucket and planning its read tasks (Parquet footers for row-group splits) is network
I/O: an S3 page of 1,000 keys can take 100 ms, a throttled one seconds. On the executor's
thread that would pause every other decision (finished tasks, the consumer's releases, other
executions). Here a thread pulls the source at most ``ahead`` items in front of the operator,
which takes what is there without blocking; the thread wakes the executor when it adds to a
queue the operator found empty, and when the source ends or fails.

The thread refills in runs: once the queue is full it sleeps until the operator has taken half
of it. Woken for every item instead, the two threads traded the GIL once per read task, which
cost the executor's thread more than planning the task did (2,000 one-file tasks).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

WAITING = object()
"""``poll`` found nothing yet; the thread will wake the executor when it has something."""


class _Done:
    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


class BackgroundSource:
    def __init__(self, source: Iterator[Any], wake: Callable[[], None], ahead: int = 64, name: str = "source") -> None:
        self._items: deque[Any] = deque()
        self._ahead = max(1, ahead)
        self._refill_at = self._ahead // 2
        self._room = threading.Condition(threading.Lock())
        """Held to change ``_items``; the thread waits on it while the queue is full."""
        self._wake = wake
        self._stop = threading.Event()
        self._starved = True
        """Set by ``poll`` before it looks, cleared by the thread when it wakes the executor."""
        self._thread = threading.Thread(target=self._run, args=(source,), name=f"dataflow-{name}", daemon=True)
        self._thread.start()

    def poll(self) -> Any:
        """The next item, ``WAITING``, or raise StopIteration at the end (the source's error if it failed)."""
        self._starved = True  # before looking: an item put after the look then wakes us
        with self._room:
            if not self._items:
                return WAITING
            item = self._items[0]
            if not isinstance(item, _Done):  # the end stays the answer for later polls
                self._items.popleft()
                if len(self._items) == self._refill_at:
                    self._room.notify()
        if isinstance(item, _Done):
            if item.error is not None:
                raise item.error
            raise StopIteration
        return item

    def close(self) -> None:
        """Stop pulling (the thread ends at its next item; a blocked listing call finishes first)."""
        self._stop.set()
        with self._room:
            self._items.clear()
            self._room.notify_all()

    def _run(self, source: Iterator[Any]) -> None:
        done = _Done()
        try:
            for item in source:
                if not self._put(item):
                    return
        except Exception as err:  # reported to the operator, which fails the execution
            done = _Done(err)
        except BaseException as err:  # SystemExit from a source must not end the executor's loop
            done = _Done(RuntimeError(f"the source stopped listing: {err!r}"))
        finally:
            try:
                close = getattr(source, "close", None)
                if close is not None:
                    close()
            except Exception as err:
                if done.error is None:
                    done = _Done(err)
            if not self._stop.is_set():
                self._put(done, wait=False)

    def _put(self, item: Any, wait: bool = True) -> bool:
        """Queue ``item``, first waiting, while the queue is full, for the operator to take half
        of it (``close`` wakes the wait); False once closed."""
        with self._room:
            while wait and len(self._items) >= self._ahead and not self._stop.is_set():
                self._room.wait()
            if self._stop.is_set():
                return False
            self._items.append(item)
        if self._starved or isinstance(item, _Done):
            self._starved = False
            self._wake()
        return True

"""The inline slot: tasks run on a thread of the driver until the first worker process is ready.

A small job's first row then does not wait ~0.3 s for processes. One task at a time; its result
is handed back to the executor's loop (which ``wake`` rouses). Once a worker is ready the slot
is closed for the session (``enabled`` goes False and stays so).
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from engine.object_store import BlockStore
from engine.task import TaskResult, run_task


class InlineSlot:
    def __init__(self, store: BlockStore, wake: Callable[[], None], enabled: bool) -> None:
        self._store = store
        self._wake = wake
        self.enabled = enabled
        """Still in the cold start: the slot may take tasks."""
        self.busy = False
        self._queue: queue.SimpleQueue[tuple[Any, Any, Any] | None] = queue.SimpleQueue()
        self._results: deque[tuple[Any, Any, Any, TaskResult]] = deque()
        self._thread: threading.Thread | None = None

    def free(self) -> bool:
        return self.enabled and not self.busy

    def run(self, execution: Any, op: Any, pending: Any) -> None:
        """Start ``pending`` (a task of ``op``) on the slot's thread."""
        self.busy = True
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="dataflow-inline", daemon=True)
            self._thread.start()
        self._queue.put((execution, op, pending))

    def finished(self) -> list[tuple[Any, Any, Any, TaskResult]]:
        """Tasks that finished since the last call (loop thread only)."""
        done = []
        while self._results:
            done.append(self._results.popleft())
            self.busy = False
        return done

    def close(self) -> None:
        self._queue.put(None)

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            execution, op, pending = item
            result = run_task(pending.spec, op.transform, self._store)
            # what the task decoded is in the store now: give the allocator's cached pages back,
            # or the driver keeps a Parquet decode's worth of memory for the rest of its life
            pa.default_memory_pool().release_unused()
            self._results.append((execution, op, pending, result))
            # drop this frame's references before waiting for the next task: the last task's
            # execution (and, when it failed, the caller's frames its error holds) stayed
            # alive until another task came, for the rest of the session if none did
            del item, execution, op, pending, result
            self._wake()

"""The engine's entry point for callers: run a list of operators, get refs and blocks back.

``ExecutionHandle`` is what ``dataflow`` sees of a running plan, whichever executor runs it:
iterate refs, read a block, release it when done, cancel, read statistics.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from engine.execution import Execution, check_resources
from engine.local import LocalExecutor
from engine.object_store import BlockRef, BlockStore
from engine.operators.base import PhysicalOperator
from engine.options import ExecutionOptions
from engine.stats import ExecutionStats


class ExecutionHandle:
    """A running (or finished) plan."""

    def __init__(self, execution: Execution, store: BlockStore) -> None:
        self.execution = execution
        self.store = store
        self._closed = False

    def iter_refs(self) -> Iterator[BlockRef]:
        raise NotImplementedError

    def get(self, ref: BlockRef) -> pa.Table:
        return self.store.get(ref)

    def release(self, ref: BlockRef) -> None:
        raise NotImplementedError

    def cancel(self) -> None:
        raise NotImplementedError

    def detach(self, ref: BlockRef) -> bool:
        """Keep ``ref`` after the execution (it no longer counts against its budget). False when
        the block was borrowed (a materialized input's): it is not the caller's to free."""
        raise NotImplementedError

    def free_detached(self, ref: BlockRef) -> None:
        """Free a block kept with ``detach``."""
        raise NotImplementedError

    def wait_stopped(self, timeout: float | None = None) -> bool:
        """Block until no task of this execution is running anymore."""
        return self.execution.stopped.wait(timeout)

    def stats(self) -> ExecutionStats:
        return ExecutionStats.of(self.execution)

    def results(self) -> list[Any]:
        """Write results (for write plans) once finished."""
        return list(getattr(self.execution.output_op, "results", []))

    def row_count(self) -> int:
        return int(getattr(self.execution.output_op, "rows_counted", 0))

    def busy_cpus(self) -> float:
        """CPUs the engine's worker processes are using right now on this machine."""
        return 0.0


class StreamingHandle(ExecutionHandle):
    def __init__(self, execution: Execution, session: Any) -> None:
        super().__init__(execution, session.store)
        self.executor = session.executor

    def busy_cpus(self) -> float:
        return self.executor.busy_cpus()

    def iter_refs(self) -> Iterator[BlockRef]:
        try:
            while True:
                ref = self.execution.buffer.get()
                if ref is None:
                    return
                self.execution_handed(ref)
                yield ref
        finally:
            if not self.execution.buffer.done or self.execution.buffer.error is None:
                self.cancel()

    def execution_handed(self, ref: BlockRef) -> None:
        self.executor.call_soon(lambda: self.execution.handed_to_consumer(ref))

    def release(self, ref: BlockRef) -> None:
        self.executor.release(self.execution, ref)

    def detach(self, ref: BlockRef) -> bool:
        self.executor.call_soon(lambda: self.execution.detach(ref))
        return ref.block_id not in self.execution.borrowed

    def free_detached(self, ref: BlockRef) -> None:
        if not self.executor.stopped:
            self.executor.call_soon(lambda: self.executor.free(ref))

    def cancel(self) -> None:
        if not self._closed:
            self._closed = True
            self.executor.cancel(self.execution)  # also frees outputs nobody will read


class LocalHandle(ExecutionHandle):
    def __init__(self, execution: Execution, local: LocalExecutor) -> None:
        super().__init__(execution, local.store)
        self.local = local

    def iter_refs(self) -> Iterator[BlockRef]:
        try:
            for ref in self.local.run(self.execution):
                self.execution.handed_to_consumer(ref)
                yield ref
        finally:
            self.cancel()

    def release(self, ref: BlockRef) -> None:
        self.execution.release_consumed(ref)

    def detach(self, ref: BlockRef) -> bool:
        self.execution.detach(ref)
        return ref.block_id not in self.execution.borrowed

    def free_detached(self, ref: BlockRef) -> None:
        self.local.free(ref)

    def cancel(self) -> None:
        if not self._closed:
            self._closed = True
            self.execution.cancel()
            self.execution.release_undelivered()
        self.execution.stopped.set()  # in-process: nothing runs once the caller stops asking


def execute(
    ops: list[PhysicalOperator],
    options: ExecutionOptions,
    mode: str = "streaming",
    session: Any = None,
) -> ExecutionHandle:
    """Start running ``ops`` (topologically ordered; the last one is the output)."""
    if mode == "local":
        local = LocalExecutor(options)
        execution = Execution(ops, options, local.free, local.store)
        check_resources(execution, options)
        return LocalHandle(execution, local)
    if session is None:
        from engine.session import get_session

        session = get_session(options)
    executor = session.executor
    execution = Execution(
        ops,
        session.options.for_execution(options),
        executor.free,
        session.store,
        executor.stored,
        store_capacity=executor.store_capacity,
    )
    session.executor.submit(execution)
    return StreamingHandle(execution, session)

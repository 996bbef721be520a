"""The synchronous in-process mode: the same operators and tasks, run in the caller's thread.

No processes, sockets or shared memory: blocks stay in a ``MemoryStore`` and each task runs
to completion when dispatched. Semantics (batching, errors, limits, write commits) are those of
the streaming executor, because the operators and ``run_task`` are the same code. Use it to
debug a UDF with pdb, and for fast tests.

``InProcessBackend`` is this mode behind the engine's backend interface (``engine.backend``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa

from engine.backend import Backend, Capacity, ExecutionHandle, put_each
from engine.errors import EngineError
from engine.execution import Execution, check_resources
from engine.object_store import BlockRef, MemoryStore
from engine.operators.base import PhysicalOperator
from engine.options import ExecutionOptions
from engine.scheduler import Candidate, pick
from engine.task import run_task

_STORE = MemoryStore()
"""One in-memory store per process, so materialized datasets outlive the execution that made them."""


class LocalExecutor:
    def __init__(self, options: ExecutionOptions) -> None:
        self.options = options
        self.store = _STORE

    def free(self, ref: BlockRef) -> None:
        self.store.free(ref)

    def run(self, execution: Execution) -> Iterator[BlockRef]:
        """Yield output refs as they are produced; the caller releases each one."""
        execution.route()
        while True:
            ready, ref = execution.buffer.get_nowait()
            if ready:
                if ref is None:
                    return
                yield ref
                continue
            if not self._step(execution):
                msg = "the in-process executor has nothing to run but the plan is not finished (a bug)"
                raise EngineError(msg)

    def _step(self, execution: Execution) -> bool:
        if self._run_one(execution):
            return True
        execution.route()  # inputs may have just finished upstream, making a last bundle ready
        return self._run_one(execution) or execution.buffer.done or bool(execution.output_op.outputs)

    def _run_one(self, execution: Execution) -> bool:
        candidates, ops = [], []
        for op in execution.map_ops():
            ready, reason = execution.dispatchable(op)
            if ready and reason is None:
                candidates.append(Candidate(op.key, execution.depth[id(op)], op.held_bytes, op.in_flight()))
                ops.append(op)
        index = pick(candidates)
        if index is None:
            return False
        op = ops[index]
        pending = op.next_task()
        result = run_task(pending.spec, op.transform, self.store)
        execution.task_finished(op, result)
        return True


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


class InProcessBackend(Backend):
    """The in-process mode as a backend: each execution runs in the thread that iterates it,
    its blocks live in this process's ``MemoryStore``. It has no settings of its own (every
    execution runs with the options it asks for) and nothing to stop."""

    def __init__(self, options: ExecutionOptions | None = None) -> None:
        self.options = options or ExecutionOptions()

    @property
    def closed(self) -> bool:
        return False

    @property
    def private_views(self) -> bool:
        return _STORE.private_views

    def execution_options(self, wanted: ExecutionOptions) -> ExecutionOptions:
        return wanted.with_()  # its own copy: the caller's options object is mutable

    def execute(self, ops: list[PhysicalOperator], options: ExecutionOptions) -> ExecutionHandle:
        local = LocalExecutor(options)
        execution = Execution(ops, options, local.free, local.store)
        check_resources(execution, options)
        return LocalHandle(execution, local)

    def put(self, tables: Sequence[pa.Table]) -> list[BlockRef]:
        return put_each(tables, _STORE.put, _STORE.free)

    def get(self, ref: BlockRef) -> pa.Table:
        return _STORE.get(ref)

    def free(self, ref: BlockRef) -> None:
        _STORE.free(ref)

    def capacity(self) -> Capacity:
        options = self.options
        return Capacity(
            float(options.resolved_num_cpus()),
            options.resolved_num_gpus(),
            options.resolved_store_capacity(),
            tuple(options.resources),
        )

    def busy_cpus(self) -> float:
        return 0.0  # tasks run in the consumer's own thread, between its batches

    def shutdown(self) -> None:
        """Nothing to stop: blocks of materialized datasets stay until those are collected."""

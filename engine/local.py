"""The synchronous in-process mode: the same operators and tasks, run in the caller's thread.

No processes, sockets or shared memory: blocks stay in a ``MemoryStore`` and each task runs
to completion when dispatched. Semantics (batching, errors, limits, write commits) are those of
the streaming executor, because the operators and ``run_task`` are the same code. Use it to
debug a UDF with pdb, and for fast tests.
"""

from __future__ import annotations

from collections.abc import Iterator

from engine.errors import EngineError
from engine.execution import Execution
from engine.object_store import BlockRef, MemoryStore
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

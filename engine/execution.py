"""One running plan: its operators wired in a chain, and the buffer its consumer reads from.

The executor (the only writer) calls ``route`` after every event to move outputs downstream,
``dispatchable`` to learn which operators may start a task and why others wait, and
``task_finished`` / ``task_lost`` as results arrive. The consumer thread only touches the
``OutputBuffer``.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from engine.backpressure import OpLoad, blocked_reason
from engine.errors import DataflowError, EngineError, make_user_error
from engine.object_store import BlockRef, BlockSlice, BlockStore
from engine.operators.base import PhysicalOperator
from engine.operators.limit import LimitOperator
from engine.operators.map import MapOperator
from engine.operators.union import UnionOperator
from engine.options import ExecutionOptions
from engine.task import TaskResult

_execution_ids = itertools.count(1)


class OutputBuffer:
    """Refs produced for the consumer, in order; closed with an optional error."""

    def __init__(self) -> None:
        self._items: deque[BlockRef] = deque()
        self._cond = threading.Condition()
        self.done = False
        self.error: BaseException | None = None

    def put(self, ref: BlockRef) -> None:
        with self._cond:
            self._items.append(ref)
            self._cond.notify()

    def finish(self, error: BaseException | None = None) -> None:
        with self._cond:
            if not self.done:
                self.done = True
                self.error = error
            self._cond.notify_all()

    def get(self, timeout: float | None = None) -> BlockRef | None:
        """The next ref; None at the end; raises the execution's error."""
        with self._cond:
            while not self._items and not self.done:
                self._cond.wait(timeout)
            if self._items:
                return self._items.popleft()
            if self.error is not None:
                raise self.error
            return None

    def get_nowait(self) -> tuple[bool, BlockRef | None]:
        """(True, ref or None at the end) if an answer is ready, else (False, None)."""
        with self._cond:
            if self._items:
                return True, self._items.popleft()
            if self.done:
                if self.error is not None:
                    raise self.error
                return True, None
            return False, None

    def drain(self) -> list[BlockRef]:
        with self._cond:
            items = list(self._items)
            self._items.clear()
            return items


class Execution:
    """The state of one plan while it runs."""

    def __init__(
        self,
        ops: list[PhysicalOperator],
        options: ExecutionOptions,
        free: Callable[[BlockRef], None],
        store: BlockStore,
        stored: Callable[[BlockRef], None] | None = None,
    ) -> None:
        """``free`` frees a block; ``stored`` counts one the driver itself put in the store."""
        self.id = next(_execution_ids)
        self._stored = stored
        self.ops = ops
        self.output_op = ops[-1]
        self.options = options
        self._free_block = free
        self.store = store
        self.borrowed: set[str] = set()
        for op in ops:
            self.borrowed |= getattr(op, "borrowed", set())
        self.buffer = OutputBuffer()
        self.depth: dict[int, int] = {}
        for op in ops:
            self.depth[id(op)] = 1 + max((self.depth[id(u)] for u in op.upstream), default=-1)
            for u in op.upstream:
                u.downstream = op
            if isinstance(op, LimitOperator):
                op.bind(self._slice_head, free)
            if isinstance(op, UnionOperator):
                op.ordered = options.preserve_order
        self.consumer_held = 0
        """Bytes handed to the consumer and not yet released by it."""
        self.started = time.perf_counter()
        self.finished_at: float | None = None
        self.cancelled = False
        self.stopped = threading.Event()
        """Set once no task of this execution runs anymore (it finished, failed or was cancelled)."""
        self._last_wait_check = time.perf_counter()

    def _free(self, ref: BlockRef) -> None:
        if ref.block_id not in self.borrowed:
            self._free_block(ref)

    def _slice_head(self, ref: BlockRef, n: int) -> BlockRef:
        piece = self.store.put(self.store.get(ref).slice(0, n))
        if self._stored is not None:
            self._stored(piece)
        return piece

    # moving data -----------------------------------------------------------------------------
    def route(self) -> None:
        """Move every operator's outputs downstream; finish when the output operator is done."""
        for op in self.ops:
            target = op.downstream
            while op.outputs:
                ref = op.outputs.popleft()
                if target is None:
                    self.buffer.put(ref)
                    continue
                if isinstance(target, MapOperator):
                    target.add_input(ref, target.upstream.index(op), op)
                else:
                    op.held_bytes -= ref.size_bytes
                    target.add_input(ref, target.upstream.index(op))
            if target is not None and op.completed() and not op.outputs:
                target.upstream_finished(target.upstream.index(op))
            if isinstance(op, LimitOperator) and op.reached():
                self._cancel_upstream(op)
        if self.output_op.completed() and not self.output_op.outputs and not self.buffer.done:
            self.finished_at = time.perf_counter()
            self.buffer.finish()

    def _cancel_upstream(self, op: PhysicalOperator) -> None:
        for up in op.upstream:
            if not up.cancelled:
                for value, producer in up.cancel():
                    self.free_input(value, producer, up)
                self._cancel_upstream(up)

    def free_input(self, value: Any, producer: PhysicalOperator | None, consumer: PhysicalOperator) -> None:
        """Free a consumed input block: an upstream's output, or a block its source gave up."""
        if isinstance(value, BlockSlice):
            if not isinstance(consumer, MapOperator) or not consumer.release_slice(value):
                return  # another slice of the block is still queued or running
            value = value.ref
        if not isinstance(value, BlockRef):
            return
        if producer is not None:
            producer.held_bytes -= value.size_bytes
            self._free(value)
        elif getattr(consumer, "source_owned", False):
            self._free(value)

    # tasks -------------------------------------------------------------------------------
    def map_ops(self) -> list[MapOperator]:
        return [op for op in self.ops if isinstance(op, MapOperator)]

    def load(self, op: MapOperator) -> OpLoad:
        budget = self.options.consumer_buffer_bytes if op is self.output_op else self.options.op_output_budget
        held = op.held_bytes + (self.consumer_held if op is self.output_op else 0)
        return OpLoad(held, op.in_flight(), op.expected_output_bytes(), budget, op.max_concurrency)

    def dispatchable(self, op: MapOperator) -> tuple[bool, str | None]:
        """(has a task ready, reason it may not start) for ``op``."""
        if self.cancelled or op.cancelled:
            return False, None
        upstream_busy = any(u.in_flight() > 0 or not u.completed() for u in op.upstream)
        inputs_were_done = op.inputs_done
        try:
            ready = op.has_ready_task(upstream_busy)  # may list more input (a source's generator)
        except Exception as err:  # listing failed (missing file, denied, a custom source's bug)
            self.fail(err)
            return False, None
        if op.inputs_done and not inputs_were_done:
            # the source ended after its last task was sent (a listing thread can be the last
            # to finish): if that task is back already, nothing else would tell downstream
            self.route()
        if not ready:
            return False, None
        return True, blocked_reason(self.load(op))

    def task_finished(self, op: MapOperator, result: TaskResult) -> None:
        pending = op.task_finished(result.task_id, result)
        if result.error is not None:
            op.stats.tasks_failed += 1
            for ref in result.refs:
                self._free(ref)
            self.fail(_user_error(op, result))
            return
        for value, producer in pending.bundle:
            self.free_input(value, producer, op)
        if op.output == "count":
            op.rows_counted += result.num_rows
            op.stats.rows_out += result.num_rows
        elif op.output == "write":
            op.results.append(result.value)
            op.stats.rows_out += result.num_rows
            op.stats.bytes_out += result.size_bytes
        refs = op.in_order(pending.spec.task_index, result.refs) if self.options.preserve_order else result.refs
        for ref in refs:
            if op.cancelled:
                self._free(ref)
            else:
                op.emit(ref)
        self.route()

    def task_lost(self, op: MapOperator, task_id: int, why: str) -> None:
        pending = op.task_lost(task_id)
        if pending.spec.attempt + 1 >= self.options.max_task_attempts:
            from engine.errors import WorkerDiedError

            msg = (
                f"task {pending.spec.task_index} of {op.name} failed {pending.spec.attempt + 1} times "
                f"because its worker died ({why}); giving up"
            )
            self.fail(WorkerDiedError(msg))

    def release_consumed(self, ref: BlockRef) -> None:
        self.consumer_held -= ref.size_bytes
        self._free(ref)

    def detach(self, ref: BlockRef) -> None:
        """The consumer keeps ``ref`` beyond this execution (materialize): stop counting it."""
        self.consumer_held -= ref.size_bytes

    def handed_to_consumer(self, ref: BlockRef) -> None:
        self.output_op.held_bytes -= ref.size_bytes
        self.consumer_held += ref.size_bytes

    # ending ------------------------------------------------------------------------------
    def fail(self, error: BaseException) -> None:
        if self.buffer.done:
            return
        self.cancel()
        self.buffer.finish(error)

    def cancel(self) -> None:
        """Stop everything: queued inputs and undelivered outputs are freed."""
        if self.cancelled:
            return
        self.cancelled = True
        for op in self.ops:
            for value, producer in op.cancel():
                self.free_input(value, producer, op)
            while op.outputs:
                self._free(op.outputs.popleft())
            if isinstance(op, MapOperator):
                for ref in op.held_out_of_order():
                    self._free(ref)
        if self.finished_at is None:
            self.finished_at = time.perf_counter()

    def release_undelivered(self) -> None:
        for ref in self.buffer.drain():
            self._free(ref)

    @property
    def done(self) -> bool:
        return self.buffer.done and all(op.in_flight() == 0 for op in self.ops)

    def note_waits(self, reasons: dict[int, str]) -> None:
        """Charge the time since the last call to each waiting operator's reason."""
        now = time.perf_counter()
        elapsed = now - self._last_wait_check
        self._last_wait_check = now
        for op in self.ops:
            reason = reasons.get(id(op))
            if reason is not None:
                op.stats.add_wait(reason, elapsed)


def _user_error(op: MapOperator, result: TaskResult) -> BaseException:
    from engine import serialization

    err = result.error
    assert err is not None
    cause = None
    if err.exception is not None:
        try:
            cause = serialization.loads(err.exception)
        except Exception:
            cause = None
    if not err.user_code:
        if isinstance(cause, DataflowError):  # e.g. ObjectStoreFullError: ours, but not a bug
            return cause
        return EngineError(f"internal error in {op.name} (this is a bug in dataflow):\n{err.traceback}")
    context = err.context or f"(operator {op.name})"
    return make_user_error(err.udf_name, cause, err.exc_type, err.traceback, context)


def check_resources(execution: Execution, options: ExecutionOptions) -> None:
    """Fail at once (ResourceError) if an operator asks for more than this cluster can ever offer."""
    from engine.errors import ResourceError

    offered = dict(options.resources)
    cpus = options.resolved_num_cpus()
    for op in execution.map_ops():
        res = op.resources
        gpus = options.resolved_num_gpus()
        if res.num_gpus > gpus:
            msg = f"{op.name} asks for num_gpus={res.num_gpus} but this machine has {gpus} GPUs; it could never run"
            raise ResourceError(msg)
        if res.num_cpus > cpus:
            msg = f"{op.name} asks for num_cpus={res.num_cpus} but this cluster has {cpus} CPUs; it could never run"
            raise ResourceError(msg)
        for name, amount in res.custom:
            if offered.get(name, 0) < amount:
                msg = f"{op.name} asks for {amount} of resource {name!r}; this cluster offers {offered.get(name, 0)}"
                raise ResourceError(msg)

"""One running plan: its operators wired in a chain, and the buffer its consumer reads from.

The executor (the only writer) calls ``route`` after every event to move outputs downstream,
``dispatchable`` to learn which operators may start a task and why others wait, and
``task_finished`` / ``task_lost`` as results arrive. The consumer thread only touches the
``OutputBuffer``.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from engine import row_errors
from engine.backpressure import (
    WAIT_BUDGET,
    WAIT_RESOURCES,
    OpLoad,
    blocked_reason,
    consumer_block_cap,
    op_budget,
    task_output_cap,
)
from engine.errors import DataflowError, EngineError, WorkerDiedError, make_user_error
from engine.object_store import BlockRef, BlockSlice, BlockStore
from engine.operators.base import OperatorContext, PhysicalOperator
from engine.operators.map import MapOperator
from engine.options import ExecutionOptions
from engine.task import TaskResult
from engine.units import common_unit

_execution_ids = itertools.count(1)
log = logging.getLogger("dataflow.execution")


class OutputBuffer:
    """Refs produced for the consumer, in order; closed with an optional error."""

    def __init__(self) -> None:
        self._items: deque[BlockRef] = deque()
        self._cond = threading.Condition()
        self.done = False
        self.error: BaseException | None = None
        self._on_finish: list[Callable[[], None]] = []

    def put(self, ref: BlockRef) -> None:
        with self._cond:
            self._items.append(ref)
            self._cond.notify()

    def __len__(self) -> int:
        """Refs produced and not yet taken by the consumer (a read of a deque's length: any thread)."""
        return len(self._items)

    def finish(self, error: BaseException | None = None) -> None:
        with self._cond:
            first = not self.done
            if first:
                self.done = True
                self.error = error
            self._cond.notify_all()
            callbacks, self._on_finish = self._on_finish, []
        for fn in callbacks if first else ():
            fn()

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` once the buffer is finished (now if it is; else in the finishing thread:
        it must be quick and never raise)."""
        with self._cond:
            if not self.done:
                self._on_finish.append(fn)
                return
        fn()

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


def _no_pool_starting(op: MapOperator) -> bool:
    return False


class Execution:
    """The state of one plan while it runs."""

    def __init__(
        self,
        ops: list[PhysicalOperator],
        options: ExecutionOptions,
        free: Callable[[BlockRef], None],
        store: BlockStore,
        stored: Callable[[BlockRef], None] | None = None,
        store_capacity: int | None = None,
        shares_finished_budgets: bool = True,
    ) -> None:
        """``free`` frees a block; ``stored`` counts one the driver itself put in the store."""
        self.id = next(_execution_ids)
        self._stored = stored
        self.ops = ops
        self.output_op = ops[-1]
        self.options = options
        self._free_block = free
        self.store = store
        self.store_capacity = store_capacity if store_capacity is not None else options.resolved_store_capacity()
        store_limit = options.resource_limits.object_store_memory
        if store_limit is not None:  # Ray's resource_limits: this execution's share of the store
            self.store_capacity = min(self.store_capacity, int(store_limit))
        self.cpu_limit = options.cpu_limit()
        """``resource_limits.cpu``: the CPUs this execution's running tasks may use at once."""
        self.pool_starting: Callable[[MapOperator], bool] = _no_pool_starting
        """Whether an operator is an actor pool none of whose actors has started yet (the
        executor, which manages workers, sets it): what feeds it then reads ahead
        (``backpressure.op_budget``)."""
        self.shares_finished_budgets = shares_finished_budgets
        """The store's operator share is split between the operators still running tasks (an
        exchange's reduce gets the part of the steps before it). The Ray runner turns it off:
        there, the map outputs a reduce reads are restored from Ray's spill into a small object
        store, and more reduce tasks at once spill more (a shuffle of 360 MiB over three 80 MiB
        stores: 28 -> 50 s)."""
        self._owner: dict[str, PhysicalOperator | None] = {}
        """The one ownership table: every block this execution produced and has not freed, and
        the task-running operator whose budget it counts against. Blocks not in it (a
        materialized dataset's, one detached by the consumer) are never freed here."""
        self.borrowed: frozenset[str] = frozenset(
            ref.block_id for op in ops for ref in op.borrowed_refs()
        )
        """Blocks of materialized datasets this plan reads (never freed by it; read by any thread)."""
        self.buffer = OutputBuffer()
        self.depth: dict[int, int] = {}
        for op in ops:
            self.depth[id(op)] = 1 + max((self.depth[id(u)] for u in op.upstream), default=-1)
            for u in op.upstream:
                u.downstream = op
        ctx = OperatorContext(
            self.release, self._slice_head, options.preserve_order, store.get,
            self.store_capacity, options.resolved_num_cpus(), self.fail,
        )
        for op in ops:
            op.start(ctx)
        self._task_ops: list[MapOperator] = [op for op in ops if op.runs_tasks]  # type: ignore[misc]
        self._feeds_consumer = {id(op) for op in self._task_ops if self._task_downstream(op) is None}
        for op in self._task_ops:
            cap = task_output_cap(self.store_capacity, len(self._task_ops), op.slots(options.resolved_num_cpus()),
                                  op.max_task_output_bytes)
            op.max_task_output_bytes = cap
        self.consumer_held = 0
        """Bytes handed to the consumer and not yet released by it."""
        self.started = time.perf_counter()
        self.finished_at: float | None = None
        self.outcome: str | None = None
        """How it ended: "finished", "failed" or "cancelled" (None while it runs)."""
        self.cancelled = False
        self.cancelled_at: float | None = None
        """When it was cancelled (``time.monotonic()``)."""
        self.stopped = threading.Event()
        """Set once no task of this execution runs anymore (it finished, failed or was cancelled)."""
        self._last_wait_check = time.perf_counter()
        self._waiting: dict[int, str] = {}
        self.errored_blocks = 0
        """Failed tasks whose output was dropped under ``max_errored_blocks``."""

    # ownership -----------------------------------------------------------------------------
    def own(self, ref: BlockRef, producer: PhysicalOperator | None) -> None:
        """Record a block this execution produced, counted against ``producer``'s budget."""
        self._owner[ref.block_id] = producer
        if producer is not None:
            producer.held_bytes += ref.size_bytes
            producer.stats.peak_held_bytes = max(producer.stats.peak_held_bytes, producer.held_bytes)

    def _disown(self, ref: BlockRef) -> bool:
        if ref.block_id not in self._owner:
            return False
        producer = self._owner.pop(ref.block_id)
        if producer is not None:
            producer.held_bytes -= ref.size_bytes
        return True

    def release(self, ref: BlockRef) -> None:
        """Free ``ref`` if this execution owns it; a borrowed or already freed block is left alone.
        The only place a block of an execution is ever freed."""
        if self._disown(ref):
            self._free_block(ref)

    def _slice_head(self, ref: BlockRef, n: int) -> BlockRef:
        piece = self.store.put(self.store.get(ref).slice(0, n))
        if self._stored is not None:
            self._stored(piece)
        self.own(piece, self._owner.get(ref.block_id))
        return piece

    def _task_downstream(self, op: PhysicalOperator) -> MapOperator | None:
        """The next operator after ``op`` that runs tasks (through limits and unions), if any."""
        down = op.downstream
        while down is not None and not down.runs_tasks:
            down = down.downstream
        return down

    # moving data -----------------------------------------------------------------------------
    def route(self) -> None:
        """Move every operator's outputs downstream; finish when the output operator is done."""
        for op in self.ops:
            target = op.downstream
            while op.outputs:
                ref = op.outputs.popleft()
                if target is None:
                    self.buffer.put(ref)
                elif target.cancelled:  # past a reached limit: nobody will read it
                    self.release_input(ref, target)
                else:
                    target.add_input(ref, target.upstream.index(op))
            if target is not None and op.completed() and not op.outputs:
                target.upstream_finished(target.upstream.index(op))
            if op.upstream_unneeded():
                self._cancel_upstream(op)
        if self.output_op.completed() and not self.output_op.outputs and not self.buffer.done:
            self.finished_at = time.perf_counter()
            self.outcome = self.outcome or "finished"
            self.buffer.finish()

    def _cancel_upstream(self, op: PhysicalOperator) -> None:
        for up in op.upstream:
            if not up.cancelled:
                self._cancel_op(up)
                self._cancel_upstream(up)

    def _cancel_op(self, op: PhysicalOperator) -> None:
        """Stop ``op``: free its queued inputs, its undelivered outputs and any it parked."""
        for value in op.cancel():
            self.release_input(value, op)
        while op.outputs:
            self.release(op.outputs.popleft())

    def release_input(self, value: Any, consumer: PhysicalOperator) -> None:
        """``consumer`` is done with an input item (a consumed or dropped block, or slice of one)."""
        if isinstance(value, BlockSlice):
            if not consumer.release_slice(value):
                return  # another slice of the block is still queued or running
            value = value.ref
        if isinstance(value, BlockRef):
            self.release(value)

    # tasks -------------------------------------------------------------------------------
    def map_ops(self) -> list[MapOperator]:
        return self._task_ops

    def load(self, op: MapOperator) -> OpLoad:
        cpus = self.options.resolved_num_cpus()
        slots = op.slots(cpus)
        expected = op.expected_output_bytes(prior=float(self.options.target_max_block_size))
        consumer = id(op) in self._feeds_consumer
        floor = self.options.consumer_buffer_bytes if consumer else self.options.op_output_budget
        down = self._task_downstream(op)
        # the budget grows with what tasks are seen to produce; until a task has finished, one
        # wave of whole-block guesses where the operator's share of the store holds them;
        # while what it feeds is behind, one task at a time (more would only hold more memory)
        learned = op.learned_output_bytes()
        backlogged = self._backlogged(op, down, cpus)
        # the store is shared by the operators that still run tasks: once the ones before an
        # exchange's reduce are done, the reduce gets their part (else it runs one task at a time)
        active = (sum(1 for o in self._task_ops if not o.completed()) or 1) if self.shares_finished_budgets else len(self._task_ops)
        # a first wave of several tasks would form its bundles before the first task has shown
        # its output (each a single input), later ones after: under preserve_order the blocks
        # must not depend on that timing, so one task runs until the first has finished
        ordered = self.options.preserve_order or op.ordered_output
        first_wave = learned is None and not ordered
        # reading ahead while the pool fed starts: under preserve_order, once that first task is back
        reads_ahead = down is not None and (learned is not None or not ordered) and self.pool_starting(down)
        budget = op_budget(self.store_capacity, active, slots, expected if first_wave else (learned or 0.0), floor,
                           consumer, first_wave=first_wave, pool_starting=reads_ahead)
        starved = down is not None and down.needs_more_input()
        return OpLoad(op.held_bytes, op.in_flight(), expected, budget, op.max_concurrency, starved, backlogged,
                      len(self.buffer) if consumer else 0, consumer_block_cap(slots) if consumer else 0)

    def _backlogged(self, op: MapOperator, down: MapOperator | None, cpus: int) -> bool:
        """What ``op`` feeds is behind: its downstream has input queued while every one of its
        slots is busy, or the consumer has a block waiting besides the one it is reading."""
        if down is None:
            return id(op) in self._feeds_consumer and len(self.buffer) > 0 and self.consumer_held > 0
        return down.queued_bytes() > 0 and down.in_flight() >= down.slots(cpus)

    def dispatchable(self, op: MapOperator) -> tuple[bool, str | None]:
        """(has a task ready, reason it may not start) for ``op``."""
        if self.cancelled or op.cancelled:
            return False, None
        # an upstream holding its output budget full sends nothing more until this one runs:
        # waiting for a fuller bundle then would wait forever
        upstream_busy = any(self._sends_more(u) for u in op.upstream)
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
        if self.cpu_limit is not None and not self._within_cpu_limit(op):
            return True, WAIT_RESOURCES
        return True, blocked_reason(self.load(op))

    def _within_cpu_limit(self, op: MapOperator) -> bool:
        """One more task of ``op`` keeps this execution within ``resource_limits.cpu`` (a task
        may always start when none of the execution's runs, whatever it asks for)."""
        running = sum(o.in_flight() * o.resources.num_cpus for o in self._task_ops)
        return running == 0 or running + op.resources.num_cpus <= (self.cpu_limit or 0.0) + 1e-9

    def _sends_more(self, op: PhysicalOperator) -> bool:
        """``op`` may send more without its downstream running first: it runs tasks and one is
        running or may start, or (a union, a limit: no tasks of its own) what feeds it may."""
        if op.in_flight() > 0:
            return True
        if op.completed():
            return False
        if op.runs_tasks or not op.upstream:
            return not self._budget_bound(op)
        return any(self._sends_more(u) for u in op.upstream)

    def _budget_bound(self, op: PhysicalOperator) -> bool:
        """``op`` runs tasks, none is running, and its budget keeps the next one from starting."""
        if not op.runs_tasks or op.in_flight() > 0 or op.held_bytes == 0:
            return False
        return blocked_reason(self.load(op)) == WAIT_BUDGET  # type: ignore[arg-type]

    def task_finished(self, op: MapOperator, result: TaskResult) -> None:
        pending = op.task_finished(result.task_id, result)
        unit = common_unit(pending.bundle)
        if unit is not None:  # a resumable write's input unit: its blocks keep it (engine.units)
            result.refs = [dataclasses.replace(ref, unit=unit) for ref in result.refs]
        owner = op.outputs_owner(pending)
        for ref in result.refs:
            self.own(ref, owner)
        if result.error is not None:
            op.stats.tasks_failed += 1
            for ref in result.refs:
                self.release(ref)
            if not self._error_tolerated(op, result):
                for value in pending.bundle:
                    self.release_input(value, op)
                self.fail(_user_error(op, result))
                return
            result = TaskResult(result.task_id)  # its output is dropped; it finished with none
        if result.read_pages:
            self._give_back_read_pages(op, pending.bundle, result)
        for value in pending.bundle:
            self.release_input(value, op)
        if op.output == "count":
            op.rows_counted += result.num_rows
            op.stats.rows_out += result.num_rows
        elif op.output == "write":
            op.results.append(result.value)
            op.stats.rows_out += result.num_rows
            op.stats.bytes_out += result.size_bytes
        if op.cancelled:
            for ref in result.refs:
                self.release(ref)
        elif not op.keep_outputs(pending, result.refs):
            if self.options.preserve_order or op.ordered_output:
                refs = op.in_order(pending.spec.task_index, result.refs)
                stuck = op.flush_order() if op.inputs_done and not op.has_pending_work() else []
                if stuck:  # no task left can fill the gap they wait for (an engine bug): never lose them
                    log.error("%s: outputs waited for a task index no task has; emitted in order", op.name)
                    refs += stuck
            elif type(op) is MapOperator:
                refs = op.soft_in_order(pending.spec.task_index, result.refs)
            else:
                refs = result.refs
            for ref in refs:
                op.emit(ref)
        self.route()

    def _give_back_read_pages(self, op: MapOperator, bundle: list[Any], result: TaskResult) -> None:
        """The task is done with its slices of spilled map outputs: the pages only their rows
        occupy go back now, not when the block's last slice is read (``engine.row_pages``).
        Only for blocks this execution owns, whose other slices are still to be read (the last
        slice's release frees the whole file)."""
        punch = getattr(self.store, "punch", None)
        if punch is None:
            return
        for position, pages in result.read_pages.items():
            piece = bundle[position] if position < len(bundle) else None
            if not isinstance(piece, BlockSlice) or piece.ref.path is None or not piece.ref.spilled:
                continue
            ref = piece.ref
            if ref.block_id in self._owner and ref.block_id not in self.borrowed and op.slices_left(ref.block_id) > 1:
                punch(ref.path, pages)
                op.stats.pages_given_back += sum(length for _, length in pages)

    def _error_tolerated(self, op: MapOperator, result: TaskResult) -> bool:
        """The failed task's error is one of the ``max_errored_blocks`` this execution may
        ignore (a UDF's or a reader's, in a task that does not write): counted and logged."""
        err = result.error
        limit = self.options.max_errored_blocks
        if err is None or not err.user_code or op.output not in ("blocks", "count") or 0 <= limit <= self.errored_blocks:
            return False
        self.errored_blocks += 1
        op.stats.blocks_errored += 1
        op.stats.errors[err.exc_type] = op.stats.errors.get(err.exc_type, 0) + 1
        row_errors.log_errored_block(op.name, _user_error(op, result), self.errored_blocks, limit)
        return True

    def task_discarded(self, op: MapOperator, task_id: int, refs: list[BlockRef]) -> None:
        """A task of a cancelled execution came back, or its worker died: free its outputs and
        the inputs it was holding (nobody will retry it)."""
        pending = op.pending.pop(task_id, None)
        for ref in refs:
            self.own(ref, op)
            self.release(ref)
        if pending is not None:
            for value in pending.bundle:
                self.release_input(value, op)

    def task_lost(self, op: MapOperator, task_id: int, why: str) -> None:
        if op.cancelled:  # past a reached limit: not worth a retry
            self.task_discarded(op, task_id, [])
            return
        pending = op.task_lost(task_id)
        retries = getattr(op.transform, "max_retries", None)  # the UDFs' own max_retries (-1: no limit)
        attempts = self.options.max_task_attempts if retries is None else (retries + 1 if retries >= 0 else None)
        if attempts is not None and pending.spec.attempt + 1 >= attempts:
            msg = (
                f"task {pending.spec.task_index} of {op.name} failed {pending.spec.attempt + 1} times "
                f"because its worker died ({why}); giving up"
            )
            self.fail(WorkerDiedError(msg))
            return
        log.info(
            "task %d of %s will run again (attempt %d): its worker died (%s)",
            pending.spec.task_index, op.name, pending.spec.attempt + 2, why,
        )
        self.flush_soft_order(op)

    def flush_soft_order(self, op: MapOperator) -> None:
        """Outputs ``op`` held back for the order of a task that is no longer running go on;
        not where the order is kept for good (``preserve_order``, an exchange's ordered
        outputs): there they wait for the task's retry."""
        if self.options.preserve_order or op.ordered_output:
            return
        for ref in op.flush_soft_order():
            op.emit(ref)

    def release_consumed(self, ref: BlockRef) -> None:
        self.consumer_held -= ref.size_bytes
        self.release(ref)

    def detach(self, ref: BlockRef) -> None:
        """The consumer keeps ``ref`` beyond this execution (materialize): it owns it now."""
        self.consumer_held -= ref.size_bytes
        self._disown(ref)

    def handed_to_consumer(self, ref: BlockRef) -> None:
        self.consumer_held += ref.size_bytes

    # ending ------------------------------------------------------------------------------
    def fail(self, error: BaseException) -> None:
        if self.buffer.done:
            return
        self.outcome = self.outcome or "failed"
        self.cancel()
        self.buffer.finish(error)

    def cancel(self) -> None:
        """Stop everything: queued inputs and undelivered outputs are freed."""
        if self.cancelled:
            return
        self.cancelled = True
        self.cancelled_at = time.monotonic()
        self.outcome = self.outcome or "cancelled"
        for op in self.ops:
            self._cancel_op(op)
        if self.finished_at is None:
            self.finished_at = time.perf_counter()

    def release_undelivered(self) -> None:
        for ref in self.buffer.drain():
            self.release(ref)

    @property
    def done(self) -> bool:
        return self.buffer.done and all(op.in_flight() == 0 for op in self.ops)

    def waiting_reason(self, op: PhysicalOperator) -> str | None:
        """Why ``op`` was held back at the loop's last look, or None (any thread: the loop
        replaces the whole table each turn)."""
        return self._waiting.get(id(op))

    def note_waits(self, reasons: dict[int, str]) -> None:
        """Charge the time since the last call to the reasons each operator was waiting for
        then (a wait lasts until the loop next looks), and remember the new ones."""
        now = time.perf_counter()
        elapsed = now - self._last_wait_check
        self._last_wait_check = now
        for op in self.ops:
            reason = self._waiting.get(id(op))
            if reason is not None:
                op.stats.add_wait(reason, elapsed)
        self._waiting = dict(reasons)


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
    files = err.input_files
    reading = f", input file{'s' if len(files) > 1 else ''} {', '.join(files[:3])}{'...' if len(files) > 3 else ''}" if files else ""
    context = err.context or f"(operator {op.name}{reading})"
    if err.attempts > 1:
        context += f" after {err.attempts} attempts (DataContext.retried_map_errors)"
    return make_user_error(err.udf_name, cause, err.exc_type, err.rendered_traceback(), context, err.message)


def check_resources(execution: Execution, options: ExecutionOptions) -> None:
    """Fail at once (ResourceError) if an operator asks for more than this cluster can ever offer."""
    from engine.errors import ResourceError

    offered = dict(options.resources)
    cpus = options.resolved_num_cpus()
    for op in execution.map_ops():
        res = op.resources
        # (GPUs are counted only for an operator that asks for some: listing /dev costs 0.2 ms)
        if res.num_gpus > 0 and res.num_gpus > (gpus := options.resolved_num_gpus()):
            msg = f"{op.name} asks for num_gpus={res.num_gpus} but this machine has {gpus} GPUs; it could never run"
            raise ResourceError(msg)
        if res.num_cpus > cpus:
            msg = f"{op.name} asks for num_cpus={res.num_cpus} but this cluster has {cpus} CPUs; it could never run"
            raise ResourceError(msg)
        for name, amount in res.custom:
            if offered.get(name, 0) < amount:
                msg = f"{op.name} asks for {amount} of resource {name!r}; this cluster offers {offered.get(name, 0)}"
                raise ResourceError(msg)

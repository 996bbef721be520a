"""StreamingExecutor: the one scheduling loop, on its own thread in the driver.

Each turn reads like a paragraph: wait for an event (a worker's message, a worker's death, a
consumer releasing a block, a new plan) -> update the state of the executions it concerns ->
ask backpressure which operators may run and the scheduler which goes first -> dispatch to free
workers. It never sleeps to poll: ``zmq.Poller`` wakes it on sockets and on file descriptors
(the zygote's pipe, one pidfd per worker, a wake-up pipe for other threads).

Until the first worker process has said Ready, tasks run in an inline slot (a thread of the
driver), so a small job answers before any process has started.
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

from engine import protocol
from engine.backpressure import WAIT_ACTORS, WAIT_ACTORS_BUSY, WAIT_RESOURCES, WAIT_WORKER
from engine.errors import EngineError
from engine.execution import Execution, check_resources
from engine.object_store import BlockRef, SharedMemoryStore
from engine.operators.map import MapOperator, Pending
from engine.options import ExecutionOptions
from engine.resources import GpuLedger, ResourceLedger
from engine.scheduler import Candidate, pick
from engine.task import TaskResult, run_task
from engine.transport import CurveKeys, DriverSocket
from engine.worker_pool import BUSY, DEAD, IDLE, RETIRING, STARTING, TASK_KIND, WorkerHandle, WorkerPool

log = logging.getLogger("dataflow.engine")

INLINE = "inline"
MAX_START_FAILURES = 5


class StreamingExecutor:
    """Owns the worker processes and runs every active execution of this session."""

    def __init__(
        self,
        options: ExecutionOptions,
        store: SharedMemoryStore,
        socket_dir: str,
        transport: str = "ipc",
    ) -> None:
        self.options = options
        self.store = store
        self.store_used = 0
        self.store_capacity = options.resolved_store_capacity()
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._curve = CurveKeys.generate(0) if transport == "tcp" else None
        address = "tcp://127.0.0.1:0" if transport == "tcp" else f"ipc://{socket_dir}/driver.sock"
        self._socket = DriverSocket(self._ctx, address, self._curve)
        self._wake_r, self._wake_w = os.pipe()
        self._wake_closed = False
        os.set_blocking(self._wake_r, False)
        self._commands: deque[Callable[[], None]] = deque()
        self._executions: list[Execution] = []
        self._actors: dict[str, list[WorkerHandle]] = {}
        worker_args: dict[str, Any] = {
            "address": self._socket.address,
            "shm_dir": store.shm_dir,
            "spill_dir": store.spill_dir,
        }
        self.pool = WorkerPool(worker_args, per_worker_args=self._worker_keys if self._curve else None)
        self._start_failures = 0
        self._broken: str | None = None
        self._gpus = GpuLedger(options.resolved_num_gpus())
        self._ledger = ResourceLedger(options.resolved_num_cpus(), dict(options.resources))
        self._inline_queue: queue.SimpleQueue[tuple[Execution, MapOperator, Pending] | None] = queue.SimpleQueue()
        self._inline_results: deque[tuple[Execution, MapOperator, Pending, TaskResult]] = deque()
        self._inline_busy = False
        self._inline_thread: threading.Thread | None = None
        self._inline_enabled = options.inline_cold_start
        self._workers_ready = 0
        self._stopping = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="dataflow-executor", daemon=True)
        self._poller = zmq.Poller()

    def _worker_keys(self) -> dict[str, Any]:
        """A fresh CurveZMQ key pair for one worker, admitted by the driver's socket."""
        assert self._curve is not None
        public, secret = zmq.curve_keypair()
        self._socket.admit(public)
        return {"server_public": self._curve.server_public.decode(), "client_keys": [public.decode(), secret.decode()]}

    # called from any thread ----------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()
        self.call_soon(self._start_workers)

    def call_soon(self, fn: Callable[[], None]) -> None:
        self._commands.append(fn)
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def _wake(self) -> None:
        """Any thread: make the loop look again (a listing thread has new read tasks)."""
        if self._wake_closed:
            return
        try:
            os.write(self._wake_w, b"s")
        except (BlockingIOError, OSError):
            pass

    def submit(self, execution: Execution) -> None:
        """Start running ``execution``; its outputs appear in ``execution.buffer``."""
        check_resources(execution, self.options)
        self.call_soon(lambda: self._add_execution(execution))

    def release(self, execution: Execution, ref: BlockRef) -> None:
        """The consumer is done with ``ref``."""
        self.call_soon(lambda: execution.release_consumed(ref))

    def cancel(self, execution: Execution) -> None:
        def do() -> None:
            execution.cancel()
            execution.release_undelivered()
            execution.buffer.finish()

        self.call_soon(do)

    def sync(self, timeout: float = 10.0) -> bool:
        """Wait until the loop has handled every command posted before this call."""
        done = threading.Event()
        self.call_soon(done.set)
        return done.wait(timeout)

    def wait_for_workers(self, timeout: float = 30.0) -> bool:
        """Block until every task worker has started (tests and benchmarks use this)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._workers_ready >= self.options.resolved_num_cpus():
                return True
            time.sleep(0.01)
        return False

    def stop(self, timeout: float = 10.0) -> None:
        self.call_soon(self._begin_stop)
        self._thread.join(timeout)

    def stored(self, ref: BlockRef) -> None:
        """Count a block the driver wrote itself (a limit's slice; loop thread only)."""
        if ref.path is not None and not ref.spilled:
            self.store_used += ref.size_bytes

    def free(self, ref: BlockRef) -> None:
        """Free a block (loop thread only)."""
        if ref.path is not None and not ref.spilled:
            self.store_used -= ref.size_bytes
        self.store.free(ref)

    @property
    def stopped(self) -> bool:
        return self._stopping or not self._thread.is_alive()

    @property
    def address(self) -> str:
        return self._socket.address

    def statistics(self) -> dict[str, Any]:
        return {
            "workers": len(self.pool.live(TASK_KIND)),
            "actors": sum(len(v) for v in self._actors.values()),
            "store_used": self.store_used,
            "store_capacity": self.store_capacity,
            "executions": len(self._executions),
        }

    # the loop ------------------------------------------------------------------------------
    def _run(self) -> None:
        self._poller.register(self._socket.sock, zmq.POLLIN)
        self._poller.register(self._wake_r, zmq.POLLIN)
        try:
            while not (self._stopping and self._stop_complete()):
                timeout = self._poll_timeout()
                events = dict(self._poller.poll(timeout))
                self._handle_events(events)
                self._schedule()
        except BaseException as err:  # the loop must never die silently
            log.exception("executor loop failed")
            self._error = err
            for execution in self._executions:
                execution.fail(EngineError(f"the executor failed (this is a bug in dataflow): {err!r}"))
        finally:
            self._teardown()

    def _poll_timeout(self) -> int | None:
        if self._stopping:
            return 100
        if any(a for a in self._actors.values()):
            return int(self.options.actor_idle_timeout_s * 1000)
        return None

    def _handle_events(self, events: dict[Any, int]) -> None:
        if self._wake_r in events:
            try:
                while os.read(self._wake_r, 4096):
                    pass
            except BlockingIOError:
                pass
        while self._commands:
            self._commands.popleft()()
        if self._socket.sock in events:
            while True:
                try:
                    worker_id, frames = self._socket.recv()
                except zmq.Again:
                    break
                try:
                    msg = protocol.decode(frames)
                except protocol.ProtocolError as err:
                    log.warning("dropped a message from %s: %s", worker_id, err)
                    continue
                self._on_message(worker_id, msg)
        fs = self.pool.forkserver
        if fs is not None and fs.fileno in events:
            for handle in self.pool.on_forked():
                assert handle.pidfd is not None
                self._poller.register(handle.pidfd, zmq.POLLIN)
        for fd in [fd for fd in events if isinstance(fd, int) and fd in self.pool.by_pidfd]:
            self._on_death(self.pool.by_pidfd[fd])
        while self._inline_results:
            execution, op, _pending, result = self._inline_results.popleft()
            self._inline_busy = False
            self._finish_task(execution, op, result)
        self._retire_idle_actors()

    def _on_message(self, worker_id: str, msg: Any) -> None:
        handle = self.pool.workers.get(worker_id)
        if handle is None:
            return
        if isinstance(msg, protocol.Ready):
            self._start_failures = 0
            handle.state = IDLE
            handle.idle_since = time.monotonic()
            if handle.kind == TASK_KIND:
                self._workers_ready += 1
                self._inline_enabled = False  # the cold start is over, for good
        elif isinstance(msg, protocol.TaskDone):
            if handle.kind != TASK_KIND:  # the next execution's actors will want them too
                self.pool.want_preloaded(msg.imported)
            task = handle.task
            handle.task = None
            handle.state = IDLE
            handle.idle_since = time.monotonic()
            if task is not None:
                execution, op, _ = task
                self._finish_task(execution, op, msg.result)

    def busy_cpus(self) -> float:
        """CPUs taken by running tasks (any thread may ask; a float read is atomic)."""
        return self._ledger.used_cpus

    def _finish_task(self, execution: Execution, op: MapOperator, result: TaskResult) -> None:
        self._ledger.give(op.resources.num_cpus, op.resources.custom)
        for ref in result.refs:
            self.stored(ref)
        if execution.cancelled:
            op.pending.pop(result.task_id, None)
            for ref in result.refs:
                self.free(ref)
            return
        execution.task_finished(op, result)
        self._reap(execution)

    def _on_death(self, handle: WorkerHandle) -> None:
        task = handle.task
        never_started = handle.state == STARTING
        retired = handle.state == RETIRING
        self._poller.unregister(handle.pidfd)
        self.pool.mark_dead(handle)
        if handle.gpus:
            self._gpus.release(handle.gpus, handle.gpu_amount)
        if handle.kind == TASK_KIND and self._workers_ready:
            self._workers_ready -= 0 if never_started else 1
        if self._stopping or retired:
            return
        log.warning("worker %s (pid %s) died", handle.worker_id, handle.pid)
        if never_started:
            self._start_failures += 1
            if self._start_failures >= MAX_START_FAILURES:
                self._broken = (
                    f"{self._start_failures} worker processes in a row exited before they were ready; "
                    "their error output above says why"
                )
                for execution in self._executions:
                    execution.fail(EngineError(self._broken))
                return
        if task is not None:
            execution, op, pending = task
            self._ledger.give(op.resources.num_cpus, op.resources.custom)
            if not execution.cancelled:
                execution.task_lost(op, pending.spec.task_id, f"worker pid {handle.pid} exited")
        if handle.kind == TASK_KIND:
            self.pool.spawn(TASK_KIND)
        elif handle.kind in self._actors:
            pool = self._actors[handle.kind]
            if handle in pool:
                pool.remove(handle)
            replacement = self._spawn_actor(handle.kind, handle.gpu_amount)
            if replacement is not None:
                pool.append(replacement)

    # scheduling ----------------------------------------------------------------------------
    def _schedule(self) -> None:
        if self._stopping:
            return
        for execution in list(self._executions):
            waits: dict[int, str] = {}
            ops = execution.map_ops()
            while True:
                candidates: list[Candidate] = []
                choices: list[tuple[MapOperator, WorkerHandle | str]] = []
                for op in ops:
                    ready, reason = execution.dispatchable(op)
                    if not ready:
                        waits.pop(id(op), None)
                        continue
                    if reason is not None:
                        waits[id(op)] = reason
                        continue
                    if not self._ledger.fits(op.resources.num_cpus, op.resources.custom):
                        waits[id(op)] = WAIT_RESOURCES
                        continue
                    slot = self._free_slot(op)
                    if slot is None:
                        waits[id(op)] = self._actor_wait(op) if op.actor_pool else WAIT_WORKER
                        continue
                    waits.pop(id(op), None)
                    candidates.append(Candidate(op.key, execution.depth[id(op)], op.held_bytes, op.in_flight()))
                    choices.append((op, slot))
                index = pick(candidates)
                if index is None:
                    break
                op, slot = choices[index]
                self._dispatch(execution, op, slot)
            self._grow_actor_pools(execution)
            execution.note_waits(waits)
            self._reap(execution)

    def _actor_wait(self, op: MapOperator) -> str:
        pool = self._actors.get(f"actor:{op.key}", [])
        if any(w.state == STARTING for w in pool) or not pool:
            return WAIT_ACTORS
        return WAIT_ACTORS_BUSY

    def _free_slot(self, op: MapOperator) -> WorkerHandle | str | None:
        if op.actor_pool is not None:
            idle = self.pool.idle(f"actor:{op.key}")
            return idle[0] if idle else None
        idle = self.pool.idle(TASK_KIND)
        if idle:
            return idle[0]
        if self._inline_enabled and not self._inline_busy:
            return INLINE
        return None

    def _dispatch(self, execution: Execution, op: MapOperator, slot: WorkerHandle | str) -> None:
        pending = op.next_task()
        spec = pending.spec
        expected = op.expected_output_bytes(prior=float(execution.options.target_max_block_size))
        spec.spill = self.store_used + expected > self.store_capacity
        self._ledger.take(op.resources.num_cpus, op.resources.custom)
        if slot == INLINE:
            self._inline_busy = True
            self._ensure_inline_thread()
            self._inline_queue.put((execution, op, pending))
            return
        assert isinstance(slot, WorkerHandle)
        transform = None if op.digest in slot.digests else op.transform_bytes
        slot.digests.add(op.digest)
        slot.state = BUSY
        slot.task = (execution, op, pending)
        try:
            sys_path = sys.path if transform is not None else None
            self._socket.send(slot.worker_id, protocol.encode(protocol.RunTask(spec, transform, sys_path)))
        except zmq.ZMQError:  # the worker vanished between Ready and now: its pidfd will say so
            pass

    def _ensure_inline_thread(self) -> None:
        if self._inline_thread is None:
            self._inline_thread = threading.Thread(target=self._inline_loop, name="dataflow-inline", daemon=True)
            self._inline_thread.start()

    def _inline_loop(self) -> None:
        while True:
            item = self._inline_queue.get()
            if item is None:
                return
            execution, op, pending = item
            result = run_task(pending.spec, op.transform, self.store)
            self._inline_results.append((execution, op, pending, result))
            try:
                os.write(self._wake_w, b"i")
            except OSError:
                pass

    # actor pools ---------------------------------------------------------------------------
    def _grow_actor_pools(self, execution: Execution) -> None:
        for op in execution.map_ops():
            if op.actor_pool is None or op.completed():
                continue
            kind = f"actor:{op.key}"
            pool = self._actors.setdefault(kind, [])
            live = [w for w in pool if w.state != DEAD]
            starting = [w for w in live if w.state == STARTING]
            busy = [w for w in live if w.state == BUSY]
            spec = op.actor_pool
            if not pool:  # start at the size the resources allow, not one actor at a time
                affordable = self._gpus.how_many(op.resources.num_gpus) if op.resources.num_gpus else self.options.resolved_num_cpus()
                target = max(spec.min_size, min(spec.max_size, affordable))
            else:
                target = spec.min_size
                ready, _ = execution.dispatchable(op)
                if ready and not starting and len(busy) == len(live):
                    target = min(spec.max_size, len(live) + 1)
            for _ in range(max(0, target - len(live))):
                handle = self._spawn_actor(kind, op.resources.num_gpus)
                if handle is None:
                    break
                pool.append(handle)

    def _spawn_actor(self, kind: str, num_gpus: float) -> WorkerHandle | None:
        """A new actor worker, with its GPUs in CUDA_VISIBLE_DEVICES; None if none are free."""
        env: dict[str, str] = {}
        grant: tuple[int, ...] = ()
        if num_gpus > 0:
            maybe = self._gpus.acquire(num_gpus)
            if maybe is None:
                return None
            grant = maybe
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in grant)
        self.pool.preload_like_driver()
        handle = self.pool.spawn(kind, env)
        handle.gpus, handle.gpu_amount = grant, num_gpus
        return handle

    def _retire_idle_actors(self) -> None:
        now = time.monotonic()
        for kind, pool in self._actors.items():
            op = self._actor_op(kind)
            minimum = op.actor_pool.min_size if op is not None and op.actor_pool else 0
            for handle in list(pool):
                if len(pool) <= minimum:
                    break
                if handle.state == IDLE and now - handle.idle_since > self.options.actor_idle_timeout_s:
                    self._shutdown_worker(handle)
                    pool.remove(handle)

    def _actor_op(self, kind: str) -> MapOperator | None:
        for execution in self._executions:
            for op in execution.map_ops():
                if f"actor:{op.key}" == kind and not op.completed():
                    return op
        return None

    def _shutdown_worker(self, handle: WorkerHandle) -> None:
        handle.state = RETIRING
        try:
            self._socket.send(handle.worker_id, protocol.encode(protocol.Shutdown()))
        except zmq.ZMQError:
            pass

    # executions ----------------------------------------------------------------------------
    def _add_execution(self, execution: Execution) -> None:
        if self._broken is not None or self._stopping:
            reason = self._broken or "dataflow was shut down before this dataset started"
            execution.fail(EngineError(reason))
            execution.stopped.set()
            return
        self._executions.append(execution)
        for op in execution.map_ops():
            op.pull_source_in_background(self._wake)
        self._grow_actor_pools(execution)
        execution.route()

    def _reap(self, execution: Execution) -> None:
        if execution.done and execution in self._executions:
            self._executions.remove(execution)
            for op in execution.map_ops():
                op.close_source()  # a failed execution's listing thread stops too
            execution.stopped.set()
            if not self._executions:
                self.pool.preload_wanted()
            for op in execution.map_ops():
                for handle in self._actors.pop(f"actor:{op.key}", []):
                    self._shutdown_worker(handle)

    # start and stop ------------------------------------------------------------------------
    def _start_workers(self) -> None:
        fs = self.pool.start_forkserver()
        self._poller.register(fs.fileno, zmq.POLLIN)
        for _ in range(self.options.resolved_num_cpus()):
            self.pool.spawn(TASK_KIND)
        # torch (if the script imported it) is for actors, imported just before the first one
        # is forked (``_spawn_actor``). Not now: task workers rarely need it, and a training
        # loop starting now would lose 1.3 CPU-s to an import nobody uses

    def _begin_stop(self) -> None:
        self._stopping = True
        for execution in self._executions:
            execution.fail(EngineError("dataflow was shut down while this dataset was running"))
            execution.release_undelivered()
            execution.stopped.set()
        for handle in self.pool.live():
            self._shutdown_worker(handle)
        self._stop_deadline = time.monotonic() + 3.0

    def _stop_complete(self) -> bool:
        if all(h.pid is None for h in self.pool.live()):  # unforked ones die with the zygote
            return True
        return time.monotonic() > self._stop_deadline

    def _teardown(self) -> None:
        for execution in self._executions:
            for op in execution.map_ops():
                op.close_source()
        self._wake_closed = True  # a listing thread still finishing a call must not write to it
        self._inline_queue.put(None)
        self.pool.close()
        self._socket.close()
        self._ctx.term()
        os.close(self._wake_r)
        os.close(self._wake_w)

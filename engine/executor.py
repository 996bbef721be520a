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
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

import zmq

from engine import protocol
from engine.autoscale import PoolState, target_size, to_retire
from engine.backpressure import WAIT_ACTORS, WAIT_ACTORS_BUSY, WAIT_MEMORY, WAIT_RESOURCES, WAIT_WORKER
from engine.errors import EngineError, TaskTimeoutError, unpicklable_error
from engine.execution import Execution, check_resources
from engine.inline import InlineSlot
from engine.object_store import BlockRef, SharedMemoryStore
from engine.operators.map import MapOperator, Resources
from engine.options import ExecutionOptions
from engine.resources import GpuLedger, ResourceLedger, visible_gpu_ids
from engine.scheduler import Candidate, pick
from engine.spare_files import SPARE_MIN_BYTES, SPARE_SHARE, SpareFiles
from engine.task import OUTPUT_WRITE, TaskResult, TaskSpec, describe_error
from engine.transform import UDFFailure
from engine.transport import MAX_MESSAGE_BYTES, CurveKeys, DriverSocket, Dropped, PeerUnreachable, StreamDriverSocket
from engine.wakeup import WakeupPipe
from engine.worker_pool import (
    BUSY,
    DEAD,
    IDLE,
    RETIRING,
    STARTING,
    TASK_KIND,
    WorkerHandle,
    WorkerPool,
    describe_exit,
    format_bytes,
    how_it_exited,
    private_bytes,
    resident_bytes,
    zombie_exit_code,
)

log = logging.getLogger("dataflow.engine")
worker_log = logging.getLogger("dataflow.worker")
SPILL_LOG_S = 10.0
"""Spilling is logged when it starts, then at most this often (with the totals so far)."""

INLINE = "inline"
INLINE_MAX_INPUT_BYTES = 8 << 20
"""The largest task the inline slot takes: it is there for a small job's first rows; a task that
decodes a big row group would hold that memory in the driver and is not sped up by skipping
the ~0.3 s the first worker takes to start."""
MAX_START_FAILURES = 5
PIPELINE_TASK_S = 0.02
"""Operators whose tasks take less than this (on average) have their next tasks queued on busy
workers, so each starts the moment the one before it ends, without a round trip through the
driver in between."""
PIPELINE_QUEUE_S = 0.005
"""A worker's queue behind its running task holds about this much work (the operator's mean task
time): enough to keep it busy while the driver waits for a core. 2,000 one-file read tasks of
~0.2 ms on 2 cores: 4,300 tasks/s with one task queued, 5,600 with 4, 6,800 with 16 (fewer
wake-ups on both sides: the driver's CPU per task 120 -> 85 us, the worker's 170 -> 141)."""
PIPELINE_MAX_DEPTH = 16
"""Tasks queued behind a worker's running task, at most (one may always be)."""
PIPELINE_STORE_SHARE = 1 / 16
"""The share of the store's capacity the tasks queued on all workers may be expected to leave in
it, at most: they count as running (``_running_output_bytes``), and a queue must not make later
tasks spill."""


def _pipelinable(op: MapOperator) -> bool:
    return (
        op.actor_pool is None
        and op.resources == Resources()
        and op.stats.tasks >= 2
        and op.stats.task_wall_s / op.stats.tasks < PIPELINE_TASK_S
        and not op.cancelled
    )


def pipeline_depth(mean_task_s: float, expected_bytes: float, queue_bytes: float) -> int:
    """Tasks that may wait behind a worker's running task: ``PIPELINE_QUEUE_S`` of work, at most
    ``PIPELINE_MAX_DEPTH``, and no more than ``queue_bytes`` of expected output; at least one."""
    by_time = int(PIPELINE_QUEUE_S / max(mean_task_s, 1e-6))
    by_bytes = int(queue_bytes / expected_bytes) if expected_bytes > 0 else PIPELINE_MAX_DEPTH
    return max(1, min(PIPELINE_MAX_DEPTH, by_time, by_bytes))


def _in_memory(ref: BlockRef) -> bool:
    """Whether ``ref`` counts against the store's capacity: a file in shared memory, or bytes
    held in the ref (memory of the driver's); not a spilled block."""
    return (ref.path is not None or ref.data is not None) and not ref.spilled


MAX_LOOP_FAILURES = 100
"""Turns of the loop failing in a row before it gives up (and fails every execution)."""
def _timeout_of(execution: Execution, op: MapOperator) -> float | None:
    """``op``'s own ``task_timeout_s``, else its execution's."""
    own: float | None = op.task_timeout_s
    return own if own is not None else execution.options.task_timeout_s  # type: ignore[no-any-return]


CANCELLED_TASK_GRACE_S = 2.0
"""A task of a cancelled execution (its iterator abandoned, its limit reached) that still runs
this long after the cancel has its worker killed and replaced: nobody wants its output, and the
next job would wait for it (a 20 s UDF held a worker for 20 s). Writes are left to finish."""
RSS_SAMPLE_S = 1.0
"""How often the resident memory of busy workers is read (while tasks run)."""


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
        self.workers_rss = 0
        """The worker processes' own resident memory (not the blocks they map), at the last sample."""
        self.memory_pressure = False
        """``workers_rss`` is over ``worker_memory_limit``: one running task per operator."""
        self.store_peak = 0
        """The most bytes the shared-memory store held at once (spilled blocks not counted)."""
        self.spilled_blocks = 0
        self.spilled_bytes = 0
        self._spill_logged_at: float | None = None
        self.store_capacity = options.resolved_store_capacity()
        self._spares = SpareFiles(store.shm_dir, int(self.store_capacity * SPARE_SHARE), reaper=store.reaper)
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._curve = CurveKeys.generate(0) if transport == "tcp" else None
        self._socket: DriverSocket | StreamDriverSocket = (
            DriverSocket(self._ctx, "tcp://127.0.0.1:0", self._curve) if transport == "tcp"
            else StreamDriverSocket(f"{socket_dir}/driver.sock")
        )
        self._wakeup = WakeupPipe()
        self.dropped_messages = 0
        """Frames from workers or peers that could not be decoded or handled (dropped, counted)."""
        self._submitted: list[Execution] = []
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
        self._deaths: dict[int, tuple[str, MapOperator | None, int]] = {}
        """pid -> (worker id, operator of its task, RSS) of dead workers until their exit status comes."""
        self._quiet_deaths: set[int] = set()
        """Workers killed on purpose (a cancelled job's task): their exit is not reported."""
        self._last_rss_sample = 0.0
        self._fs_fd: int | None = None
        """The zygote's pipe, while the loop watches it."""
        self._gpus = GpuLedger(options.resolved_num_gpus())
        self._ledger = ResourceLedger(options.resolved_num_cpus(), dict(options.resources))
        self._inline = InlineSlot(store, self._wake, options.inline_cold_start)
        self._workers_ready = 0
        self._ready_cond = threading.Condition()
        self._stopping = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="dataflow-executor", daemon=True)
        self._poller = zmq.Poller()
        self._turn = 0

    def _worker_keys(self) -> dict[str, Any]:
        """A fresh CurveZMQ key pair for one worker, admitted by the driver's socket."""
        assert self._curve is not None and isinstance(self._socket, DriverSocket)
        public, secret = zmq.curve_keypair()
        self._socket.admit(public)
        return {"server_public": self._curve.server_public.decode(), "client_keys": [public.decode(), secret.decode()]}

    # called from any thread ----------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()
        self.call_soon(self._start_workers)

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Any thread: run ``fn`` on the loop's thread (dropped once the loop has ended)."""
        self._commands.append(fn)
        self._wake()

    def call_on_next_turn(self, fn: Callable[[], None]) -> None:
        """Any thread: run ``fn`` on the loop's thread whenever it next wakes, without waking
        it: bookkeeping that changes no decision before the next event (a reply, a release)."""
        self._commands.append(fn)

    def _wake(self) -> None:
        """Any thread: make the loop look again (a command, a listing thread's read tasks)."""
        self._wakeup.wake()

    def submit(self, execution: Execution) -> None:
        """Start running ``execution``; its outputs appear in ``execution.buffer``."""
        check_resources(execution, self.options)
        if self._error is not None or not self._thread.is_alive():
            why = f": {self._error!r}" if self._error is not None else ""
            msg = f"dataflow's executor is no longer running{why}; call dataflow.shutdown() and try again"
            raise EngineError(msg)
        self._submitted.append(execution)
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
        """Wait until the loop has handled every command posted before this call, and the files
        it freed meanwhile are unlinked."""
        deadline = time.monotonic() + timeout
        done = threading.Event()
        self.call_soon(done.set)
        if not done.wait(timeout):
            return False
        reaper = getattr(self.store, "reaper", None)
        return reaper is None or reaper.flush(max(0.0, deadline - time.monotonic()))

    def wait_for_workers(self, timeout: float = 30.0) -> bool:
        """Block until every task worker has started (tests and benchmarks use this)."""
        with self._ready_cond:
            return self._ready_cond.wait_for(lambda: self._workers_ready >= self.options.resolved_num_cpus(), timeout)

    def stop(self, timeout: float = 10.0) -> None:
        self.call_soon(self._begin_stop)
        self._thread.join(timeout)

    def stored(self, ref: BlockRef) -> None:
        """Count a block written to the store (loop thread only)."""
        if _in_memory(ref):
            self.store_used += ref.size_bytes
            self.store_peak = max(self.store_peak, self.store_used)
        elif ref.spilled:
            self.spilled_blocks += 1
            self.spilled_bytes += ref.size_bytes
            self._log_spill()

    def _log_spill(self) -> None:
        now = time.monotonic()
        if self._spill_logged_at is None or now - self._spill_logged_at >= SPILL_LOG_S:
            self._spill_logged_at = now
            log.info(
                "blocks spill to %s: the store (%s used of %s) cannot take the next outputs; %d blocks, %s spilled so far",
                self.store.spill_dir, format_bytes(self.store_used), format_bytes(self.store_capacity),
                self.spilled_blocks, format_bytes(self.spilled_bytes),
            )

    def free(self, ref: BlockRef) -> None:
        """Free a block (loop thread only): a big one's file is kept to be written over when
        nobody maps it any more (``engine.spare_files``), else unlinked."""
        if _in_memory(ref):
            self.store_used -= ref.size_bytes
            if ref.path is not None and ref.size_bytes >= SPARE_MIN_BYTES:
                self._spares.offer(ref.path, time.monotonic())  # (kept, or unlinked)
                return
        self.store.free(ref)

    def _reclaim_spares(self, spec: TaskSpec) -> None:
        """The spare files ``spec``'s task was given and did not write over are the pool's again."""
        if spec.spare_files:
            self._spares.reclaim(spec.spare_files, time.monotonic())
            spec.spare_files = ()

    @property
    def stopped(self) -> bool:
        return self._stopping or not self._thread.is_alive()

    @property
    def address(self) -> str:
        return self._socket.address

    def actors_of(self, op: MapOperator) -> int:
        """Live actors of ``op``'s pool (any thread: a copy of one list)."""
        return sum(1 for w in list(self._actors.get(f"actor:{op.key}", ())) if w.state != DEAD)

    def statistics(self) -> dict[str, Any]:
        return {
            "workers": len(self.pool.live(TASK_KIND)),
            "actors": sum(len(v) for v in self._actors.values()),
            "store_used": self.store_used,
            "store_peak": self.store_peak,
            "workers_rss": self.workers_rss,
            "memory_pressure": self.memory_pressure,
            "store_capacity": self.store_capacity,
            "spilled_blocks": self.spilled_blocks,
            "spilled_bytes": self.spilled_bytes,
            "spare_files": len(self._spares),
            "spare_files_lent": sum(  # (handed to tasks not yet ended; list(): one C call, whole)
                len(entry[2].spec.spare_files) for handle in self.pool.live() for entry in list(handle.tasks)
            ),
            "spare_bytes": self._spares.bytes,
            "spares_kept": self._spares.kept,
            "spares_reused": self._spares.reused,
            "spares_refused": self._spares.refused,
            "executions": len(self._executions),
        }

    # the loop ------------------------------------------------------------------------------
    def _run(self) -> None:
        self._socket.register(self._poller)
        self._poller.register(self._wakeup.fileno, zmq.POLLIN)
        failures = 0
        try:
            while not (self._stopping and self._stop_complete()):
                try:
                    timeout = self._poll_timeout()
                    events = dict(self._poller.poll(timeout))
                    self._handle_events(events)
                    self._schedule()
                    failures = 0
                except Exception:  # a bug in one step: log it and go on, unless it keeps failing
                    failures += 1
                    log.exception("dataflow executor: a turn of the loop failed (%d in a row)", failures)
                    if failures >= MAX_LOOP_FAILURES:
                        raise
        except BaseException as err:  # the loop must never die silently
            log.exception("executor loop failed")
            self._error = err
        finally:
            self._teardown()

    def _guarded(self, what: str, fn: Callable[[], None], execution: Execution | None = None) -> None:
        """Run one step of the loop; an exception fails ``execution`` (if known) and is logged,
        never the loop: one bad message or one plan's bug must not stop every other job."""
        try:
            fn()
        except BaseException as err:  # (only the main thread gets KeyboardInterrupt: this is not it)
            log.exception("dataflow executor: %s failed", what)
            if execution is not None:
                execution.fail(EngineError(f"{what} failed (this is a bug in dataflow): {err!r}"))
                self._reap(execution)

    def _poll_timeout(self) -> int | None:
        """How long the loop may sleep with nothing happening: deadlines only, never a poll."""
        if self._stopping:
            return 100
        timeouts = []
        expiry = self._spares.next_expiry(time.monotonic())
        if expiry is not None:
            timeouts.append(expiry + 0.01)
        if any(a for a in self._actors.values()):
            timeouts.append(self.options.actor_idle_timeout_s)
        starting = [
            h.spawned_at for h in self.pool.live() if h.state == STARTING and h.pid is not None and not h.start_killed
        ]
        if starting:
            deadline = min(starting) + self.options.worker_start_timeout_s - time.monotonic()
            timeouts.append(max(0.01, deadline + 0.01))
        for handle in self.pool.live():
            limit = self._task_timeout(handle)
            if limit is not None and handle.task is not None:
                deadline = handle.task[2].started_at + limit - time.monotonic()
                timeouts.append(max(0.01, deadline + 0.01))
            if handle.state == BUSY:
                timeouts.append(RSS_SAMPLE_S)  # a deadline while tasks run: sample their memory
        return int(min(timeouts) * 1000) if timeouts else None

    def _handle_events(self, events: dict[Any, int]) -> None:
        if self._wakeup.fileno in events:
            self._wakeup.drain()
        while self._commands:
            self._guarded("a command", self._commands.popleft())
        for item in self._socket.receive(events):
            if isinstance(item, Dropped):  # a peer that is not ours, bytes that are not messages
                self._drop(item.reason)
                continue
            worker_id, frames = item
            try:
                msg = protocol.decode(frames)
            except BaseException as err:  # bad header, no body, bad ids, a body that does not unpickle
                if not self._unreadable_result(worker_id, frames, err):
                    self._drop(f"undecodable message from {worker_id!r}: {err!r}")
                continue
            self._guarded(f"handling {type(msg).__name__} from {worker_id}", partial(self._on_message, worker_id, msg))
        if self._fs_fd is not None and self._fs_fd in events:
            self._guarded("watching the zygote", self._on_zygote_output)
        for fd in [fd for fd in events if isinstance(fd, int) and fd in self.pool.by_pidfd]:
            handle = self.pool.by_pidfd[fd]
            self._guarded(f"the death of worker {handle.worker_id}", partial(self._on_death, handle))
        for execution, op, _pending, result in self._inline.finished():
            self._ledger.give(op.resources.num_cpus, op.resources.custom)
            self._guarded(f"a task of {op.name}", partial(self._finish_task, execution, op, result), execution)
        self._guarded("retiring idle actors", self._retire_idle_actors)
        self._guarded("checking starting workers", self._check_start_deadlines)
        self._guarded("sampling worker memory", self._sample_memory)

    def _unreadable_result(self, worker_id: str, frames: list[Any], err: BaseException) -> bool:
        """A worker's reply to its task that does not unpickle here (a sink's or a UDF's object
        whose loading fails in the driver): the worker is killed, still busy with that task (so
        nothing more is sent to it), and its death fails the task with that error, as the user's
        (``_on_death``), requeues what was pipelined behind it and sweeps the blocks the
        unreadable reply named. False when ``frames`` are no such reply (they are then dropped)."""
        handle = self.pool.workers.get(worker_id)
        if (handle is None or handle.task is None or handle.pid is None or not isinstance(err, protocol.BadBody)
                or protocol.kind_of(frames) is not protocol.TaskDone or handle.unreadable is not None):
            return False
        handle.unreadable = err.__cause__ if err.__cause__ is not None else err
        self._quiet_deaths.add(handle.pid)
        try:
            os.kill(handle.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return True

    def _drop(self, why: str) -> None:
        self.dropped_messages += 1
        if self.dropped_messages <= 10 or self.dropped_messages % 1000 == 0:
            log.warning("dataflow executor dropped a message (%d so far): %s", self.dropped_messages, why)

    def _on_zygote_output(self) -> None:
        """The zygote reported forked pids, or its pipe closed: it died (killed, OOM)."""
        fs = self.pool.forkserver
        if fs is None or fs.fileno != self._fs_fd:  # a stale registration: watch the current one
            self._unwatch_zygote()
            if fs is not None:
                self._watch_zygote()
            return
        for handle in self.pool.on_forked():
            assert handle.pidfd is not None
            self._poller.register(handle.pidfd, zmq.POLLIN)
        while fs.exits:
            self._on_exit(*fs.exits.pop(0))
        if fs.eof:
            self._zygote_gone()

    def _zygote_gone(self) -> None:
        """Stop watching a dead zygote; the workers it never forked are requested again."""
        self._unwatch_zygote()
        self.pool.forget_forkserver()
        if self._stopping:
            return
        log.warning("dataflow: the zygote that forks workers exited; starting a new one")
        for handle in [h for h in self.pool.live() if h.pid is None]:
            self.pool.mark_dead(handle)
            if handle.gpus:
                self._gpus.release(handle.gpus, handle.gpu_amount)
            self._replace(handle)

    def _watch_zygote(self) -> None:
        fs = self.pool.forkserver
        if fs is not None and self._fs_fd is None:
            self._poller.register(fs.fileno, zmq.POLLIN)
            self._fs_fd = fs.fileno

    def _unwatch_zygote(self) -> None:
        if self._fs_fd is not None:
            try:
                self._poller.unregister(self._fs_fd)
            except KeyError:
                pass
            self._fs_fd = None

    def _spawn(self, kind: str, env: dict[str, str] | None = None) -> WorkerHandle:
        """A new worker through the zygote (a new zygote if it died), watched by the loop."""
        fs = self.pool.forkserver
        if fs is not None and not fs.alive():
            self._zygote_gone()  # before its pipe is closed and its fd number reused
        handle = self.pool.spawn(kind, env)
        if self._fs_fd is not None and (self.pool.forkserver is None or self.pool.forkserver.fileno != self._fs_fd):
            self._unwatch_zygote()
        self._watch_zygote()
        return handle

    @staticmethod
    def _task_timeout(handle: WorkerHandle) -> float | None:
        if handle.task is None or handle.timed_out:
            return None
        execution, op, _ = handle.task
        return _timeout_of(execution, op)

    def _check_start_deadlines(self) -> None:
        """A worker that has not said Ready within ``worker_start_timeout_s`` is killed (its death
        is then handled as a failed start); one whose task has run past ``task_timeout_s`` too
        (its death then fails the job with ``TaskTimeoutError``)."""
        now = time.monotonic()
        for handle in self.pool.live():
            limit = self._task_timeout(handle)
            if limit is not None and handle.task is not None and handle.pid is not None:
                if now - handle.task[2].started_at > limit:
                    handle.timed_out = True
                    self._quiet_deaths.add(handle.pid)  # (said here; its death is not an OOM kill)
                    log.warning(
                        "task of %s on worker %s (pid %s) ran past task_timeout_s=%s; killing it",
                        handle.task[1].name,
                        handle.worker_id,
                        handle.pid,
                        limit,
                    )
                    try:
                        os.kill(handle.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            if self._runs_on_cancelled(handle, now):
                handle.cancel_killed = True
                log.info("worker %s (pid %s) still runs a task of a cancelled job after %.0f s; replacing it",
                         handle.worker_id, handle.pid, CANCELLED_TASK_GRACE_S)
                self._quiet_deaths.add(handle.pid)
                try:
                    os.kill(handle.pid, signal.SIGKILL)  # type: ignore[arg-type]
                except ProcessLookupError:
                    pass
            late = now - handle.spawned_at > self.options.worker_start_timeout_s
            if handle.state == STARTING and handle.pid is not None and not handle.start_killed and late:
                log.warning("worker %s (pid %s) did not start within %.0f s; killing it", handle.worker_id, handle.pid, self.options.worker_start_timeout_s)
                try:
                    os.kill(handle.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                handle.start_killed = True

    @staticmethod
    def _runs_on_cancelled(handle: WorkerHandle, now: float) -> bool:
        """Whether ``handle`` is a task worker whose running task's execution was cancelled
        more than ``CANCELLED_TASK_GRACE_S`` ago (and the task is not a write)."""
        if handle.kind != TASK_KIND or handle.task is None or handle.pid is None or handle.cancel_killed:
            return False
        execution, _, pending = handle.task
        since = execution.cancelled_at
        return since is not None and now - since > CANCELLED_TASK_GRACE_S and pending.spec.output != OUTPUT_WRITE

    def _on_message(self, worker_id: str, msg: Any) -> None:
        handle = self.pool.workers.get(worker_id)
        if handle is None:
            if isinstance(msg, protocol.TaskDone):  # after its worker's death: the task was retried
                for ref in getattr(msg.result, "refs", ()):
                    self.store.free(ref)
            else:
                self._drop(f"{type(msg).__name__} from unknown worker {worker_id!r}")
            return
        if isinstance(msg, protocol.TaskDone) and (
            handle.task is None or getattr(msg.result, "task_id", None) != handle.task[2].spec.task_id
        ):
            self._drop(f"TaskDone from {worker_id} for a task it was not running")
            return
        if isinstance(msg, protocol.Ready):
            self._start_failures = 0
            handle.state = IDLE
            handle.idle_since = time.monotonic()
            if handle.kind == TASK_KIND:
                with self._ready_cond:
                    self._workers_ready += 1
                    self._ready_cond.notify_all()
                self._inline.enabled = False  # the cold start is over, for good
        elif isinstance(msg, protocol.TaskDone):
            if handle.kind != TASK_KIND:  # the next execution's actors will want them too
                self.pool.want_preloaded(msg.imported)
            execution, op, pending = handle.finished()
            self._reclaim_spares(pending.spec)
            for ref in msg.result.refs:
                counter = ref.block_id.rsplit("-", 1)[-1]
                if counter.isdigit():
                    handle.last_accepted = max(handle.last_accepted, int(counter))
            self._ledger.give(op.resources.num_cpus, op.resources.custom)
            if handle.tasks:  # a pipelined task starts now: it takes the CPU this one gave back
                _, next_op, next_pending = handle.tasks[0]
                next_pending.started_at = time.monotonic()
                self._ledger.take(next_op.resources.num_cpus, next_op.resources.custom)
            else:
                handle.state = IDLE
                handle.idle_since = time.monotonic()
            self._finish_task(execution, op, msg.result)

    def busy_cpus(self) -> float:
        """CPUs taken by running tasks (any thread may ask; a float read is atomic)."""
        return self._ledger.used_cpus

    def _finish_task(self, execution: Execution, op: MapOperator, result: TaskResult) -> None:
        """A task's result is in (its CPUs are already given back)."""
        for ref in result.refs:
            self.stored(ref)
        if execution.cancelled:
            execution.task_discarded(op, result.task_id, result.refs)
            self._reap(execution)
            return
        execution.task_finished(op, result)
        self._reap(execution)

    def _on_death(self, handle: WorkerHandle) -> None:
        for _, _, pending in handle.tasks:  # files it did not write over: nobody else has them open
            self._reclaim_spares(pending.spec)
        task = handle.task
        # read before the zygote is asked to reap it: a zombie still holds its exit status
        code = zombie_exit_code(handle.pid) if handle.pid is not None and task is not None else None
        never_started = handle.state == STARTING
        retired = handle.state == RETIRING
        if handle.pidfd is not None:
            self._poller.unregister(handle.pidfd)
        self.pool.mark_dead(handle)
        self.pool.sweep_orphans(handle, (self.store.shm_dir, self.store.spill_dir))
        if handle.gpus:
            self._gpus.release(handle.gpus, handle.gpu_amount)
        if handle.kind == TASK_KIND and self._workers_ready and not never_started:
            self._workers_ready -= 1
        if self._stopping or retired:
            return
        self._ask_how_it_ended(handle)
        if never_started:
            self._start_failures += 1
            if self._start_failures >= MAX_START_FAILURES:
                # fail what runs now, but do not break the session: a later job tries again
                self._start_failures = 0
                why = (
                    f"{MAX_START_FAILURES} worker processes in a row exited before they were ready "
                    f"(the last: pid {handle.pid}); a worker's error, if it printed one, is on this "
                    "process's standard error"
                )
                for execution in list(self._executions):
                    execution.fail(EngineError(why))
                    self._reap(execution)
        queued = handle.forget_tasks()[1:]  # pipelined behind the one that ran: never started
        for execution, op, pending in queued:
            if execution.cancelled or op.cancelled:
                execution.task_discarded(op, pending.spec.task_id, [])
            else:
                op.requeue(pending.spec.task_id)
                execution.flush_soft_order(op)
        if task is not None and handle.timed_out:
            execution, op, pending = task
            self._ledger.give(op.resources.num_cpus, op.resources.custom)
            execution.task_discarded(op, pending.spec.task_id, [])
            limit = _timeout_of(execution, op)
            execution.fail(
                TaskTimeoutError(
                    f"task {pending.spec.task_index} of {op.name} ran longer than task_timeout_s={limit} s "
                    f"(a hung UDF?); its worker (pid {handle.pid}) was killed"
                )
            )
            self._reap(execution)
        elif task is not None and handle.unreadable is not None:
            execution, op, pending = task
            self._ledger.give(op.resources.num_cpus, op.resources.custom)
            failure = UDFFailure(f"reading the result of task {pending.spec.task_index} in the driver", handle.unreadable)
            self._finish_task(execution, op, TaskResult(pending.spec.task_id, error=describe_error(failure)))
        elif task is not None:
            execution, op, pending = task
            self._ledger.give(op.resources.num_cpus, op.resources.custom)
            if not execution.cancelled:
                rss = f"; its memory (RSS) was {format_bytes(handle.rss)} shortly before" if handle.rss else ""
                how = how_it_exited(code) if code is not None else "exited"
                execution.task_lost(op, pending.spec.task_id, f"worker pid {handle.pid} {how}{rss}")
            else:
                execution.task_discarded(op, pending.spec.task_id, [])
            self._reap(execution)
        self._replace(handle)

    def _ask_how_it_ended(self, handle: WorkerHandle) -> None:
        """Ask the zygote for the dead worker's exit status; ``_on_exit`` reports it."""
        task = handle.task
        self._deaths[handle.pid or 0] = (handle.worker_id, task[1] if task is not None else None, handle.rss)
        fs = self.pool.forkserver
        try:
            if fs is not None and handle.pid is not None and fs.alive():
                fs.reap(handle.pid)
                return
        except OSError:
            pass
        self._on_exit(handle.pid or 0, None)

    def _on_exit(self, pid: int, code: int | None) -> None:
        """Say how a worker died (the zygote's answer to ``reap``): logged and in ``stats()``."""
        worker_id, op, rss = self._deaths.pop(pid, ("?", None, 0))
        if pid in self._quiet_deaths:  # killed on purpose: its job was cancelled
            self._quiet_deaths.discard(pid)
            return
        line = describe_exit(worker_id, pid, op.name if op is not None else None, code, rss)
        worker_log.warning("dataflow: %s", line)
        if op is not None:
            op.stats.worker_deaths.append(line)

    def _sample_memory(self) -> None:
        """Read the resident memory of busy workers (at most every ``RSS_SAMPLE_S``), so a death
        can be told with the memory the worker had (and the loop sees a worker's heap grow)."""
        now = time.monotonic()
        if now - self._last_rss_sample < RSS_SAMPLE_S:
            return
        self._last_rss_sample = now
        total = 0
        for handle in self.pool.live():  # idle ones too: a UDF's heap stays with its process
            if handle.pid is not None:
                if handle.state == BUSY:
                    handle.rss = resident_bytes(handle.pid) or handle.rss
                total += private_bytes(handle.pid)
        self.workers_rss = total
        pressed = total > self.options.resolved_worker_memory_limit()
        if pressed and not self.memory_pressure:
            log.warning(
                "dataflow: worker processes use %s of memory, over %s: one task per operator at a time "
                "until it falls (a UDF holding memory across calls? see worker_memory_limit)",
                format_bytes(total), format_bytes(self.options.resolved_worker_memory_limit()),
            )
        self.memory_pressure = pressed

    def _replace(self, handle: WorkerHandle) -> None:
        """Start a worker in place of a dead one (a task worker, or an actor of a running pool)."""
        if handle.kind == TASK_KIND:
            self._spawn(TASK_KIND)
        elif handle.kind in self._actors:
            pool = self._actors[handle.kind]
            if handle in pool:
                pool.remove(handle)
            op = self._actor_op(handle.kind)
            if op is not None:
                replacement = self._spawn_actor(handle.kind, handle.gpu_amount)
                if replacement is not None:
                    pool.append(replacement)
                    worker_log.info("actor %s of %s (pid %s) died; restarting it", handle.worker_id, op.name, handle.pid)

    # scheduling ----------------------------------------------------------------------------
    def _schedule(self) -> None:
        """Dispatch to free workers, one task per execution per round, so executions running
        together (a train and an eval iterator) share the workers instead of the first taking all."""
        if self._stopping:
            return
        self._spares.expire(time.monotonic())
        if self._executions:
            self._turn = (self._turn + 1) % len(self._executions)
        active = self._executions[self._turn :] + self._executions[: self._turn]
        waits: dict[int, dict[int, str]] = {execution.id: {} for execution in active}
        while active:
            still = []
            for execution in active:
                try:
                    if self._dispatch_one(execution, waits[execution.id]):
                        still.append(execution)
                except Exception as err:
                    log.exception("dataflow executor: scheduling %s failed", execution.id)
                    execution.fail(EngineError(f"scheduling failed (this is a bug in dataflow): {err!r}"))
            active = still
        for execution in list(self._executions):
            self._guarded("growing actor pools", partial(self._grow_actor_pools, execution), execution)
            execution.note_waits(waits.get(execution.id, {}))
            self._reap(execution)

    def _dispatch_one(self, execution: Execution, waits: dict[int, str]) -> bool:
        """Dispatch the most urgent ready task of ``execution``; False when none may start."""
        candidates: list[Candidate] = []
        choices: list[tuple[MapOperator, WorkerHandle | str]] = []
        queued_behind: list[bool] = []
        starved_depth = -1  # the deepest operator with a plain CPU task ready and no worker for it
        for op in execution.map_ops():
            ready, reason = execution.dispatchable(op)
            if not ready:
                waits.pop(id(op), None)
                continue
            if reason is not None:
                waits[id(op)] = reason
                continue
            if self.memory_pressure and op.in_flight() > 0:
                waits[id(op)] = WAIT_MEMORY
                continue
            fits = self._ledger.fits(op.resources.num_cpus, op.resources.custom)
            slot = self._free_slot(op, execution) if fits else None
            behind_running = slot is None
            if slot is None:
                slot = self._pipeline_slot(execution, op)
            if slot is None:
                if not fits:
                    waits[id(op)] = WAIT_RESOURCES
                else:
                    waits[id(op)] = self._actor_wait(op) if op.actor_pool else WAIT_WORKER
                if op.actor_pool is None and op.resources.num_gpus == 0 and not op.resources.custom:
                    starved_depth = max(starved_depth, execution.depth[id(op)])
                continue
            waits.pop(id(op), None)
            candidates.append(Candidate(op.key, execution.depth[id(op)], op.held_bytes, op.in_flight()))
            choices.append((op, slot))
            queued_behind.append(behind_running)
        # a task queued behind a running one takes that worker the moment it frees up: not while
        # an operator further downstream (a pushed merge, a reduce) waits for a worker, or it
        # would wait until the operators above it ran out of tasks
        keep = [i for i, c in enumerate(candidates) if not (queued_behind[i] and c.depth < starved_depth)]
        if len(keep) < len(candidates):
            candidates, choices = [candidates[i] for i in keep], [choices[i] for i in keep]
        index = pick(candidates)
        if index is None:
            return False
        op, slot = choices[index]
        return self._dispatch(execution, op, slot)

    def _running_output_bytes(self) -> float:
        """Bytes the tasks sent to workers are expected to add to the store (each task's
        estimate from its operator when it was sent, ``MapOperator.expected_bytes_of``): summed
        per worker as tasks come and go, since up to ``PIPELINE_MAX_DEPTH`` wait on each."""
        return float(sum(handle.expected_bytes for handle in self.pool.live()))

    def _pool_starting(self, op: MapOperator) -> bool:
        """``op`` runs on an actor pool and none of its actors has started yet."""
        if op.actor_pool is None:
            return False
        return not any(h.state != STARTING for h in self._actors.get(f"actor:{op.key}", []))

    def _actor_wait(self, op: MapOperator) -> str:
        pool = self._actors.get(f"actor:{op.key}", [])
        if any(w.state == STARTING for w in pool) or not pool:
            return WAIT_ACTORS
        return WAIT_ACTORS_BUSY

    def _free_slot(self, op: MapOperator, execution: Execution) -> WorkerHandle | str | None:
        if op.actor_pool is not None:
            idle = self.pool.idle(f"actor:{op.key}")
            return idle[0] if idle else None
        idle = self.pool.idle(TASK_KIND)
        if idle:
            return idle[0]
        # a task with a timeout runs where it can be killed: a thread of the driver cannot be
        if self._inline.free() and op.next_input_bytes() <= INLINE_MAX_INPUT_BYTES and _timeout_of(execution, op) is None:
            return INLINE
        return None

    def _pipeline_slot(self, execution: Execution, op: MapOperator) -> WorkerHandle | None:
        """A busy task worker that may take ``op``'s next task now, to start it the moment the
        tasks before it end, or None; of those, the one with the fewest tasks queued.

        Only for short tasks (a task's cost is then mostly the round trip through the driver)
        of plain one-CPU operators behind other such tasks, up to ``pipeline_depth`` of them:
        a queued task takes over the CPU the one before it gives back, so the resource ledger
        never counts more than runs. ``_dispatch_one`` uses it only while no operator further
        downstream waits for a worker."""
        if not _pipelinable(op):
            return None
        handles = self.pool.live(TASK_KIND)
        expected = op.expected_output_bytes(prior=float(execution.options.target_max_block_size))
        queue_bytes = self.store_capacity * PIPELINE_STORE_SHARE / max(1, len(handles))
        depth = pipeline_depth(op.stats.task_wall_s / max(1, op.stats.tasks), expected, queue_bytes)
        best: WorkerHandle | None = None
        for handle in handles:
            tasks = handle.tasks
            if handle.state != BUSY or not tasks or len(tasks) > depth:
                continue
            # (each queued task was short when it was queued: the first and last ones say it all)
            if not _pipelinable(tasks[0][1]) or not _pipelinable(tasks[-1][1]):
                continue
            if best is None or len(tasks) < len(best.tasks):
                best = handle
        return best

    def _dispatch(self, execution: Execution, op: MapOperator, slot: WorkerHandle | str) -> bool:
        """Send ``op``'s next task to ``slot``; False (and the execution failed) when the task
        cannot be sent: a UDF or a read task that does not pickle is that job's error."""
        transform = None
        # the inline slot does not need the function pickled, but a worker will: a UDF that
        # cannot be pickled fails the first job as it fails every later one
        if slot == INLINE or (isinstance(slot, WorkerHandle) and op.digest not in slot.digests):
            try:
                transform = op.transform_bytes
            except Exception as err:
                execution.fail(unpicklable_error(op.name, "its function", err))
                return False
        pending = op.next_task()
        spec = pending.spec
        expected = op.expected_output_bytes(prior=float(execution.options.target_max_block_size))
        # what the tasks already running will add counts too: two tasks sent in one turn would
        # otherwise both see room for one and both write to shared memory
        room = self.store_capacity - self.store_used - self._spares.bytes - self._running_output_bytes()
        if expected > room and self._spares.bytes:  # kept files give way to blocks
            room += self._spares.bytes
            self._spares.drop()
        spec.spill = expected > room
        # a task may overshoot what was expected of it (a flat_map's unknown fan-out): past its
        # share of the room its outputs go to disk, so the tasks running at once cannot fill
        # shared memory far past the store's capacity before any of them reports
        spec.shm_room = None if spec.spill else max(2 * expected, room / max(1, self.options.resolved_num_cpus()))
        frames: list[bytes] = []
        if isinstance(slot, WorkerHandle):
            spec.spare_files = () if spec.spill else self._spares.take(expected)
            try:
                frames = protocol.encode(protocol.RunTask(spec, transform, sys.path if transform is not None else None))
            except Exception as err:
                self._reclaim_spares(spec)
                op.pending.pop(spec.task_id, None)
                execution.fail(unpicklable_error(op.name, "a task's inputs (its read task or arguments)", err))
                return False
            size = sum(len(frame) for frame in frames)
            if size > MAX_MESSAGE_BYTES:  # a worker would refuse it: say why, instead of a dead worker
                self._reclaim_spares(spec)
                op.pending.pop(spec.task_id, None)
                err = ValueError(
                    f"it pickles to {size / 2**20:.0f} MiB, more than the {MAX_MESSAGE_BYTES >> 20} MiB a message to "
                    "a worker may carry; load large objects inside the function (a callable class's __init__, "
                    "or from a file) instead of capturing them"
                )
                execution.fail(unpicklable_error(op.name, "its function and a task's inputs", err))
                return False
        if slot == INLINE:
            self._ledger.take(op.resources.num_cpus, op.resources.custom)
            self._inline.run(execution, op, pending)
            return True
        assert isinstance(slot, WorkerHandle)
        if not slot.tasks:  # a pipelined task takes its CPU when it starts (see _on_message)
            self._ledger.take(op.resources.num_cpus, op.resources.custom)
        slot.digests.add(op.digest)
        slot.state = BUSY
        pending.expected_bytes = int(op.expected_bytes_of(pending))
        slot.send((execution, op, pending))
        try:
            self._socket.send(slot.worker_id, frames)
        except PeerUnreachable:  # the worker vanished between Ready and now: its pidfd will say so
            pass
        return True

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
            affordable = (
                self._gpus.how_many(op.resources.num_gpus)
                if op.resources.num_gpus
                else self.options.resolved_num_cpus()
            )
            waiting = bool(pool) and not starting and len(busy) == len(live) and execution.dispatchable(op)[0]
            state = PoolState(spec.min_size, spec.max_size, len(live), len(starting), len(busy), waiting, affordable)
            target = target_size(state, new=not pool)
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
            ids = visible_gpu_ids()  # the ledger counts GPUs 0..n-1; a worker sees them by the driver's names
            env["CUDA_VISIBLE_DEVICES"] = ",".join(ids[i] if i < len(ids) else str(i) for i in grant)
        self.pool.preload_like_driver()
        handle = self._spawn(kind, env)
        handle.gpus, handle.gpu_amount = grant, num_gpus
        return handle

    def _retire_idle_actors(self) -> None:
        now = time.monotonic()
        for kind, pool in self._actors.items():
            op = self._actor_op(kind)
            minimum = op.actor_pool.min_size if op is not None and op.actor_pool else 0
            idle = [h.idle_since if h.state == IDLE else None for h in pool]
            for handle in [pool[i] for i in to_retire(idle, minimum, self.options.actor_idle_timeout_s, now)]:
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
        except PeerUnreachable:
            pass

    # executions ----------------------------------------------------------------------------
    def _add_execution(self, execution: Execution) -> None:
        if self._stopping:
            execution.fail(EngineError("dataflow was shut down before this dataset started"))
            execution.stopped.set()
            return
        if execution in self._submitted:
            self._submitted.remove(execution)
        self._executions.append(execution)
        execution.pool_starting = self._pool_starting
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
        for _ in range(self.options.resolved_num_cpus()):
            self._spawn(TASK_KIND)
        # then torch, if the script imported it: the zygote imports it once its task workers are
        # forked (they start without it), in the background, so the first actors fork with it
        # instead of waiting 0.7 CPU-s for the import. A script that only trains in the driver
        # pays that once per session, in the zygote's process
        self.pool.preload_like_driver()

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
        why = (
            f"dataflow's executor failed (this is a bug in dataflow): {self._error!r}"
            if self._error is not None
            else "dataflow was shut down while this dataset was running"
        )
        for execution in self._submitted + self._executions:  # nobody waits forever on a dead loop
            for op in execution.map_ops():
                op.close_source()
            execution.fail(EngineError(why))
            execution.stopped.set()
        self._wakeup.close()  # a thread waking the loop from now on writes nothing
        self._inline.close()
        self.pool.close()
        self._socket.close()
        self._ctx.term()

"""The driver's view of its worker processes: who exists, what each is doing, who died.

Workers are forked by the zygote (``engine.forkserver``). Each has a pidfd the executor polls,
so a death is noticed the moment it happens (no heartbeat needed on one machine). Task workers
serve any operator; actor workers (``kind="actor:<op>"``) belong to one operator's pool.
"""

from __future__ import annotations

import itertools
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.forkserver import HEAVY_MODULES, ForkServer, stat_fields

STARTING, IDLE, BUSY, RETIRING, DEAD = "starting", "idle", "busy", "retiring", "dead"
TASK_KIND = "task"


@dataclass
class WorkerHandle:
    worker_id: str
    kind: str
    state: str = STARTING
    pid: int | None = None
    pidfd: int | None = None
    tasks: deque[tuple[Any, Any, Any]] = field(default_factory=deque)
    """(execution, operator, pending task) sent to it, the running one first; more wait in its
    socket when short tasks are pipelined (``StreamingExecutor._pipeline_slot``). Changed only
    by ``send``, ``finished`` and ``forget_tasks``, which keep ``expected_bytes``."""
    expected_bytes: int = 0
    """What its tasks were expected to leave in the store, summed (each task's ``expected_bytes``)."""
    digests: set[str] = field(default_factory=set)
    idle_since: float = 0.0
    gpus: tuple[int, ...] = ()
    gpu_amount: float = 0.0
    spawned_at: float = 0.0
    """When the zygote reported its pid (``time.monotonic()``): the start deadline counts from it."""
    start_killed: bool = False
    """Killed for not being ready within ``worker_start_timeout_s``."""
    @property
    def task(self) -> tuple[Any, Any, Any] | None:
        """The task it is running, if any."""
        return self.tasks[0] if self.tasks else None

    def send(self, entry: tuple[Any, Any, Any]) -> None:
        """``entry``'s task was sent to it (runs after those before it)."""
        self.tasks.append(entry)
        self.expected_bytes += entry[2].expected_bytes

    def finished(self) -> tuple[Any, Any, Any]:
        """Its running task ended: that task's entry; the next one, if any, runs now."""
        entry = self.tasks.popleft()
        self.expected_bytes -= entry[2].expected_bytes
        return entry

    def forget_tasks(self) -> list[tuple[Any, Any, Any]]:
        """It died: every task sent to it, the one that ran first."""
        entries = list(self.tasks)
        self.tasks.clear()
        self.expected_bytes = 0
        return entries

    rss: int = 0
    """Resident bytes when last sampled while it ran a task."""
    timed_out: bool = False
    """Killed because its task ran past ``task_timeout_s``."""
    unreadable: BaseException | None = None
    """Why the reply to its task could not be read (it was killed for it: the task fails so)."""
    cancel_killed: bool = False
    """Killed because its task's execution was cancelled and the task ran on regardless."""
    last_accepted: int = -1
    """The highest block counter of its outputs the driver accepted: after its death, its files
    numbered above it are orphans (``StreamingExecutor._sweep_orphans``)."""


class WorkerPool:
    """Starts workers through the zygote and keeps their handles."""

    def __init__(
        self,
        worker_args: dict[str, Any],
        env: dict[str, str] | None = None,
        per_worker_args: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self._args = worker_args
        self._per_worker_args = per_worker_args
        self._env = env or {}
        self._ids = itertools.count()
        self.forkserver: ForkServer | None = None
        self.workers: dict[str, WorkerHandle] = {}
        self.by_pidfd: dict[int, WorkerHandle] = {}
        self._preloaded: set[str] = set()
        self._wanted: set[str] = set()

    def start_forkserver(self) -> ForkServer:
        if self.forkserver is None or not self.forkserver.alive():
            self.forget_forkserver()
            # the session's folders: the zygote, its last process, removes them if we die
            folders = [self._args[k] for k in ("shm_dir", "spill_dir") if self._args.get(k)]
            self.forkserver = ForkServer(self._env, cleanup=folders)
            self._preloaded = set()
        return self.forkserver

    def spawn(self, kind: str, extra_env: dict[str, str] | None = None) -> WorkerHandle:
        handle = WorkerHandle(f"w{next(self._ids)}", kind)
        self.workers[handle.worker_id] = handle
        args = dict(self._args, worker_id=handle.worker_id)
        if self._per_worker_args is not None:
            args.update(self._per_worker_args())
        try:
            self.start_forkserver().request(handle.worker_id, args, extra_env)
        except (BrokenPipeError, OSError):  # the zygote died: a new one
            self.forget_forkserver()
            self.start_forkserver().request(handle.worker_id, args, extra_env)
        return handle

    def preload_like_driver(self) -> None:
        """Have the zygote import the frameworks the driver has imported (torch...), so workers
        forked from now on start with them instead of each importing them (1-2 s each)."""
        self.want_preloaded([m for m in HEAVY_MODULES if m in sys.modules])
        self.preload_wanted()

    def want_preloaded(self, modules: list[str] | tuple[str, ...]) -> None:
        """Note that the zygote should import ``modules`` (from ``HEAVY_MODULES``) once.

        Called with what an actor reports its UDF imported: a job whose model class imports
        torch in its constructor then pays that import in its first actors only, not again in
        every actor of every later execution. The import itself waits for ``preload_wanted``.
        """
        self._wanted.update(m for m in modules if m in HEAVY_MODULES and m not in self._preloaded)

    def preload_wanted(self) -> None:
        """Send the noted imports to the zygote (it imports them before its next fork).

        The executor calls this when no execution is running (the import then costs no running
        job anything) and before forking an actor (which would otherwise import them itself).
        """
        wanted = sorted(self._wanted - self._preloaded)
        self._wanted.clear()
        if wanted and self.forkserver is not None:
            self._preloaded.update(wanted)
            self.forkserver.preload(wanted)

    def on_forked(self) -> list[WorkerHandle]:
        """Record pids the zygote reported; returns the handles now being watched."""
        if self.forkserver is None:
            return []
        started = []
        for worker_id, pid in self.forkserver.read_replies():
            handle = self.workers.get(worker_id)
            if handle is None:
                continue
            handle.pid = pid
            handle.spawned_at = time.monotonic()
            try:
                handle.pidfd = os.pidfd_open(pid)
            except ProcessLookupError:
                handle.state = DEAD
                continue
            self.by_pidfd[handle.pidfd] = handle
            started.append(handle)
        return started

    def forget_forkserver(self) -> None:
        """The zygote died: the next ``spawn`` starts a new one."""
        if self.forkserver is not None:
            self.forkserver.close()
            self.forkserver = None

    def mark_dead(self, handle: WorkerHandle) -> None:
        handle.state = DEAD
        if handle.pidfd is not None:
            self.by_pidfd.pop(handle.pidfd, None)
            os.close(handle.pidfd)
            handle.pidfd = None
        self.workers.pop(handle.worker_id, None)

    @staticmethod
    def sweep_orphans(handle: WorkerHandle, folders: Sequence[str]) -> None:
        """Remove the block files a dead worker wrote that the driver never accepted (the output
        of the task it died in, or of a reply that never arrived): nobody else would."""
        if handle.pid is None:
            return
        prefix = f"{handle.worker_id}.{handle.pid}-"
        for folder in folders:
            try:
                names = os.listdir(folder)
            except FileNotFoundError:
                continue
            for name in names:
                if not name.startswith(prefix):
                    continue
                counter = name[len(prefix) :].split(".", 1)[0]
                if counter.isdigit() and int(counter) > handle.last_accepted:
                    try:
                        os.unlink(os.path.join(folder, name))
                    except FileNotFoundError:
                        pass

    def live(self, kind: str | None = None) -> list[WorkerHandle]:
        return [w for w in self.workers.values() if w.state != DEAD and (kind is None or w.kind == kind)]

    def idle(self, kind: str) -> list[WorkerHandle]:
        return [w for w in self.workers.values() if w.state == IDLE and w.kind == kind]

    def close(self) -> None:
        if self.forkserver is not None:
            self.forkserver.close()
            self.forkserver = None
        for handle in list(self.workers.values()):
            if handle.pidfd is not None:
                os.close(handle.pidfd)
        self.workers.clear()
        self.by_pidfd.clear()


def resident_bytes(pid: int) -> int:
    """Resident memory of process ``pid`` in bytes (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def private_bytes(pid: int) -> int:
    """Resident memory of ``pid`` that is its own (heap, stacks): resident less shared pages,
    so blocks it maps from the store are not counted (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            fields = f.read().split()
        return max(0, int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def format_bytes(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 28 else f"{n / (1 << 20):.0f} MiB"


def zombie_exit_code(pid: int) -> int | None:
    """How process ``pid`` ended (-N for signal N, else its exit code), read from the kernel
    while it is a zombie not yet reaped by its parent (the zygote reaps a worker only when asked,
    so at the moment the driver sees its pidfd fire this is known); None otherwise."""
    fields = stat_fields(pid)
    if fields is None or fields[0] != b"Z" or len(fields) < 50:  # field 52, exit_code, since Linux 3.5
        return None
    try:
        return os.waitstatus_to_exitcode(int(fields[-1]))
    except ValueError:
        return None


def how_it_exited(code: int | None) -> str:
    """``code`` (``os.waitstatus_to_exitcode``'s convention, -N for signal N; None when unknown)
    in words. A SIGKILL nobody in dataflow sent is most often the kernel's OOM killer: said."""
    if code is None:
        return "exited (how is unknown: its zygote is gone)"
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    how = f"was killed by {name}"
    if -code == signal.SIGKILL:
        how += " (the kernel's OOM killer sends SIGKILL when memory runs out)"
    return how


def describe_exit(worker_id: str, pid: int, op_name: str | None, code: int | None, rss: int) -> str:
    """One line on how a worker died (:func:`how_it_exited`), the operator it ran, its memory."""
    how = how_it_exited(code)
    where = f" running a task of {op_name}" if op_name is not None else ""
    memory = f"; RSS {format_bytes(rss)} when last sampled" if rss else ""
    return f"worker {worker_id} (pid {pid}){where} {how}{memory}"

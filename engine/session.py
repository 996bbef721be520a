"""The engine session of this process: its shared-memory folder, its executor, its workers.

``Session.start`` creates ``/dev/shm/dataflow-<uuid>/`` (mode 0700) holding a ``lock`` file
this process keeps ``flock``-ed (and a spill folder alike), sweeps the folders of sessions
whose lock is free (their process died), and starts the executor. ``shutdown`` stops workers
and removes the folders; it runs at interpreter exit and on SIGTERM too.

When the driver dies without running ``shutdown`` (SIGKILL, the OOM killer, or SIGTERM's
default action):

* the zygote (``engine.forkserver``), the session's last process, gets its parent-death signal,
  kills the workers and removes both folders once the driver's lock is free;
* a session that never started a zygote leaves its folders to the next process on this machine
  that executes anything (``sweep_dead_sessions_once``: even a ``count()`` from metadata or a
  local-mode job), or that starts a session.

The session is the multi-process backend (``engine.backend.Backend``): ``execute`` submits to its
executor, blocks are files in its folder, and a ``streaming_split`` coordinator serves iterators
in other processes over a socket in that folder (``engine.split_server``).

The SIGTERM handler can only be installed from the main thread (``signal.signal``). A process
whose first engine call runs in another thread keeps SIGTERM's default action: it dies without
``shutdown``, and the zygote cleans up as above.
"""

from __future__ import annotations

import atexit
import fcntl
import glob
import os
import shutil
import signal
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from engine.backend import Backend, Capacity, ExecutionHandle, put_each
from engine.errors import EngineError
from engine.execution import Execution
from engine.executor import StreamingExecutor
from engine.file_reaper import FileReaper
from engine.forkserver import remove_abandoned
from engine.object_store import BlockRef, SharedMemoryStore, read_block
from engine.operators.base import PhysicalOperator
from engine.options import ExecutionOptions
from engine.split import SplitCoordinator, SplitTransport
from engine.split_server import SplitClient, SplitServer

SHM_ROOT = "/dev/shm"
PREFIX = "dataflow-"


def sweep_dead_sessions(root: str) -> list[str]:
    """Remove session folders under ``root`` whose owning process is gone (their lock is free)."""
    return [path for path in glob.glob(os.path.join(root, PREFIX + "*")) if remove_abandoned(path)]


def _shm_root() -> str:
    return SHM_ROOT if os.path.isdir(SHM_ROOT) else tempfile.gettempdir()


_swept = False


def sweep_dead_sessions_once(spill_dir: str | None = None) -> None:
    """Sweep dead sessions' shared-memory and spill folders, the first time only in this process
    (a glob and a non-blocking ``flock`` per folder). Called when anything executes, so the blocks
    of a killed driver that had no zygote to clean up do not hold /dev/shm until some later
    process starts workers."""
    global _swept
    if _swept:
        return
    _swept = True
    sweep_dead_sessions(_shm_root())
    sweep_dead_sessions(spill_dir or tempfile.gettempdir())


def _make_locked_dir(root: str, name: str) -> tuple[str, int]:
    path = os.path.join(root, name)
    os.mkdir(path, 0o700)
    # locked before it is named ``lock``: a sweeper never finds the lock of a live session free
    pending = os.path.join(path, "lock.new")
    fd = os.open(pending, os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(pending, os.path.join(path, "lock"))
    return path, fd


class Session(Backend):
    """Everything this process started for the engine, and how to stop it: the multi-process
    backend."""

    def __init__(self, options: ExecutionOptions, transport: str = "ipc") -> None:
        options = options.with_()  # its own copy: the caller's options object is mutable
        self.options = options
        self.session_id = uuid.uuid4().hex[:12]
        shm_root = _shm_root()
        spill_root = options.spill_dir or tempfile.gettempdir()
        sweep_dead_sessions(shm_root)
        sweep_dead_sessions(spill_root)
        self.shm_dir, self._shm_lock = _make_locked_dir(shm_root, PREFIX + self.session_id)
        self.spill_dir, self._spill_lock = _make_locked_dir(spill_root, PREFIX + "spill-" + self.session_id)
        self.store = SharedMemoryStore(self.shm_dir, self.spill_dir, owner="driver", reaper=FileReaper())
        self.executor = StreamingExecutor(options, self.store, self.shm_dir, transport)
        self._closed = False
        self._lock = threading.Lock()

    def start(self) -> Session:
        self.executor.start()
        return self

    def shutdown(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            SplitCoordinator.close_all()
            self.executor.stop()
        finally:
            if self.store.reaper is not None:
                self.store.reaper.close()
            for path, fd in ((self.shm_dir, self._shm_lock), (self.spill_dir, self._spill_lock)):
                shutil.rmtree(path, ignore_errors=True)
                os.close(fd)

    @property
    def closed(self) -> bool:
        return self._closed

    # the backend interface -------------------------------------------------------------------
    @property
    def private_views(self) -> bool:
        return self.store.private_views

    def execute(self, ops: list[PhysicalOperator], options: ExecutionOptions) -> ExecutionHandle:
        executor = self.executor
        execution = Execution(
            ops,
            self.options.for_execution(options),
            executor.free,
            self.store,
            executor.stored,
            store_capacity=executor.store_capacity,
        )
        executor.submit(execution)
        return StreamingHandle(execution, self)

    def put(self, tables: Sequence[pa.Table]) -> list[BlockRef]:
        """Written into shared memory by this thread while the store has room (the room read
        once, then counted down here: the loop counts them when it next turns), on disk after."""
        executor = self.executor
        if executor.stopped:
            msg = "dataflow was shut down: start it again (dataflow.init) to make a dataset"
            raise EngineError(msg)
        room = executor.store_capacity - executor.store_used

        def put(table: pa.Table) -> BlockRef:
            nonlocal room
            nbytes = table.nbytes
            ref = self.store.put(table, spill=nbytes > room)
            room -= 0 if ref.spilled else nbytes
            return ref

        refs = put_each(tables, put, self.store.free)  # (a full disk, an interrupt: nothing is kept)
        executor.call_soon(lambda: [executor.stored(ref) for ref in refs])
        return refs

    def get(self, ref: BlockRef) -> pa.Table:
        return self.store.get(ref)

    def free(self, ref: BlockRef) -> None:
        executor = self.executor
        if not executor.stopped:
            executor.call_soon(lambda: executor.free(ref))

    def capacity(self) -> Capacity:
        return Capacity(
            float(self.options.resolved_num_cpus()),
            self.options.resolved_num_gpus(),
            self.executor.store_capacity,
            tuple(self.options.resources),
        )

    def busy_cpus(self) -> float:
        return self.executor.busy_cpus()

    def statistics(self) -> dict[str, Any]:
        for _ in range(3):  # the loop may add a worker while its table is read: read again
            try:
                return self.executor.statistics()
            except RuntimeError:
                continue
        return {}

    def split_transport(self) -> Callable[[SplitCoordinator], SplitTransport]:
        """A ROUTER socket in the session's 0700 folder, one per coordinator."""
        shm_dir = self.shm_dir

        def serve(coordinator: SplitCoordinator) -> SplitTransport:
            return SplitServer(coordinator, f"ipc://{shm_dir}/split-{coordinator.key}.sock")

        return serve

    @classmethod
    def split_client(cls, address: str) -> SharedMemorySplitClient:
        return SharedMemorySplitClient(address)


class StreamingHandle(ExecutionHandle):
    """An execution submitted to the session's executor; calls that change its state are
    handed to the executor's loop thread."""

    def __init__(self, execution: Execution, session: Session) -> None:
        super().__init__(execution, session.store)
        self.executor = session.executor

    def busy_cpus(self) -> float:
        return self.executor.busy_cpus()

    def actors_of(self, op: PhysicalOperator) -> int:
        return self.executor.actors_of(op)

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
        # no wake of its own: it only counts bytes, and the release of this block wakes the loop
        self.executor.call_on_next_turn(lambda: self.execution.handed_to_consumer(ref))

    def release(self, ref: BlockRef) -> None:
        self.executor.release(self.execution, ref)

    def detach(self, ref: BlockRef) -> bool:
        self.executor.call_soon(lambda: self.execution.detach(ref))
        return ref.block_id not in self.execution.borrowed

    def free_detached(self, ref: BlockRef) -> None:
        if not self.executor.stopped:
            self.executor.call_soon(lambda: self.executor.free(ref))

    @property
    def blocks_alive(self) -> bool:
        return not self.executor.stopped  # a shutdown removes the session's shared memory

    def cancel(self) -> None:
        if not self._closed:
            self._closed = True
            self.executor.cancel(self.execution)  # also frees outputs nobody will read


class SharedMemorySplitClient(SplitClient):
    """A split iterator's link to a coordinator in another process of this machine: pieces come
    over the coordinator's socket, blocks are mapped from the session's shared memory directly
    (copy-on-write, so a consumer's in-place writes stay its own)."""

    private_views = True

    def get(self, ref: BlockRef) -> pa.Table:
        return read_block(ref)


_current: Session | None = None
_current_lock = threading.Lock()
_hooks_installed = False
_sigterm_tried = False


def get_session(options: ExecutionOptions | None = None, **kwargs: Any) -> Session:
    """The running session, started with ``options`` if there is none yet."""
    global _current
    with _current_lock:
        if _current is None or _current.closed:
            _install_exit_hooks()
            _current = Session(options or ExecutionOptions(), **kwargs).start()
        return _current


def current_session() -> Session | None:
    return _current if _current is not None and not _current.closed else None


def shutdown() -> None:
    """Stop the session's workers and remove its shared memory (idempotent)."""
    global _current
    with _current_lock:
        session, _current = _current, None
    if session is not None:
        session.shutdown()


def _install_exit_hooks() -> None:
    global _hooks_installed, _sigterm_tried
    if not _hooks_installed:
        _hooks_installed = True
        atexit.register(shutdown)
    # only the main thread may install a handler: from another thread SIGTERM keeps its default
    # action (the zygote cleans up after the dead driver, see the module docstring) until a
    # session is started from the main thread
    if not _sigterm_tried and threading.current_thread() is threading.main_thread():
        _sigterm_tried = True
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, _on_sigterm)


def _forget_after_fork() -> None:
    """In a forked child (a DataLoader worker, multiprocessing with fork): the session belongs to
    the parent. Forget it, so the child's exit or SIGTERM never stops the parent's workers or
    removes its shared memory."""
    global _current, _hooks_installed, _sigterm_tried
    _current = None
    _hooks_installed = False
    _sigterm_tried = False
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


os.register_at_fork(after_in_child=_forget_after_fork)


def _on_sigterm(signum: int, frame: Any) -> None:
    shutdown()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)

"""The engine session of this process: its shared-memory folder, its executor, its workers.

``Session.start`` creates ``/dev/shm/dataflow-<uuid>/`` (mode 0700) holding a ``lock`` file
this process keeps ``flock``-ed, sweeps the folders of sessions whose lock is free (their
process died), and starts the executor. ``shutdown`` stops workers and removes the folder; it
runs at interpreter exit and on SIGTERM too.
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
from typing import Any

from engine.executor import StreamingExecutor
from engine.object_store import SharedMemoryStore
from engine.options import ExecutionOptions

SHM_ROOT = "/dev/shm"
PREFIX = "dataflow-"


def sweep_dead_sessions(root: str) -> list[str]:
    """Remove session folders under ``root`` whose owning process is gone."""
    removed = []
    for path in glob.glob(os.path.join(root, PREFIX + "*")):
        lock_path = os.path.join(path, "lock")
        try:
            fd = os.open(lock_path, os.O_RDWR)
        except FileNotFoundError:
            continue  # being created right now, or not ours
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)
        removed.append(path)
    return removed


def _make_locked_dir(root: str, name: str) -> tuple[str, int]:
    path = os.path.join(root, name)
    os.mkdir(path, 0o700)
    fd = os.open(os.path.join(path, "lock"), os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return path, fd


class Session:
    """Everything this process started for the engine, and how to stop it."""

    def __init__(self, options: ExecutionOptions, transport: str = "ipc") -> None:
        self.options = options
        self.session_id = uuid.uuid4().hex[:12]
        shm_root = SHM_ROOT if os.path.isdir(SHM_ROOT) else tempfile.gettempdir()
        spill_root = options.spill_dir or tempfile.gettempdir()
        sweep_dead_sessions(shm_root)
        sweep_dead_sessions(spill_root)
        self.shm_dir, self._shm_lock = _make_locked_dir(shm_root, PREFIX + self.session_id)
        self.spill_dir, self._spill_lock = _make_locked_dir(spill_root, PREFIX + "spill-" + self.session_id)
        self.store = SharedMemoryStore(self.shm_dir, self.spill_dir, owner="driver")
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
            from engine.split import SplitCoordinator

            SplitCoordinator.close_all()
            self.executor.stop()
        finally:
            for path, fd in ((self.shm_dir, self._shm_lock), (self.spill_dir, self._spill_lock)):
                shutil.rmtree(path, ignore_errors=True)
                os.close(fd)

    @property
    def closed(self) -> bool:
        return self._closed


_current: Session | None = None
_current_lock = threading.Lock()
_hooks_installed = False


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
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    atexit.register(shutdown)
    if threading.current_thread() is threading.main_thread():
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, _on_sigterm)


def _forget_after_fork() -> None:
    """In a forked child (a DataLoader worker, multiprocessing with fork): the session belongs to
    the parent. Forget it, so the child's exit or SIGTERM never stops the parent's workers or
    removes its shared memory."""
    global _current, _hooks_installed
    _current = None
    _hooks_installed = False
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


os.register_at_fork(after_in_child=_forget_after_fork)


def _on_sigterm(signum: int, frame: Any) -> None:
    shutdown()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)

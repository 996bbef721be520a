"""A zygote process that has already imported pyarrow, numpy and the worker, and forks workers.

A fresh Python that imports pyarrow takes ~0.3 s; a fork of this process takes milliseconds.
The driver talks to it over its stdin/stdout: one JSON line per request ``{"worker_id", "env",
"args"}``, one JSON line back ``{"worker_id", "pid"}``. The driver watches each worker with a
pidfd (``os.pidfd_open``), so a death is seen at once even though workers are the zygote's
children. If the zygote is killed, its workers get SIGKILL from the kernel (PR_SET_PDEATHSIG).

How it ends:

* the driver stops it (``ForkServer.close``: an ``{"exit": true}`` line, then its stdin closes):
  it kills its workers and exits; the driver removes its own folders;
* the driver dies (SIGKILL, SIGTERM without a handler, OOM): the zygote, the session's last
  process, gets SIGTERM from the kernel (its parent-death signal, armed first thing in its
  ``__main__``) or reads EOF on its stdin. Once its parent pid is no longer the driver's it
  kills its workers, waits for them, and removes the session's folders (shared memory and
  spill) whose ``lock`` nobody holds any more (``remove_abandoned``), within
  ``FINISH_DEADLINE_S``. While the driver lives, a SIGTERM is ignored and an EOF removes
  nothing: the parent-death signal also fires when the driver *thread* that started the zygote
  ends, and an ordinary shutdown must never lose the race to the driver's own cleanup.
"""

from __future__ import annotations

import ctypes
import fcntl
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import IO, Any

_PR_SET_PDEATHSIG = 1

DRIVER_PID_ENV = "DATAFLOW_ZYGOTE_DRIVER_PID"
"""The driver's pid, given to the zygote (which removes it from its environment)."""
CLEANUP_ENV = "DATAFLOW_ZYGOTE_CLEANUP"
"""A JSON list of the session's folders the zygote removes once the driver has died."""
WORKER_EXIT_TIMEOUT_S = 3.0
"""How long the zygote waits for its SIGKILLed workers to be gone before removing folders."""
DRIVER_EXIT_GRACE_S = 2.0
"""After an EOF without the driver's goodbye: how long to wait for the driver to be gone (the
kernel closes a dying process's pipes a moment before it reparents its children)."""
FINISH_DEADLINE_S = 10
"""The zygote's cleanup never takes longer: SIGALRM (default action) ends it then."""
MALLOC_TUNABLES = {
    "glibc.malloc.mmap_threshold": str(32 << 20),
    "glibc.malloc.trim_threshold": str(64 << 20),
    "glibc.malloc.tcache_count": "0",
}
"""glibc's allocator in the zygote and so in every worker (as ``GLIBC_TUNABLES``).

Blocks up to 32 MiB come from the heap, and free memory at its top goes back to the kernel only
past 64 MiB. With glibc's defaults a task's numpy temporaries of a few MiB are handed back to
the kernel when freed and fault in again, page by page, on the next task: a 200k-row shuffle's
keys and order took 750-1,100 page faults per step and ~1.5x the time (splitmix of 200k keys 3.2
against 0.6 ms, a whole 200k-row shuffle task 30 against 21-25 ms).

No per-thread cache of freed small chunks (``tcache_count=0``; small ones still go to glibc's
fast bins). torch allocates with ``posix_memalign``, and glibc 2.36 serves an aligned request of
N bytes from a free chunk of N + 96 or more only: each allocation splits off a small leading
chunk, and that chunk, parked in the thread's cache, is counted as in use, so the chunk freed
beside it never merges into one big enough for the next request. A model's 4 MiB activations
then came from new memory for every batch, and the heap grew by 8 MiB a batch until the task
ended and it was trimmed: 2,065 page faults per batch of the inference benchmark against 1
without the cache, 4.2 against 2.6 s for the whole job. Fast-bin chunks are merged before glibc
looks for a big one.

A ``GLIBC_TUNABLES`` in the driver's environment (even an empty one) replaces all of these. One
of glibc's older variables replaces only the setting it names (``MALLOC_TRIM_THRESHOLD_``,
``MALLOC_MMAP_THRESHOLD_``): container images often set ``MALLOC_ARENA_MAX``, and that alone
must not cost a model's workers the rest."""
MALLOC_ALIASES = {
    "glibc.malloc.mmap_threshold": "MALLOC_MMAP_THRESHOLD_",
    "glibc.malloc.trim_threshold": "MALLOC_TRIM_THRESHOLD_",
}
"""The older environment variable of each of ``MALLOC_TUNABLES`` that has one."""


MIMALLOC_ENV = {"MIMALLOC_PURGE_DELAY": "10000"}
"""Arrow's allocator (mimalloc) in the workers gives memory back to the kernel once it has been
free for 10 s, not 1 s (its default); a user's own ``MIMALLOC_PURGE_DELAY`` wins.

A worker idle for a second between two jobs (a warm-up and a run, two cells of a notebook) had
its Arrow memory purged, and the next job faulted all of it in again, on this virtual machine
from memory the host had taken back. Decoding the 32 files of the 4M-row sort benchmark in one
process: 1.32 CPU-s the first time with the default, 0.60 never purging; the sort after a small
warm-up, five pairs: 1.76-2.33 s against 1.45-1.74 s (10 s or never). Never purging would keep a
worker's peak for good (and ``worker_memory_limit`` pressed for good); 10 s gives an idle
session's memory back soon enough. mimalloc reads it when pyarrow is first imported, so the
zygote removes it from its environment only after its imports."""


def zygote_malloc_env(env: dict[str, str]) -> dict[str, str]:
    """What to add to ``env`` (the zygote's environment) for ``MALLOC_TUNABLES`` and
    ``MIMALLOC_ENV``: no ``GLIBC_TUNABLES`` when the user set one, else those tunables whose
    older variable the user did not set; each of ``MIMALLOC_ENV`` the user did not set."""
    added = {name: value for name, value in MIMALLOC_ENV.items() if name not in env}
    if "GLIBC_TUNABLES" in env:
        return added
    tunables = [f"{name}={value}" for name, value in MALLOC_TUNABLES.items() if MALLOC_ALIASES.get(name) not in env]
    return {"GLIBC_TUNABLES": ":".join(tunables), **added} if tunables else added


MALLOC_SET_ENV = "DATAFLOW_ZYGOTE_MALLOC"
"""The names ``zygote_malloc_env`` added to the zygote's environment (it removes them once read:
glibc's at its start, mimalloc's after its imports; a UDF's own subprocesses get the user's
environment)."""


def _set_parent_death_signal(sig: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def remove_abandoned(path: str) -> bool:
    """Remove the session folder ``path`` if the process that owned it is gone, i.e. nobody holds
    the ``flock`` on its ``lock`` file any more; True if it was removed.

    A folder without a ``lock`` file (being created, or not a session's) is left alone, and so is
    one whose lock a live process holds (its owner, or a child it forked that inherited the lock).
    """
    try:
        fd = os.open(os.path.join(path, "lock"), os.O_RDWR)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        shutil.rmtree(path, ignore_errors=True)
        return True
    finally:
        os.close(fd)


FREE_LOCK_WAIT_S = 1.0
"""How long the zygote retries a dead driver's folder whose lock is busy: another process may be
probing it that instant (a session's sweep, which then removes it itself, or a leak check,
which does not), and the lock of a dead owner is only ever held for such a moment."""


def _remove_when_free(path: str) -> None:
    deadline = time.monotonic() + FREE_LOCK_WAIT_S
    while not remove_abandoned(path) and os.path.exists(os.path.join(path, "lock")):
        if time.monotonic() >= deadline:
            return
        time.sleep(0.02)


def _reap(pid: int) -> int | None:
    """How child ``pid`` ended (``os.waitstatus_to_exitcode``: -N for signal N), or None when
    it is not our child or not dead within a second (the driver saw its pidfd fire: it is)."""
    deadline = time.monotonic() + 1.0
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.001)


def stat_fields(pid: int) -> list[bytes] | None:
    """Process ``pid``'s ``/proc/<pid>/stat`` fields from the third on (state, parent, ...: field
    N is item N - 3), read past the command name, which may hold spaces; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2 :].split()
    except (OSError, ValueError):
        return None


def _parent_of(pid: int) -> int | None:
    fields = stat_fields(pid)
    try:
        return int(fields[1]) if fields is not None else None
    except (ValueError, IndexError):
        return None


def _child(request: dict[str, Any], parent_pid: int) -> None:
    gc.enable()  # off in the zygote (see main); a worker collects its own objects, not the frozen ones
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)
    os.environ.update(request.get("env") or {})
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)  # prints from UDFs go to the driver's stderr, never into our pipe
    os.close(devnull)
    from engine.worker import main

    code = 0
    try:
        main(**request["args"])
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


class _DriverGone(BaseException):
    """Raised in the zygote's main thread by its SIGTERM handler once the driver has died."""


BYE, EOF, DRIVER_DIED, FAILED = "bye", "eof", "driver died", "failed"
"""How the zygote's loop ended."""


class Zygote:
    """The zygote's state: the driver it serves, its workers, the folders it may have to remove."""

    def __init__(self, driver_pid: int, folders: Sequence[str] = ()) -> None:
        self.driver_pid = driver_pid
        self.folders = list(folders)
        self.children: set[int] = set()
        self.interruptible = False
        """While True (importing, serving), the SIGTERM handler may end the loop; elsewhere a
        dead driver is noticed by ``finish`` itself."""
        self.me = os.getpid()
        self.after_imports: list[str] = []
        """Variables the driver added for the allocators of libraries the zygote imports
        (``MIMALLOC_ENV``): removed from its environment once they are imported."""

    @classmethod
    def from_environ(cls) -> Zygote:
        """The driver's pid and the folders from the environment, removed from it (workers
        forked later must not inherit them)."""
        driver = os.environ.pop(DRIVER_PID_ENV, "")
        added = [name for name in os.environ.pop(MALLOC_SET_ENV, "").split(",") if name]
        if "GLIBC_TUNABLES" in added:  # (glibc read it when the zygote started)
            os.environ.pop("GLIBC_TUNABLES", None)
        try:
            folders = [str(f) for f in json.loads(os.environ.pop(CLEANUP_ENV, "") or "[]")]
        except (ValueError, TypeError):
            folders = []
        zygote = cls(int(driver) if driver.isdigit() else os.getppid(), folders)
        zygote.after_imports = [name for name in added if name in MIMALLOC_ENV]
        return zygote

    def driver_alive(self) -> bool:
        """Whether the driver is still our parent (once it dies we are reparented)."""
        return os.getppid() == self.driver_pid

    def on_sigterm(self, signum: int, frame: Any) -> None:
        """SIGTERM, our parent-death signal: the driver died, or only the driver thread that
        started us ended (or someone signalled the process group). Only the first means
        anything: the driver, while alive, ends us itself by closing our stdin."""
        if not self.interruptible or self.driver_alive():
            return
        self.interruptible = False
        raise _DriverGone

    def __enter__(self) -> Zygote:
        self.interruptible = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.interruptible = False  # the handler may still raise right before this: inside the with

    def serve(self, stdin: IO[str], stdout: IO[str]) -> str:
        """Fork one worker per request until the driver says goodbye (``BYE``) or our stdin
        closes or our replies cannot be written (``EOF``)."""
        for line in stdin:
            request = json.loads(line)
            if request.get("exit"):
                return BYE
            if "preload" in request:
                _import_quietly(request["preload"])
                continue
            if "reap" in request:
                reply: dict[str, Any] = {"exited": int(request["reap"]), "code": _reap(int(request["reap"]))}
                try:
                    stdout.write(json.dumps(reply) + "\n")
                    stdout.flush()
                except OSError:
                    return EOF
                continue
            pid = self._fork(request)
            try:
                stdout.write(json.dumps({"worker_id": request["worker_id"], "pid": pid}) + "\n")
                stdout.flush()
            except OSError:  # nobody reads our replies: the driver closed its end or died
                return EOF
        return EOF

    def _fork(self, request: dict[str, Any]) -> int:
        # the handler must not end the loop between the fork and recording the child (it would
        # be left out of the children killed at the end): a signal meanwhile is ignored, and
        # the driver's death checked right after
        self.interruptible = False
        gc.freeze()  # what we imported so far: the child's collections never walk it (see main)
        pid = os.fork()
        if pid == 0:
            try:
                _child(request, self.me)
            finally:
                os._exit(1)
        self.children.add(pid)
        self.interruptible = True
        if not self.driver_alive():
            self.interruptible = False
            raise _DriverGone
        return pid

    def finish(self, outcome: str) -> None:
        """Kill the workers; if the driver is gone, remove the session's abandoned folders. Ends
        within ``FINISH_DEADLINE_S`` whatever hangs (a worker stuck in the kernel, a slow disk)."""
        self.interruptible = False
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(FINISH_DEADLINE_S)
        self._kill_children()
        if outcome == EOF:
            driver_gone = self._driver_exits_within(DRIVER_EXIT_GRACE_S)
        else:
            driver_gone = outcome == DRIVER_DIED or not self.driver_alive()
        if driver_gone:
            for folder in self.folders:
                _remove_when_free(folder)

    def _kill_children(self) -> None:
        for pid in self.children:
            if _parent_of(pid) != self.me:  # gone (reaped by the kernel), or its pid reused
                continue
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + WORKER_EXIT_TIMEOUT_S
        while time.monotonic() < deadline:
            try:  # ECHILD once every child is reaped
                done, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if not done:
                time.sleep(0.005)

    def _driver_exits_within(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.driver_alive():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True


def serve(
    stdin: IO[str], stdout: IO[str], zygote: Zygote | None = None, preload: Callable[[], None] | None = None
) -> str:
    """The zygote's life: ``preload``, then fork one worker per request until the driver says
    goodbye or goes away; then kill the workers (and clean up after a dead driver). Returns how
    it ended."""
    zygote = zygote or Zygote(os.getppid())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    # children stay zombies until the driver, told of a death by its pidfd, asks how it ended
    # ("reap"); ``finish`` reaps the rest
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    outcome = FAILED
    try:
        with zygote:
            if not zygote.driver_alive():  # it died before our parent-death signal was armed
                raise _DriverGone
            if preload is not None:
                preload()
            for name in zygote.after_imports:  # read by now: a UDF's subprocesses get the user's
                os.environ.pop(name, None)
            outcome = zygote.serve(stdin, stdout)
    except _DriverGone:
        outcome = DRIVER_DIED
    except Exception:
        import traceback

        traceback.print_exc()
    zygote.finish(outcome)
    return outcome


def main() -> None:
    """``python -m engine.forkserver``: arm the parent-death signal first, then import and serve.

    The zygote never runs Python's cycle collector. An import makes objects by the hundred
    thousand (torch: ~230k), and the collector walked them over and over as they came: torch's
    import took 0.85 CPU-s with it and 0.66-0.71 without. Nothing the zygote makes after its
    imports is cyclic garbage worth collecting (a JSON line per request). Before each fork
    everything it holds is frozen (``gc.freeze``), so a worker's collections skip it: they
    neither spend time on it nor write into (and so copy) the pages the worker shares with the
    zygote, the recipe of ``gc.freeze``'s documentation."""
    gc.disable()
    zygote = Zygote.from_environ()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, zygote.on_sigterm)
    _set_parent_death_signal(signal.SIGTERM)
    serve(sys.stdin, sys.stdout, zygote, _preload)
    os._exit(0)  # nothing to flush, no interpreter teardown (our stdout may be a broken pipe)


def _import_quietly(modules: list[str]) -> None:
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # the worker will import it (and fail properly) itself
            pass


class ForkServer:
    """The driver's handle on the zygote."""

    def __init__(self, env: dict[str, str] | None = None, cleanup: Sequence[str] = ()) -> None:
        """Start the zygote with ``env``; ``cleanup``: the session's folders it removes if this
        process dies (see the module docstring)."""
        child_env = dict(os.environ)
        child_env.update(env or {})
        child_env[DRIVER_PID_ENV] = str(os.getpid())
        child_env[CLEANUP_ENV] = json.dumps(list(cleanup))
        malloc_env = zygote_malloc_env(child_env)
        if malloc_env:
            child_env.update(malloc_env)
            child_env[MALLOC_SET_ENV] = ",".join(malloc_env)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine.forkserver"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
            env=child_env,
            cwd=os.getcwd(),
            start_new_session=False,
        )
        assert self.proc.stdout is not None
        self._buffer = ""
        self.exits: list[tuple[int, int | None]] = []
        """(pid, exit code or -signal) of dead workers, answers to ``reap``."""
        self.eof = False
        """Its pipe closed: the zygote is gone."""
        self.requested = 0
        self.replied = 0
        self.fileno = self.proc.stdout.fileno()
        os.set_blocking(self.fileno, False)

    def request(self, worker_id: str, args: dict[str, Any], env: dict[str, str] | None = None) -> None:
        """Ask for a worker; its pid arrives later through ``read_replies``."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"worker_id": worker_id, "args": args, "env": env or {}}) + "\n")
        self.proc.stdin.flush()
        self.requested += 1

    def preload(self, modules: list[str]) -> None:
        """Have the zygote import ``modules`` before it forks the next workers."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"preload": modules}) + "\n")
        self.proc.stdin.flush()

    def read_replies(self) -> list[tuple[str, int]]:
        """(worker id, pid) for each worker forked since the last call (non-blocking)."""
        try:
            chunk = os.read(self.fileno, 65536)
        except BlockingIOError:
            return []
        if not chunk:
            self.eof = True
            return []
        self._buffer += chunk.decode()
        *lines, self._buffer = self._buffer.split("\n")
        replies = [json.loads(line) for line in lines if line]
        for reply in replies:
            if "exited" in reply:
                self.exits.append((int(reply["exited"]), reply["code"]))
        forked = [(r["worker_id"], int(r["pid"])) for r in replies if "worker_id" in r]
        self.replied += len(forked)
        return forked

    def reap(self, pid: int) -> None:
        """Ask how worker ``pid`` (dead: its pidfd fired) ended; the answer lands in ``exits``."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"reap": pid}) + "\n")
        self.proc.stdin.flush()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """Stop the zygote; its workers go with it (it kills them, or the kernel does)."""
        killed = self.replied < self.requested
        if killed:
            # still starting (importing pyarrow) with requests queued: workers that nobody
            # will use must not be forked at all, so don't wait for it to read its stdin
            self.proc.kill()
        if self.proc.stdin is not None:
            try:
                if not killed and not self.proc.stdin.closed:  # goodbye: we live, it must not wait to see us die
                    self.proc.stdin.write(json.dumps({"exit": True}) + "\n")
                    self.proc.stdin.flush()
            except OSError:
                pass
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


HEAVY_MODULES = ("torch", "transformers", "sklearn")
"""Frameworks the zygote imports on request: those the driver imported, once the session's task
workers are forked (they start without them), and those a UDF imported, once no job runs.
Seconds each to import, so never before the task workers are forked. Only frameworks whose
import starts no thread: the zygote forks afterwards, and a child forked while another thread
holds a lock can deadlock (tensorflow and jax are left to each actor)."""


def frameworks_imported() -> tuple[str, ...]:
    """Which of ``HEAVY_MODULES`` this process has imported (actors report them)."""
    return tuple(m for m in HEAVY_MODULES if m in sys.modules)


def _preload() -> None:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    import numpy  # noqa: F401
    import pyarrow
    import pyarrow.dataset  # Parquet reads: 0.27 s and ~25 MB per worker otherwise
    import pyarrow.parquet  # noqa: F401

    # besides the worker: what the tasks of every plan unpickle (the API package, the Parquet
    # reader), imported once here, not on the first task of every worker (~0.12 s each). Not
    # polars: its import starts threads, and a child forked while another thread holds a lock
    # can deadlock
    import connectors.parquet_format  # noqa: F401
    import dataflow  # noqa: F401
    import engine.worker  # noqa: F401


if __name__ == "__main__":
    main()

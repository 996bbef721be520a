"""A zygote process that has already imported pyarrow, numpy and the worker, and forks workers.

A fresh Python that imports pyarrow takes ~0.3 s; a fork of this process takes milliseconds.
The driver talks to it over its stdin/stdout: one JSON line per request ``{"worker_id", "env",
"args"}``, one JSON line back ``{"worker_id", "pid"}``. The driver watches each worker with a
pidfd (``os.pidfd_open``), so a death is seen at once even though workers are the zygote's
children. When the driver goes away (stdin closes) the zygote kills its workers and exits;
if the zygote is killed, its workers get SIGKILL from the kernel (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from typing import IO, Any

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _child(request: dict[str, Any], parent_pid: int) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _die_with_parent()
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


def serve(stdin: IO[str], stdout: IO[str]) -> None:
    """The zygote's loop: fork one worker per request until stdin closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    children: set[int] = set()
    me = os.getpid()
    for line in stdin:
        request = json.loads(line)
        if "preload" in request:
            _import_quietly(request["preload"])
            continue
        pid = os.fork()
        if pid == 0:
            _child(request, me)
        children.add(pid)
        stdout.write(json.dumps({"worker_id": request["worker_id"], "pid": pid}) + "\n")
        stdout.flush()
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    while True:  # with SIGCHLD ignored, wait() returns once every child is gone
        try:
            os.wait()
        except ChildProcessError:
            break


def _import_quietly(modules: list[str]) -> None:
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # the worker will import it (and fail properly) itself
            pass


class ForkServer:
    """The driver's handle on the zygote."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        child_env = dict(os.environ)
        child_env.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine.forkserver"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
            env=child_env,
            cwd=os.getcwd(),
            start_new_session=False,
            preexec_fn=_zygote_preexec,
        )
        assert self.proc.stdout is not None
        self._buffer = ""
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
        self.replied += len(replies)
        return [(r["worker_id"], int(r["pid"])) for r in replies]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """Stop the zygote; its workers go with it (it kills them, or the kernel does)."""
        if self.replied < self.requested:
            # still starting (importing pyarrow) with requests queued: workers that nobody
            # will use must not be forked at all, so don't wait for it to read its stdin
            self.proc.kill()
        if self.proc.stdin is not None:
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
"""Frameworks the zygote imports on request: those the driver imported, before the first actor
is forked, and those an actor's UDF imported, once no job runs. Seconds each to import, rarely
needed by task workers, so never up front. Only frameworks whose import starts no thread: the
zygote forks afterwards, and a child forked while another thread holds a lock can deadlock
(tensorflow and jax are left to each actor)."""


def frameworks_imported() -> tuple[str, ...]:
    """Which of ``HEAVY_MODULES`` this process has imported (actors report them)."""
    return tuple(m for m in HEAVY_MODULES if m in sys.modules)


def _zygote_preexec() -> None:
    _die_with_parent()


def _preload() -> None:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    import numpy  # noqa: F401
    import pyarrow
    import pyarrow.dataset  # Parquet reads: 0.27 s and ~25 MB per worker otherwise
    import pyarrow.parquet  # noqa: F401

    import engine.worker  # noqa: F401


if __name__ == "__main__":
    _preload()
    serve(sys.stdin, sys.stdout)

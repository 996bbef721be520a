"""The engine's one entry point for callers: pick a backend, start and stop it, run operators.

``dataflow`` reaches the engine's running parts only through this module: a ``Backend``
(``engine.backend``: execute, get, free, capacity, busy_cpus, split coordinators, shutdown) for
an execution mode, and the ``ExecutionHandle`` of each execution (iterate refs, read a block,
release it when done, cancel, read statistics). Which backend runs a mode, and how a split
iterator in another process reaches its coordinator, is decided here and nowhere in
``dataflow``:

* ``"streaming"``: the multi-process backend of this machine (``engine.session``), started on
  first use, one per process, stopped by ``shutdown`` (and at exit);
* ``"local"``: the synchronous in-process backend (``engine.local``);
* ``"ray"``: a Ray cluster (``engine.ray_backend``, the only module that imports ray), at the
  address given to ``use_ray`` (``dataflow.init(runner="ray", address=...)``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import pyarrow as pa

from engine.backend import Backend, Capacity, ExecutionHandle, HeldBlocks, SplitSource
from engine.local import InProcessBackend
from engine.object_store import BlockRef
from engine.operators.base import PhysicalOperator
from engine.options import ExecutionOptions
from engine.split import RAY_SPLIT_PREFIX, SplitCoordinator

MODES = ("streaming", "local", "ray")

_ray_address: str | None = os.environ.get("DATAFLOW_RAY_ADDRESS") or None
_ray: Backend | None = None
_ray_lock = threading.Lock()


def use_ray(address: str | None) -> None:
    """Where the ``"ray"`` mode connects: None (a Ray instance already initialized in this
    process, or a new local one), ``"auto"``, or ``"ray://host:10001"``."""
    global _ray_address
    _ray_address = address


def _ray_backend(options: ExecutionOptions | None) -> Backend:
    global _ray
    with _ray_lock:
        if _ray is None or _ray.closed:
            try:
                from engine.ray_backend import RayBackend
            except ImportError as err:
                msg = "the ray runner needs Ray: pip install 'dataflow[ray]'"
                raise ImportError(msg) from err
            _ray = RayBackend(options or ExecutionOptions(), _ray_address)
        return _ray

_in_process: InProcessBackend | None = None
_in_process_lock = threading.Lock()


def _local() -> InProcessBackend:
    global _in_process
    with _in_process_lock:
        if _in_process is None:
            _in_process = InProcessBackend()
        return _in_process


def backend(options: ExecutionOptions | None = None, mode: str = "streaming") -> Backend:
    """The backend that runs ``mode``, started with ``options`` if it is not running yet (the
    settings of a running one stay: ``shutdown`` first to change them)."""
    if mode == "local":
        return _local()
    if mode == "streaming":
        from engine.session import get_session

        return get_session(options)
    if mode == "ray":
        return _ray_backend(options)
    msg = f"execution mode must be one of {MODES}, got {mode!r}"
    raise ValueError(msg)


def init(options: ExecutionOptions, mode: str = "streaming") -> Backend:
    """Start ``mode``'s backend now (otherwise the first execution starts it)."""
    return backend(options, mode)


def current() -> Backend | None:
    """The running backend that holds settings and processes (the multi-process one), if any;
    the in-process backend has neither and is never reported."""
    from engine.session import current_session

    return current_session()


def shutdown() -> None:
    """Stop the running backends' workers and free their blocks (idempotent)."""
    global _ray
    from engine.session import shutdown as stop_session

    stop_session()
    with _ray_lock:
        ray_backend, _ray = _ray, None
    if ray_backend is not None:
        ray_backend.shutdown()


def reclaim_abandoned(spill_dir: str | None = None) -> None:
    """Free what engines of dead processes on this machine left behind (shared-memory and spill
    folders), the first time only in this process: cheap, and called before anything executes
    so a killed driver's blocks do not wait for the next process that starts workers."""
    from engine.session import sweep_dead_sessions_once

    sweep_dead_sessions_once(spill_dir)


def execute(
    ops: list[PhysicalOperator],
    options: ExecutionOptions,
    mode: str = "streaming",
    target: Backend | None = None,
) -> ExecutionHandle:
    """Start running ``ops`` (topologically ordered; the last one is the output) on ``target``,
    or on ``mode``'s backend."""
    if target is None:
        target = backend(options, mode)
    return target.execute(ops, options)


def hold(tables: Sequence[pa.Table], options: ExecutionOptions, mode: str = "streaming") -> tuple[list[BlockRef], HeldBlocks]:
    """``tables`` held as blocks by ``mode``'s backend (``Backend.put``), and what frees them."""
    target = backend(options, mode)
    return target.put(tables), HeldBlocks(target)


def find_split(key: str) -> SplitCoordinator | None:
    """The open ``streaming_split`` coordinator ``key``, when it lives in this process."""
    return SplitCoordinator.find(key)


def split_client(address: str) -> SplitSource:
    """Reach the ``streaming_split`` coordinator at ``address`` from another process: the
    multi-process backend's socket, or the Ray backend's coordinator actor."""
    if address.startswith(RAY_SPLIT_PREFIX):
        from engine.ray_split import RaySplitClient

        return RaySplitClient.connect(address)
    from engine.session import Session

    return Session.split_client(address)


__all__ = [
    "MODES",
    "Backend",
    "Capacity",
    "ExecutionHandle",
    "SplitSource",
    "backend",
    "current",
    "execute",
    "find_split",
    "init",
    "reclaim_abandoned",
    "shutdown",
    "split_client",
]

"""A worker process: receive a task, run it, put its blocks in the store, reply. Repeat.

Workers are forked by ``engine.forkserver`` with pyarrow already imported. Each one caches
its operators' transforms by digest, so a UDF is unpickled, and a callable class constructed,
once per worker. A worker never raises out of a task: failures go back as ``TaskError``.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from engine import protocol, serialization
from engine.forkserver import frameworks_imported
from engine.object_store import SharedMemoryStore
from engine.task import TaskResult, TaskSpec, describe_error, run_task
from engine.transform import TaskTransform, UDFFailure


def main(
    address: str,
    worker_id: str,
    shm_dir: str,
    spill_dir: str,
    env: dict[str, str] | None = None,
    server_public: str | None = None,
    client_keys: tuple[str, str] | None = None,
) -> None:
    """Serve tasks from the driver at ``address`` until told to stop or the driver is gone."""
    import pyarrow as pa
    import zmq

    from engine.transport import connect_worker

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(env or {})
    pa.set_cpu_count(1)
    pa.set_io_thread_count(max(4, pa.io_thread_count()))
    store = SharedMemoryStore(shm_dir, spill_dir, owner=f"{worker_id}.{os.getpid()}")
    transforms: dict[str, TaskTransform] = {}
    reported = set(frameworks_imported())  # what the zygote already has
    ctx = zmq.Context()
    sock = connect_worker(
        ctx,
        address,
        worker_id,
        server_public.encode() if server_public else None,
        (client_keys[0].encode(), client_keys[1].encode()) if client_keys else None,
    )
    try:
        sock.send(protocol.encode(protocol.Ready(worker_id, os.getpid())))
        while True:
            try:
                frames = sock.recv()
            except EOFError:  # the driver is gone
                break
            assert frames is not None
            msg = protocol.decode(frames)
            if isinstance(msg, protocol.Shutdown):
                break
            if isinstance(msg, protocol.RunTask):
                result = _serve_task(msg, transforms, store)
                imported = tuple(m for m in frameworks_imported() if m not in reported)
                reported.update(imported)
                try:
                    sock.send(protocol.encode(protocol.TaskDone(result, imported)))
                except (BrokenPipeError, ConnectionResetError):  # the driver is gone
                    break
    finally:
        sock.close()
        ctx.term()


def _serve_task(msg: protocol.RunTask, transforms: dict[str, TaskTransform], store: SharedMemoryStore) -> TaskResult:
    for entry in msg.sys_path or ():
        if entry not in sys.path:
            sys.path.append(entry)
    # BaseException: SystemExit too (a user module that parses sys.argv when it is imported);
    # this process ignores SIGINT, so a KeyboardInterrupt here is user code's as well
    try:
        spec: TaskSpec = serialization.loads(msg.spec)
    except BaseException as err:  # a read task or input from a module this worker cannot import
        return TaskResult(msg.task_id, error=describe_error(UDFFailure("deserializing the task's inputs", err)))
    transform = transforms.get(spec.transform_digest)
    if transform is None:
        try:
            if msg.transform is None:
                err = RuntimeError(f"worker has no transform {spec.transform_digest} and none was sent")
                return TaskResult(spec.task_id, error=describe_error(err))
            transform = load_transform(msg.transform)
        except BaseException as err:
            return TaskResult(spec.task_id, error=describe_error(UDFFailure("deserializing the UDF", err)))
        transforms[spec.transform_digest] = transform
    store.spares = list(spec.spare_files)
    try:
        return run_task(spec, transform, store)
    finally:
        store.spares = []  # the driver takes back the ones left


def load_transform(data: bytes) -> TaskTransform:
    transform: Any = serialization.loads(data)
    if not isinstance(transform, TaskTransform):
        msg = f"expected a TaskTransform, got {type(transform).__name__}"
        raise TypeError(msg)
    return transform

"""The wire protocol between the driver and workers: typed messages, one version, one module.

Every message is a list of frames: a 4-byte header (magic ``DF``, protocol version, kind) and
one pickled body. A task is the exception: its id and the driver's ``sys.path`` travel as JSON
after the header's 4 bytes, before the pickled spec, so a worker can set the path and then unpickle the spec itself
(a spec that does not unpickle is then that task's error, not the worker's death); the first
time a worker sees an operator the task also carries its transform (afterwards the worker has
it cached by digest). The header is checked before anything is unpickled. Frames are the only
thing ``transport`` moves.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from engine import serialization

VERSION = 4
MAGIC = b"DF"


class ProtocolError(Exception):
    """A peer spoke another protocol or version."""


class BadBody(ProtocolError):
    """The header is ours but the body does not unpickle (``__cause__`` says why) or is not
    the message its header names."""


@dataclass
class Ready:
    """Worker -> driver: started and waiting for tasks."""

    worker_id: str
    pid: int


@dataclass
class RunTask:
    """Driver -> worker: run ``spec`` with the transform identified by ``spec.transform_digest``."""

    spec: Any
    """A TaskSpec; as decoded, its pickled bytes (the worker unpickles them after setting
    ``sys_path``)."""
    transform: bytes | None = None
    """The pickled transform, sent only if the worker does not have it yet."""
    sys_path: list[str] | None = None
    """The driver's ``sys.path``, sent with the transform, so UDFs and read tasks defined in
    modules the driver can import (a script's folder, a test folder) unpickle in the worker too."""
    task_id: int = 0
    """``spec.task_id``, readable without unpickling the spec."""


@dataclass
class TaskDone:
    """Worker -> driver: a finished task, successful or not (``result.error``)."""

    result: Any
    imported: tuple[str, ...] = ()
    """Frameworks (``forkserver.HEAVY_MODULES``) the worker imported since its last
    report, for the zygote to import before forking more workers."""


@dataclass
class Shutdown:
    """Driver -> worker: exit now."""


@dataclass
class SplitNext:
    """Split iterator -> coordinator: the next piece of ``epoch`` for ``split``."""

    split: int
    epoch: int
    seq: int = 0
    """The client's number for this request, echoed in the reply and in every keepalive for it."""
    pid: int = 0
    """The client's process (the coordinator's server watches it: a rank that died lets go)."""


@dataclass
class SplitRelease:
    """Split iterator -> coordinator: done with ``piece``."""

    piece: Any


@dataclass
class SplitAbandon:
    """Split iterator -> coordinator: stopped reading ``epoch`` early."""

    split: int
    epoch: int


@dataclass
class SplitReply:
    """Coordinator -> split iterator: a piece, None at the end, or the execution's error."""

    piece: Any = None
    error: Any = None
    busy_cpus: float = 0.0
    """CPUs the engine's workers were using when the piece was dealt."""
    seq: int = 0
    """The ``SplitNext.seq`` this answers."""


@dataclass
class SplitWaiting:
    """Coordinator -> split iterator: request ``seq`` is parked (no piece to give yet) and the
    coordinator is alive. Sent every ``split_server.KEEPALIVE_S`` while the request waits, so a
    long wait for a slow pipeline is not mistaken for a dead coordinator."""

    seq: int


_KINDS: dict[type, int] = {
    Ready: 1,
    RunTask: 2,
    TaskDone: 3,
    Shutdown: 5,
    SplitNext: 6,
    SplitRelease: 7,
    SplitReply: 8,
    SplitAbandon: 9,
    SplitWaiting: 10,
}
_TYPES = {v: k for k, v in _KINDS.items()}


def encode(msg: Any) -> list[bytes]:
    """Frames for ``msg``."""
    header = MAGIC + bytes((VERSION, _KINDS[type(msg)]))
    if isinstance(msg, RunTask):
        # the task id alone as digits (most tasks); JSON when sys.path rides along
        meta = (json.dumps({"task_id": msg.spec.task_id, "sys_path": msg.sys_path}).encode()
                if msg.sys_path is not None else b"%d" % msg.spec.task_id)
        frames = [header + meta, serialization.dumps_for_worker(msg.spec)]
        if msg.transform is not None:
            frames.append(msg.transform)
        return frames
    if isinstance(msg, TaskDone):  # worker -> driver: plain data, the fast pickler
        return [header, serialization.dumps_data(msg)]
    return [header, serialization.dumps(msg)]


def kind_of(frames: list[bytes] | list[Any]) -> type | None:
    """The message class ``frames``' header names, or None when it names none (nothing is
    unpickled)."""
    if not frames or len(frames[0]) < 4 or bytes(frames[0][:2]) != MAGIC or frames[0][2] != VERSION:
        return None
    return _TYPES.get(frames[0][3])


def decode(frames: list[bytes] | list[Any]) -> Any:
    """The message in ``frames``; raises ProtocolError before unpickling anything unexpected."""
    if not frames or len(frames[0]) < 4 or bytes(frames[0][:2]) != MAGIC:
        msg = "not a dataflow message (bad header frame)"
        raise ProtocolError(msg)
    version, kind = frames[0][2], frames[0][3]
    if version != VERSION:
        msg = f"protocol version {version} from peer, this process speaks {VERSION}"
        raise ProtocolError(msg)
    cls = _TYPES.get(kind)
    if cls is None:
        msg = f"unknown message kind {kind}"
        raise ProtocolError(msg)
    if cls is RunTask:  # the header frame carries the task's id and sys.path after its 4 bytes
        if len(frames) not in (2, 3):
            msg = f"a task has 2 or 3 frames, got {len(frames)}"
            raise ProtocolError(msg)
        try:
            raw = bytes(frames[0][4:])
            if raw.isdigit():
                task_id, sys_path = int(raw), None
            else:
                meta = json.loads(raw)
                task_id, sys_path = int(meta["task_id"]), meta["sys_path"]
        except (ValueError, KeyError, TypeError) as err:
            msg = f"a task's metadata is not valid: {err}"
            raise ProtocolError(msg) from err
        transform = bytes(frames[2]) if len(frames) > 2 else None
        return RunTask(bytes(frames[1]), transform, sys_path, task_id)
    if len(frames[0]) != 4:
        msg = "not a dataflow message (bad header frame)"
        raise ProtocolError(msg)
    if len(frames) != 2:
        msg = f"a {cls.__name__} has 2 frames, got {len(frames)}"
        raise ProtocolError(msg)
    try:
        body = serialization.loads(frames[1])
    except BaseException as err:  # (SystemExit too: a user object's __setstate__ may raise anything)
        msg = f"a {cls.__name__} body that does not unpickle: {err!r}"
        raise BadBody(msg) from err
    if not isinstance(body, cls):
        msg = f"header says {cls.__name__}, body is {type(body).__name__}"
        raise BadBody(msg)
    return body

"""The wire protocol between the driver and workers: typed messages, one version, one module.

Every message is a list of frames: a 4-byte header (magic ``DF``, protocol version, kind) and
one pickled body; a task also carries its operator's transform as a third frame the first time
a worker sees it (afterwards the worker has it cached by digest). The header is checked before
anything is unpickled. Frames are the only thing ``transport`` moves.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from engine import serialization

VERSION = 1
MAGIC = b"DF"


class ProtocolError(Exception):
    """A peer spoke another protocol or version."""


@dataclass
class Ready:
    """Worker -> driver: started and waiting for tasks."""

    worker_id: str
    pid: int


@dataclass
class RunTask:
    """Driver -> worker: run ``spec`` with the transform identified by ``spec.transform_digest``."""

    spec: Any
    transform: bytes | None = None
    """The pickled transform, sent only if the worker does not have it yet."""
    sys_path: list[str] | None = None
    """The driver's ``sys.path``, sent with the transform, so UDFs defined in modules the driver
    can import (a script's folder, a test folder) unpickle in the worker too."""


@dataclass
class TaskDone:
    """Worker -> driver: a finished task, successful or not (``result.error``)."""

    result: Any
    imported: tuple[str, ...] = ()
    """Frameworks (``forkserver.FRAMEWORKS``) the worker imported since its last
    report, for the zygote to import before forking more workers."""


@dataclass
class Heartbeat:
    """Either way: I am alive (used on tcp links, where there is no pidfd to watch)."""

    worker_id: str


@dataclass
class Shutdown:
    """Driver -> worker: exit now."""


@dataclass
class SplitNext:
    """Split iterator -> coordinator: the next piece of ``epoch`` for ``split``."""

    split: int
    epoch: int


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


_KINDS: dict[type, int] = {
    Ready: 1,
    RunTask: 2,
    TaskDone: 3,
    Heartbeat: 4,
    Shutdown: 5,
    SplitNext: 6,
    SplitRelease: 7,
    SplitReply: 8,
    SplitAbandon: 9,
}
_TYPES = {v: k for k, v in _KINDS.items()}


def encode(msg: Any) -> list[bytes]:
    """Frames for ``msg``."""
    header = MAGIC + bytes((VERSION, _KINDS[type(msg)]))
    if isinstance(msg, RunTask):
        frames = [header, serialization.dumps(msg.spec)]
        if msg.transform is not None:
            frames += [msg.transform, json.dumps(msg.sys_path or []).encode()]
        return frames
    return [header, serialization.dumps(msg)]


def decode(frames: list[bytes] | list[Any]) -> Any:
    """The message in ``frames``; raises ProtocolError before unpickling anything unexpected."""
    if not frames or len(frames[0]) != 4 or bytes(frames[0][:2]) != MAGIC:
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
    if cls is RunTask:
        spec = serialization.loads(frames[1])
        transform = bytes(frames[2]) if len(frames) > 2 else None
        sys_path = json.loads(bytes(frames[3])) if len(frames) > 3 else None
        return RunTask(spec, transform, sys_path)
    return serialization.loads(frames[1])

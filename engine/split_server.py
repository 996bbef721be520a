"""The socket side of streaming_split: split iterators in other processes (training ranks)
ask the coordinator for pieces over a ROUTER socket in the session's 0700 folder.

A request that cannot be answered yet is parked and answered when the coordinator's state
changes (the pump or a release writes to a wake-up pipe). While a request is parked, its
client gets a ``SplitWaiting`` keepalive every ``KEEPALIVE_S``: a client that hears nothing for
``LIVENESS_S`` knows the coordinator is gone (its process died or stopped answering) and
raises ``SplitCoordinatorLostError``, while a long wait for a slow pipeline never times out
(the ZeroMQ guide's "Paranoid Pirate" heartbeating, one way).

Whatever arrives on the socket is decoded and handled inside ``try``: a frame that is not a
well-formed split request (a bad header, a body that does not unpickle, an unknown kind, an
unknown split) is dropped, counted (``SplitServer.statistics``) and logged once per kind, and
the server goes on serving. An exception in the coordinator while answering a request goes
back to that client as an error reply, which it raises.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import threading
import time
import traceback
from collections import Counter
from typing import Any

import zmq

from engine import protocol, serialization
from engine.errors import DataflowError, SplitCoordinatorLostError
from engine.forkserver import stat_fields
from engine.object_store import BlockRef
from engine.split import WAIT, Piece
from engine.wakeup import WakeupPipe

log = logging.getLogger("dataflow.split")

KEEPALIVE_S = 1.0
"""How often the server tells the client of each parked request that it is still there."""
LIVENESS_S = 5.0
"""How long a client waits without a word from the coordinator before it declares it gone:
five keepalives missed in a row, so a driver busy for a moment (GIL, GC) is not taken for dead,
while a rank still learns of a dead driver within seconds."""
MAX_REQUEST_BYTES = 1 << 20
"""A larger inbound message gets its sender disconnected (requests are a few hundred bytes)."""
_MAX_BATCH = 1000
"""Requests read per turn of the loop, so keepalives are sent on time under a flood."""
_MAX_LOOP_FAILURES = 100
"""Failures of the serving loop itself in a row after which the server gives up."""


def _start_time(pid: int) -> bytes | None:
    """When process ``pid`` started (``/proc/<pid>/stat``'s field 22), or None if it is gone
    (a zombie included: killed, not yet reaped)."""
    fields = stat_fields(pid)
    if fields is None or len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    return fields[19]


def _same_process_alive(pid: int, started: bytes) -> bool:
    """Process ``pid`` runs, and is the one first seen (not a later one given the same pid)."""
    return _start_time(pid) == started


def _take(held: Counter[Piece], piece: Piece) -> None:
    held[piece] -= 1
    if held[piece] <= 0:
        del held[piece]


def _is_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_piece(value: Any) -> bool:
    if not isinstance(value, Piece) or not isinstance(value.ref, BlockRef):
        return False
    return isinstance(value.ref.block_id, str) and _is_index(value.offset) and _is_index(value.length)


def _portable(err: BaseException) -> BaseException:
    """``err`` if it survives pickling, else a DataflowError carrying its text and traceback."""
    if serialization.dumps_exception(err, by_state=False) is not None:  # (sent as itself, below)
        return err
    text = "".join(traceback.format_exception(err)).rstrip()
    return DataflowError(f"the streaming_split coordinator failed: {type(err).__name__}: {err}\n\n{text}")


class SplitServer:
    """Serves ``coordinator`` at ``address`` on its own thread until ``close``."""

    def __init__(self, coordinator: Any, address: str) -> None:
        self._coordinator = coordinator
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a reply to a departed client fails, not vanishes
        self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST_BYTES)
        self._sock.bind(address)
        self.address = address
        self._wakeup = WakeupPipe()
        self._parked: list[tuple[bytes, protocol.SplitNext]] = []
        self._outstanding: dict[bytes, Counter[Piece]] = {}
        """Pieces dealt to each client and not released yet: a release of anything else is dropped."""
        self._reading: dict[bytes, set[int]] = {}
        """The splits each client has asked for: its departure lets them go."""
        self._processes: dict[bytes, tuple[int, bytes]] = {}
        """Each client's process (pid, start time), checked every ``KEEPALIVE_S``: clients share
        this machine (the socket is an ipc path), and one whose process is gone has departed."""
        self._next_check = time.monotonic() + KEEPALIVE_S
        self._next_keepalive = time.monotonic()
        self._stats_lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._dropped: Counter[str] = Counter()
        self._warned: set[str] = set()
        self._serving = True
        self._stop = False
        self._thread = threading.Thread(target=self._serve, name="dataflow-split-server", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wakeup.wake()

    def statistics(self) -> dict[str, Any]:
        """What the server has done: requests served, frames dropped (by kind), keepalives sent."""
        with self._stats_lock:
            return {
                "serving": self._serving and self._thread.is_alive(),
                "served": self._counts["served"],
                "error_replies": self._counts["error_replies"],
                "keepalives": self._counts["keepalives"],
                "departed": self._counts["departed"],
                "parked": len(self._parked),
                "dropped": sum(self._dropped.values()),
                "dropped_by_kind": dict(self._dropped),
            }

    # the loop ------------------------------------------------------------------------------
    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wakeup.fileno, zmq.POLLIN)
        reason = f"the streaming_split coordinator at {self.address} was closed (the driver shut down)"
        failures = 0
        try:
            while not self._stop:
                try:
                    self._turn(poller)
                    failures = 0
                except Exception as err:  # a bug here must not leave every rank waiting
                    failures += 1
                    self._drop("serving loop error", f"{type(err).__name__}: {err}")
                    if failures >= _MAX_LOOP_FAILURES:
                        raise
        except BaseException as err:
            log.error("the streaming_split server at %s stopped: %s", self.address, err, exc_info=True)
            reason = (
                f"the streaming_split coordinator at {self.address} stopped serving after an internal "
                f"error ({type(err).__name__}: {err}); this is a bug in dataflow, please report it"
            )
        finally:
            with self._stats_lock:
                self._serving = False
            self._fail_parked(reason)
            self._sock.close(linger=200)  # long enough for those last replies to go out
            self._ctx.term()
            self._wakeup.close()

    def _turn(self, poller: zmq.Poller) -> None:
        timeout = max(0.0, self._next_keepalive - time.monotonic()) if self._parked else KEEPALIVE_S
        events = dict(poller.poll(math.ceil(timeout * 1000)))
        if self._wakeup.fileno in events:
            self._wakeup.drain()
        if self._sock in events:
            for _ in range(_MAX_BATCH):
                try:
                    parts = self._sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._receive(parts)
        self._retry_parked()
        if self._parked and time.monotonic() >= self._next_keepalive:
            self._send_keepalives()
            self._next_keepalive = time.monotonic() + KEEPALIVE_S
        if self._processes and time.monotonic() >= self._next_check:
            self._next_check = time.monotonic() + KEEPALIVE_S
            for ident, process in list(self._processes.items()):
                if not _same_process_alive(*process):
                    self._client_gone(ident)

    def _receive(self, parts: list[bytes]) -> None:
        if len(parts) < 2:
            self._drop("empty message", f"{len(parts)} frames")
            return
        ident, frames = parts[0], parts[1:]
        try:
            msg = protocol.decode(frames)
        except protocol.BadBody as err:
            kind = "undecodable body" if err.__cause__ is not None else "body does not match its header"
            self._drop(kind, str(err))
            return
        except protocol.ProtocolError as err:
            self._drop("bad header", str(err))
            return
        except BaseException as err:  # unpickling junk can raise anything at all
            self._drop("undecodable body", f"{type(err).__name__}: {err}")
            return
        if protocol._KINDS.get(type(msg)) != frames[0][3]:  # decode checked the header, not the body
            self._drop("body does not match its header", f"{type(msg).__name__} under kind {frames[0][3]}")
            return
        try:
            self._handle(ident, msg)
        except Exception as err:
            self._drop("request failed", f"{type(msg).__name__}: {type(err).__name__}: {err}")

    def _drop(self, kind: str, detail: str) -> None:
        with self._stats_lock:
            self._dropped[kind] += 1
            first = kind not in self._warned
            self._warned.add(kind)
        if first:
            log.warning(
                "streaming_split server at %s dropped a message (%s: %s); further ones of this kind are "
                "counted in statistics() but not logged",
                self.address,
                kind,
                detail[:300],
            )

    def _count(self, what: str) -> None:
        with self._stats_lock:
            self._counts[what] += 1

    # requests ------------------------------------------------------------------------------
    def _handle(self, ident: bytes, msg: Any) -> None:
        if isinstance(msg, protocol.SplitNext):
            problem = self._check(msg.split, msg.epoch)
            if problem is None and not _is_index(msg.seq):
                problem = f"bad request number {msg.seq!r}"
            if problem is not None:
                self._drop("bad split request", problem)
                if _is_index(msg.seq):  # the sender waits for an answer: tell it what is wrong
                    self._send(ident, protocol.SplitReply(error=ValueError(problem), seq=msg.seq))
                return
            self._coordinator.note_remote_client()
            self._reading.setdefault(ident, set()).add(msg.split)
            if ident not in self._processes and _is_index(msg.pid) and msg.pid:
                started = _start_time(msg.pid)
                if started is not None:
                    self._processes[ident] = (msg.pid, started)
            if not self._answer(ident, msg):
                if not self._parked:
                    self._next_keepalive = time.monotonic() + KEEPALIVE_S
                self._parked.append((ident, msg))
        elif isinstance(msg, protocol.SplitRelease):
            piece = msg.piece
            held = self._outstanding.get(ident)
            if not _is_piece(piece) or held is None or held[piece] <= 0:  # (a Counter lookup adds nothing)
                self._drop("release of an unknown piece", repr(piece)[:200])
                return
            _take(held, piece)
            self._coordinator.release(piece)
            self._retry_parked()
        elif isinstance(msg, protocol.SplitAbandon):
            problem = self._check(msg.split, msg.epoch)
            if problem is not None:
                self._drop("bad split request", problem)
                return
            self._coordinator.abandon(msg.split, msg.epoch)
            self._retry_parked()
        else:
            self._drop("unexpected message kind", type(msg).__name__)

    def _check(self, split: Any, epoch: Any) -> str | None:
        n = self._coordinator.n
        if not _is_index(split) or split >= n:
            return f"unknown split {split!r} (this streaming_split has splits 0..{n - 1})"
        if not _is_index(epoch):
            return f"bad epoch {epoch!r}"
        return None

    def _answer(self, ident: bytes, msg: protocol.SplitNext) -> bool:
        """Reply to ``msg`` if there is an answer (a piece, the end, an error); False to park it."""
        try:
            result = self._coordinator.try_next(msg.split, msg.epoch)
            if isinstance(result, str) and result == WAIT:
                return False
            piece = result if isinstance(result, Piece) else None
            reply = protocol.SplitReply(piece=piece, busy_cpus=self._busy_cpus(), seq=msg.seq)
        except BaseException as err:  # the execution's error, or the coordinator's: the client raises it
            self._count("error_replies")
            self._send(ident, protocol.SplitReply(error=_portable(err), seq=msg.seq))
            return True
        if piece is not None:
            self._outstanding.setdefault(ident, Counter())[piece] += 1
        if self._send(ident, reply):
            self._count("served")
        elif piece is not None:  # nobody to take it: give it back so its block is freed
            _take(self._outstanding[ident], piece)
            self._coordinator.release(piece)
        return True

    def _client_gone(self, ident: bytes) -> None:
        """A client's process exited or was killed: what it held is released, the splits it
        read are let go (with ``equal=True`` the other splits would wait for their share for
        ever), and its parked requests are dropped."""
        self._processes.pop(ident, None)
        splits, held = self._reading.pop(ident, None), self._outstanding.pop(ident, None)
        self._count("departed")
        self._parked = [(i, m) for i, m in self._parked if i != ident]
        for piece, count in (held or Counter()).items():
            for _ in range(count):
                self._coordinator.release(piece)
        for split in sorted(splits or ()):
            self._coordinator.depart(split)
        self._retry_parked()

    def _busy_cpus(self) -> float:
        try:
            return float(self._coordinator.busy_cpus())
        except Exception:
            return 0.0

    def _send(self, ident: bytes, msg: Any) -> bool:
        """Send ``msg`` to client ``ident``; False (and counted) if it cannot be delivered."""
        try:
            frames = protocol.encode(msg)
        except Exception as err:
            if not isinstance(msg, protocol.SplitReply) or msg.error is None:
                raise
            fallback = DataflowError(f"the streaming_split coordinator failed: {msg.error!r} ({err})")
            frames = protocol.encode(protocol.SplitReply(error=fallback, seq=msg.seq))
        try:
            self._sock.send_multipart([ident, *frames], zmq.NOBLOCK)
        except zmq.ZMQError as err:  # EHOSTUNREACH: the client is gone; EAGAIN: it reads nothing
            self._drop("reply to a departed client", f"{ident!r}: {err}")
            return False
        return True

    def _retry_parked(self) -> None:
        parked, self._parked = self._parked, []
        for i, (ident, msg) in enumerate(parked):
            try:
                answered = self._answer(ident, msg)
            except Exception:
                self._parked.extend(parked[i:])  # _turn counts the error; the rest stay parked
                raise
            if not answered:
                self._parked.append((ident, msg))

    def _send_keepalives(self) -> None:
        parked, self._parked = self._parked, []
        for ident, msg in parked:
            if self._send(ident, protocol.SplitWaiting(msg.seq)):
                self._count("keepalives")
                self._parked.append((ident, msg))

    def _fail_parked(self, reason: str) -> None:
        parked, self._parked = self._parked, []
        for ident, msg in parked:
            try:
                self._send(ident, protocol.SplitReply(error=SplitCoordinatorLostError(reason), seq=msg.seq))
            except Exception:
                pass

    def close(self) -> None:
        self._stop = True
        self.wake()
        self._thread.join(5)


class SplitClient:
    """A split iterator's connection from another process (one thread at a time).

    Every wait is bounded: if the coordinator says nothing for ``liveness_s`` (default
    ``LIVENESS_S``) while a request is outstanding, ``next`` raises
    ``SplitCoordinatorLostError``, and so does every later call.
    """

    def __init__(self, address: str, liveness_s: float | None = None) -> None:
        self.address = address
        self._liveness_s = liveness_s
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 1000)
        self._sock.connect(address)
        self._busy_cpus = 0.0
        self._seq = itertools.count(1)
        self._lost: str | None = None

    def next(self, split: int, epoch: int) -> Piece | None:
        """The next piece of ``epoch`` for ``split``, None at its end; waits as long as the
        coordinator keeps saying it is alive."""
        if self._lost is not None:
            raise SplitCoordinatorLostError(self._lost)
        seq = next(self._seq)
        window = self._liveness_s if self._liveness_s is not None else LIVENESS_S
        try:
            self._sock.send_multipart(protocol.encode(protocol.SplitNext(split, epoch, seq, os.getpid())), zmq.NOBLOCK)
        except zmq.Again:
            raise self._lose("its requests are not being read") from None
        deadline = time.monotonic() + window
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._lose(f"it has not answered for {window:g} s")
            if not self._sock.poll(math.ceil(remaining * 1000), zmq.POLLIN):
                continue
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                continue
            try:
                msg = protocol.decode(frames)
            except Exception as err:
                text = f"a reply from the streaming_split coordinator at {self.address} could not be decoded: {err}"
                raise DataflowError(text) from err
            deadline = time.monotonic() + window  # it spoke: it is alive
            if isinstance(msg, protocol.SplitWaiting) or not isinstance(msg, protocol.SplitReply):
                continue
            if msg.seq != seq:  # the answer to a request abandoned by an interrupted call
                if msg.piece is not None and msg.error is None:
                    self.release(msg.piece)
                continue
            if msg.error is not None:
                if isinstance(msg.error, SplitCoordinatorLostError):
                    self._lost = str(msg.error)
                raise msg.error
            self._busy_cpus = msg.busy_cpus
            return msg.piece  # type: ignore[no-any-return]

    def _lose(self, why: str) -> SplitCoordinatorLostError:
        self._lost = (
            f"lost the streaming_split coordinator at {self.address}: {why}. The driver process that "
            "called streaming_split (it hosts the coordinator) has died, shut down or hung; this split "
            "iterator cannot go on"
        )
        return SplitCoordinatorLostError(self._lost)

    def busy_cpus(self) -> float:
        """What the coordinator said with its last piece."""
        return self._busy_cpus

    def release(self, piece: Piece) -> None:
        self._post(protocol.SplitRelease(piece))

    def abandon(self, split: int, epoch: int) -> None:
        self._post(protocol.SplitAbandon(split, epoch))

    def _post(self, msg: Any) -> None:
        """Send a message that has no reply; nothing to do once the coordinator is lost."""
        if self._lost is not None:
            return
        try:
            self._sock.send_multipart(protocol.encode(msg), zmq.NOBLOCK)
        except zmq.Again:
            log.warning(
                "streaming_split coordinator at %s is not reading; %s not sent", self.address, type(msg).__name__
            )

    def close(self) -> None:
        self._sock.close(linger=0 if self._lost is not None else 1000)
        self._ctx.term()

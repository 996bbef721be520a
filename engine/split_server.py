"""The socket side of streaming_split: split iterators in other processes (training ranks)
ask the coordinator for pieces over a ROUTER socket in the session's 0700 folder.

A request that cannot be answered yet is parked and answered when the coordinator's state
changes (the pump or a release writes to a wake-up pipe); nothing polls on a timer.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import zmq

from engine import protocol
from engine.split import WAIT, Piece


class SplitServer:
    def __init__(self, coordinator: Any, address: str) -> None:
        self._coordinator = coordinator
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(address)
        self.address = address
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._parked: list[tuple[bytes, protocol.SplitNext]] = []
        self._stop = False
        self._thread = threading.Thread(target=self._serve, name="dataflow-split-server", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        try:
            while not self._stop:
                events = dict(poller.poll())
                if self._wake_r in events:
                    try:
                        while os.read(self._wake_r, 4096):
                            pass
                    except BlockingIOError:
                        pass
                if self._sock in events:
                    while True:
                        try:
                            ident, *frames = self._sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._handle(ident, protocol.decode(frames))
                self._retry_parked()
        finally:
            self._sock.close(linger=0)
            self._ctx.term()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _handle(self, ident: bytes, msg: Any) -> None:
        if isinstance(msg, protocol.SplitRelease):
            self._coordinator.release(msg.piece)
            self._retry_parked()
        elif isinstance(msg, protocol.SplitAbandon):
            self._coordinator.abandon(msg.split, msg.epoch)
            self._retry_parked()
        elif isinstance(msg, protocol.SplitNext):
            if not self._answer(ident, msg):
                self._parked.append((ident, msg))

    def _answer(self, ident: bytes, msg: protocol.SplitNext) -> bool:
        try:
            result = self._coordinator.try_next(msg.split, msg.epoch)
        except BaseException as err:
            reply = protocol.SplitReply(error=err)
        else:
            if result == WAIT:
                return False
            piece = result if isinstance(result, Piece) else None
            reply = protocol.SplitReply(piece=piece, busy_cpus=self._coordinator.busy_cpus())
        self._sock.send_multipart([ident, *protocol.encode(reply)])
        return True

    def _retry_parked(self) -> None:
        parked, self._parked = self._parked, []
        for ident, msg in parked:
            if not self._answer(ident, msg):
                self._parked.append((ident, msg))

    def close(self) -> None:
        self._stop = True
        self.wake()
        self._thread.join(5)


class SplitClient:
    """A split iterator's connection from another process."""

    def __init__(self, address: str) -> None:
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 1000)
        self._sock.connect(address)
        self._busy_cpus = 0.0

    def next(self, split: int, epoch: int) -> Piece | None:
        self._sock.send_multipart(protocol.encode(protocol.SplitNext(split, epoch)))
        reply: protocol.SplitReply = protocol.decode(self._sock.recv_multipart())
        if reply.error is not None:
            raise reply.error
        self._busy_cpus = reply.busy_cpus
        return reply.piece  # type: ignore[no-any-return]

    def busy_cpus(self) -> float:
        """What the coordinator said with its last piece."""
        return self._busy_cpus

    def release(self, piece: Piece) -> None:
        self._sock.send_multipart(protocol.encode(protocol.SplitRelease(piece)))

    def abandon(self, split: int, epoch: int) -> None:
        self._sock.send_multipart(protocol.encode(protocol.SplitAbandon(split, epoch)))

    def close(self) -> None:
        self._sock.close()
        self._ctx.term()

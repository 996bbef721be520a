"""The sockets between the driver and its workers: messages are lists of byte frames.

Local workers (the default) connect to a Unix stream socket inside the session's 0700 folder
(only the session's user can connect): ``StreamDriverSocket`` / ``StreamWorkerSocket``, one
connection per worker, no I/O thread. A message is one ``sendmsg(2)`` that wakes the reader
directly; a zmq round trip through both sides' I/O threads costs ~3.5x the CPU (measured here:
123 against 33 µs per round trip, both processes together), and with tasks of a few hundred
µs that was a quarter of each task's cost.

Remote workers use ``tcp://`` with CurveZMQ (``DriverSocket`` / ``WorkerSocket``): the
driver's ROUTER is a CURVE server and a ZAP handler admits only the client keys it was given;
it binds to 127.0.0.1 unless told otherwise. Sockets set LINGER, a maximum message size and
ROUTER_MANDATORY explicitly.

Both driver sockets speak to the executor's loop the same way: ``register`` their descriptors
in its poller, ``receive(events)`` yields ``(worker id, frames)`` or a ``Dropped`` reason for
what could not be read (never raises), ``send`` raises ``PeerUnreachable`` for a worker that is
not (or no longer) connected.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import zmq

MAX_MESSAGE_BYTES = 256 << 20
STREAM_SCHEME = "unix://"
HELLO = b"DFHELLO1"
"""A stream connection's first message: ``[HELLO, worker id]``."""
_COUNT = struct.Struct("<I")
_LENGTH = struct.Struct("<Q")
MAX_FRAMES = 16
_READ_BYTES = 1 << 18
_POLLIN, _POLLOUT = int(zmq.POLLIN), int(zmq.POLLOUT)
_POLLIN_OR_ERR = _POLLIN | int(zmq.POLLERR)
"""As plain ints: pyzmq's are ``IntFlag`` members, and each ``&`` or ``|`` on one runs
``enum``'s Python code (~1 us), several times a message in the loop."""


class PeerUnreachable(Exception):
    """The worker a message is for is not connected (not yet, or no longer)."""


@dataclass(frozen=True)
class Dropped:
    """Something a peer sent that is not a message (counted and dropped by the loop)."""

    reason: str


@dataclass(frozen=True)
class CurveKeys:
    """Key material for tcp links: the server's pair and the client pairs it admits."""

    server_public: bytes
    server_secret: bytes
    clients: dict[bytes, bytes] = field(default_factory=dict)
    """client public key -> client secret key (the secret goes to that worker only)."""

    @staticmethod
    def generate(n_clients: int = 1) -> CurveKeys:
        server_public, server_secret = zmq.curve_keypair()
        clients = dict(zmq.curve_keypair() for _ in range(n_clients))
        return CurveKeys(server_public, server_secret, clients)


class DriverSocket:
    """The driver's ROUTER: send to a worker by id, receive (worker id, frames)."""

    def __init__(self, ctx: zmq.Context[Any], address: str, curve: CurveKeys | None = None) -> None:
        self._auth: Any = None
        if address.startswith("tcp://") and curve is None:
            msg = "tcp sockets need CurveZMQ keys (pass curve=CurveKeys.generate())"
            raise ValueError(msg)
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        if curve is not None and address.startswith("tcp://"):
            from zmq.auth.thread import ThreadAuthenticator

            self._auth = ThreadAuthenticator(ctx)
            self._auth.start()
            self._allowed = _KeyAllowList(set(curve.clients))
            self._auth.configure_curve_callback("*", self._allowed)
            self.sock.curve_server = True
            self.sock.curve_secretkey = curve.server_secret
            self.sock.curve_publickey = curve.server_public
        if address.endswith(":0"):
            port = self.sock.bind_to_random_port(address.rsplit(":", 1)[0])
            address = f"{address.rsplit(':', 1)[0]}:{port}"
        else:
            self.sock.bind(address)
        self.address = address

    def admit(self, public_key: bytes) -> None:
        """Let the holder of ``public_key`` connect (tcp only)."""
        self._allowed.allowed.add(public_key)

    def send(self, worker_id: str, frames: list[bytes]) -> None:
        try:
            self.sock.send_multipart([worker_id.encode(), *frames], copy=_copy(frames))
        except zmq.ZMQError as err:
            raise PeerUnreachable(f"worker {worker_id}: {err}") from err

    def recv(self) -> tuple[str, list[bytes]]:
        """One message, without blocking (call when the poller says the socket is readable)."""
        ident, *frames = self.sock.recv_multipart(zmq.NOBLOCK)
        return ident.decode(), frames

    def register(self, poller: zmq.Poller) -> None:
        poller.register(self.sock, zmq.POLLIN)

    def receive(self, events: dict[Any, int]) -> Iterator[tuple[str, list[bytes]] | Dropped]:
        """Every message waiting, when ``events`` says the socket is readable."""
        if self.sock not in events:
            return
        while True:
            try:
                yield self.recv()
            except zmq.Again:
                return
            except Exception as err:  # a peer with an identity that is not ours (not text)
                yield Dropped(f"unreadable message: {err!r}")

    def close(self) -> None:
        self.sock.close(linger=0)
        if self._auth is not None:
            self._auth.stop()


ZERO_COPY_BYTES = 64 << 10
"""Frames at least this big go zero-copy; smaller ones are copied (cheaper for libzmq)."""


def _copy(frames: list[bytes]) -> bool:
    return all(len(f) < ZERO_COPY_BYTES for f in frames)


class _KeyAllowList:
    def __init__(self, allowed: set[bytes]) -> None:
        self.allowed = allowed

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self.allowed


class WorkerSocket:
    """A worker's DEALER, with its id as the socket identity."""

    def __init__(
        self,
        ctx: zmq.Context[Any],
        address: str,
        worker_id: str,
        server_public: bytes | None = None,
        client_keys: tuple[bytes, bytes] | None = None,
    ) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 1000)
        self.sock.setsockopt(zmq.IDENTITY, worker_id.encode())
        self.sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        if address.startswith("tcp://"):
            if server_public is None or client_keys is None:
                msg = "tcp links need the server's public key and this worker's key pair"
                raise ValueError(msg)
            self.sock.curve_serverkey = server_public
            self.sock.curve_publickey, self.sock.curve_secretkey = client_keys
            self.sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)
            self.sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 5000)
        self.sock.connect(address)

    def send(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames, copy=_copy(frames))

    def recv(self, timeout_ms: int | None = None) -> list[bytes] | None:
        if timeout_ms is not None and not self.sock.poll(timeout_ms):
            return None
        return self.sock.recv_multipart()  # type: ignore[no-any-return]

    def close(self) -> None:
        self.sock.close()


# local workers: Unix stream sockets -----------------------------------------------------------
def encode_frames(frames: list[bytes]) -> list[bytes | memoryview]:
    """A message on a stream: the frame count, then each frame's length and bytes."""
    parts: list[bytes | memoryview] = [_COUNT.pack(len(frames))]
    for frame in frames:
        parts.append(_LENGTH.pack(len(frame)))
        parts.append(frame)
    return parts


class FrameError(Exception):
    """Bytes on a stream that are not a message: the stream cannot be read any further."""


def parse_frames(buffer: bytearray | memoryview, start: int) -> tuple[list[bytes], int] | None:
    """The message starting at ``buffer[start]`` and where the next begins; None when it has
    not all arrived. Raises ``FrameError`` for a count or a length no sender writes."""
    end = len(buffer)
    if end - start < _COUNT.size:
        return None
    with memoryview(buffer) as view:  # released on return: the caller may then trim the buffer
        (count,) = _COUNT.unpack_from(view, start)
        if not 0 < count <= MAX_FRAMES:
            raise FrameError(f"a message of {count} frames")
        at, total, frames = start + _COUNT.size, 0, []
        for _ in range(count):
            if end - at < _LENGTH.size:
                return None
            (length,) = _LENGTH.unpack_from(view, at)
            total += length
            if total > MAX_MESSAGE_BYTES:
                raise FrameError(f"a message of more than {MAX_MESSAGE_BYTES} bytes")
            at += _LENGTH.size
            if end - at < length:
                return None
            frames.append(bytes(view[at : at + length]))
            at += length
        return frames, at


class _Connection:
    __slots__ = ("inbox", "outbox", "sock", "worker_id")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.worker_id: str | None = None
        self.inbox = bytearray()
        self.outbox: deque[memoryview] = deque()


class StreamDriverSocket:
    """The driver's end for local workers (see the module's docstring): a listening Unix
    socket, one non-blocking connection per worker, a worker named by its first message."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.address = STREAM_SCHEME + path
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        os.chmod(path, 0o600)
        self._listener.listen(256)
        self._listener.setblocking(False)
        self._by_fd: dict[int, _Connection] = {}
        self._by_worker: dict[str, _Connection] = {}
        self._poller: zmq.Poller | None = None

    def register(self, poller: zmq.Poller) -> None:
        self._poller = poller
        poller.register(self._listener.fileno(), zmq.POLLIN)

    def send(self, worker_id: str, frames: list[bytes]) -> None:
        conn = self._by_worker.get(worker_id)
        if conn is None:
            raise PeerUnreachable(f"worker {worker_id} is not connected")
        parts = [memoryview(p).cast("B") for p in encode_frames(frames)]
        if not conn.outbox:
            try:
                sent = conn.sock.sendmsg(parts)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as err:  # its end is closed: the worker died or is going
                self._close(conn)
                raise PeerUnreachable(f"worker {worker_id}: {err}") from err
            parts = _after(parts, sent)
            if not parts:
                return
            self._watch(conn, writable=True)
        conn.outbox.extend(parts)

    def receive(self, events: dict[Any, int]) -> Iterator[tuple[str, list[bytes]] | Dropped]:
        """Messages that arrived on the descriptors ``events`` names; new connections accepted,
        queued output written where a connection can take it."""
        if self._listener.fileno() in events:
            self._accept()
        for fd, flags in list(events.items()):
            conn = self._by_fd.get(fd) if isinstance(fd, int) else None
            if conn is None:
                continue
            if flags & _POLLOUT:
                self._flush(conn)
            if flags & _POLLIN_OR_ERR and conn.sock.fileno() >= 0:
                yield from self._read(conn)

    def close(self) -> None:
        for conn in list(self._by_fd.values()):
            with contextlib.suppress(OSError):  # a last Shutdown, if it fits without waiting
                if conn.outbox:
                    conn.sock.sendmsg(list(conn.outbox))
            self._close(conn)
        if self._poller is not None:
            with contextlib.suppress(KeyError, zmq.ZMQError):
                self._poller.unregister(self._listener.fileno())
        self._listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    # inside --------------------------------------------------------------------------------
    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors: the peer waits in the backlog
                return
            sock.setblocking(False)
            conn = _Connection(sock)
            self._by_fd[sock.fileno()] = conn
            self._watch(conn, writable=False)

    def _watch(self, conn: _Connection, writable: bool) -> None:
        """Poll the connection for input, and for room to write while output is queued
        (registering again updates the flags)."""
        if self._poller is not None:
            self._poller.register(conn.sock.fileno(), _POLLIN | (_POLLOUT if writable else 0))

    def _flush(self, conn: _Connection) -> None:
        while conn.outbox:
            try:
                sent = conn.sock.sendmsg(list(conn.outbox)[:64])
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._close(conn)
                return
            while sent and conn.outbox:
                head = conn.outbox[0]
                if sent >= len(head):
                    sent -= len(head)
                    conn.outbox.popleft()
                else:
                    conn.outbox[0] = head[sent:]
                    sent = 0
        self._watch(conn, writable=False)

    def _read(self, conn: _Connection) -> Iterator[tuple[str, list[bytes]] | Dropped]:
        try:
            data = conn.sock.recv(_READ_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except ConnectionResetError:  # its end closed with our bytes unread: an exit, as below
            data = b""
        except OSError as err:
            self._close(conn)
            yield Dropped(f"a connection failed: {err!r}")
            return
        if not data:  # its end closed (a worker that exited, a peer that left)
            self._close(conn)
            return
        conn.inbox += data
        start = 0
        try:
            while (parsed := parse_frames(conn.inbox, start)) is not None:
                frames, start = parsed
                if conn.worker_id is None:
                    message = self._hello(conn, frames)
                    if message is not None:
                        yield message
                        return
                    continue
                yield conn.worker_id, frames
        except FrameError as err:
            self._close(conn)
            yield Dropped(f"a stream that is not messages ({err}) from {conn.worker_id or 'a peer'}; closed")
            return
        del conn.inbox[:start]

    def _hello(self, conn: _Connection, frames: list[bytes]) -> Dropped | None:
        """Name the connection after its first message; None when that worked."""
        reason = None
        if len(frames) != 2 or frames[0] != HELLO:
            reason = "a connection whose first message is not a hello"
        else:
            try:
                worker_id = frames[1].decode()
            except UnicodeDecodeError:
                worker_id = ""
            if not worker_id or worker_id in self._by_worker:
                reason = f"a connection naming itself {frames[1][:40]!r} (taken or not a name)"
            else:
                conn.worker_id = worker_id
                self._by_worker[worker_id] = conn
                return None
        self._close(conn)
        return Dropped(reason + "; closed")

    def _close(self, conn: _Connection) -> None:
        fd = conn.sock.fileno()
        if fd >= 0:
            self._by_fd.pop(fd, None)
            if self._poller is not None:
                with contextlib.suppress(KeyError, zmq.ZMQError):
                    self._poller.unregister(fd)
        if conn.worker_id is not None and self._by_worker.get(conn.worker_id) is conn:
            del self._by_worker[conn.worker_id]
        conn.outbox.clear()
        conn.sock.close()


def _after(parts: list[memoryview], sent: int) -> list[memoryview]:
    """What is left of ``parts`` once ``sent`` bytes of them went out."""
    for i, part in enumerate(parts):
        if sent < len(part):
            return [part[sent:], *parts[i + 1 :]]
        sent -= len(part)
    return []


class StreamWorkerSocket:
    """A local worker's end: blocking reads and writes on one Unix stream connection."""

    def __init__(self, address: str, worker_id: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(address.removeprefix(STREAM_SCHEME))
        self._inbox = bytearray()
        self.send([HELLO, worker_id.encode()])

    def send(self, frames: list[bytes]) -> None:
        parts = [memoryview(p).cast("B") for p in encode_frames(frames)]
        while parts:
            parts = _after(parts, self.sock.sendmsg(parts))

    def recv(self, timeout_ms: int | None = None) -> list[bytes] | None:
        """The next message; None when none came within ``timeout_ms``. Raises EOFError once
        the driver's end is closed (the driver is gone)."""
        while True:
            parsed = parse_frames(self._inbox, 0)
            if parsed is not None:
                frames, end = parsed
                del self._inbox[:end]
                return frames
            if timeout_ms is not None and not self.poll(timeout_ms):
                return None
            try:
                data = self.sock.recv(_READ_BYTES)
            except ConnectionResetError:
                data = b""
            if not data:
                raise EOFError("the driver closed the connection")
            self._inbox += data

    def poll(self, timeout_ms: int) -> bool:
        import select

        readable, _, _ = select.select([self.sock], [], [], timeout_ms / 1000)
        return bool(readable)

    def close(self) -> None:
        self.sock.close()


def connect_worker(
    ctx: zmq.Context[Any],
    address: str,
    worker_id: str,
    server_public: bytes | None = None,
    client_keys: tuple[bytes, bytes] | None = None,
) -> StreamWorkerSocket | WorkerSocket:
    """The worker's socket for ``address``: a stream for a local driver, zmq for tcp."""
    if address.startswith(STREAM_SCHEME):
        return StreamWorkerSocket(address, worker_id)
    return WorkerSocket(ctx, address, worker_id, server_public, client_keys)

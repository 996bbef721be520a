"""pyzmq sockets and nothing else: the driver binds a ROUTER, each worker connects a DEALER.

Local workers use ``ipc://`` inside the session's 0700 folder (only the session's user can
connect). Remote workers use ``tcp://`` with CurveZMQ: the driver's socket is a CURVE server
and a ZAP handler admits only the client keys it was given; it binds to 127.0.0.1 unless told
otherwise. Sockets set LINGER, a maximum message size and ROUTER_MANDATORY explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import zmq

MAX_MESSAGE_BYTES = 256 << 20


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
        self.sock.send_multipart([worker_id.encode(), *frames], copy=_copy(frames))

    def recv(self) -> tuple[str, list[bytes]]:
        """One message, without blocking (call when the poller says the socket is readable)."""
        ident, *frames = self.sock.recv_multipart(zmq.NOBLOCK)
        return ident.decode(), frames

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

"""The protocol runs unchanged over tcp:// with CurveZMQ; peers without keys are refused."""

from __future__ import annotations

import time

import pytest
import zmq

import dataflow
from engine import protocol
from engine import session as engine_session
from engine.options import ExecutionOptions
from engine.transport import CurveKeys, DriverSocket, WorkerSocket


def test_workers_over_tcp_run_a_pipeline(fresh_engine):
    options = ExecutionOptions(num_cpus=2, inline_cold_start=False)
    current = engine_session.get_session(options, transport="tcp")
    assert current.executor.address.startswith("tcp://127.0.0.1:")
    with dataflow.options(execution_mode="streaming"):
        rows = dataflow.range(5000, override_num_blocks=10).map_batches(lambda b: {"id": b["id"] * 2}).take_all()
    assert sorted(r["id"] for r in rows) == [2 * i for i in range(5000)]
    assert current.executor.statistics()["workers"] == 2


def test_curve_admits_known_keys_only():
    ctx = zmq.Context()
    keys = CurveKeys.generate(1)
    server = DriverSocket(ctx, "tcp://127.0.0.1:0", keys)
    try:
        client_pair = next(iter(keys.clients.items()))
        good = WorkerSocket(ctx, server.address, "good", keys.server_public, client_pair)
        good.send(protocol.encode(protocol.Ready("good", 1)))
        stranger = WorkerSocket(ctx, server.address, "stranger", keys.server_public, zmq.curve_keypair())
        stranger.send(protocol.encode(protocol.Ready("stranger", 2)))
        poller = zmq.Poller()
        poller.register(server.sock, zmq.POLLIN)
        seen = []
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            if poller.poll(100):
                worker_id, frames = server.recv()
                seen.append((worker_id, protocol.decode(frames)))
        assert [w for w, _ in seen] == ["good"]
        assert isinstance(seen[0][1], protocol.Ready)
        good.close()
        stranger.close()
    finally:
        server.close()
        ctx.term()


def test_plain_tcp_without_keys_is_refused():
    ctx = zmq.Context()
    try:
        with pytest.raises(ValueError, match="CurveZMQ"):
            DriverSocket(ctx, "tcp://127.0.0.1:0")
    finally:
        ctx.term()


def test_protocol_rejects_other_versions_before_unpickling():
    frames = protocol.encode(protocol.Shutdown())
    bad = [b"DF" + bytes((protocol.VERSION + 1, frames[0][3])), b"\x80\x04not-a-pickle"]
    with pytest.raises(protocol.ProtocolError, match="version"):
        protocol.decode(bad)
    with pytest.raises(protocol.ProtocolError, match="header"):
        protocol.decode([b"GET / HTTP/1.1", b""])

"""The protocol runs unchanged over tcp:// with CurveZMQ (peers without keys are refused) and
over the local workers' Unix stream sockets."""

from __future__ import annotations

import struct
import time

import pytest
import zmq

import dataflow
from engine import protocol, serialization
from engine import session as engine_session
from engine.options import ExecutionOptions
from engine.transport import (
    MAX_FRAMES,
    MAX_MESSAGE_BYTES,
    CurveKeys,
    DriverSocket,
    FrameError,
    PeerUnreachable,
    StreamDriverSocket,
    StreamWorkerSocket,
    WorkerSocket,
    encode_frames,
    parse_frames,
)


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


# local workers: Unix stream sockets -----------------------------------------------------------
def _drain(server: StreamDriverSocket, poller: zmq.Poller, want: int, timeout: float = 5.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        got.extend(server.receive(dict(poller.poll(100))))
    return got


def _served(tmp_path, worker_id: str) -> tuple[StreamDriverSocket, zmq.Poller, StreamWorkerSocket]:
    """A driver's socket, its poller, and a worker connected to it (its hello not yet read)."""
    server = StreamDriverSocket(str(tmp_path / "driver.sock"))
    poller = zmq.Poller()
    server.register(poller)
    return server, poller, StreamWorkerSocket(server.address, worker_id)


def test_stream_sockets_carry_messages_both_ways_in_order(tmp_path):
    """Messages of every size keep their frames and their order; one bigger than the socket's
    buffer is written over several turns of the driver's loop (never blocking it)."""
    server, poller, worker = _served(tmp_path, "w7")
    try:
        worker.send(protocol.encode(protocol.Ready("w7", 123)))
        (first,) = _drain(server, poller, 1)
        assert first[0] == "w7" and protocol.decode(first[1]) == protocol.Ready("w7", 123)
        big = bytes(range(256)) * (20_000)  # 5 MB: more than a Unix socket's buffer
        messages = [[b"a"], [b"", b"x" * 70_000], [big, b"tail"], [b"z"]]
        for frames in messages:
            server.send("w7", frames)
        received = []
        deadline = time.monotonic() + 10
        while len(received) < len(messages) and time.monotonic() < deadline:
            list(server.receive(dict(poller.poll(10))))  # the loop's turn: writes what fits
            frames = worker.recv(timeout_ms=10)  # (a part of a message stays until the rest comes)
            if frames is not None:
                received.append(frames)
        assert received == messages
        for i in range(50):
            worker.send([b"%d" % i])
        assert [frames for _, frames in _drain(server, poller, 50)] == [[b"%d" % i] for i in range(50)]
        with pytest.raises(PeerUnreachable):
            server.send("w-unknown", [b"x"])
    finally:
        worker.close()
        server.close()
    assert not (tmp_path / "driver.sock").exists()


def test_a_worker_that_exits_with_messages_unread_is_a_close_not_a_dropped_message(tmp_path):
    """A worker that closes its end with bytes of ours unread resets the connection (an actor
    retired while a message was on its way): the driver forgets it as after an ordinary exit
    and reports nothing dropped."""
    from engine.transport import Dropped

    server, poller, worker = _served(tmp_path, "w3")
    try:
        worker.send(protocol.encode(protocol.Ready("w3", 1)))
        assert len(_drain(server, poller, 1)) == 1
        server.send("w3", [b"never read"])
        list(server.receive(dict(poller.poll(100))))  # the loop's turn writes it
        time.sleep(0.1)
        worker.close()  # unread bytes: the kernel resets the connection
        got = []
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            got.extend(server.receive(dict(poller.poll(50))))
        assert not [item for item in got if isinstance(item, Dropped)], got
        with pytest.raises(PeerUnreachable):
            server.send("w3", [b"x"])
    finally:
        server.close()


def test_a_stream_worker_learns_that_its_driver_is_gone(tmp_path):
    server = StreamDriverSocket(str(tmp_path / "driver.sock"))
    poller = zmq.Poller()
    server.register(poller)
    worker = StreamWorkerSocket(server.address, "w1")
    assert list(server.receive(dict(poller.poll(2000)))) == []  # accepted; its hello names it
    assert worker.recv(timeout_ms=50) is None  # nothing yet: a bounded wait
    server.close()
    with pytest.raises(EOFError):
        worker.recv(timeout_ms=2000)
    worker.close()


def test_stream_frames_are_parsed_only_when_whole_and_sane():
    frames = [b"header", b"", b"x" * 1000]
    data = b"".join(bytes(p) for p in encode_frames(frames))
    for cut in (0, 3, 4, 11, len(data) - 1):
        assert parse_frames(bytearray(data[:cut]), 0) is None
    assert parse_frames(bytearray(data + b"next"), 0) == (frames, len(data))
    with pytest.raises(FrameError):
        parse_frames(bytearray(struct.pack("<I", 0)), 0)
    with pytest.raises(FrameError):
        parse_frames(bytearray(struct.pack("<I", MAX_FRAMES + 1)), 0)
    with pytest.raises(FrameError):
        parse_frames(bytearray(struct.pack("<IQ", 1, MAX_MESSAGE_BYTES + 1)), 0)


def test_refs_and_task_messages_survive_a_round_trip_with_every_field():
    """Block refs pickle through their constructor (faster than a slots dataclass's state):
    every field must come back, including ones added later."""
    import dataclasses
    import pickle

    from engine.object_store import BlockRef, BlockSlice
    from engine.task import TaskSpec

    ref = BlockRef("w1.2-3", "/dev/shm/x/w1.2-3.arrow", 10, 80, True, b"\x01\0\0\0", "node-a", 4, sample=[1, 2])
    back = pickle.loads(pickle.dumps(BlockSlice(ref, 2, 5)))
    assert [getattr(back.ref, f.name) for f in dataclasses.fields(BlockRef)] == [
        getattr(ref, f.name) for f in dataclasses.fields(BlockRef)]
    assert (back.offset, back.length) == (2, 5)
    spec = TaskSpec(task_id=77, op_key="op1", transform_digest="d", inputs=[ref], output="count")
    for sys_path in (None, ["/somewhere"]):
        msg = protocol.decode(protocol.encode(protocol.RunTask(spec, b"udf" if sys_path else None, sys_path)))
        assert (msg.task_id, msg.sys_path) == (77, sys_path)
        assert serialization.loads(msg.spec).inputs == [ref]

"""streaming_split under faults: junk at the coordinator's socket, a coordinator that dies, a
slow pipeline. Nothing may hang: the server drops what it cannot read and keeps serving, and a
split iterator in another process learns within seconds that its coordinator is gone."""

from __future__ import annotations

import fcntl
import os
import pickle
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections import deque

import pytest
import zmq

import dataflow
from dataflow.split import SplitIterator
from engine import protocol, serialization, split_server
from engine.errors import DataflowError, SplitCoordinatorLostError
from engine.object_store import BlockRef
from engine.split import END, WAIT, Piece, SplitCoordinator
from engine.split_server import SplitClient, SplitServer


def _wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def _explode():
    raise RuntimeError("unpickling this raises")


class _Boom:
    def __reduce__(self):
        return (_explode, ())


def _junk_messages() -> list[list[bytes]]:
    """Messages no client of ours sends: malformed, truncated, of the wrong kind, for unknown splits."""
    header, body = protocol.encode(protocol.SplitNext(0, 0, 1))
    v = protocol.VERSION
    fake = Piece(BlockRef("never-dealt", None, 10, 80), 0, 10)
    junk = [
        [b""],
        [b"DF"],
        [header[:3], body],
        [header],  # a header with no body
        [header, body[: len(body) // 2]],  # a truncated body
        [header, b"\x80\x05not a pickle at all"],
        [header, b""],
        [header, pickle.dumps(_Boom())],  # unpickling it raises
        [header, serialization.dumps(12345)],  # a body of the wrong type
        [header, serialization.dumps(protocol.SplitRelease(fake))],  # a body that is not what the header says
        [b"DF" + bytes((v + 1, header[3])), body],  # another protocol version
        [b"DF" + bytes((v, 250)), body],  # an unknown kind
        [b"DF" + bytes((v, 2)), b"x", b"y", b"z"],  # a malformed task
        [b"", header, body],  # a REQ-style envelope
        protocol.encode(protocol.SplitReply()),  # kinds the server never takes
        protocol.encode(protocol.SplitWaiting(3)),
        protocol.encode(protocol.Shutdown()),
        protocol.encode(protocol.Shutdown()),
        protocol.encode(protocol.SplitNext(99, 0, 1)),  # unknown splits, bad fields
        protocol.encode(protocol.SplitNext(-1, 0, 2)),
        protocol.encode(protocol.SplitNext(0, -5, 3)),
        protocol.encode(protocol.SplitNext("0", 0, 4)),  # type: ignore[arg-type]
        protocol.encode(protocol.SplitNext(0, 0, "seq")),  # type: ignore[arg-type]
        protocol.encode(protocol.SplitAbandon(7, 0)),
        protocol.encode(protocol.SplitAbandon(0, None)),  # type: ignore[arg-type]
        protocol.encode(protocol.SplitRelease("not a piece")),
        protocol.encode(protocol.SplitRelease(fake)),  # a piece nobody was given
    ]
    rng = random.Random(20240601)
    junk += [[rng.randbytes(rng.randint(0, 96)) for _ in range(rng.randint(1, 4))] for _ in range(300)]
    junk += [[b"DF" + bytes((v, rng.randint(0, 255))), rng.randbytes(rng.randint(0, 64))] for _ in range(100)]
    return junk


def _flood(address: str, ctx: zmq.Context, sockets: list[zmq.Socket]) -> int:
    """Junk from a plain DEALER (counted) and from odd peers (their sockets go to ``sockets``);
    returns how many messages the plain one sent. A plain DEALER announces an empty identity
    (libzmq refuses to set one explicitly) and the ROUTER makes one up for it."""
    junk = _junk_messages()

    def dealer(routing_id: bytes | None = None, kind: int = zmq.DEALER) -> zmq.Socket:
        sock = ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 2000)
        if routing_id is not None:
            sock.setsockopt(zmq.ROUTING_ID, routing_id)
        sock.connect(address)
        sockets.append(sock)
        return sock

    plain = dealer()
    for frames in junk:
        plain.send_multipart(frames)
    for routing_id in (b"\x00weird", b"\xff" * 255, b"\x00weird"):  # the last one is a duplicate
        sock = dealer(routing_id)
        for frames in junk[:40]:
            sock.send_multipart(frames)
    dealer(kind=zmq.REQ).send_multipart(protocol.encode(protocol.SplitNext(0, 0, 1)))
    dealer().send(b"x" * (split_server.MAX_REQUEST_BYTES + 1))  # too big: libzmq disconnects it
    path = address.removeprefix("ipc://")
    for garbage in (b"\xff" + b"\x00" * 8 + b"\x7f", os.urandom(200), b"\xff\x00\x00"):  # not ZMTP at all
        with socket.socket(socket.AF_UNIX) as raw:
            raw.connect(path)
            raw.sendall(garbage)
    return len(junk)


def _remote_iterators(coordinator: SplitCoordinator) -> list[SplitIterator]:
    """Split iterators that talk to the coordinator over its socket, as in another process."""
    return [
        SplitIterator(None, "in-another-process", coordinator.address, i, coordinator.n) for i in range(coordinator.n)
    ]


def _drain(iterators, batch_size=64, timeout=60):
    seen = [[] for _ in iterators]
    errors = []

    def run(i):
        try:
            for batch in iterators[i].iter_batches(batch_size=batch_size):
                seen[i].extend(batch["id"].tolist())
        except BaseException as err:  # reported by the test
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(iterators))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a split iterator hung"
    assert not errors, errors
    return seen


# the server alone, with a stand-in coordinator -----------------------------------------------
class FakeCoordinator:
    """What SplitServer needs from a coordinator: pieces per split, and faults on demand."""

    def __init__(self, n: int = 2) -> None:
        self.n = n
        self.queues = [deque() for _ in range(n)]
        self.released: list[Piece] = []
        self.fail: BaseException | None = None

    def try_next(self, split: int, epoch: int) -> Piece | str:
        if self.fail is not None:
            raise self.fail
        queue = self.queues[split]
        if not queue:
            return WAIT
        item = queue.popleft()
        return END if item is None else item

    def release(self, piece: Piece) -> None:
        self.released.append(piece)

    def abandon(self, split: int, epoch: int) -> None:
        pass

    def busy_cpus(self) -> float:
        return 1.5

    def note_remote_client(self) -> None:
        pass

    def depart(self, split: int) -> None:
        pass


@pytest.fixture
def server():
    folder = tempfile.mkdtemp(prefix="df-split-")  # short: ipc paths are limited to ~100 bytes
    coordinator = FakeCoordinator()
    srv = SplitServer(coordinator, f"ipc://{folder}/split.sock")
    srv.coordinator = coordinator
    try:
        yield srv
    finally:
        srv.close()
        shutil.rmtree(folder, ignore_errors=True)


def _piece(i: int) -> Piece:
    return Piece(BlockRef(f"block-{i}", None, 10, 80), 0, 10)


def test_junk_is_dropped_and_counted_and_the_server_keeps_serving(server):
    ctx = zmq.Context()
    sockets: list[zmq.Socket] = []
    try:
        sent = _flood(server.address, ctx, sockets)
        assert _wait_for(lambda: server.statistics()["dropped"] >= sent), server.statistics()
        stats = server.statistics()
        assert stats["serving"] and stats["served"] == 0, stats
        for kind in (
            "bad header",
            "undecodable body",
            "unexpected message kind",
            "bad split request",
            "release of an unknown piece",
            "body does not match its header",
        ):
            assert stats["dropped_by_kind"].get(kind), (kind, stats)
        # a request for an unknown split is told what is wrong rather than left waiting
        client = SplitClient(server.address, liveness_s=5)
        with pytest.raises(ValueError, match="unknown split 5"):
            client.next(5, 0)
        # and a legitimate client is served
        server.coordinator.queues[1].extend([_piece(1), None])
        piece = client.next(1, 0)
        assert piece == _piece(1) and client.busy_cpus() == 1.5
        client.release(piece)
        client.release(piece)  # twice: the second is dropped, the coordinator sees one
        assert client.next(1, 0) is None
        assert _wait_for(lambda: server.coordinator.released == [_piece(1)])
        assert _wait_for(lambda: server.statistics()["dropped_by_kind"]["release of an unknown piece"] >= 3)
        client.close()
    finally:
        for sock in sockets:
            sock.close(linger=0)
        ctx.term()


def test_an_error_in_the_coordinator_reaches_the_client_and_the_server_goes_on(server):
    client = SplitClient(server.address, liveness_s=5)
    server.coordinator.fail = KeyError("coordinator bug")
    with pytest.raises(KeyError, match="coordinator bug"):
        client.next(0, 0)

    class Unpicklable(Exception):
        def __init__(self) -> None:
            super().__init__("holds a lock")
            self.lock = threading.Lock()

    server.coordinator.fail = Unpicklable()
    with pytest.raises(DataflowError, match="Unpicklable: holds a lock"):
        client.next(0, 0)
    server.coordinator.fail = None
    server.coordinator.queues[0].append(_piece(0))
    assert client.next(0, 0) == _piece(0)
    assert server.statistics()["error_replies"] == 2 and server.statistics()["serving"]
    client.close()


def test_a_parked_request_is_kept_alive_for_longer_than_the_liveness_window(server, monkeypatch):
    monkeypatch.setattr(split_server, "KEEPALIVE_S", 0.1)
    client = SplitClient(server.address, liveness_s=0.5)
    threading.Timer(2.0, lambda: (server.coordinator.queues[0].append(_piece(7)), server.wake())).start()
    start = time.monotonic()
    assert client.next(0, 0) == _piece(7)
    assert time.monotonic() - start >= 1.9
    assert server.statistics()["keepalives"] >= 5
    client.close()


def test_a_dead_serving_thread_fails_requests_fast(server):
    client = SplitClient(server.address, liveness_s=1.0)
    parked = SplitClient(server.address, liveness_s=30)
    outcome = {}

    def wait_parked():
        try:
            parked.next(0, 0)
        except BaseException as err:
            outcome["error"] = err

    waiter = threading.Thread(target=wait_parked, daemon=True)
    waiter.start()
    assert _wait_for(lambda: server.statistics()["parked"] == 1)

    def broken(poller):
        raise OSError("the serving loop is broken")

    server._turn = broken
    server.wake()
    assert _wait_for(lambda: not server.statistics()["serving"])
    waiter.join(5)  # a request that was waiting is told at once, not after its 30 s window
    assert isinstance(outcome.get("error"), SplitCoordinatorLostError), outcome
    start = time.monotonic()
    with pytest.raises(SplitCoordinatorLostError, match="lost the streaming_split coordinator at ipc://"):
        client.next(1, 0)
    assert time.monotonic() - start < 3
    with pytest.raises(SplitCoordinatorLostError):  # and so does every later call, at once
        client.next(1, 0)
    client.close()
    parked.close()


# the real engine ---------------------------------------------------------------------------
def test_junk_at_a_real_coordinator_leaves_split_iteration_exact(streaming):
    its = dataflow.range(3000, override_num_blocks=12).streaming_split(2, equal=True)
    coordinator = SplitCoordinator._registry[its[0]._key]
    server = coordinator._server
    remote = _remote_iterators(coordinator)
    ctx = zmq.Context()
    sockets: list[zmq.Socket] = []
    try:
        sent = _flood(coordinator.address, ctx, sockets)
        assert _wait_for(lambda: server.statistics()["dropped"] >= sent), server.statistics()
        seen = _drain(remote)
        _flood(coordinator.address, ctx, sockets)  # and again between epochs
        assert _wait_for(lambda: server.statistics()["dropped"] >= 2 * sent), server.statistics()
        again = _drain(remote)
        for it in remote:
            it._client.close()
    finally:
        for sock in sockets:
            sock.close(linger=0)
        ctx.term()
    for rows in (seen, again):
        assert [len(r) for r in rows] == [1500, 1500]
        assert sorted(rows[0] + rows[1]) == list(range(3000))
    assert server.statistics()["serving"] and server.statistics()["served"] >= 6


def _sleepy(batch):
    time.sleep(1.5)
    return batch


def test_a_slow_pipeline_is_not_mistaken_for_a_dead_coordinator(streaming, monkeypatch):
    """Each block takes three liveness windows to come: the keepalives carry the client through."""
    monkeypatch.setattr(split_server, "KEEPALIVE_S", 0.1)
    monkeypatch.setattr(split_server, "LIVENESS_S", 0.5)
    its = dataflow.range(400, override_num_blocks=4).map_batches(_sleepy).streaming_split(2, equal=True)
    coordinator = SplitCoordinator._registry[its[0]._key]
    remote = _remote_iterators(coordinator)
    seen = _drain(remote)
    for it in remote:
        it._client.close()
    assert [len(r) for r in seen] == [200, 200]
    assert sorted(seen[0] + seen[1]) == list(range(400))
    assert coordinator._server.statistics()["keepalives"] > 0


HOST_SCRIPT = """
import pickle, sys, time
import dataflow
from engine import session

def slow(batch):
    time.sleep(0.05)
    return batch

dataflow.init(num_cpus=1, min_task_input_bytes=1)  # one block per task: the first comes at once
its = dataflow.range(100_000, override_num_blocks=2000).map_batches(slow).streaming_split(1)
with open(sys.argv[1], "wb") as f:
    pickle.dump(its[0], f)
print(session.current_session().shm_dir, flush=True)
time.sleep(300)
"""


def _die_with_test_process() -> None:
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def _remove_dead_session(shm_dir: str) -> None:
    """The killed host's session folder, once its lock is free (nobody else will remove it)."""

    def free() -> bool:
        try:
            fd = os.open(os.path.join(shm_dir, "lock"), os.O_RDWR)
        except FileNotFoundError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
        finally:
            os.close(fd)

    assert _wait_for(free)
    shutil.rmtree(shm_dir, ignore_errors=True)


def test_a_rank_learns_within_seconds_that_its_coordinator_died(tmp_path):
    path = tmp_path / "split.pkl"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    host = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(HOST_SCRIPT), str(path)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=_die_with_test_process,
    )
    shm_dir = None
    try:
        assert host.stdout is not None
        ready, _, _ = select.select([host.stdout], [], [], 60)
        assert ready, "the coordinator's host did not start"
        shm_dir = host.stdout.readline().strip()
        assert shm_dir, f"the host exited with {host.poll()}"
        iterator = pickle.loads(path.read_bytes())
        rows = []
        outcome = {}
        started = threading.Event()

        def rank():
            try:
                for batch in iterator.iter_batches(batch_size=10, prefetch_batches=0):
                    rows.extend(batch["id"].tolist())
                    started.set()
                outcome["finished"] = True
            except BaseException as err:
                outcome["error"] = err
                outcome["at"] = time.monotonic()
            finally:
                started.set()

        thread = threading.Thread(target=rank, daemon=True)
        thread.start()
        assert started.wait(60) and rows, outcome
        killed_at = time.monotonic()
        host.send_signal(signal.SIGKILL)
        host.wait(10)
        thread.join(30)
        assert not thread.is_alive(), "the split iterator hung after its coordinator died"
        err = outcome.get("error")
        assert isinstance(err, SplitCoordinatorLostError), outcome
        assert iterator._address in str(err) and "driver process" in str(err)
        assert outcome["at"] - killed_at < 15
        with pytest.raises(SplitCoordinatorLostError):  # the next epoch fails at once too
            next(iter(iterator.iter_batches()))
        iterator._client.close()
    finally:
        if host.poll() is None:
            host.kill()
        host.wait(10)
        if host.stdout is not None:
            host.stdout.close()
        if shm_dir:
            _remove_dead_session(shm_dir)



DYING_RANK_SCRIPT = """
import os, pickle, signal, sys
with open(sys.argv[1], "rb") as f:
    iterator = pickle.load(f)
batches = iter(iterator.iter_batches(batch_size=10, prefetch_batches=0))
if sys.argv[2] == "mid-epoch":
    for _ in range(3):
        next(batches)
else:  # the whole first epoch, then gone before the next
    for _ in batches:
        pass
os.kill(os.getpid(), signal.SIGKILL)  # holding what it was dealt
"""


@pytest.mark.parametrize("when", ["mid-epoch", "between-epochs"])
def test_a_rank_whose_process_dies_does_not_hold_the_others_back(streaming, tmp_path, when):
    """With equal=True the others may not run ahead of a rank: one whose process died (in an
    epoch, or before the next began) held them back for ever. Its connection closing now lets
    its share and what it held go, so the others finish, with nothing left in the store."""
    ds = dataflow.range(4000, override_num_blocks=40).map_batches(lambda b: b)
    with dataflow.options(consumer_buffer_bytes=16 << 10):  # 20 of the 40 blocks: the pump pauses
        local, remote = ds.streaming_split(2, equal=True)
    path = tmp_path / "rank1.pkl"
    path.write_bytes(pickle.dumps(remote))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    rank = subprocess.Popen([sys.executable, "-c", textwrap.dedent(DYING_RANK_SCRIPT), str(path), when], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_die_with_test_process)
    try:
        first = _drain([local])[0]
        _, err = rank.communicate(timeout=60)
        assert rank.returncode == -signal.SIGKILL, err
        assert len(set(first)) == len(first) and 2000 - 100 <= len(first) < 4000
        if when == "between-epochs":
            second = _drain([local])[0]  # the dead rank's split is left out: this one gets every row
            assert sorted(second) == list(range(4000))
    finally:
        if rank.poll() is None:
            rank.kill()
            rank.wait(10)


class _GatedHandle:
    """An execution handle of ``n`` blocks whose production waits at block ``hold`` for ``gate``."""

    def __init__(self, name: str, n: int, hold: int, gate: threading.Event) -> None:
        self.name, self.n, self.hold, self.gate = name, n, hold, gate
        self.produced, self.freed, self.closed = 0, [], False

    def iter_refs(self):
        try:
            for i in range(self.n):
                if i == self.hold:
                    self.gate.wait(10)
                self.produced += 1
                yield BlockRef(f"{self.name}-{i}", None, 10, 100)
        finally:
            self.closed = True

    def detach(self, ref):
        return True

    def free_detached(self, ref):
        self.freed.append(ref.block_id)


def test_an_epoch_left_while_its_execution_waits_stops_once_the_next_begins():
    """Every split left epoch 0 while its pump waited for the next block, and epoch 1 began
    first: the old pump no longer saw its epoch as left and ran its whole execution."""
    gate, handles = threading.Event(), []

    def start():
        handles.append(_GatedHandle(f"e{len(handles)}", 200, 2 if not handles else -1, gate))
        return handles[-1]

    coordinator = SplitCoordinator(start, 2, False, read=lambda ref: None, max_pending_bytes=1 << 30)
    for split in (0, 1):
        coordinator.release(coordinator.next(split, 0))
        coordinator.abandon(split, 0)
    assert coordinator.next(0, 1) is not None  # epoch 1 begins before epoch 0's pump wakes
    gate.set()
    assert _wait_for(lambda: handles[0].closed)
    assert handles[0].produced < 10 and sorted(handles[0].freed) == sorted(f"e0-{i}" for i in range(handles[0].produced))
    coordinator.close()


@pytest.mark.parametrize("equal", [False, True])
def test_a_coordinator_closed_while_its_execution_waits_frees_the_next_block(equal):
    gate, handles = threading.Event(), []

    def start():
        handles.append(_GatedHandle("b", 5, 1, gate))
        return handles[-1]

    coordinator = SplitCoordinator(start, 2, equal, read=lambda ref: None, max_pending_bytes=1 << 30)
    first = coordinator.next_within(0, 0, 1.0)
    if isinstance(first, Piece):
        coordinator.release(first)
    coordinator.close()
    gate.set()
    assert _wait_for(lambda: handles[0].closed and len(handles[0].freed) == handles[0].produced)
    assert not coordinator._owners

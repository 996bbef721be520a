"""Nothing a worker, a peer or a UDF does can kill the scheduling loop.

Each test hurts the loop one way and then runs an ordinary job in the same session: it must
give exact results. Bad frames are dropped and counted; a UDF's own problem (a BaseException,
an exception group, a function that does not pickle) fails that job with the UDF's error.
"""

from __future__ import annotations

import os
import pickle
import random
import signal
import socket
import struct
import threading
import time

import numpy as np
import pytest

import dataflow
from engine import protocol, transport
from engine import session as engine_session


def _executor():
    return engine_session.current_session().executor


def _healthy() -> None:
    ds = dataflow.range(5000, override_num_blocks=10).map_batches(lambda b: {"id": b["id"] * 2})
    assert sorted(r["id"] for r in ds.take_all()) == list(range(0, 10000, 2))


@pytest.fixture
def ready(streaming):
    assert _executor().wait_for_workers()


def _frames(rng: random.Random) -> list[list[bytes]]:
    header = protocol.MAGIC + bytes((protocol.VERSION, 3))  # a TaskDone header
    task_header = protocol.MAGIC + bytes((protocol.VERSION, 2))
    return [
        [rng.randbytes(rng.randint(0, 64))],
        [rng.randbytes(4)],
        [header],  # a header with no body
        [header, b"not a pickle"],
        [header, pickle.dumps(object)[:-3]],  # truncated
        [header, pickle.dumps({"not": "a message"})],
        [protocol.MAGIC + bytes((protocol.VERSION, 250)), b""],  # unknown kind
        [protocol.MAGIC + bytes((99, 3)), b""],  # another version
        [task_header, b"not-an-int", b"", b""],
        [header, protocol.encode(protocol.TaskDone(result=None))[1]],  # a result that is None
        protocol.encode(protocol.Ready("w-nobody", 1)),
        protocol.encode(protocol.Shutdown()),
    ]


def _peer(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    return sock


def _write(sock: socket.socket, data: bytes) -> None:
    """Send, unless the driver has already cut this peer off (what it does to a stranger)."""
    try:
        sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        pass


def _send(sock: socket.socket, frames: list[bytes]) -> None:
    _write(sock, b"".join(bytes(p) for p in transport.encode_frames(frames)))


def test_fuzzed_frames_at_the_driver_socket_leave_it_serving(ready):
    """Peers that are not workers (same user: the socket is in the session's 0700 folder) send
    noise, messages without a hello, hellos with odd or taken names, lengths no sender writes and
    messages cut short: each is dropped and counted, and the workers keep serving."""
    executor = _executor()
    path = executor.address.removeprefix(transport.STREAM_SCHEME)
    before = executor.dropped_messages
    rng = random.Random(7)
    peers = []
    try:
        for _ in range(3):  # bytes that are not messages at all
            sock = _peer(path)
            _write(sock, rng.randbytes(rng.randint(1, 300)))
            peers.append(sock)
        for _ in range(2):  # well-framed messages, but no hello first
            sock = _peer(path)
            for frames in _frames(rng):
                _send(sock, frames)
            peers.append(sock)
        for name in (b"\xff\xfe\x00binary", b"", b"w0", b"w1"):  # names that are not text, or taken
            sock = _peer(path)
            _send(sock, [transport.HELLO, name])
            _send(sock, protocol.encode(protocol.Ready(name.decode(errors="replace"), 1)))
            peers.append(sock)
        for name in ("w-nobody", "w-stranger"):  # a fresh name: every fuzzed message after it
            sock = _peer(path)
            _send(sock, [transport.HELLO, name.encode()])
            for _ in range(5):
                for frames in _frames(rng):
                    _send(sock, frames)
            peers.append(sock)
        sock = _peer(path)  # a frame count and a length no sender writes
        _send(sock, [transport.HELLO, b"w-huge"])
        _write(sock, struct.pack("<IQ", 1, transport.MAX_MESSAGE_BYTES + 1))
        peers.append(sock)
        sock = _peer(path)
        _write(sock, struct.pack("<I", 10_000))
        peers.append(sock)
        sock = _peer(path)  # a message cut short, then gone
        _send(sock, [transport.HELLO, b"w-short"])
        _write(sock, b"".join(bytes(p) for p in transport.encode_frames(protocol.encode(protocol.Ready("w-short", 1))))[:-3])
        sock.close()
        assert executor.sync()
        _healthy()
        assert executor.sync()
    finally:
        for sock in peers:
            sock.close()
    assert executor.dropped_messages >= before + 10
    assert executor._thread.is_alive()
    _healthy()


class _Boom(Exception):
    pass


class _Failed(BaseException):
    """A test framework's own BaseException (as pytest.fail raises)."""


def _raiser(kind: str):
    def udf(batch):
        if batch["id"][0] >= 2000:
            if kind == "memory":
                raise MemoryError("the UDF ran out of memory")
            if kind == "group":
                raise ExceptionGroup("several", [ValueError("a"), _Boom("b")])
            if kind == "interrupt":
                raise KeyboardInterrupt
            if kind == "exit":
                raise SystemExit(3)
            if kind == "base-group":
                raise BaseExceptionGroup("several", [KeyboardInterrupt(), ValueError("a")])
            if kind == "own-base":
                raise _Failed("the UDF's own BaseException")
            if kind == "generator-exit":
                raise GeneratorExit("raised by the UDF")
        return batch

    return udf


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("memory", MemoryError), ("group", ExceptionGroup), ("interrupt", KeyboardInterrupt), ("exit", SystemExit),
     ("base-group", BaseExceptionGroup), ("own-base", _Failed), ("generator-exit", GeneratorExit)],
)
def test_a_udf_base_exception_reaches_the_caller_as_itself(mode, kind, expected):
    if mode == "streaming":
        assert _executor().wait_for_workers()
    ds = dataflow.range(5000, override_num_blocks=5).map_batches(_raiser(kind))
    with pytest.raises(expected) as info:
        ds.take_all()
    text = str(info.value) + "".join(getattr(info.value, "__notes__", []))
    assert "udf" in text, text
    if kind == "exit":
        assert info.value.code == 3
    if kind == "group":
        assert info.value.subgroup(ValueError) is not None
    _healthy()


class _ExitsWhenLoaded:
    """A callable whose unpickling raises SystemExit, as a user module that parses sys.argv
    when a worker imports it does."""

    def __call__(self, batch):
        return batch

    def __reduce__(self):
        return (_exit_on_load, ())


def _exit_on_load():
    if os.environ.get("DATAFLOW_TEST_IN_DRIVER") != str(os.getpid()):
        raise SystemExit(2)
    return _ExitsWhenLoaded()


def test_a_udf_that_exits_while_a_worker_loads_it_fails_with_that_exit(ready, monkeypatch):
    """It was taken for a dead worker three times over ('worker died'), the SystemExit lost."""
    monkeypatch.setenv("DATAFLOW_TEST_IN_DRIVER", str(os.getpid()))
    with pytest.raises(SystemExit) as info:
        dataflow.range(5000, override_num_blocks=10).map_batches(_ExitsWhenLoaded()).take_all()
    assert info.value.code == 2
    _healthy()


class _LoadsOnlyInWorkers:
    """A sink's result whose loading fails in the driver (here: with SystemExit)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def __reduce__(self):
        return (_load_in_worker, (self.pid,))


def _load_in_worker(pid: int):
    if os.environ.get("DATAFLOW_TEST_IN_DRIVER") == str(os.getpid()):
        raise SystemExit(9)
    return _LoadsOnlyInWorkers(pid)


def test_a_task_result_the_driver_cannot_load_fails_its_job_not_the_loop(ready, monkeypatch):
    """The reply was dropped as a bad frame (the job then waited forever) or, for SystemExit,
    killed the scheduling loop and every later job with it."""
    from dataflow.datasource import Datasink

    class ResultSink(Datasink):
        def write(self, blocks, ctx):
            for _ in blocks:
                pass
            return _LoadsOnlyInWorkers(os.getpid())

    monkeypatch.setenv("DATAFLOW_TEST_IN_DRIVER", str(os.getpid()))
    with pytest.raises(SystemExit) as info:
        dataflow.range(5000, override_num_blocks=4).map_batches(lambda b: b).write_datasink(ResultSink())
    assert info.value.code == 9
    _healthy()


def test_a_udf_raising_in_the_first_inline_task_does_not_hang(fresh_engine):
    dataflow.init(num_cpus=2)  # workers still starting: the first tasks run in the driver
    ds = dataflow.range(100, override_num_blocks=1).map_batches(_raiser("interrupt"))
    with pytest.raises(KeyboardInterrupt):
        dataflow.range(5000, override_num_blocks=5).map_batches(_raiser("interrupt")).take_all()
    assert ds.count() == 100
    _healthy()


def test_a_udf_that_cannot_be_pickled_fails_its_job_only(ready):
    lock = threading.Lock()

    def holds_a_lock(batch):
        with lock:
            return batch

    with pytest.raises(TypeError, match=r"holds_a_lock|pickl"):
        dataflow.range(5000, override_num_blocks=10).map_batches(holds_a_lock).take_all()
    _healthy()


def test_a_udf_too_big_to_send_fails_its_job_saying_so(ready):
    """A function that captures more than a message to a worker may carry fails its job with
    the reason, not with workers that die one after another; the next job runs."""
    from engine.transport import MAX_MESSAGE_BYTES

    blob = np.ones(MAX_MESSAGE_BYTES // 8 + 1024, dtype=np.float64)

    def captures_a_blob(batch):
        return {"id": batch["id"] + int(blob[0])}

    with pytest.raises(ValueError, match=r"more than the 256 MiB a message to a worker may carry"):
        dataflow.range(5000, override_num_blocks=10).map_batches(captures_a_blob).take_all()
    _healthy()


def test_the_zygote_killed_twice_in_one_job_then_a_worker(ready, tmp_path):
    executor = _executor()
    marker = str(tmp_path / "worker-killed")
    driver = os.getpid()

    def slow(batch):
        time.sleep(0.0002 * len(batch["id"]))
        if batch["id"][0] == 9000 and os.getpid() != driver and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return {"id": batch["id"], "sq": batch["id"] ** 2}

    with dataflow.options(min_task_input_bytes=1):  # 200 tasks, not a few bundles
        ds = dataflow.range(20_000, override_num_blocks=200).map_batches(slow)
        it = ds.iter_batches(batch_size=100, batch_format="numpy")
        ids = [next(it)["id"]]
        for _ in range(2):
            deadline = time.monotonic() + 10
            while (executor.pool.forkserver is None or not executor.pool.forkserver.alive()) and time.monotonic() < deadline:
                time.sleep(0.01)
            zygote = executor.pool.forkserver
            assert zygote is not None
            zygote.proc.kill()
            zygote.proc.wait()
            ids += [next(it)["id"] for _ in range(10)]
        ids += [b["id"] for b in it]
        assert ds._last_handle.stats().operators[-1].tasks >= 100
    assert sorted(np.concatenate(ids).tolist()) == list(range(20_000))
    assert os.path.exists(marker)
    cpu_before = time.process_time()
    time.sleep(1.0)  # the idle loop must sleep, not spin on a dead pipe
    assert time.process_time() - cpu_before < 0.3
    _healthy()


def test_a_worker_killed_while_writing_leaves_no_file(ready, tmp_path):
    marker = str(tmp_path / "killed")
    driver = os.getpid()

    def writes_then_dies(batch):
        yield {"id": batch["id"][:10]}  # written to the store before the process dies
        if batch["id"][0] == 3000 and os.getpid() != driver and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        yield {"id": batch["id"][10:]}

    ds = dataflow.range(10_000, override_num_blocks=10).map_batches(writes_then_dies)
    assert sorted(r["id"] for r in ds.take_all()) == list(range(10_000))
    assert os.path.exists(marker)
    # the conftest leak check fails the test if the dead worker's first block is still there


def test_calls_after_shutdown_never_write_into_a_reused_descriptor(fresh_engine, tmp_path):
    dataflow.init(num_cpus=1)
    executor = _executor()
    wake_fd = executor._wakeup.fileno
    dataflow.shutdown()
    path = tmp_path / "user-file"
    with open(path, "wb") as f:  # likely to reuse the closed pipe's descriptor numbers
        fds = [os.dup(f.fileno()) for _ in range(4)]
        executor.call_soon(lambda: None)
        executor._wake()
        for fd in fds:
            os.close(fd)
    assert path.read_bytes() == b"", f"wrote into fd {wake_fd} after shutdown"


def test_workers_that_never_start_fail_the_job_clearly_not_forever(fresh_engine):
    # every worker is killed before it can say Ready: the job fails within seconds, naming why
    dataflow.init(num_cpus=1, worker_start_timeout_s=0.001, inline_cold_start=False)
    start = time.perf_counter()
    with pytest.raises(dataflow.DataflowError, match="exited before they were ready"):
        dataflow.range(100).map_batches(lambda b: b).take_all()
    assert time.perf_counter() - start < 30
    assert _executor()._thread.is_alive()

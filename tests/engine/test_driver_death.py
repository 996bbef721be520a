"""A driver that dies without ``shutdown`` leaves nothing behind.

Its zygote, the session's last process, kills the workers and removes the session's
shared-memory and spill folders once the driver is gone (never while it lives, never a folder
whose lock a live process still holds). What no zygote cleaned up is swept by the next process
that executes anything, even a ``count()`` answered from metadata.

Other engine processes on this machine sweep /dev/shm too, so each driver here spills into a
folder of its own (``TMPDIR``): only its zygote, or the sweep under test, can remove that one.
"""

from __future__ import annotations

import fcntl
import glob
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from engine.forkserver import ForkServer
from engine.session import sweep_dead_sessions

PY = sys.executable
TIMEOUT = 10.0

DRIVER = """
    import os, sys, threading, time
    import dataflow
    from engine.session import current_session

    def run():
        global mat
        dataflow.init(num_cpus=2)
        mat = dataflow.range(1_000_000, override_num_blocks=8).map_batches(lambda b: b).materialize()  # ~8 MB
        session = current_session()
        print(session.shm_dir, session.spill_dir, flush=True)

    {start}
    time.sleep(120)
"""


class Driver:
    """A driver subprocess (its own process group), its session's folders and its process tree."""

    def __init__(self, tmp_path: Path, start: str = "run()") -> None:
        name = f"driver-{uuid.uuid4().hex[:6]}"
        self.log = tmp_path / f"{name}.log"
        self.spill_root = tmp_path / f"{name}-spill"
        self.spill_root.mkdir()
        code = textwrap.dedent(DRIVER).replace("{start}", textwrap.dedent(start).strip())
        with open(self.log, "w") as stderr:
            self.proc = subprocess.Popen(
                [PY, "-c", code],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                start_new_session=True,
                env={**os.environ, "TMPDIR": str(self.spill_root)},
            )
        self.tree: list[psutil.Process] = []
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the driver died before its job ran:\n{self.log.read_text()}"
        self.shm_dir, self.spill_dir, *self.extra = line.split()
        assert self.shm_dir.startswith("/dev/shm/dataflow-"), line
        assert self.spill_dir.startswith(str(self.spill_root)), line
        assert glob.glob(os.path.join(self.shm_dir, "*.arrow")) or glob.glob(os.path.join(self.spill_dir, "*.arrow"))
        zygotes = [p for p in psutil.Process(self.proc.pid).children() if "engine.forkserver" in p.cmdline()]
        assert len(zygotes) == 1, zygotes
        # its two workers, started with the session (a small job may not have needed them yet)
        assert _wait(lambda: len(zygotes[0].children()) >= 2, 30), zygotes[0].children()
        self.tree = [zygotes[0], *zygotes[0].children(recursive=True)]

    def folders_gone(self) -> bool:
        return not os.path.exists(self.shm_dir) and not os.path.exists(self.spill_dir)

    def survivors(self) -> list[psutil.Process]:
        return [p for p in self.tree if _alive(p)]

    def close(self) -> None:
        """Whatever the test found: nothing of this driver outlives it."""
        self.proc.kill()
        for p in self.survivors():
            p.kill()
        self.proc.wait(timeout=TIMEOUT)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        for folder in (self.shm_dir, self.spill_dir):
            if os.path.isdir(folder):
                sweep_dead_sessions(os.path.dirname(folder))


@pytest.fixture
def drivers(tmp_path: Path) -> Iterator[list[Driver]]:
    started: list[Driver] = []
    yield started
    for driver in started:
        driver.close()


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait(predicate, timeout: float = TIMEOUT) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _session_folder(root: Path | str, name: str, held: bool = False) -> tuple[str, int | None]:
    """A folder like a session's; its lock held by this process if ``held`` (else its owner died)."""
    path = os.path.join(root, name)
    os.mkdir(path, 0o700)
    Path(path, "block.arrow").write_bytes(b"x" * 1024)
    fd = os.open(os.path.join(path, "lock"), os.O_CREAT | os.O_RDWR, 0o600)
    if held:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return path, fd
    os.close(fd)
    return path, None


def test_a_sigkilled_driver_s_zygote_kills_the_workers_and_removes_the_folders(drivers, tmp_path):
    driver = Driver(tmp_path)
    drivers.append(driver)
    os.kill(driver.proc.pid, signal.SIGKILL)
    assert driver.proc.wait(timeout=TIMEOUT) == -signal.SIGKILL
    assert _wait(driver.folders_gone), f"left behind: {driver.shm_dir}, {driver.spill_dir}"
    assert _wait(lambda: not driver.survivors()), f"survived their driver: {driver.survivors()}"


def test_the_zygote_removes_the_folders_when_another_process_probes_their_lock(drivers, tmp_path):
    """Other processes look at a dead session's lock (a sweep, a leak check), each for a moment:
    the zygote's cleanup waits such a moment out instead of leaving the folders behind."""
    driver = Driver(tmp_path)
    drivers.append(driver)
    fd = os.open(os.path.join(driver.shm_dir, "lock"), os.O_RDWR)
    held = threading.Event()

    def probe() -> None:  # takes the lock the instant the driver's death frees it, for 0.3 s
        fcntl.flock(fd, fcntl.LOCK_EX)
        held.set()
        time.sleep(0.3)
        fcntl.flock(fd, fcntl.LOCK_UN)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        os.kill(driver.proc.pid, signal.SIGKILL)
        assert driver.proc.wait(timeout=TIMEOUT) == -signal.SIGKILL
        assert held.wait(TIMEOUT)
        prober.join()
        assert _wait(driver.folders_gone), f"left behind: {driver.shm_dir}, {driver.spill_dir}"
    finally:
        prober.join()
        os.close(fd)


def test_a_driver_started_from_a_thread_and_killed_by_sigterm_leaves_nothing(drivers, tmp_path):
    """No SIGTERM handler can be installed from a thread: the driver dies of SIGTERM's default
    action, and its zygote cleans up."""
    driver = Driver(
        tmp_path,
        start="""
        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
    """,
    )
    drivers.append(driver)
    driver.proc.terminate()
    assert driver.proc.wait(timeout=TIMEOUT) == -signal.SIGTERM
    assert _wait(driver.folders_gone), f"left behind: {driver.shm_dir}, {driver.spill_dir}"
    assert _wait(lambda: not driver.survivors()), f"survived their driver: {driver.survivors()}"


def test_the_zygote_leaves_a_folder_whose_lock_a_live_process_holds(drivers, tmp_path):
    """A child the driver forked (a DataLoader worker) inherited the session's locks and may still
    read its blocks: the dead driver's zygote kills the workers but keeps the folders."""
    driver = Driver(
        tmp_path,
        start="""
        run()
        if os.fork() == 0:
            time.sleep(120)
            os._exit(0)
    """,
    )
    drivers.append(driver)
    children = psutil.Process(driver.proc.pid).children
    assert _wait(lambda: len(children()) == 2)
    forked = [p for p in children() if p not in driver.tree]
    assert len(forked) == 1
    os.kill(driver.proc.pid, signal.SIGKILL)
    driver.proc.wait(timeout=TIMEOUT)
    assert _wait(lambda: not driver.survivors()), f"survived their driver: {driver.survivors()}"
    assert os.path.isdir(driver.shm_dir) and os.path.isdir(driver.spill_dir)
    forked[0].kill()
    forked[0].wait(TIMEOUT)
    sweep_dead_sessions("/dev/shm")
    assert sweep_dead_sessions(str(driver.spill_root)) == [driver.spill_dir]
    assert driver.folders_gone()


def test_a_count_from_metadata_in_local_mode_sweeps_what_no_zygote_removed(drivers, tmp_path):
    # a driver killed together with its zygote (SIGKILL to the process group): nobody cleaned up
    driver = Driver(tmp_path)
    drivers.append(driver)
    spill_root = driver.spill_root
    os.killpg(driver.proc.pid, signal.SIGKILL)
    driver.proc.wait(timeout=TIMEOUT)
    assert _wait(lambda: not driver.survivors())
    assert os.path.isdir(driver.spill_dir)
    tag = uuid.uuid4().hex[:8]
    dead, _ = _session_folder("/dev/shm", f"dataflow-test-dead-{tag}")
    live, live_fd = _session_folder("/dev/shm", f"dataflow-test-live-{tag}", held=True)
    dead_spill, _ = _session_folder(spill_root, f"dataflow-spill-test-dead-{tag}")
    try:
        out = subprocess.run(
            [PY, "-c", "import dataflow; print(dataflow.range(10).count())"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "DATAFLOW_EXECUTION_MODE": "local", "TMPDIR": str(spill_root)},
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "10"
        for gone in (driver.shm_dir, driver.spill_dir, dead, dead_spill):
            assert not os.path.exists(gone), f"not swept: {gone}"
        assert os.path.isdir(live), "a live session's folder was swept"
    finally:
        assert live_fd is not None
        os.close(live_fd)
        sweep_dead_sessions("/dev/shm")


def _catches_sigterm(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        caught = next(line for line in f if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


@pytest.mark.parametrize("how", ["close", "eof", "sigterm"])
def test_a_zygote_whose_driver_lives_removes_nothing(tmp_path, how):
    """An ordinary shutdown, a closed pipe, a stray SIGTERM (the parent-death signal also fires
    when the driver thread that started the zygote ends): the driver is alive, its folder stays."""
    folder, _ = _session_folder(tmp_path, "dataflow-test")  # lock free: only a live driver protects it
    fs = ForkServer(cleanup=[folder])
    try:
        assert _wait(lambda: _catches_sigterm(fs.proc.pid))
        if how == "sigterm":
            fs.proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            assert fs.alive(), "a SIGTERM ended the zygote of a live driver"
            fs.close()
        elif how == "eof":
            assert fs.proc.stdin is not None
            fs.proc.stdin.close()
            assert fs.proc.wait(timeout=TIMEOUT) == 0
        else:
            fs.close()
        assert fs.proc.wait(timeout=TIMEOUT) == 0
        assert os.path.isdir(folder)
    finally:
        fs.close()

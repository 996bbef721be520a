"""Freed block files written over by later blocks (``engine.spare_files``): only when nobody,
in any process, still opens or maps them, so no batch a user, a UDF or another process kept ever
changes under it."""

from __future__ import annotations

import errno
import fcntl
import gc
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import dataflow
from engine import spare_files
from engine.object_store import SharedMemoryStore, read_block, write_over
from engine.session import current_session
from engine.spare_files import SPARE_MIN_BYTES, SpareFiles, nobody_else_opens, on_tmpfs

MiB = 1 << 20


def _leases_on_tmpfs() -> bool:
    """/dev/shm is tmpfs and the kernel answers write-lease requests there (the pool's ground)."""
    if not (os.path.isdir("/dev/shm") and on_tmpfs("/dev/shm")):
        return False
    fd, path = tempfile.mkstemp(dir="/dev/shm", prefix="spare-test-")
    try:
        return nobody_else_opens(fd) is True
    finally:
        os.close(fd)
        os.unlink(path)


needs_tmpfs = pytest.mark.skipif(not _leases_on_tmpfs(), reason="the pool keeps files only on tmpfs that grants leases")


@pytest.fixture
def shm_tmp():
    """A folder on tmpfs, where the pool keeps files (``tmp_path`` may be on disk)."""
    folder = tempfile.mkdtemp(prefix="spare-test-", dir="/dev/shm")
    yield Path(folder)
    shutil.rmtree(folder, ignore_errors=True)


def _file(path, size: int) -> str:
    with open(path, "wb") as f:
        f.write(b"\x07" * size)
    return str(path)


def _unused(path: str) -> bool:
    fd = os.open(path, os.O_RDONLY)
    try:
        return nobody_else_opens(fd)
    finally:
        os.close(fd)


@needs_tmpfs
def test_the_kernel_says_who_still_maps_a_file(shm_tmp):
    path = _file(shm_tmp / "b", 2 * MiB)
    assert _unused(path)
    mapped = pa.memory_map(path)
    view = mapped.read_buffer(16)  # a view of the mapping outlives the file object
    mapped.close()
    assert not _unused(path)
    del view
    assert _unused(path)
    # another process: mapped with its descriptor closed
    code = f"import mmap, os, sys; fd = os.open({path!r}, os.O_RDONLY); m = mmap.mmap(fd, 0, prot=mmap.PROT_READ); os.close(fd); print(1, flush=True); sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "1"
        assert not _unused(path)
    finally:
        child.communicate("")
    assert _unused(path)


@needs_tmpfs
def test_the_pool_keeps_takes_gives_back_and_forgets(shm_tmp):
    tmp_path = shm_tmp
    pool = SpareFiles(str(tmp_path), capacity=5 * MiB, idle_s=10.0)
    assert not pool.offer(_file(tmp_path / "small.arrow", SPARE_MIN_BYTES - 1), 0.0)  # too small to gain
    assert not os.path.exists(tmp_path / "small.arrow")
    assert pool.offer(_file(tmp_path / "a.arrow", 2 * MiB), 0.0)
    assert pool.offer(_file(tmp_path / "b.arrow", 2 * MiB), 1.0)
    assert not pool.offer(_file(tmp_path / "c.arrow", 2 * MiB), 1.0)  # past the capacity: unlinked
    assert sorted(os.listdir(tmp_path)) == ["spare-0", "spare-1"]  # renamed: nobody opens them by name
    assert pool.bytes == 4 * MiB
    assert pool.take(SPARE_MIN_BYTES - 1) == ()
    first = pool.take(1.5 * MiB)
    assert [os.path.basename(p) for p, _ in first] == ["spare-0"]  # the longest freed first
    held = pa.memory_map(os.path.join(tmp_path, "spare-1")).read_buffer(8)  # still mapped: passed over
    assert pool.take(8 * MiB) == ()
    assert pool.refused == 1 and len(pool) == 1
    del held
    os.rename(first[0][0], tmp_path / "written.arrow")  # a task wrote over the one it took...
    pool.reclaim(first, 2.0)
    assert pool.reused == 1 and len(pool) == 1
    second = pool.take(8 * MiB)
    assert [os.path.basename(p) for p, _ in second] == ["spare-1"]
    pool.reclaim(second, 3.0)  # ...this one it left: the pool's again
    assert len(pool) == 1 and pool.next_expiry(3.0) == pytest.approx(10.0)
    pool.expire(12.9)
    assert len(pool) == 1
    pool.expire(13.0)
    assert len(pool) == 0 and pool.bytes == 0 and pool.next_expiry(13.0) is None
    assert sorted(os.listdir(tmp_path)) == ["written.arrow"]


@needs_tmpfs
def test_the_pool_keeps_nothing_off_tmpfs_or_where_leases_fail(shm_tmp, tmp_path, monkeypatch):
    assert on_tmpfs(str(shm_tmp)) and on_tmpfs("/dev/shm")
    assert not on_tmpfs("/proc/self")
    if not on_tmpfs(str(tmp_path)):  # e.g. an overlay or ext4 /tmp: a mapping may hide from the lease there
        pool = SpareFiles(str(tmp_path), capacity=64 * MiB)
        assert not pool.offer(_file(tmp_path / "a.arrow", 2 * MiB), 0.0)
        assert os.listdir(tmp_path) == []
    pool = SpareFiles(str(shm_tmp), capacity=64 * MiB)
    for name in "abc":
        assert pool.offer(_file(shm_tmp / f"{name}.arrow", 2 * MiB), 0.0)
    first = pool.take(2 * MiB)
    assert len(first) == 1
    real = fcntl.fcntl

    def no_leases(fd, cmd, *args):
        if cmd == fcntl.F_SETLEASE:
            raise OSError(errno.EINVAL, "leases are off")
        return real(fd, cmd, *args)

    monkeypatch.setattr(spare_files.fcntl, "fcntl", no_leases)
    assert pool.take(8 * MiB) == ()  # the kernel cannot tell: the pool lets everything go, for good
    assert len(pool) == 0 and pool.bytes == 0 and pool.capacity == 0
    assert sorted(os.listdir(shm_tmp)) == [os.path.basename(first[0][0])]  # the one a task holds stays its
    pool.reclaim(first, 1.0)  # and goes when the task gives it back
    assert os.listdir(shm_tmp) == []


def _table(rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"i": np.arange(rows) + seed, "x": rng.random(rows), "s": [f"r{seed}-{k}" for k in range(rows)]})


@pytest.mark.parametrize("spare_size", [4 * MiB, 64 * MiB])
def test_a_block_written_over_a_bigger_or_smaller_spare_reads_back_whole(tmp_path, spare_size):
    table = _table(400_000, 3)  # ~13 MiB
    spare = _file(tmp_path / "spare-0", spare_size)
    store = SharedMemoryStore(str(tmp_path), str(tmp_path / "spill"), owner="t")
    store.spares = [(spare, spare_size)]
    ref = store.put(table)
    assert store.spares == [] and not os.path.exists(spare)
    assert read_block(ref).equals(table)
    written = os.path.getsize(ref.path)
    fresh = store.put(table)  # the same table into a new file: the same bytes
    assert os.path.getsize(fresh.path) == written


def test_a_failed_write_over_a_spare_leaves_no_file(tmp_path):
    spare = _file(tmp_path / "spare-0", 4 * MiB)
    target = str(tmp_path / "b.arrow")
    with pytest.raises(AttributeError):
        write_over(spare, target, "not a table")  # type: ignore[arg-type]
    assert os.listdir(tmp_path) == []


class _Keeper:
    """Keeps every batch it is given and checks, on every call, that none of them changed."""

    def __init__(self) -> None:
        self.kept: list[tuple[np.ndarray, float]] = []

    def __call__(self, batch: dict) -> dict:
        for values, total in self.kept:
            if float(values.sum()) != total:
                raise AssertionError("a batch this UDF kept was written over")
        self.kept.append((batch["x"], float(batch["x"].sum())))
        return {"id": batch["id"], "x": batch["x"] * 2}


def _executor_stats() -> dict:
    current = current_session()
    assert current is not None
    current.executor.sync()
    return current.executor.statistics()


@needs_tmpfs
def test_blocks_reuse_freed_files_and_no_kept_batch_changes(fresh_engine):
    """Blocks of 1.6 MB: the read tasks' outputs are freed as the pool consumes them and written
    over by later ones, except those whose batches the UDF (in another process) or the
    consumer here still holds."""
    dataflow.init(num_cpus=2)
    n = 3_200_000

    def slowly(batch: dict) -> dict:
        time.sleep(0.05)  # the consumer frees blocks while later tasks have yet to start
        return {"id": batch["id"], "x": batch["id"].astype(np.float64)}

    ds = dataflow.range(n, override_num_blocks=32).map_batches(slowly)
    # the consumer keeps every other batch, zero-copy
    kept, total = [], 0
    for k, batch in enumerate(ds.iter_batches(batch_size=100_000, batch_format="numpy")):
        total += len(batch["id"])
        if k % 2 == 0:
            kept.append((batch["x"], float(batch["x"].sum()), int(batch["id"][0])))
    assert total == n
    for values, checksum, first in kept:
        assert float(values.sum()) == checksum and values[0] == first
    stats = _executor_stats()
    assert stats["spares_kept"] > 0 and stats["spares_reused"] > 0, stats
    # a UDF on an actor that keeps every batch it was given: written over, it would fail
    out = ds.map_batches(_Keeper, concurrency=1, batch_size=200_000).sum("x")
    assert out == 2 * sum(range(n))


@needs_tmpfs
def test_kept_files_go_back_when_idle_and_on_shutdown(fresh_engine):
    dataflow.init(num_cpus=2)
    current = current_session()
    assert current is not None
    current.executor._spares.idle_s = 0.3  # (the loop wakes for the deadline; no job needed)
    shm_dir = current.shm_dir
    done = dataflow.range(2_000_000, override_num_blocks=8).map_batches(lambda b: {"x": b["id"] * 1.0}).materialize()
    assert done.count() == 2_000_000
    del done  # its blocks (2 MB each) are freed, and kept
    gc.collect()
    assert _executor_stats()["spare_files"] > 0
    spares = lambda: [f for f in os.listdir(shm_dir) if f.startswith("spare-")]  # noqa: E731
    deadline = time.monotonic() + 10
    while spares() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert spares() == []
    assert _executor_stats()["spare_bytes"] == 0

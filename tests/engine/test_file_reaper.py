"""Freed block files are unlinked off the executor's loop (``engine.file_reaper``): the loop
goes on dispatching while the kernel frees a big file's pages, and nothing is left behind."""

from __future__ import annotations

import gc
import glob
import os
import threading
import time

import numpy as np
import pytest

import dataflow
from engine import file_reaper
from engine.file_reaper import BACKGROUND_MIN_BYTES, FileReaper
from engine.session import current_session

MiB = 1 << 20


def _file(path, size: int) -> str:
    with open(path, "wb") as f:
        f.write(b"\x01" * size)
    return str(path)


@pytest.fixture
def held(monkeypatch):
    """Paths the reaper's unlinks wait on until ``release`` is set (others go through)."""
    paths: set[str] = set()
    release = threading.Event()
    real = file_reaper.unlink_quietly

    def gated(path: str) -> None:
        if path in paths:
            assert release.wait(30), "the test never released the reaper"
        real(path)

    monkeypatch.setattr(file_reaper, "unlink_quietly", gated)
    yield paths, release
    release.set()


def test_a_big_file_is_unlinked_by_the_thread_a_small_one_at_once(tmp_path, held):
    paths, release = held
    reaper = FileReaper()
    big = _file(tmp_path / "big", BACKGROUND_MIN_BYTES)
    small = _file(tmp_path / "small", 64 << 10)
    paths.add(big)
    reaper.unlink(big, BACKGROUND_MIN_BYTES)
    assert os.path.exists(big)  # the call returned before the unlink
    assert reaper.pending == 1
    reaper.unlink(small, 64 << 10)  # the thread is stuck on the big one: this one is the caller's
    assert not os.path.exists(small)
    assert not reaper.flush(0.1)
    release.set()
    assert reaper.flush(10)
    assert not os.path.exists(big)
    assert reaper.pending == 0
    reaper.close()


def test_close_unlinks_what_is_left_and_later_files_go_at_once(tmp_path):
    reaper = FileReaper()
    files = [_file(tmp_path / f"f{i}", 2 * MiB) for i in range(5)]
    for path in files:
        reaper.unlink(path, 2 * MiB)
    reaper.close()
    assert not any(os.path.exists(p) for p in files)
    assert reaper.pending == 0
    late = _file(tmp_path / "late", 2 * MiB)
    reaper.unlink(late, 2 * MiB)
    assert not os.path.exists(late)


def test_a_missing_file_does_not_stop_the_thread(tmp_path):
    reaper = FileReaper()
    reaper.unlink(str(tmp_path / "gone"), 4 * MiB)
    real = _file(tmp_path / "real", 4 * MiB)
    reaper.unlink(real, 4 * MiB)
    assert reaper.flush(10)
    assert not os.path.exists(real)
    reaper.close()


def _block_files() -> set[str]:
    session = current_session()
    assert session is not None
    return set(glob.glob(os.path.join(session.shm_dir, "*.arrow")) + glob.glob(os.path.join(session.spill_dir, "*.arrow")))


def test_the_next_job_runs_while_the_last_one_s_blocks_are_unlinked(fresh_engine, held):
    """The executor's loop hands freed files to the reaper: a job whose blocks' unlinks are held
    up does not hold up the next job (before, the loop unlinked each file itself, and a slow
    unlink stalled every dispatch behind it). An 8 MiB store: the 2 MiB blocks are in shared
    memory or spilled, and too big for the pool of files kept to be written over."""
    paths, release = held
    dataflow.init(num_cpus=2, object_store_memory=8 * MiB)
    before = _block_files()
    ds = dataflow.range(8, override_num_blocks=8).map_batches(
        lambda b: {"x": np.ones((len(b["id"]), 2 * MiB // 8))}
    ).materialize()
    files = _block_files() - before
    assert len(files) >= 4, files
    paths.update(files)
    session = current_session()
    assert session is not None and session.store.reaper is not None
    del ds
    gc.collect()
    deadline = time.monotonic() + 10
    while session.store.reaper.pending < len(files) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert session.store.reaper.pending == len(files)  # every file handed over, none unlinked yet
    started = time.monotonic()
    assert dataflow.range(1000, override_num_blocks=4).map(lambda r: {"id": r["id"] * 2}).sum("id") == 999_000
    assert time.monotonic() - started < 20
    assert files <= _block_files()  # still held: the job ran while they waited
    release.set()
    assert session.store.reaper.flush(10)
    assert not files & _block_files()

"""GPU actor pools, tested without a GPU: the engine's bookkeeping is what is checked here
(which worker may see which device); CUDA itself is exercised where a GPU exists."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest

import dataflow
from engine import resources
from engine.errors import ResourceError
from engine.resources import GpuLedger


def test_ledger_packs_fractions_and_keeps_whole_gpus_whole():
    ledger = GpuLedger(2)
    quarters = [ledger.acquire(0.25) for _ in range(4)]
    assert quarters == [(0,), (0,), (0,), (0,)]  # packed onto one device
    assert ledger.acquire(1) == (1,)
    assert ledger.acquire(0.25) is None
    ledger.release((1,), 1)
    assert ledger.how_many(0.5) == 2
    assert ledger.acquire(2) is None


class WhichGpu:
    def __init__(self):
        self.visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")

    def __call__(self, batch):
        return {"id": batch["id"], "gpu": np.array([self.visible] * len(batch["id"]))}


def test_each_actor_sees_only_its_gpus(fresh_engine):
    dataflow.init(num_cpus=2, num_gpus=2)  # two (virtual) devices: the bookkeeping is the same
    rows = dataflow.range(400, override_num_blocks=8).map_batches(
        WhichGpu, num_gpus=1, concurrency=2, batch_size=50
    ).take_all()
    assert {r["gpu"] for r in rows} == {"0", "1"}
    assert sorted(r["id"] for r in rows) == list(range(400))


def test_fractional_gpus_share_a_device(fresh_engine):
    dataflow.init(num_cpus=2, num_gpus=1)
    rows = dataflow.range(400, override_num_blocks=8).map_batches(
        WhichGpu, num_gpus=0.5, concurrency=2, batch_size=50
    ).take_all()
    assert {r["gpu"] for r in rows} == {"0"}


def test_workers_see_the_drivers_gpu_ids_not_ledger_indices(fresh_engine, monkeypatch):
    # a driver limited to GPUs 2 and 5 hands out those devices, not 0 and 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    dataflow.init(num_cpus=2)
    rows = dataflow.range(400, override_num_blocks=8).map_batches(
        WhichGpu, num_gpus=1, concurrency=2, batch_size=50
    ).take_all()
    assert {r["gpu"] for r in rows} == {"2", "5"}


def test_visible_gpu_ids(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 1,-1,0")
    assert resources.visible_gpu_ids() == ["3", "1"]  # CUDA stops at the first invalid id
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert resources.detect_gpus() == 0
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    real_listdir = os.listdir

    def container(path):  # no /proc/driver/nvidia, as in many containers; device nodes in /dev
        if str(path).startswith("/proc/driver/nvidia"):
            raise FileNotFoundError(path)
        if path == "/dev":
            return ["null", "nvidiactl", "nvidia-uvm", "nvidia0", "nvidia1", "nvidia-modeset"]
        return real_listdir(path)

    monkeypatch.setattr(resources.os, "listdir", container)
    assert resources.visible_gpu_ids() == ["0", "1"]


def test_a_gpu_function_runs_on_gpu_workers(fresh_engine):
    dataflow.init(num_cpus=2, num_gpus=1)

    def where(batch):
        return {"gpu": np.array([os.environ.get("CUDA_VISIBLE_DEVICES", "none")] * len(batch["id"]))}

    rows = dataflow.range(100).map_batches(where, num_gpus=1).take_all()
    assert {r["gpu"] for r in rows} == {"0"}


def test_more_gpus_than_the_machine_has_is_an_immediate_error(fresh_engine):
    dataflow.init(num_cpus=2, num_gpus=1)
    with pytest.raises(ValueError, match="num_gpus=2"):
        dataflow.range(10).map_batches(WhichGpu, num_gpus=2, concurrency=1).take_all()


def test_custom_resources_limit_how_many_tasks_run_at_once(fresh_engine):
    import time

    dataflow.init(num_cpus=2, resources={"TPU": 1})

    def timed(batch):
        start = time.time()
        time.sleep(0.2)
        return {"start": np.array([start]), "end": np.array([time.time()])}

    rows = dataflow.range(4, override_num_blocks=4).map_batches(timed, resources={"TPU": 1}).take_all()
    spans = sorted((r["start"], r["end"]) for r in rows)
    assert len(spans) == 4
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end - 0.01, "two tasks held the only TPU at once"


def test_a_plan_without_gpus_does_not_look_for_them(fresh_engine, monkeypatch):
    """Counting GPUs lists /dev (0.2 ms): a job none of whose operators asks for a GPU skips it,
    and one that asks still fails at once where there are none."""
    dataflow.init(num_cpus=2)
    assert dataflow.range(10).map(lambda r: r).count() == 10  # the session is up
    calls = []
    real = resources.detect_gpus
    monkeypatch.setattr(resources, "detect_gpus", lambda: calls.append(1) or real())
    assert sorted(r["id"] for r in dataflow.range(10).map(lambda r: r).take_all()) == list(range(10))
    assert calls == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ResourceError, match=r"num_gpus=1\.0 but this machine has 0 GPUs"):
        dataflow.range(10).map_batches(lambda b: b, num_gpus=1).take_all()
    assert calls

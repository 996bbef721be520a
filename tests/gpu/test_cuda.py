"""CUDA for real: GPU actor pools, batches delivered on the device, CUDA errors. Skipped without a GPU.

The bookkeeping (which worker may see which device) is tested without a GPU in
``tests/engine/test_gpu_pools.py``; here the same paths run with CUDA initialized in the workers
and in the driver, on every GPU the machine has.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pyarrow as pa
import pytest

import dataflow
from engine.block_format import tensor_array
from engine.resources import detect_gpus

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

DIM = 32


def table_of(rows: int) -> pa.Table:
    emb = np.random.default_rng(0).standard_normal((rows, DIM), dtype=np.float32)
    return pa.table({"id": np.arange(rows, dtype=np.int64), "emb": tensor_array(emb)})


def reference_model() -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(DIM, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4)).eval()


class CudaScorer:
    """The model on the GPU this actor was given; reports what the actor saw."""

    def __init__(self) -> None:
        self.model = reference_model().to("cuda")
        self.visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        self.count = torch.cuda.device_count()
        self.name = torch.cuda.get_device_name(0)

    def __call__(self, batch: dict) -> dict:
        with torch.inference_mode():
            x = torch.as_tensor(batch["emb"]).to("cuda", non_blocking=True)
            out = self.model(x)
            assert out.is_cuda
            scores = out.cpu().numpy()
        n = len(scores)
        return {"id": batch["id"], "scores": scores, "pid": np.full(n, os.getpid()),
                "visible": np.array([self.visible] * n), "count": np.full(n, self.count)}


def cpu_scores(rows: int) -> np.ndarray:
    emb = np.random.default_rng(0).standard_normal((rows, DIM), dtype=np.float32)
    with torch.inference_mode():
        return reference_model()(torch.from_numpy(emb)).numpy()


def test_the_engine_counts_the_gpus_torch_sees():
    assert detect_gpus() == torch.cuda.device_count()


def test_actor_scores_on_its_own_gpu(streaming):
    rows = 4000
    out = dataflow.from_arrow(table_of(rows), override_num_blocks=8).map_batches(
        CudaScorer, num_gpus=1, concurrency=1, batch_size=512).to_arrow().sort_by("id")
    assert out.column("id").to_pylist() == list(range(rows))
    assert set(out.column("count").to_pylist()) == {1}  # the actor sees exactly one device
    assert len(set(out.column("visible").to_pylist())) == 1
    scores = np.stack(out.column("scores").to_numpy(zero_copy_only=False))
    np.testing.assert_allclose(scores, cpu_scores(rows), rtol=1e-3, atol=1e-4)


def test_whole_gpu_actors_get_distinct_devices(streaming):
    gpus = detect_gpus()
    out = dataflow.from_arrow(table_of(4000), override_num_blocks=16).map_batches(
        CudaScorer, num_gpus=1, concurrency=(1, gpus), batch_size=256).to_arrow()
    by_pid = {}
    for pid, visible in zip(out.column("pid").to_pylist(), out.column("visible").to_pylist(), strict=True):
        by_pid.setdefault(pid, set()).add(visible)
    assert 1 <= len(by_pid) <= gpus
    devices = [v for vs in by_pid.values() for v in vs]
    assert len(devices) == len(set(devices)) == len(by_pid)  # no two actors on one device
    assert sorted(out.column("id").to_pylist()) == list(range(4000))


def test_fractional_actors_share_one_gpu(streaming):
    out = dataflow.from_arrow(table_of(3000), override_num_blocks=12).map_batches(
        CudaScorer, num_gpus=0.5, concurrency=2, batch_size=250).to_arrow()
    assert len(set(out.column("pid").to_pylist())) == 2
    assert len(set(out.column("visible").to_pylist())) == 1  # both packed onto one device
    scores = np.stack(out.sort_by("id").column("scores").to_numpy(zero_copy_only=False))
    np.testing.assert_allclose(scores, cpu_scores(3000), rtol=1e-3, atol=1e-4)


def test_iter_torch_batches_on_cuda(mode):
    ds = dataflow.from_arrow(table_of(1000), override_num_blocks=4)
    for device, pin in (("cuda", True), ("cuda:0", False), ("auto", True)):
        batches = list(ds.iter_torch_batches(batch_size=300, device=device, pin_memory=pin))
        assert all(b["emb"].is_cuda and b["id"].is_cuda for b in batches)
        ids = torch.cat([b["id"] for b in batches]).cpu()
        emb = torch.cat([b["emb"] for b in batches]).cpu()[ids.argsort()]
        np.testing.assert_array_equal(emb.numpy(), np.stack(table_of(1000).column("emb").to_numpy(zero_copy_only=False)))


def test_streaming_split_ranks_train_on_cuda(streaming):
    splits = dataflow.range(6000, override_num_blocks=12).streaming_split(2, equal=True)
    totals: list[int] = [0, 0]
    errors: list[BaseException] = []

    def rank(i: int) -> None:
        try:
            model = torch.nn.Linear(1, 1).to("cuda")
            opt = torch.optim.SGD(model.parameters(), lr=1e-9)
            for batch in splits[i].iter_torch_batches(batch_size=256, device="cuda", dtypes=torch.float32):
                loss = model(batch["id"].unsqueeze(1)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                totals[i] += int(batch["id"].sum().item())
        except BaseException as exc:  # reraised in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert sum(totals) == sum(range(6000))


class Hog:
    """Asks the GPU for far more memory than it has."""

    def __init__(self) -> None:
        self.device = torch.device("cuda")

    def __call__(self, batch: dict) -> dict:
        torch.empty(1 << 50, dtype=torch.uint8, device=self.device)
        return batch


def test_cuda_out_of_memory_reaches_the_caller_as_itself(streaming):
    ds = dataflow.range(100).map_batches(Hog, num_gpus=1, concurrency=1)
    with pytest.raises(torch.cuda.OutOfMemoryError) as info:
        ds.take_all()
    assert "Hog" in str(info.value) or "Hog" in "".join(str(n) for n in getattr(info.value, "__notes__", []))
    # the device is free again: the next GPU job in the same session runs
    out = dataflow.from_arrow(table_of(500)).map_batches(CudaScorer, num_gpus=1, concurrency=1, batch_size=100)
    assert out.count() == 500


def test_gpu_actors_start_after_the_driver_used_cuda(fresh_engine):
    torch.zeros(1, device="cuda").add_(1)  # CUDA initialized in the driver before the engine starts
    torch.cuda.synchronize()
    dataflow.init(num_cpus=2)
    out = dataflow.from_arrow(table_of(1000), override_num_blocks=4).map_batches(
        CudaScorer, num_gpus=1, concurrency=1, batch_size=250).to_arrow()
    assert out.num_rows == 1000
    np.testing.assert_allclose(np.stack(out.sort_by("id").column("scores").to_numpy(zero_copy_only=False)),
                               cpu_scores(1000), rtol=1e-3, atol=1e-4)

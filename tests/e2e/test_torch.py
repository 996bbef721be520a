"""Torch: batch inference with a model on an actor pool, iter_torch_batches, the DataLoader adapter."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import uuid

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import dataflow
from dataflow.collate_fn import ArrowBatchCollateFn, DefaultCollateFn, NumpyBatchCollateFn, PandasBatchCollateFn
from engine import session as engine_session
from engine.block_format import tensor_array

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

DIM = 64


def embeddings(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, DIM), dtype=np.float32)


def table_of(rows: int) -> pa.Table:
    return pa.table({"id": np.arange(rows, dtype=np.int64), "emb": tensor_array(embeddings(rows))})


class MLP:
    """Built once per actor; reports which process and which instance scored each row."""

    def __init__(self, seed: int) -> None:
        torch.manual_seed(seed)
        torch.set_num_threads(1)
        self.model = torch.nn.Sequential(torch.nn.Linear(DIM, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).eval()
        self.instance = uuid.uuid4().hex

    def __call__(self, batch):
        from dataflow.torch_batches import tensor_view

        with torch.inference_mode():
            scores = self.model(tensor_view(batch["emb"])).numpy()
        n = len(scores)
        return {"id": batch["id"], "scores": scores, "pid": np.full(n, os.getpid()),
                "instance": np.array([self.instance] * n), "rows": np.full(n, n)}


# ----- batch inference ---------------------------------------------------------------------


def test_model_constructed_once_per_actor_and_scores_match(mode):
    rows = 3000
    ds = dataflow.from_arrow(table_of(rows), override_num_blocks=6).map_batches(
        MLP, batch_size=256, concurrency=2, fn_constructor_args=(7,))
    out = ds.to_arrow().sort_by("id")
    assert out.num_rows == rows
    pids = out.column("pid").to_numpy()
    instances = out.column("instance").to_pylist()
    by_pid = {}
    for pid, inst in zip(pids, instances):
        by_pid.setdefault(int(pid), set()).add(inst)
    assert all(len(v) == 1 for v in by_pid.values()), f"a process built the model twice: {by_pid}"
    assert len(set(instances)) <= 2  # concurrency=2: at most two actors
    assert rows // 256 > len(set(instances))  # so each model served many batches
    reference = MLP(7)
    with torch.inference_mode():
        expected = reference.model(torch.from_numpy(embeddings(rows))).numpy()
    np.testing.assert_allclose(np.stack(out.column("scores").to_numpy(zero_copy_only=False)), expected,
                               rtol=1e-5, atol=1e-5)


def test_udf_gets_exactly_batch_size_rows_but_the_last(mode):
    ds = dataflow.from_arrow(table_of(1000), override_num_blocks=1).map_batches(
        lambda b: {"call": np.array([uuid.uuid4().hex] * len(b["id"])), "first": np.full(len(b["id"]), b["id"][0])},
        batch_size=128)
    rows = ds.to_arrow()
    calls = {}
    for call, first in zip(rows.column("call").to_pylist(), rows.column("first").to_pylist()):
        calls.setdefault(call, [first, 0])[1] += 1
    sizes = [n for _, n in sorted(calls.values())]
    assert sizes == [128] * 7 + [1000 - 7 * 128]


def test_udf_gets_numeric_and_tensor_columns_as_numpy_views(mode):
    source = table_of(500)
    original = {"id": source.column("id").chunk(0).to_numpy(), "emb": embeddings(500)}
    local = mode == "local"

    def check(batch):
        flags = []
        for name in ("id", "emb"):
            arr = batch[name]
            assert isinstance(arr, np.ndarray) and arr.dtype != object
            # a view of Arrow memory: numpy neither owns it nor may write it
            view = not arr.flags.owndata and not arr.flags.writeable
            if local:  # the driver's own table: the very same memory
                view = view and np.shares_memory(arr, original["id"] if name == "id" else source.column("emb").chunk(0).storage.flatten().to_numpy())
            flags.append(view)
        return {"ok": np.full(len(batch["id"]), all(flags))}

    assert batch_shape(source) == (500, DIM)
    ok = dataflow.from_arrow(source).map_batches(check, batch_size=100).to_numpy("ok")
    assert ok.all() and len(ok) == 500


def batch_shape(table: pa.Table) -> tuple[int, ...]:
    from engine.block_format import column_to_numpy

    return column_to_numpy(table.column("emb")).shape


def test_num_gpus_without_gpus_fails_at_once(mode):
    from engine.errors import ResourceError

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    ds = dataflow.from_arrow(table_of(100)).map_batches(MLP, batch_size=10, concurrency=1, num_gpus=1,
                                                       fn_constructor_args=(0,))
    start = time.monotonic()
    with pytest.raises(ResourceError, match=r"(?i)gpu"):
        ds.take_all()
    assert time.monotonic() - start < 10


def test_batch_inference_example(streaming, tmp_path):
    from dataflow.examples import batch_inference

    batch_inference.generate(str(tmp_path / "in"), 5000, files=2)
    assert batch_inference.run(str(tmp_path / "in"), str(tmp_path / "out"), batch_size=512) == 5000
    out = dataflow.read_parquet(str(tmp_path / "out")).to_arrow()
    assert sorted(out.column("id").to_pylist()) == list(range(5000))
    assert out.column("label").to_numpy().max() < 10


# ----- iter_torch_batches ------------------------------------------------------------------


def test_iter_torch_batches_tensors_dtypes_drop_last(mode):
    ds = dataflow.from_arrow(table_of(1000), override_num_blocks=3)
    batches = list(ds.iter_torch_batches(batch_size=300, device="cpu"))
    assert [len(b["id"]) for b in batches] == [300, 300, 300, 100]
    first = batches[0]
    assert first["id"].dtype == torch.int64 and first["emb"].dtype == torch.float32
    assert first["emb"].shape == (300, DIM) and first["emb"].device.type == "cpu"
    order = torch.cat([b["id"] for b in batches]).argsort()  # blocks arrive as they finish
    np.testing.assert_array_equal(torch.cat([b["emb"] for b in batches])[order].numpy(), embeddings(1000))
    assert [len(b["id"]) for b in ds.iter_torch_batches(batch_size=300, drop_last=True)] == [300] * 3
    one = next(iter(ds.iter_torch_batches(batch_size=10, dtypes=torch.float64)))
    assert one["id"].dtype == torch.float64 and one["emb"].dtype == torch.float64
    per = next(iter(ds.iter_torch_batches(batch_size=10, dtypes={"emb": torch.float16})))
    assert per["id"].dtype == torch.int64 and per["emb"].dtype == torch.float16


def test_iter_torch_batches_collate_fn_gets_numpy(mode):
    seen = []

    def collate(batch):
        seen.append({k: type(v) for k, v in batch.items()})
        return torch.as_tensor(batch["id"] * 2), [torch.as_tensor(batch["emb"].sum(axis=1))]

    out = list(dataflow.from_arrow(table_of(100)).iter_torch_batches(batch_size=40, collate_fn=collate))
    assert seen and all(s == {"id": np.ndarray, "emb": np.ndarray} for s in seen)
    assert torch.cat([ids for ids, _ in out]).tolist() == [2 * i for i in range(100)]
    assert isinstance(out[0][1], list) and out[0][1][0].shape == (40,)
    with pytest.raises(ValueError, match="dtypes"):
        dataflow.range(3).iter_torch_batches(collate_fn=collate, dtypes=torch.float32)


@dataclasses.dataclass
class _Batch:
    x: torch.Tensor


def test_collate_fn_may_return_anything_and_rows_are_counted_from_the_batch(mode):
    """Ray does not take the length of what ``collate_fn`` returns: a dataclass, a 0-d tensor,
    or a tuple ``(x, y)``, which holds its batch's rows, not 2."""
    ds = dataflow.range(10)
    boxed = list(ds.iter_torch_batches(batch_size=4, collate_fn=lambda b: _Batch(torch.tensor(b["id"]))))
    assert [b.x.tolist() for b in boxed] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    sums = list(ds.iter_torch_batches(batch_size=4, collate_fn=lambda b: torch.tensor(b["id"]).sum()))
    assert [s.item() for s in sums] == [6, 22, 17]
    it = ds.iterator()
    pairs = it.iter_torch_batches(batch_size=4, collate_fn=lambda b: (torch.tensor(b["id"]), torch.tensor(b["id"])))
    next(pairs)
    assert it.state_dict()["rows_consumed"] == 4
    pairs.close()


class ArrowCollate(ArrowBatchCollateFn):
    def __call__(self, batch):
        assert isinstance(batch, pa.Table)
        return torch.tensor(batch.column("id").to_numpy())  # a copy: Arrow memory is read-only


class PandasCollate(PandasBatchCollateFn):
    def __call__(self, batch):
        assert isinstance(batch, pd.DataFrame)
        return torch.as_tensor(batch["id"].to_numpy(dtype="int64") + 1)


def test_collate_fn_classes_get_the_batch_format_they_name(mode):
    """Ray's ``ray.data.collate_fn`` classes: an Arrow one gets tables, a pandas one frames."""
    ds = dataflow.range(100, override_num_blocks=3)
    arrow = torch.cat(list(ds.iter_torch_batches(batch_size=32, collate_fn=ArrowCollate())))
    assert sorted(arrow.tolist()) == list(range(100))
    frames = torch.cat(list(ds.iter_torch_batches(batch_size=32, collate_fn=PandasCollate())))
    assert sorted(frames.tolist()) == list(range(1, 101))
    with pytest.raises(TypeError, match="abstract"):
        NumpyBatchCollateFn()


def test_default_collate_fn_gives_tensors_of_their_own(mode):
    """Ray's ``DefaultCollateFn``: passed (or subclassed) as the collate, a dict of tensors."""
    ds = dataflow.range(100, override_num_blocks=3).map_batches(lambda b: {"id": b["id"], "half": b["id"] / 2})
    out = list(ds.iter_torch_batches(batch_size=32, collate_fn=DefaultCollateFn(dtypes={"id": torch.float32})))
    assert all(set(b) == {"id", "half"} for b in out)
    assert out[0]["id"].dtype == torch.float32 and out[0]["half"].dtype == torch.float64
    assert sorted(torch.cat([b["id"] for b in out]).tolist()) == [float(i) for i in range(100)]
    table = pa.table({"x": np.arange(5, dtype=np.int64)})
    tensors = DefaultCollateFn(combine_chunks=True)(table)
    tensors["x"][0] = 99  # its own memory: the table is unchanged
    assert table.column("x").to_pylist() == [0, 1, 2, 3, 4]
    with pytest.raises(TypeError, match="dtypes"):
        DefaultCollateFn(dtypes="float32")


def test_iter_torch_batches_local_shuffle(mode):
    ds = dataflow.range(2000, override_num_blocks=4)

    def ids(seed):
        return torch.cat([b["id"] for b in ds.iter_torch_batches(
            batch_size=100, local_shuffle_buffer_size=500, local_shuffle_seed=seed)]).tolist()

    a = ids(1)
    assert sorted(a) == list(range(2000)) and a != list(range(2000))
    if mode == "local":  # the same seed over the same block order: the same permutation
        assert a == ids(1) and a != ids(2)


def test_iter_torch_batches_devices_without_cuda(mode):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    ds = dataflow.range(10)
    auto = next(iter(ds.iter_torch_batches(device="auto", pin_memory=True)))  # pinning: a no-op without CUDA
    assert auto["id"].device.type == "cpu" and auto["id"].tolist() == list(range(10))
    for device in ("cuda", "cuda:0", torch.device("cuda")):
        with pytest.raises(ValueError, match="CUDA is not available"):
            ds.iter_torch_batches(device=device)  # at call time, before any batch
    with pytest.raises(ValueError, match="device must be"):
        ds.iter_torch_batches(device="no-such-device")


def test_iter_torch_batches_rejects_string_columns_clearly(mode):
    ds = dataflow.from_items([{"id": 1, "text": "a"}, {"id": 2, "text": "b"}])
    with pytest.raises(TypeError, match="column 'text'"):
        list(ds.iter_torch_batches())
    assert next(iter(ds.select_columns(["id"]).iter_torch_batches()))["id"].tolist() == [1, 2]


def _mapped_files() -> list[tuple[int, int, str]]:
    ranges = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                ranges.append((lo, hi, parts[5]))
    return ranges


def test_tensors_are_zero_copy_views_of_shared_memory_and_writes_stay_private(streaming):
    shm_dir = engine_session.current_session().shm_dir
    ds = dataflow.from_arrow(table_of(1000), override_num_blocks=2).map_batches(lambda b: b).materialize()
    for batch in ds.iter_torch_batches(batch_size=100, device="cpu"):  # "auto" is CUDA where there is one
        maps = _mapped_files()
        for name in ("id", "emb"):
            ptr = batch[name].data_ptr()
            assert any(lo <= ptr < hi and path.startswith(shm_dir) for lo, hi, path in maps), (
                f"column {name} was copied out of the object store")
        batch["emb"] += 1.0  # copy-on-write: private to this batch
    again = list(ds.iter_torch_batches(batch_size=100, device="cpu"))
    order = torch.cat([b["id"] for b in again]).argsort()
    np.testing.assert_array_equal(torch.cat([b["emb"] for b in again])[order].numpy(), embeddings(1000))


def test_in_process_mode_tensors_never_write_into_the_dataset():
    with dataflow.options(execution_mode="local"):
        data = embeddings(50)
        ds = dataflow.from_numpy(data)
        for batch in ds.iter_torch_batches(batch_size=10):
            batch["data"] += 1.0
        np.testing.assert_array_equal(data, embeddings(50))


# ----- the IterableDataset adapter ---------------------------------------------------------


def _ids_from_loader(dataset, num_workers):
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=num_workers)
    return [i for batch in loader for i in batch["id"].tolist()]


def test_torch_iterable_with_dataloader_workers_reads_every_row_once(mode):
    ds = dataflow.range(1000, override_num_blocks=10).map_batches(lambda b: {"id": b["id"], "sq": b["id"] ** 2})
    ids = _ids_from_loader(ds.to_torch_iterable(batch_size=64), num_workers=2)
    assert sorted(ids) == list(range(1000))
    assert sorted(_ids_from_loader(ds.to_torch_iterable(batch_size=64), num_workers=0)) == list(range(1000))


def test_dataloader_workers_leave_the_parent_engine_alone(mode):
    import signal

    def probe(batch):
        n = len(batch["id"])
        return {"id": batch["id"], "pid": np.full(n, os.getpid()),
                "no_session": np.full(n, engine_session.current_session() is None),
                "sigterm_default": np.full(n, signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)}

    ds = dataflow.range(200, override_num_blocks=4).map_batches(probe)
    loader = torch.utils.data.DataLoader(ds.to_torch_iterable(batch_size=50), batch_size=None, num_workers=2)
    batches = list(loader)
    assert sorted(i for b in batches for i in b["id"].tolist()) == list(range(200))
    assert all(b["no_session"].all() and b["sigterm_default"].all() for b in batches)
    assert os.getpid() not in {p for b in batches for p in b["pid"].tolist()}
    if mode == "streaming":  # the parent's engine still works
        assert dataflow.range(10).map(lambda r: r).count() == 10


def test_torch_iterable_from_a_materialized_dataset(mode):
    ds = dataflow.range(600, override_num_blocks=6).map_batches(lambda b: b).materialize()
    ids = _ids_from_loader(ds.to_torch_iterable(batch_size=50), num_workers=2)
    assert sorted(ids) == list(range(600))


def test_torch_iterable_shards_across_ranks_and_workers(mode, monkeypatch):
    ds = dataflow.range(900, override_num_blocks=9)
    seen = []
    monkeypatch.setattr(torch.distributed, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 3)
    for rank in range(3):
        monkeypatch.setattr(torch.distributed, "get_rank", lambda rank=rank: rank)
        seen += _ids_from_loader(ds.to_torch_iterable(batch_size=32), num_workers=2)
    assert sorted(seen) == list(range(900))


def test_torch_iterable_shards_a_mix_by_its_inputs(mode, monkeypatch):
    a = dataflow.range(600, override_num_blocks=6)
    b = dataflow.range(300, override_num_blocks=3).map_batches(lambda t: {"id": t["id"] + 10_000})
    mixed = a.mix(b, weights=[2, 1])
    ids = _ids_from_loader(mixed.to_torch_iterable(batch_size=50), num_workers=2)
    assert sorted(ids) == list(range(600)) + list(range(10_000, 10_300))
    shortest = a.mix(b, stopping_condition=dataflow.MixStoppingCondition.STOP_ON_SHORTEST)
    monkeypatch.setattr(torch.distributed, "is_available", lambda: True)  # rank 0 of 2, in this process
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 0)
    with pytest.raises(ValueError, match="STOP_ON_SHORTEST cannot be sharded"):
        _ids_from_loader(shortest.to_torch_iterable(batch_size=50), num_workers=0)


def test_torch_iterable_refuses_a_limit_when_sharded(mode, monkeypatch):
    it = dataflow.range(100).limit(10).to_torch_iterable(batch_size=5)
    assert _ids_from_loader(it, num_workers=0) == list(range(10))  # one shard: nothing to split
    monkeypatch.setattr(torch.distributed, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 0)
    with pytest.raises(ValueError, match="limit"):
        _ids_from_loader(it, num_workers=0)


def _busy_block(batch):
    time.sleep(0.2)  # keeps a worker (and its CPU in the ledger) busy while the loop runs
    return batch


def test_closing_a_torch_iterator_restores_threads_at_once_whoever_else_holds_its_stages(streaming, monkeypatch):
    """close() runs the stages' cleanup on the caller's thread, not at a later collection elsewhere.

    torch's thread count belongs to a thread: a stage closed by a garbage collection on another
    thread (its generator caught in a reference cycle) would restore that thread's count instead.
    """
    import dataflow.torch_batches as torch_batches

    held = []
    real = torch_batches._batches

    def holding(*args, **kwargs):
        stage = real(*args, **kwargs)
        held.append(stage)  # as a reference cycle would: the stage outlives the caller's iterator
        return stage

    monkeypatch.setattr(torch_batches, "_batches", holding)
    saved = torch.get_num_threads()
    torch.set_num_threads(len(os.sched_getaffinity(0)) + 2)
    try:
        ds = dataflow.range(4_000, override_num_blocks=4).map_batches(_busy_block)
        batches = ds.iter_torch_batches(batch_size=500, device="cpu")
        next(batches)
        batches.close()
        assert held and held[0].gi_frame is None  # closed, its finally run
        assert torch.get_num_threads() == len(os.sched_getaffinity(0)) + 2
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"))])
def test_torch_threads_make_room_for_busy_workers_and_are_restored_after(mode, device):
    """Workers hold cores while a loop iterates; torch's spinning OpenMP threads would fight them.
    On CUDA too: a loop that breaks early gets its thread count back (its stages closed at once)."""
    saved = torch.get_num_threads()
    cores = len(os.sched_getaffinity(0))
    torch.set_num_threads(cores)
    try:
        ds = dataflow.range(4_000, override_num_blocks=4).map_batches(_busy_block)
        seen = {torch.get_num_threads() for _ in ds.iter_torch_batches(batch_size=500, device=device)}
        assert torch.get_num_threads() == cores
        if mode == "local" or cores == 1:
            assert seen == {cores}
        else:
            assert min(seen) < cores and min(seen) >= max(1, cores - 2), seen

        batches = ds.iter_torch_batches(batch_size=500, device=device)
        next(batches)
        batches.close()  # a loop that breaks out early
        assert torch.get_num_threads() == cores

        ctx = dataflow.DataContext.get_current()
        ctx.cap_torch_threads = False
        try:
            assert {torch.get_num_threads() for _ in ds.iter_torch_batches(batch_size=500)} == {cores}
        finally:
            ctx.cap_torch_threads = True
    finally:
        torch.set_num_threads(saved)


def test_thread_cap_follows_busy_workers_and_yields_to_the_loops_own_setting():
    from dataflow.torch_batches import _TorchThreadCap

    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        cap = _TorchThreadCap()
        cap.enter()
        cap._state.cores = 4  # as if this machine had 4 cores
        cap.adjust(3.0)
        assert torch.get_num_threads() == 1
        cap.adjust(1.5)  # a fraction of a CPU counts as a whole one
        assert torch.get_num_threads() == 2
        cap.adjust(0.0)
        assert torch.get_num_threads() == 4  # never more than the loop had
        cap.enter()  # a second iterator
        cap.adjust(4.0)
        cap.exit()
        assert torch.get_num_threads() == 1  # still one iterator running
        cap.exit()
        assert torch.get_num_threads() == 4  # the last one restores

        cap.enter()
        cap._state.cores = 4
        cap.adjust(2.0)
        torch.set_num_threads(3)  # the loop chose its own: hands off from now on
        cap.adjust(4.0)
        cap.exit()
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(saved)


def test_thread_cap_is_per_thread_and_each_loop_gets_its_own_back():
    """torch's thread count belongs to the thread that sets it: two loops in two threads (split
    ranks) are capped and restored independently, whatever order they end in."""
    from dataflow.torch_batches import _TorchThreadCap

    cap = _TorchThreadCap()
    ready, release = threading.Barrier(2), threading.Barrier(2)
    results: dict[str, tuple[int, int]] = {}

    def loop(name: str, busy: float, end_first: bool) -> None:
        torch.set_num_threads(4)
        cap.enter()
        cap._state.cores = 4
        cap.adjust(busy)
        during = torch.get_num_threads()
        ready.wait(10)
        if not end_first:
            release.wait(10)
        cap.exit()
        if end_first:
            release.wait(10)
        results[name] = (during, torch.get_num_threads())

    threads = [threading.Thread(target=loop, args=("a", 3.0, True)), threading.Thread(target=loop, args=("b", 2.0, False))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert results == {"a": (1, 4), "b": (2, 4)}


def test_torch_tensors_a_udf_returns_become_columns_as_in_ray(mode):
    """An inference UDF returns the model's tensors: Ray converts them; dataflow raised
    TypeError ("cannot convert values to Arrow")."""
    out = dataflow.range(4).map_batches(lambda b: {"t": torch.as_tensor(b["id"].copy()) * 2}).take_all()
    assert [r["t"] for r in out] == [0, 2, 4, 6]
    grads = dataflow.range(2).map_batches(lambda b: {"p": torch.ones(len(b["id"]), 2, requires_grad=True) * 2})
    assert [r["p"].tolist() for r in grads.take_all()] == [[2.0, 2.0]] * 2  # detached, on the CPU
    rows = dataflow.from_items([{"t": torch.tensor([1.0, 2.0])}, {"t": torch.tensor([3.0, 4.0])}]).take_all()
    assert [r["t"].tolist() for r in rows] == [[1.0, 2.0], [3.0, 4.0]] and rows[0]["t"].dtype == np.float32
    assert dataflow.range(2).map(lambda r: {"t": torch.tensor(r["id"])}).take_all() == [{"t": 0}, {"t": 1}]

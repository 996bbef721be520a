"""streaming_split: n iterators over one execution, equal on request, usable from other processes."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import dataflow


def _drain(iterators, batch_size=64, epochs=1):
    seen = [[] for _ in iterators]
    errors = []

    def run(i):
        try:
            for _ in range(epochs):
                for batch in iterators[i].iter_batches(batch_size=batch_size):
                    seen[i].extend(batch["id"].tolist())
        except BaseException as err:  # reported by the test
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(iterators))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads), "a split iterator hung"
    return seen


def test_equal_split_gives_every_split_the_same_rows_and_reports_the_rest(mode):
    its = dataflow.range(1003, override_num_blocks=7).streaming_split(3, equal=True)
    seen = _drain(its)
    assert [len(s) for s in seen] == [334, 334, 334]
    everything = [i for s in seen for i in s]
    assert len(set(everything)) == 1002
    stats = its[0].split_stats()
    assert {k: stats[k] for k in ("dropped_rows", "rows")} == {"dropped_rows": 1, "rows": [334, 334, 334]}
    # Ray's DataIterator.stats() of a split is text: the execution's statistics, then the split's
    text = its[1].stats()
    assert isinstance(text, str) and "ReadRange" in text, text
    assert text.endswith("rows per split [334, 334, 334], dropped to make them equal 1"), text


def test_unequal_split_delivers_every_row_once(mode):
    its = dataflow.range(5000, override_num_blocks=20).map(lambda r: r).streaming_split(2)
    seen = _drain(its)
    assert sorted(seen[0] + seen[1]) == list(range(5000))


def test_each_epoch_runs_the_plan_again(mode):
    its = dataflow.range(200, override_num_blocks=4).streaming_split(2, equal=True)
    seen = _drain(its, epochs=3)
    assert [len(s) for s in seen] == [300, 300]
    assert sorted(seen[0] + seen[1]) == sorted(list(range(200)) * 3)


def test_a_split_that_stops_early_does_not_block_the_others(mode):
    its = dataflow.range(2000, override_num_blocks=10).streaming_split(2)
    first = next(iter(its[0].iter_batches(batch_size=10)))
    assert len(first["id"]) == 10
    rest = _drain([its[1]])[0]
    assert len(rest) + 10 <= 2000 and len(set(rest)) == len(rest)


def test_a_fast_split_waits_for_a_slow_one_when_equal(fresh_engine):
    import numpy as np

    MiB = 1 << 20
    dataflow.init(num_cpus=2, consumer_buffer_bytes=4 * MiB, op_output_budget=4 * MiB, min_task_input_bytes=1)
    ds = dataflow.range(20_000, override_num_blocks=20).map_batches(
        lambda b: {"id": b["id"], "payload": np.zeros((len(b["id"]), 128))}  # 1 MiB per block
    )
    its = ds.streaming_split(2, equal=True)
    fast = its[0].iter_batches(batch_size=100, prefetch_batches=0)
    got = 0
    done = threading.Event()

    def read_fast():
        nonlocal got
        for batch in fast:
            got += len(batch["id"])
        done.set()

    t = threading.Thread(target=read_fast)
    t.start()
    t.join(3)
    # the slow split has read nothing: the fast one is held within one block of it
    assert got <= 1000 + 100, got
    slow = sum(len(b["id"]) for b in its[1].iter_batches(batch_size=100))
    t.join(30)
    assert done.is_set() and got == slow == 10_000


RANK_SCRIPT = """
import os, pickle, sys
import torch
import torch.distributed as dist

rank, world, port, path, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
dist.init_process_group("gloo", rank=rank, world_size=world)
with open(path, "rb") as f:
    iterator = pickle.load(f)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
seen = []
for epoch in range(2):
    for batch in iterator.iter_batches(batch_size=32, batch_format="numpy"):
        x = torch.from_numpy(batch["x"].astype("float32"))
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():  # DDP-style gradient averaging: every rank steps together
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        seen.extend((epoch, int(i)) for i in batch["id"])
with open(out, "w") as f:
    f.write("\\n".join(f"{e} {i}" for e, i in seen))
dist.destroy_process_group()
"""


@pytest.mark.torch
def test_ranks_in_other_processes_train_on_their_splits(streaming, tmp_path):
    pytest.importorskip("torch")
    import socket

    import numpy as np

    ds = dataflow.range(1000, override_num_blocks=8).map_batches(
        lambda b: {"id": b["id"], "x": np.ones((len(b["id"]), 4), dtype=np.float64)}
    )
    iterators = ds.streaming_split(2, equal=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = []
    for rank, it in enumerate(iterators):
        path = tmp_path / f"split{rank}.pkl"
        path.write_bytes(pickle.dumps(it))
        out = tmp_path / f"rank{rank}.txt"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        procs.append(subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(RANK_SCRIPT), str(rank), "2", port, str(path), str(out)],
            env=env, stderr=subprocess.PIPE, text=True,
        ))
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    rows = [line.split() for rank in range(2) for line in (tmp_path / f"rank{rank}.txt").read_text().splitlines()]
    per_epoch = {e: sorted(int(i) for ep, i in rows if int(ep) == e) for e in (0, 1)}
    for epoch in (0, 1):
        assert per_epoch[epoch] == list(range(1000)), f"epoch {epoch}: rows missing or repeated"
    counts = [len((tmp_path / f"rank{r}.txt").read_text().splitlines()) for r in range(2)]
    assert counts == [1000, 1000]


@pytest.mark.torch
def test_split_iterators_feed_torch(mode):
    pytest.importorskip("torch")
    its = dataflow.range(600, override_num_blocks=6).streaming_split(2, equal=True)
    seen = []

    def run(i):
        for batch in its[i].iter_torch_batches(batch_size=50):
            seen.extend(batch["id"].tolist())

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(seen) == list(range(600))


THREADS_SCRIPT = """
import os, pickle, sys
import torch
cores = len(os.sched_getaffinity(0))
torch.set_num_threads(cores)
with open(sys.argv[1], "rb") as f:
    iterator = pickle.load(f)
open(sys.argv[1] + ".started", "w").close()
seen = sorted({torch.get_num_threads() for _ in iterator.iter_torch_batches(batch_size=50)})
print(cores, min(seen), torch.get_num_threads())
"""


def _slow_block(batch):
    time.sleep(0.2)
    return batch


@pytest.mark.torch
def test_a_rank_in_another_process_leaves_busy_workers_their_cores(streaming, tmp_path):
    """The coordinator tells each rank how many CPUs the workers use; its torch loop makes room."""
    pytest.importorskip("torch")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: torch already runs one thread")
    its = dataflow.range(2000, override_num_blocks=8).map_batches(_slow_block).streaming_split(2, equal=True)
    path = tmp_path / "split.pkl"
    path.write_bytes(pickle.dumps(its[0]))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(THREADS_SCRIPT), str(path)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "split.pkl.started").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # the child imports torch first; the plan starts when a split first asks
    mine = sum(len(b["id"]) for b in its[1].iter_batches(batch_size=50))
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    cores, lowest, after = (int(x) for x in out.split())
    assert lowest < cores and after == cores, out
    assert mine > 0


@pytest.mark.timeout(60)
def test_ordered_splits_read_one_after_the_other_do_not_deadlock(mode):
    """Dealt by position, split 1's rows pile up while split 0 is read to its end: the
    coordinator keeps pulling past its buffer for a split that has nothing left to read."""
    with dataflow.options(preserve_order=True, consumer_buffer_bytes=64 << 10):
        a, b = dataflow.range(200_000, override_num_blocks=20).streaming_split(2)
        first = [i for batch in a.iter_batches(batch_size=None, batch_format="numpy") for i in batch["id"].tolist()]
        second = [i for batch in b.iter_batches(batch_size=None, batch_format="numpy") for i in batch["id"].tolist()]
    assert len(first) == len(second) == 100_000
    assert sorted(first + second) == list(range(200_000))


@pytest.mark.parametrize("n, equal", [(1, False), (2, False), (2, True)])
def test_splits_of_a_materialized_dataset_leave_it_whole(mode, n, equal):
    """Materialize once, split every epoch (the usual multi-epoch training set-up): the blocks
    are the materialized dataset's, dealt and never freed by the split."""
    base = dataflow.range(1000, override_num_blocks=10).materialize()
    its = base.streaming_split(n, equal=equal)
    seen = _drain(its, epochs=2)
    assert sorted(i for s in seen for i in s) == sorted(list(range(1000)) * 2)
    assert base.count() == 1000
    assert sorted(r["id"] for r in base.take_all()) == list(range(1000))


@pytest.mark.parametrize("equal", [False, True])
@pytest.mark.parametrize("ordered", [False, True])
def test_an_epoch_every_split_leaves_frees_its_blocks_and_stops(mode, equal, ordered):
    """Each split reads a batch and stops: the buffered blocks are freed at once (not at
    shutdown) and the execution stops; the next epoch runs whole."""
    from engine import session as engine_session

    with dataflow.options(preserve_order=ordered, min_task_input_bytes=1):
        its = dataflow.range(4000, override_num_blocks=200).map_batches(lambda b: b).streaming_split(2, equal=equal)
        firsts = [iter(it.iter_batches(batch_size=1)) for it in its]
        assert all(len(next(f)["id"]) == 1 for f in firsts)
        for f in firsts:
            f.close()
        current = engine_session.current_session()
        if current is not None and mode == "streaming":
            deadline = time.monotonic() + 10
            while current.executor.statistics()["store_used"] and time.monotonic() < deadline:
                time.sleep(0.02)
            assert current.executor.statistics()["store_used"] == 0
        seen = _drain(its)
    assert sorted(i for s in seen for i in s) == list(range(4000)[: 4000 - 4000 % 2 if equal else 4000])


def test_a_failing_epoch_frees_what_it_buffered(mode):
    def late_failure(batch):
        if batch["id"][0] >= 2000:
            raise ValueError("late failure")
        return batch

    with dataflow.options(min_task_input_bytes=1):
        its = dataflow.range(4000, override_num_blocks=100).map_batches(late_failure).streaming_split(2)
        errors = []

        def read(it, pause):
            try:
                for _ in it.iter_batches(batch_size=10):
                    time.sleep(pause)
            except ValueError as err:
                errors.append(err)

        threads = [threading.Thread(target=read, args=(it, p)) for it, p in zip(its, (0.0, 0.01))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert len(errors) == 2 and all("late failure" in str(e) for e in errors)


def test_a_coordinator_closes_once_its_iterators_are_gone(streaming):
    """Every streaming_split starts a coordinator (and a server thread and socket for ranks in
    other processes); one per call stayed until shutdown, with the plan it holds."""
    import gc

    from engine.split import SplitCoordinator

    def serving() -> int:
        return sum(t.name == "dataflow-split-server" and t.is_alive() for t in threading.enumerate())

    before = (len(SplitCoordinator._registry), serving())
    for _ in range(3):
        its = dataflow.range(100).streaming_split(2)
        _drain(its)
        del its
    (it,) = dataflow.range(100).streaming_split(1)
    batches = iter(it.iter_batches(batch_size=10))  # a generator keeps its iterator open
    del it
    gc.collect()
    assert sum(len(b["id"]) for b in batches) == 100
    del batches
    gc.collect()
    deadline = time.monotonic() + 10
    while (len(SplitCoordinator._registry), serving()) != before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert (len(SplitCoordinator._registry), serving()) == before


def test_a_coordinator_whose_iterators_were_pickled_stays_open(streaming):
    """Iterators pickled to ranks that have not asked yet ([w.train.remote(it) for it in
    ds.streaming_split(2)]): the driver dropping its own must not close the coordinator."""
    import gc

    from engine.split import SplitCoordinator

    its = dataflow.range(100).streaming_split(2)
    sent = [pickle.dumps(it) for it in its]
    key = its[0]._key
    del its
    gc.collect()
    time.sleep(0.2)
    assert key in SplitCoordinator._registry
    rank = pickle.loads(sent[0])  # (here in-process: it finds the coordinator by its key)
    source = rank._source()
    piece = source.next(0, 0)
    assert piece is not None and piece.length > 0
    source.release(piece)
    SplitCoordinator._registry[key].close()

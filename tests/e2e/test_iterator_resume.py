"""Resuming an epoch mid-way: ``DataIterator.state_dict()`` / ``load_state_dict()``."""

from __future__ import annotations

import json
import threading

import pytest

import dataflow


def _take(batches, n):
    out = []
    for batch in batches:
        out.append(batch["id"].tolist())
        if len(out) == n:
            break
    return out


@pytest.mark.parametrize("order", ["preserve_order", "seeded_shuffle"])
def test_a_resumed_epoch_sees_every_row_once_in_the_same_order(mode, order):
    with dataflow.options(preserve_order=order == "preserve_order"):
        ds = dataflow.range(5000, override_num_blocks=13).map_batches(lambda b: {"id": b["id"]})
        if order == "seeded_shuffle":
            ds = ds.random_shuffle(seed=3)
        full = [i for b in ds.iterator().iter_batches(batch_size=100, batch_format="numpy") for i in b["id"].tolist()]
        first = ds.iterator()
        seen = _take(first.iter_batches(batch_size=100, batch_format="numpy", prefetch_batches=4), 7)
        state = json.loads(json.dumps(first.state_dict()))  # plain data: saved with a checkpoint
        assert state["rows_consumed"] == 700
        resumed = ds.iterator()
        resumed.load_state_dict(state)
        rest = [b["id"].tolist() for b in resumed.iter_batches(batch_size=100, batch_format="numpy")]
        assert all(len(b) == 100 for b in rest)  # the same batch boundaries as before
        assert [i for b in seen + rest for i in b] == full
        assert resumed.state_dict()["rows_consumed"] == 5000


def test_resume_for_rows_and_torch_batches(mode):
    with dataflow.options(preserve_order=True):
        ds = dataflow.range(1000, override_num_blocks=4)
        it = ds.iterator()
        rows = it.iter_rows()
        head = [next(rows)["id"] for _ in range(250)]
        rows.close()
        again = ds.iterator()
        again.load_state_dict(it.state_dict())
        assert head + [r["id"] for r in again.iter_rows()] == list(range(1000))
        torch = pytest.importorskip("torch")
        it = ds.iterator()
        got = []
        for batch in it.iter_torch_batches(batch_size=64):
            assert isinstance(batch["id"], torch.Tensor)
            got += batch["id"].tolist()
            if len(got) >= 320:
                break
        again = ds.iterator()
        again.load_state_dict(it.state_dict())
        got += [i for b in again.iter_torch_batches(batch_size=64) for i in b["id"].tolist()]
        assert got == list(range(1000))


def test_a_new_epoch_starts_from_the_beginning(mode):
    ds = dataflow.range(300)
    it = ds.iterator()
    it.load_state_dict({"epoch": 0, "rows_consumed": 200})
    assert sum(len(b["id"]) for b in it.iter_batches(batch_size=50)) == 100
    assert sum(len(b["id"]) for b in it.iter_batches(batch_size=50)) == 300  # the next epoch is whole
    assert it.state_dict() == {"epoch": 1, "rows_consumed": 300}
    with pytest.raises(ValueError):
        it.load_state_dict({"rows_consumed": -1})


def _consume_ranks(iterators, stop_after=None, states=None):
    """Each split read by its own thread (as ranks read), in batches of 32; a rank given
    ``stop_after[r]`` stops after that many batches. Returns each rank's ids and final state."""
    seen = [[] for _ in iterators]
    final = [None] * len(iterators)

    def rank(r):
        it = iterators[r]
        if states is not None:
            it.load_state_dict(states[r])
        for batch in it.iter_batches(batch_size=32, batch_format="numpy"):
            seen[r].extend(batch["id"].tolist())
            if stop_after is not None and len(seen[r]) >= 32 * stop_after[r]:
                break
        final[r] = json.loads(json.dumps(it.state_dict()))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(iterators))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    return seen, final


@pytest.mark.parametrize("equal", [False, True])
@pytest.mark.parametrize("order", ["preserve_order", "sort"])
def test_streaming_split_iterators_resume_exactly(mode, equal, order):
    """Ranks stop at different points, save their states, and new iterators (as after a
    restart) resume each rank on exactly the rows it had not seen, in the same order."""
    with dataflow.options(preserve_order=order == "preserve_order"):
        ds = dataflow.range(2003, override_num_blocks=9).map_batches(lambda b: {"id": b["id"] * 7 % 2003})
        if order == "sort":
            ds = ds.sort("id", descending=True)
        full, _ = _consume_ranks(ds.streaming_split(3, equal=equal))
        again, _ = _consume_ranks(ds.streaming_split(3, equal=equal))
        assert again == full  # dealt by position: the same rows to the same rank every run
        rows = sorted(i for rank in full for i in rank)
        assert rows == (list(range(2003)) if not equal else sorted(rows)) and len(rows) == (2003 if not equal else 2001)
        if equal:
            assert [len(rank) for rank in full] == [667, 667, 667]
        head, states = _consume_ranks(ds.streaming_split(3, equal=equal), stop_after=[2, 5, 9])
        assert [s["rows_consumed"] for s in states] == [64, 160, 288]
        tail, ends = _consume_ranks(ds.streaming_split(3, equal=equal), states=states)
        assert [h + t for h, t in zip(head, tail, strict=True)] == full
        assert [s["rows_consumed"] for s in ends] == [len(rank) for rank in full]

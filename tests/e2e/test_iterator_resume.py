"""Resuming an epoch mid-way: ``DataIterator.state_dict()`` / ``load_state_dict()``."""

from __future__ import annotations

import json

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

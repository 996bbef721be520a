"""A materialized dataset's blocks belong to it: no operator of a later plan frees them.

Each plan below runs over the same materialized input twice; afterwards the input still reads
back whole. Before the ownership table, ``materialize().limit(n)`` unlinked borrowed blocks and
the next ``take_all()`` failed with FileNotFoundError (KeyError in local mode).
"""

from __future__ import annotations

import pytest

import dataflow


class AddOne:
    def __call__(self, batch):
        return {"id": batch["id"] + 1}


PLANS = {
    "limit": lambda ds: ds.limit(150),
    "limit-0": lambda ds: ds.limit(0),
    "limit-in-block": lambda ds: ds.limit(7),
    "map": lambda ds: ds.map(lambda r: {"id": r["id"] * 2}),
    "map_batches": lambda ds: ds.map_batches(lambda b: {"id": b["id"] + 1}),
    "map_batches-exact": lambda ds: ds.map_batches(lambda b: b, batch_size=33),
    "actor-pool": lambda ds: ds.map_batches(AddOne, batch_size=64, concurrency=1),
    "filter": lambda ds: ds.filter(lambda r: r["id"] % 3 == 0),
    "flat_map": lambda ds: ds.flat_map(lambda r: [r, r]),
    "union-self": lambda ds: ds.union(ds),
    "union-then-limit": lambda ds: ds.union(ds).limit(1500),
    "limit-then-map": lambda ds: ds.limit(333).map_batches(lambda b: b),
    "materialize-again": lambda ds: ds.materialize(),
}


def _expected_rows(name: str) -> int:
    return {
        "limit": 150,
        "limit-0": 0,
        "limit-in-block": 7,
        "filter": 334,
        "flat_map": 2000,
        "union-self": 2000,
        "union-then-limit": 1500,
        "limit-then-map": 333,
    }.get(name, 1000)


@pytest.mark.parametrize("name", sorted(PLANS))
def test_every_operator_leaves_a_materialized_input_whole(mode, name):
    base = dataflow.range(1000, override_num_blocks=10).materialize()
    for _ in range(2):
        out = PLANS[name](base)
        assert len(out.take_all()) == _expected_rows(name)
        assert out.count() == _expected_rows(name)
    assert sorted(r["id"] for r in base.take_all()) == list(range(1000))


def test_an_iterator_abandoned_early_leaves_the_input_whole(mode):
    base = dataflow.range(1000, override_num_blocks=10).materialize()
    for _ in range(2):
        it = base.map_batches(lambda b: b).iter_batches(batch_size=10)
        next(iter(it))
        del it
    assert base.count() == 1000
    assert sorted(r["id"] for r in base.take_all()) == list(range(1000))


def test_writes_leave_the_input_whole(mode, tmp_path):
    base = dataflow.range(1000, override_num_blocks=10).materialize()
    for i in range(2):
        base.write_parquet(str(tmp_path / f"out{i}"))
        assert dataflow.read_parquet(str(tmp_path / f"out{i}")).count() == 1000
    assert sorted(r["id"] for r in base.take_all()) == list(range(1000))

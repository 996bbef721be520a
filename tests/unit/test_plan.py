"""Optimizer rules and the consumer's rebatching, without executing anything."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

import dataflow
from dataflow.iterator import local_shuffle, rebatch
from dataflow.optimizer import count_from_metadata, optimize
from dataflow.plan import FusedRead, MapStages, Read


def test_adjacent_maps_fuse_into_the_read_task():
    ds = dataflow.range(10).map(lambda r: r).filter(lambda r: True).map_batches(lambda b: b)
    plan = optimize(ds._plan)
    assert isinstance(plan, FusedRead) and isinstance(plan.read, Read)
    assert len(plan.maps.stages) == 3


def test_different_resources_do_not_fuse():
    ds = dataflow.range(10).map(lambda r: r).map_batches(lambda b: b, num_cpus=2)
    plan = optimize(ds._plan)
    assert isinstance(plan, MapStages) and isinstance(plan.input, FusedRead)


def test_count_from_metadata_only_when_rows_are_preserved():
    ds = dataflow.range(1000)
    assert count_from_metadata(optimize(ds.map(lambda r: r)._plan)) == 1000
    assert count_from_metadata(optimize(ds.filter(lambda r: True)._plan)) is None
    assert count_from_metadata(optimize(ds.limit(5)._plan)) == 5


def test_rebatch_exact_and_zero_copy_when_possible():
    blocks = [pa.table({"x": np.arange(i * 10, i * 10 + 10)}) for i in range(3)]
    out = list(rebatch(iter(blocks), 4))
    assert [t.num_rows for t in out] == [4, 4, 4, 4, 4, 4, 4, 2]
    assert np.concatenate([t["x"].to_numpy() for t in out]).tolist() == list(range(30))
    assert [t.num_rows for t in rebatch(iter(blocks), 4, drop_last=True)] == [4] * 7


def test_local_shuffle_is_a_permutation_and_seeded():
    blocks = [pa.table({"x": np.arange(i * 50, i * 50 + 50)}) for i in range(4)]
    a = np.concatenate([t["x"].to_numpy() for t in local_shuffle(iter(blocks), 16, 64, 7)])
    b = np.concatenate([t["x"].to_numpy() for t in local_shuffle(iter(blocks), 16, 64, 7)])
    assert sorted(a.tolist()) == list(range(200))
    assert a.tolist() == b.tolist()

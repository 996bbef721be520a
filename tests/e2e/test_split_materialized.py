"""split, split_at_indices, split_proportionately, train_test_split and
streaming_train_test_split, on both execution modes, with Ray Data's semantics and rounding."""

from __future__ import annotations

import gc

import pytest

import dataflow
from dataflow.dataset import MaterializedDataset


def _ids(ds):
    return [row["id"] for row in ds.take_all()]


def _local_blocks() -> int:
    from engine import local

    return len(local._STORE)


def test_split_at_indices_as_np_split(mode):
    parts = dataflow.range(10, override_num_blocks=3).split_at_indices([2, 5])
    assert all(isinstance(p, MaterializedDataset) for p in parts)
    assert [_ids(p) for p in parts] == [[0, 1], [2, 3, 4], [5, 6, 7, 8, 9]]
    parts = dataflow.range(10).split_at_indices([0, 4, 4, 20])
    assert [_ids(p) for p in parts] == [[], [0, 1, 2, 3], [], list(range(4, 10)), []]


@pytest.mark.parametrize("indices", [[], [3, 2], [-1, 2]])
def test_split_at_indices_rejects_bad_indices(mode, indices):
    with pytest.raises(ValueError, match="indices must"):
        dataflow.range(10).split_at_indices(indices)


def test_cuts_inside_blocks_keep_every_row_once_in_order(mode):
    ds = dataflow.range(1000, override_num_blocks=7).map_batches(lambda b: {"id": b["id"], "x": b["id"] * 2})
    indices = [1, 140, 141, 500, 999]
    parts = ds.split_at_indices(indices)
    bounds = [0, *indices, 1000]
    for part, lo, hi in zip(parts, bounds, bounds[1:]):
        rows = part.take_all()
        assert [r["id"] for r in rows] == list(range(lo, hi))
        assert all(r["x"] == 2 * r["id"] for r in rows)
        assert part.count() == hi - lo


def test_split_equal_drops_the_remainder(mode):
    parts = dataflow.range(10, override_num_blocks=4).split(3, equal=True)
    assert [_ids(p) for p in parts] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    parts = dataflow.range(100).split(n=4, equal=True)
    assert [p.count() for p in parts] == [25] * 4


def test_split_unequal_deals_whole_blocks_as_ray(mode):
    ds = dataflow.range(100, override_num_blocks=5).materialize()
    parts = ds.split(2)
    assert [p.num_blocks() for p in parts] == [3, 2]
    assert sorted(_ids(parts[0]) + _ids(parts[1])) == list(range(100))
    # fewer blocks than splits (small sources are one block here, several in Ray): rows are cut
    # so that no split is empty, where whole blocks would leave one with nothing
    few = dataflow.range(10, override_num_blocks=2).materialize().split(3)
    assert [p.count() for p in few] == [3, 3, 4]
    assert sorted(_ids(few[0]) + _ids(few[1]) + _ids(few[2])) == list(range(10))
    assert [p.count() for p in dataflow.range(6).split(2)] == [3, 3]  # Ray's [3, 3], from its 6 blocks


def test_split_checks_its_arguments(mode):
    ds = dataflow.range(10)
    with pytest.raises(ValueError, match="not positive"):
        ds.split(0)
    with pytest.raises(ValueError, match="locality_hints"):
        ds.split(2, locality_hints=["a"])
    assert [p.count() for p in ds.split(2, equal=True, locality_hints=["a", "b"])] == [5, 5]


def test_split_proportionately_as_ray(mode):
    parts = dataflow.range(10).split_proportionately([0.2, 0.5])
    assert [_ids(p) for p in parts] == [[0, 1], [2, 3, 4, 5, 6], [7, 8, 9]]
    # every part but the last gets at least one row: cuts move down
    assert [p.count() for p in dataflow.range(10).split_proportionately([0.25, 0.01])] == [1, 1, 8]
    with pytest.raises(ValueError, match="non-empty"):
        dataflow.range(2).split_proportionately([0.1, 0.1])
    for bad in ([], [0.5, 0.5], [0.0, 0.5]):
        with pytest.raises(ValueError, match="proportions"):
            dataflow.range(10).split_proportionately(bad)


def test_train_test_split_fraction_and_count(mode):
    train, test = dataflow.range(8).train_test_split(test_size=0.25)
    assert (_ids(train), _ids(test)) == ([0, 1, 2, 3, 4, 5], [6, 7])
    train, test = dataflow.range(10, override_num_blocks=3).train_test_split(3)
    assert (_ids(train), _ids(test)) == (list(range(7)), [7, 8, 9])
    train, test = dataflow.range(10).train_test_split(0.33)
    assert (train.count(), test.count()) == (6, 4)  # int(10 * 0.67) rows train, as Ray


@pytest.mark.parametrize("size", [0.0, 1.0, 1.5, -0.1, 0, 10, 11, -1])
def test_train_test_split_rejects_bad_sizes(mode, size):
    with pytest.raises(ValueError, match="test_size"):
        dataflow.range(10).train_test_split(size)


def test_train_test_split_argument_types(mode):
    with pytest.raises(TypeError, match="test_size"):
        dataflow.range(10).train_test_split("0.5")
    with pytest.raises(ValueError, match="stratify"):
        dataflow.range(10).train_test_split(0.5, shuffle=True, stratify="id")


def test_train_test_split_shuffled_with_a_seed(mode):
    if not hasattr(dataflow.Dataset, "random_shuffle"):
        pytest.skip("Dataset.random_shuffle is not in this tree yet")
    ds = dataflow.range(100, override_num_blocks=4)
    train, test = ds.train_test_split(0.2, shuffle=True, seed=7)
    again, _ = ds.train_test_split(0.2, shuffle=True, seed=7)
    assert (train.count(), test.count()) == (80, 20)
    assert sorted(_ids(train) + _ids(test)) == list(range(100))
    assert _ids(train) == _ids(again)
    assert _ids(train) != list(range(80))


def test_train_test_split_stratified_keeps_class_proportions(mode):
    items = [{"label": "abc"[i % 3] if i < 90 else "a", "v": i} for i in range(100)]
    train, test = dataflow.from_items(items, override_num_blocks=6).train_test_split(0.2, stratify="label")
    test_rows = test.take_all()
    by_label = {k: sum(r["label"] == k for r in test_rows) for k in "abc"}
    assert by_label == {"a": int(40 * 0.2), "b": int(30 * 0.2), "c": int(30 * 0.2)}
    train_rows = train.take_all()
    assert sorted(r["v"] for r in train_rows + test_rows) == list(range(100))
    assert [r["v"] for r in test_rows] == sorted(r["v"] for r in test_rows)  # rows keep their order
    with pytest.raises(ValueError, match="no column"):
        dataflow.from_items(items).train_test_split(0.2, stratify="nope")


def test_parts_share_blocks_and_free_them_when_collected(mode):
    before = _local_blocks()
    parent = dataflow.range(1000, override_num_blocks=4).materialize()
    parts = parent.split_at_indices([100, 600])  # cuts in blocks 0 and 2: two new slices each side
    del parent
    gc.collect()
    assert [p.count() for p in parts] == [100, 500, 400]
    assert sorted(i for p in parts for i in _ids(p)) == list(range(1000))  # the parent's blocks stay alive
    del parts
    gc.collect()
    if mode == "local":
        assert _local_blocks() == before  # in streaming mode the leak check (conftest) looks


def test_parts_of_parts_and_transforms_on_parts(mode):
    first, rest = dataflow.range(100, override_num_blocks=3).split_at_indices([10])
    a, b = rest.split_at_indices([45])
    assert _ids(a) == list(range(10, 55)) and _ids(b) == list(range(55, 100))
    assert _ids(b.map(lambda r: {"id": r["id"] + 1})) == list(range(56, 101))
    assert first.union(b).count() == 55


def test_streaming_train_test_split_hash_as_ray(mode):
    train, test = dataflow.range(8).streaming_train_test_split(test_size=0.25, split_type="hash", hash_column="id")
    assert not isinstance(train, MaterializedDataset)
    assert (sorted(_ids(train)), sorted(_ids(test))) == ([0, 2, 3, 4, 5, 6], [1, 7])


def test_streaming_train_test_split_random_sides_agree(mode):
    ds = dataflow.range(2000, override_num_blocks=8).map_batches(lambda b: b)
    train, test = ds.streaming_train_test_split(0.25, seed=1)
    a, b = _ids(train), _ids(test)
    assert sorted(a + b) == list(range(2000))
    assert 400 < len(b) < 600
    again, _ = ds.streaming_train_test_split(0.25, seed=1)
    assert sorted(_ids(again)) == sorted(a)
    other, _ = ds.streaming_train_test_split(0.25, seed=2)
    assert sorted(_ids(other)) != sorted(a)


def test_streaming_train_test_split_checks_as_ray(mode):
    ds = dataflow.range(10)
    for kwargs, match in [
        ({"test_size": 0}, "between 0 and 1"),
        ({"test_size": 1.0}, "between 0 and 1"),
        ({"test_size": 0.5, "split_type": "hash", "hash_column": "id", "seed": 1}, "seed"),
        ({"test_size": 0.5, "hash_column": "id"}, "hash_column"),
        ({"test_size": 0.5, "split_type": "hash"}, "hash_column is required"),
        ({"test_size": 0.5, "split_type": "other"}, "Invalid split type"),
    ]:
        with pytest.raises(ValueError, match=match):
            ds.streaming_train_test_split(**kwargs)
    train, _ = ds.streaming_train_test_split(0.5, split_type="hash", hash_column="nope")
    with pytest.raises(ValueError, match="nope"):
        train.take_all()

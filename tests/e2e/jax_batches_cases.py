"""iter_jax_batches on both execution modes: values, dtypes, paddings, drop_last, collate_fn,
local shuffle and the errors.

Not collected by the suite's run on its own: ``test_jax_batches.py`` runs this file in a child
pytest process (JAX starts threads once it makes its first array and then warns, rightly, at
every ``os.fork()``, which later tests of the suite do). Run it directly to see each case:
``.venv/bin/python -m pytest tests/e2e/jax_batches_cases.py``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import dataflow
from dataflow.collate_fn import ArrowBatchCollateFn, NumpyBatchCollateFn, PandasBatchCollateFn
from engine.block_format import tensor_array

jax = pytest.importorskip("jax")
jnp = jax.numpy


def table_of(rows: int) -> pa.Table:
    rng = np.random.default_rng(0)
    return pa.table({
        "id": np.arange(rows, dtype=np.int64),
        "x": rng.standard_normal(rows).astype(np.float32),
        "flag": np.arange(rows) % 3 == 0,
        "emb": tensor_array(rng.standard_normal((rows, 2, 3)).astype(np.float32)),
    })


def host(batch):
    return {k: np.asarray(v) for k, v in batch.items()}


# ----- values, dtypes, sharding ------------------------------------------------------------


def test_values_equal_iter_batches(mode):
    ds = dataflow.from_arrow(table_of(103), override_num_blocks=4)
    expected = list(ds.iter_batches(batch_size=16, batch_format="numpy"))
    got = list(ds.iter_jax_batches(batch_size=16))
    assert len(got) == len(expected) == 7
    for batch, want in zip(got, expected, strict=True):
        assert set(batch) == set(want) == {"id", "x", "flag", "emb"}
        for name, array in batch.items():
            assert isinstance(array, jax.Array)
            np.testing.assert_array_equal(np.asarray(array), want[name])
        assert batch["emb"].shape == (len(want["id"]), 2, 3)
        assert batch["x"].dtype == jnp.float32 and batch["flag"].dtype == jnp.bool_
        # without jax_enable_x64, JAX holds int64 as int32 (as in Ray)
        assert batch["id"].dtype == jnp.int32
        sharding = batch["x"].sharding
        assert isinstance(sharding, jax.sharding.NamedSharding)
        assert sharding.spec == jax.sharding.PartitionSpec("data") and sharding.mesh.axis_names == ("data",)


def test_a_single_column_dataset_gives_a_dict_as_rays(mode):
    ds = dataflow.from_numpy(np.arange(8, dtype=np.float32))
    batches = list(ds.iter_jax_batches(batch_size=4))
    assert [sorted(b) for b in batches] == [["data"], ["data"]]
    np.testing.assert_array_equal(np.asarray(batches[1]["data"]), [4, 5, 6, 7])


def test_a_collate_fn_returning_one_array_gives_a_bare_array(mode):
    class Stack(NumpyBatchCollateFn):
        def __call__(self, batch):
            return np.stack([batch["id"], batch["id"] * 10], axis=1)

    batches = list(dataflow.range(6).iter_jax_batches(batch_size=4, collate_fn=Stack(), paddings=-1, dtypes="float32"))
    assert all(isinstance(b, jax.Array) for b in batches)
    np.testing.assert_array_equal(np.asarray(batches[1]), [[4, 40], [5, 50], [-1, -1], [-1, -1]])
    assert batches[0].dtype == jnp.float32
    # a dict of dtypes or paddings for one array holds exactly one, as Ray's
    one = next(iter(dataflow.range(4).iter_jax_batches(batch_size=4, collate_fn=Stack(), dtypes={"any": jnp.int8})))
    assert one.dtype == jnp.int8
    with pytest.raises(ValueError, match="only a single dtype should be given"):
        list(dataflow.range(4).iter_jax_batches(batch_size=4, collate_fn=Stack(), dtypes={"a": "int8", "b": "int8"}))


def test_dtypes_one_for_all_and_per_column(mode):
    ds = dataflow.from_arrow(table_of(10))
    batch = next(iter(ds.iter_jax_batches(batch_size=10, dtypes=jnp.bfloat16)))
    assert {v.dtype for v in batch.values()} == {jnp.dtype(jnp.bfloat16)}
    batch = next(iter(ds.iter_jax_batches(batch_size=10, dtypes={"id": jnp.float32, "x": "float16"})))
    assert batch["id"].dtype == jnp.float32 and batch["x"].dtype == jnp.float16
    assert batch["flag"].dtype == jnp.bool_ and batch["emb"].dtype == jnp.float32  # left out: kept
    np.testing.assert_array_equal(np.asarray(batch["id"]), np.arange(10, dtype=np.float32))
    with pytest.raises(TypeError, match="dtypes must be a JAX dtype"):
        ds.iter_jax_batches(dtypes={"x": "not-a-dtype"})  # checked at the call


# ----- paddings, drop_last, batch_size -----------------------------------------------------


def test_paddings_fill_the_last_batch(mode):
    ds = dataflow.from_arrow(table_of(10), override_num_blocks=3)
    batches = list(ds.iter_jax_batches(batch_size=4, paddings=-1))
    assert [len(b["id"]) for b in batches] == [4, 4, 4]
    last = host(batches[-1])
    np.testing.assert_array_equal(last["id"], [8, 9, -1, -1])
    np.testing.assert_array_equal(last["flag"], [False, True, True, True])  # -1 as a bool is True
    assert last["emb"].shape == (4, 2, 3) and (last["emb"][2:] == -1).all()

    per_column = {"id": 0, "x": 0.5, "flag": False, "emb": 7}
    last = host(list(ds.iter_jax_batches(batch_size=4, paddings=per_column))[-1])
    np.testing.assert_array_equal(last["id"], [8, 9, 0, 0])
    np.testing.assert_array_equal(last["x"][2:], [0.5, 0.5])
    np.testing.assert_array_equal(last["flag"][2:], [False, False])
    assert (last["emb"][2:] == 7).all()

    with pytest.raises(KeyError, match="paddings has no value for column 'emb'"):
        list(ds.iter_jax_batches(batch_size=4, paddings={"id": 0, "x": 0.0, "flag": False}))
    with pytest.raises(TypeError, match="paddings must be an int, float or bool"):
        ds.iter_jax_batches(paddings="zero")


def test_a_padding_that_does_not_fit_names_the_column(mode):
    ds = dataflow.from_arrow(pa.table({"u": np.arange(3, dtype=np.uint8)}))
    with pytest.raises(OverflowError, match="column 'u'"):
        list(ds.iter_jax_batches(batch_size=2, paddings=-1))


def test_drop_last(mode):
    ds = dataflow.range(10)
    batches = list(ds.iter_jax_batches(batch_size=4, drop_last=True))
    assert [np.asarray(b["id"]).tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [len(b["id"]) for b in ds.iter_jax_batches(batch_size=4)] == [4, 4, 2]


def test_batch_size_is_checked_at_the_call_with_rays_message(mode):
    ds = dataflow.range(10)
    for bad in (0, -4, None):
        with pytest.raises(ValueError, match=r"must be a positive integer evenly divisible by the number of local JAX"):
            ds.iter_jax_batches(batch_size=bad)
    with pytest.raises(ValueError, match="Unsupported collate function"):
        ds.iter_jax_batches(collate_fn="stack")


def test_state_dict_counts_rows_read_not_padding(mode):
    it = dataflow.range(10).iterator()
    assert len(list(it.iter_jax_batches(batch_size=4, paddings=0))) == 3
    assert it.state_dict()["rows_consumed"] == 10


# ----- collate_fn, shuffle, errors ---------------------------------------------------------


class ArrowSum(ArrowBatchCollateFn):
    def __call__(self, table):
        assert isinstance(table, pa.Table)
        ids = table.column("id").to_numpy()
        return {"id": ids, "twice": ids * 2}


class NumpyDiff(NumpyBatchCollateFn):
    def __call__(self, batch):
        assert isinstance(batch, dict)
        return {"id": batch["id"], "twice": batch["id"] * 2}


class PandasDiff(PandasBatchCollateFn):
    def __call__(self, df):
        assert isinstance(df, pd.DataFrame)
        return {"id": df["id"].to_numpy(), "twice": (df["id"] * 2).to_numpy()}


@pytest.mark.parametrize("collate", [ArrowSum(), NumpyDiff(), PandasDiff(),
                                     lambda b: {"id": b["id"], "twice": b["id"] * 2}],
                         ids=["arrow", "numpy", "pandas", "function"])
def test_collate_fn_variants(mode, collate):
    batches = list(dataflow.range(6).iter_jax_batches(batch_size=4, collate_fn=collate, dtypes={"twice": jnp.int16}))
    assert [np.asarray(b["id"]).tolist() for b in batches] == [[0, 1, 2, 3], [4, 5]]
    assert np.asarray(batches[1]["twice"]).tolist() == [8, 10] and batches[1]["twice"].dtype == jnp.int16


def test_collate_fn_must_return_arrays(mode):
    with pytest.raises(TypeError, match=r"collate_fn must return a np.ndarray or a dict of np.ndarray \(they become jax.Arrays\), got list"):
        list(dataflow.range(4).iter_jax_batches(batch_size=4, collate_fn=lambda b: [b["id"]]))


def test_local_shuffle_with_a_seed_is_deterministic(mode):
    ds = dataflow.range(200, override_num_blocks=4)

    def epoch(seed):
        with dataflow.options(preserve_order=True):  # the same blocks in the same order each epoch
            return np.concatenate([np.asarray(b["id"]) for b in ds.iter_jax_batches(
                batch_size=20, local_shuffle_buffer_size=50, local_shuffle_seed=seed)])

    first = epoch(7)
    np.testing.assert_array_equal(first, epoch(7))
    assert sorted(first.tolist()) == list(range(200)) and first.tolist() != list(range(200))
    assert epoch(8).tolist() != first.tolist()


def test_a_column_jax_cannot_hold_is_named(mode):
    ds = dataflow.from_items([{"id": i, "name": f"n{i}"} for i in range(4)])
    with pytest.raises(TypeError, match=r"column 'name' holds str values.*select_columns"):
        list(ds.iter_jax_batches(batch_size=2))
    assert [len(b["id"]) for b in ds.select_columns(["id"]).iter_jax_batches(batch_size=2)] == [2, 2]
    ragged = dataflow.from_items([{"v": np.ones(2, np.float32)}, {"v": np.ones(3, np.float32)}])
    with pytest.raises(TypeError, match=r"column 'v' holds arrays of different shapes \(\(2,\), \(3,\)\)"):
        list(ragged.iter_jax_batches(batch_size=2))
    even = dataflow.from_items([{"v": np.full(3, i, np.float32)} for i in range(4)])  # one array per row
    batch = next(iter(even.iter_jax_batches(batch_size=4)))
    assert batch["v"].shape == (4, 3) and np.asarray(batch["v"])[3].tolist() == [3, 3, 3]

"""TensorFlow: iter_tf_batches, to_tf (type specs, feature/label/additional columns, shuffling,
a Keras training step) and from_tf, on both execution modes."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pyarrow as pa
import pytest

import dataflow
from engine.block_format import tensor_array

tf = pytest.importorskip("tensorflow")

ROWS = 10


def table_of(rows: int = ROWS) -> pa.Table:
    ids = np.arange(rows, dtype=np.int64)
    return pa.table({
        "id": ids,
        "x": (ids * 0.5).astype(np.float32),
        "flag": ids % 3 == 0,
        "name": [f"r{i}" for i in ids],
        "emb": tensor_array(np.arange(rows * 6, dtype=np.float64).reshape(rows, 2, 3)),
        "pair": tensor_array(np.stack([ids, ids * 10], axis=1)),  # (rows, 2): a fixed-size list
        "tokens": pa.array([list(range(i % 3)) for i in ids], type=pa.list_(pa.int64())),
    })


def dataset(blocks: int = 3) -> dataflow.Dataset:
    return dataflow.from_arrow(table_of(), override_num_blocks=blocks)


def spec(shape, dtype, name):
    return tf.TensorSpec(shape, dtype=dtype, name=name)


# ----- iter_tf_batches --------------------------------------------------------------------------


def test_iter_tf_batches_equal_the_numpy_batches(mode):
    ds = dataset().drop_columns(["tokens"])
    numpy_batches = list(ds.iter_batches(batch_size=4, batch_format="numpy"))
    tf_batches = list(ds.iterator().iter_tf_batches(batch_size=4))
    assert [len(b["id"]) for b in tf_batches] == [4, 4, 2]
    for expected, got in zip(numpy_batches, tf_batches, strict=True):
        assert list(got) == list(expected)
        for name, array in expected.items():
            assert isinstance(got[name], tf.Tensor)
            if name == "name":
                assert got[name].dtype == tf.string
                assert [v.decode() for v in got[name].numpy()] == list(array)
            else:
                assert got[name].dtype.as_numpy_dtype == array.dtype, name
                np.testing.assert_array_equal(got[name].numpy(), array)


def test_iter_tf_batches_dtypes_drop_last_and_ragged_rows(mode):
    ds = dataset().select_columns(["id", "x", "tokens"])
    everything = list(ds.iterator().iter_tf_batches(batch_size=4, dtypes=tf.float64, drop_last=True))
    assert len(everything) == 2 and everything[1]["id"].dtype == tf.float64
    assert everything[0]["tokens"].dtype == tf.float64
    one = next(iter(ds.iterator().iter_tf_batches(batch_size=4, dtypes={"id": tf.int32})))
    assert one["id"].dtype == tf.int32 and one["x"].dtype == tf.float32  # not named: kept
    # rows of different lengths: a RaggedTensor (Ray Data fails on them)
    assert isinstance(one["tokens"], tf.RaggedTensor)
    assert one["tokens"].to_list() == [[], [0], [0, 1], []]
    with pytest.raises(TypeError, match=r"dtypes must be a tf\.DType"):
        ds.iterator().iter_tf_batches(dtypes="no-such-type")


def test_dataset_iter_tf_batches_is_deprecated_as_in_ray(mode):
    with pytest.warns(DeprecationWarning, match="Use `to_tf` instead"):
        batches = list(dataflow.range(6).iter_tf_batches(batch_size=4))
    assert [b["id"].numpy().tolist() for b in batches] == [[0, 1, 2, 3], [4, 5]]


# ----- to_tf ----------------------------------------------------------------------------------


def test_to_tf_single_columns_and_type_specs_from_the_schema(mode):
    tfds = dataset().to_tf("emb", "id", batch_size=4)
    assert tfds.element_spec == (spec((None, 2, 3), tf.float64, "emb"), spec((None,), tf.int64, "id"))
    assert type(tfds).__name__ == "_OptionsDataset"
    batches = list(tfds)
    assert [f.shape[0] for f, _ in batches] == [4, 4, 2]
    features = np.concatenate([f.numpy() for f, _ in batches])
    labels = np.concatenate([y.numpy() for _, y in batches])
    np.testing.assert_array_equal(features, np.arange(ROWS * 6, dtype=np.float64).reshape(ROWS, 2, 3))
    np.testing.assert_array_equal(labels, np.arange(ROWS))
    assert [f.shape[0] for f, _ in dataset().to_tf("x", "id", batch_size=4, drop_last=True)] == [4, 4]
    assert len(list(dataset().to_tf("x", "id"))) == ROWS  # batch_size=1 by default, as Ray's
    specs = dataset().to_tf("pair", "flag").element_spec
    assert specs == (spec((None, 2), tf.int64, "pair"), spec((None,), tf.bool, "flag"))
    ragged, _ = dataset().to_tf("tokens", "name").element_spec
    assert ragged == tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1)
    tokens, names = next(iter(dataset(1).to_tf("tokens", "name", batch_size=3)))
    assert tokens.to_list() == [[], [0], [0, 1]] and names.numpy().tolist() == [b"r0", b"r1", b"r2"]


def test_columns_of_ragged_rows_become_ragged_tensors(mode):
    """Ray Data declares a tf.RaggedTensorSpec for them but fails to make the tensors."""
    images = [np.full((2, 3), 1.0), np.full((1, 2), 2.0), np.full((3, 1), 3.0)]
    ds = dataflow.from_items([{"img": a, "y": i} for i, a in enumerate(images)])
    tfds = ds.to_tf("img", "y", batch_size=3)
    assert tfds.element_spec[0] == tf.RaggedTensorSpec([None, None, None], tf.float64, ragged_rank=2)
    (img, _), = list(tfds)
    assert img.to_list() == [a.tolist() for a in images]
    nested = dataflow.from_arrow(pa.table({"ll": pa.array([[[1], [2, 3]], [], [[4]]], pa.list_(pa.list_(pa.int64())))}))
    assert nested.to_tf("ll", "ll").element_spec[0] == tf.RaggedTensorSpec([None, None, None], tf.int64, 2)
    (batch,) = list(nested.iterator().iter_tf_batches(batch_size=3))
    assert batch["ll"].to_list() == [[[1], [2, 3]], [], [[4]]]


def test_to_tf_lists_of_columns_and_additional_columns(mode):
    ds = dataset()
    tfds = ds.to_tf(["x", "emb"], ["id", "flag"], additional_columns="name", batch_size=5)
    features_spec, labels_spec, extra_spec = tfds.element_spec
    assert features_spec == {"x": spec((None,), tf.float32, "x"), "emb": spec((None, 2, 3), tf.float64, "emb")}
    assert list(labels_spec) == ["id", "flag"]  # the schema's order, as Ray's
    assert extra_spec == spec((None,), tf.string, "name")
    features, labels, extra = next(iter(tfds))
    assert sorted(features) == ["emb", "x"] and sorted(labels) == ["flag", "id"]
    assert features["x"].numpy().tolist() == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert labels["flag"].numpy().tolist() == [True, False, False, True, False]
    assert extra.numpy().tolist() == [b"r0", b"r1", b"r2", b"r3", b"r4"]
    _, _, extra_dict = ds.to_tf("x", "id", additional_columns=["flag"]).element_spec
    assert extra_dict == {"flag": spec((None,), tf.bool, "flag")}


def test_to_tf_given_type_specs_cast_and_rename(mode):
    ds = dataset()
    tfds = ds.to_tf(
        "pair", "id", additional_columns=["x"], batch_size=4,
        feature_type_spec=spec((None, 2), tf.float32, "features"),
        label_type_spec=spec((None,), tf.float32, "label"),
        additional_type_spec={"x": spec((None,), tf.float64, "weight")},
    )
    assert tfds.element_spec[0].name == "features" and tfds.element_spec[1].name == "label"
    features, labels, extra = next(iter(tfds))
    assert features.dtype == tf.float32 and labels.dtype == tf.float32 and extra["x"].dtype == tf.float64
    assert features.numpy().tolist() == [[0, 0], [1, 10], [2, 20], [3, 30]]
    # only the spec not given is derived (Ray derives both when one is missing)
    _, label_spec = ds.to_tf("x", "id", label_type_spec=spec((None,), tf.float32, "y")).element_spec
    assert label_spec == spec((None,), tf.float32, "y")


def test_to_tf_errors(mode):
    ds = dataset()
    with pytest.raises(ValueError, match=r"there's no column named 'nope' in the dataset\. Valid column names are"):
        ds.to_tf("nope", "id")
    with pytest.raises(ValueError, match="no column named 'zz'"):
        ds.to_tf("x", "id", additional_columns=["zz"])
    with pytest.raises(TypeError, match="feature_type_spec must be a dict"):
        ds.to_tf(["x"], "id", feature_type_spec=spec((None,), tf.float32, "x"))
    with pytest.raises(TypeError, match=r"label_type_spec must be a tf\.TypeSpec"):
        ds.to_tf("x", "id", label_type_spec={"id": spec((None,), tf.int64, "id")})
    with pytest.raises(ValueError, match="one entry per column"):
        ds.to_tf(["x", "id"], "id", feature_type_spec={"x": spec((None,), tf.float32, "x")})
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        ds.to_tf("x", "id", batch_size=0)
    stamps = dataflow.from_arrow(pa.table({"t": pa.array([1, 2], pa.timestamp("s")), "y": [1, 2]}))
    with pytest.raises(TypeError, match="column 't' has type timestamp"):
        stamps.to_tf("t", "y")
    nulls = dataflow.from_arrow(pa.table({"a": [1.0, 2.0], "b": pa.array([None, 3], pa.int64())}))
    with pytest.raises(tf.errors.InvalidArgumentError, match="column 'b' has nulls"):
        list(nulls.to_tf("a", "b", batch_size=2))


def test_to_tf_local_shuffle_is_deterministic_with_a_seed(mode):
    ds = dataflow.range(64, override_num_blocks=4)

    def epoch(seed):
        tfds = ds.to_tf("id", "id", batch_size=8, local_shuffle_buffer_size=16, local_shuffle_seed=seed)
        return np.concatenate([f.numpy() for f, _ in tfds]).tolist()

    with dataflow.options(preserve_order=True):  # the same blocks in the same order each epoch
        first = epoch(7)
        assert sorted(first) == list(range(64)) and first != list(range(64))
        assert epoch(7) == first
        assert epoch(8) != first


def test_to_tf_of_an_iterator_and_of_a_streaming_split(mode):
    ds = dataflow.range(8)
    it = ds.iterator()
    assert it.to_tf("id", "id").element_spec == (spec((None,), tf.int64, "id"),) * 2
    assert sum(int(f.shape[0]) for f, _ in it.to_tf("id", "id", batch_size=3)) == 8
    (shard,) = ds.streaming_split(1)
    tfds = shard.to_tf("id", "id", batch_size=4, feature_type_spec=spec((None,), tf.float32, "id"),
                       label_type_spec=spec((None,), tf.int64, "id"))
    assert sorted(np.concatenate([f.numpy() for f, _ in tfds]).tolist()) == list(range(8))


def test_stopping_early_releases_the_blocks(mode):
    ds = dataflow.range(1000, override_num_blocks=10)
    for _ in ds.to_tf("id", "id", batch_size=10).take(2):
        pass
    for _ in ds.iterator().iter_tf_batches(batch_size=10):
        break
    # the no_leaks fixture fails the test if a block is still held


def test_keras_model_fits_one_epoch(mode):
    keras = pytest.importorskip("keras")
    rng = np.random.default_rng(0)
    features = rng.standard_normal((64, 4)).astype(np.float32)
    target = features @ np.array([1.0, -2.0, 0.5, 3.0], dtype=np.float32)
    ds = dataflow.from_arrow(pa.table({"features": tensor_array(features), "target": target}), override_num_blocks=2)

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1), loss="mse")
    before = model.get_weights()[0].copy()
    # no reference kept to the tf.data.Dataset: what Keras holds keeps it readable. Keras warns
    # at the end of every dataset of unknown length (as any from_generator dataset, Ray's too)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Your input ran out of data", category=UserWarning)
        history = model.fit(ds.to_tf("features", "target", batch_size=16), epochs=1, shuffle=False, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert not np.allclose(model.get_weights()[0], before)  # a real training step ran


# ----- from_tf --------------------------------------------------------------------------------


def test_from_tf_of_dicts(mode):
    source = tf.data.Dataset.from_tensor_slices({
        "x": np.arange(4, dtype=np.float32),
        "y": np.array([b"a", b"b", b"c", b"d"]),
        "v": np.arange(8).reshape(4, 2),
        "img": np.arange(4 * 2 * 2 * 3, dtype=np.uint8).reshape(4, 2, 2, 3),
    })
    ds = dataflow.from_tf(source)
    assert isinstance(ds, dataflow.MaterializedDataset)
    assert ds.count() == 4
    schema = ds.schema()
    assert schema.names == ["x", "y", "v", "img"]  # as Ray: one column per key
    assert [str(t) for t in schema.types[:2]] == ["float", "binary"]
    rows = ds.take_all()
    assert rows[1]["x"] == 1.0 and rows[1]["y"] == b"b"
    np.testing.assert_array_equal(rows[1]["v"], [2, 3])
    assert rows[3]["img"].shape == (2, 2, 3) and rows[3]["img"].dtype == np.uint8


def test_from_tf_of_tuples_and_of_scalars(mode):
    pairs = tf.data.Dataset.from_tensor_slices((np.arange(12, dtype=np.float32).reshape(4, 3), np.arange(4)))
    ds = dataflow.from_tf(pairs)
    assert ds.columns() == ["item"]  # as Ray: a tuple element is one value of column "item"
    features, label = ds.take(2)[1]["item"]
    np.testing.assert_array_equal(features, [3.0, 4.0, 5.0])
    assert label == 1
    scalars = dataflow.from_tf(tf.data.Dataset.from_tensor_slices(np.arange(3)))
    assert scalars.take_all() == [{"item": 0}, {"item": 1}, {"item": 2}]
    with pytest.raises(TypeError, match=r"from_tf takes a tf\.data\.Dataset"):
        dataflow.from_tf([1, 2, 3])


def test_import_dataflow_does_not_import_tensorflow():
    code = (
        "import sys, dataflow\n"
        "dataflow.range(3).take_all()\n"
        "assert dataflow.from_tf.__module__ == 'dataflow.read_api'\n"
        "assert 'tensorflow' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)

"""Preprocessors end to end: the values Ray 2.60's docstring examples document, on both modes."""

from __future__ import annotations

import string

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import dataflow
from dataflow.errors import ResourceError
from dataflow.preprocessors import (
    Categorizer,
    Chain,
    Concatenator,
    CountVectorizer,
    CustomKBinsDiscretizer,
    FeatureHasher,
    HashingVectorizer,
    LabelEncoder,
    MaxAbsScaler,
    MinMaxScaler,
    MultiHotEncoder,
    Normalizer,
    OneHotEncoder,
    OrdinalEncoder,
    PowerTransformer,
    Preprocessor,
    PreprocessorNotFittedException,
    RobustScaler,
    SimpleImputer,
    StandardScaler,
    Tokenizer,
    UniformKBinsDiscretizer,
)
from dataflow.preprocessors.utils import simple_hash


def _xs() -> dataflow.Dataset:
    return dataflow.from_pandas(pd.DataFrame({"X1": [-2, 0, 2], "X2": [-3, -3, 3], "X3": [1, 1, 1]}))


def _genres() -> dataflow.Dataset:
    return dataflow.from_pandas(
        pd.DataFrame(
            {
                "name": ["Shaolin Soccer", "Moana", "The Smartest Guys in the Room"],
                "genre": [["comedy", "action", "sports"], ["animation", "comedy", "action"], ["documentary"]],
            }
        )
    )


def _people() -> dataflow.Dataset:
    return dataflow.from_pandas(
        pd.DataFrame({"sex": ["male", "female", "male", "female"], "level": ["L4", "L5", "L3", "L4"]})
    )


def _missing() -> dataflow.Dataset:
    return dataflow.from_pandas(pd.DataFrame({"X": [0, None, 3, 3], "Y": [None, "b", "c", "c"]}))


def _col(ds: dataflow.Dataset, name: str) -> list:
    """A column's values; a missing one as None (Arrow-backed pandas columns hold ``pd.NA``)."""
    return [list(v) if isinstance(v, np.ndarray) else None if v is pd.NA else v for v in ds.to_pandas()[name].tolist()]


def test_standard_scaler(mode):
    p = StandardScaler(columns=["X1", "X2"])
    out = p.fit_transform(_xs()).to_pandas()
    np.testing.assert_allclose(out["X1"], [-1.224745, 0.0, 1.224745], atol=1e-6)
    np.testing.assert_allclose(out["X2"], [-0.707107, -0.707107, 1.414214], atol=1e-6)
    assert out["X3"].tolist() == [1, 1, 1]
    assert p.stats_ == pytest.approx(
        {"mean(X1)": 0.0, "mean(X2)": -1.0, "std(X1)": 1.632993161855452, "std(X2)": 2.8284271247461903}
    )
    assert _col(StandardScaler(columns=["X3"]).fit_transform(_xs()), "X3") == [0.0, 0.0, 0.0]
    appended = StandardScaler(["X1", "X2"], output_columns=["X1_scaled", "X2_scaled"]).fit_transform(_xs()).to_pandas()
    assert list(appended.columns) == ["X1", "X2", "X3", "X1_scaled", "X2_scaled"]
    assert appended["X1"].tolist() == [-2, 0, 2]
    assert repr(p) == "StandardScaler(columns=['X1', 'X2'], output_columns=['X1', 'X2'])"


def test_min_max_and_max_abs_scalers(mode):
    out = MinMaxScaler(columns=["X1", "X2"]).fit_transform(_xs()).to_pandas()
    assert out["X1"].tolist() == [0.0, 0.5, 1.0]
    assert out["X2"].tolist() == [0.0, 0.0, 1.0]
    assert _col(MinMaxScaler(columns=["X3"]).fit_transform(_xs()), "X3") == [0.0, 0.0, 0.0]
    ds = dataflow.from_pandas(pd.DataFrame({"X1": [-6, 3], "X2": [2, -4], "X3": [0, 0]}))
    p = MaxAbsScaler(columns=["X1", "X2", "X3"])
    out = p.fit_transform(ds).to_pandas()
    assert out["X1"].tolist() == [-1.0, 0.5]
    assert out["X2"].tolist() == [0.5, -1.0]
    assert out["X3"].tolist() == [0.0, 0.0]
    assert p.stats_ == {"abs_max(X1)": 6, "abs_max(X2)": 4, "abs_max(X3)": 0}


def test_robust_scaler(mode):
    ds = dataflow.from_pandas(pd.DataFrame({"X1": [1, 2, 3, 4, 5], "X2": [13, 5, 14, 2, 8], "X3": [1, 2, 2, 2, 3]}))
    p = RobustScaler(columns=["X1", "X2"])
    out = p.fit_transform(ds).to_pandas()
    assert out["X1"].tolist() == [-1.0, -0.5, 0.0, 0.5, 1.0]
    assert out["X2"].tolist() == [0.625, -0.375, 0.75, -0.75, 0.0]
    assert (p.stats_["low_quantile(X2)"], p.stats_["median(X2)"], p.stats_["high_quantile(X2)"]) == (5, 8, 13)
    assert repr(p) == "RobustScaler(columns=['X1', 'X2'], quantile_range=(0.25, 0.75), output_columns=['X1', 'X2'])"


def test_simple_imputer(mode):
    mean = SimpleImputer(columns=["X"])
    assert _col(mean.fit_transform(_missing()), "X") == [0.0, 2.0, 3.0, 3.0]
    assert mean.stats_ == {"mean(X)": 2.0}
    frequent = SimpleImputer(columns=["X", "Y"], strategy="most_frequent")
    out = frequent.fit_transform(_missing()).to_pandas()
    assert out["X"].tolist() == [0.0, 3.0, 3.0, 3.0]
    assert out["Y"].tolist() == ["c", "b", "c", "c"]
    assert frequent.stats_ == {"most_frequent(X)": 3.0, "most_frequent(Y)": "c"}
    constant = SimpleImputer(columns=["Y"], strategy="constant", fill_value="?")
    assert constant.fit_status() == Preprocessor.FitStatus.NOT_FITTABLE
    assert _col(constant.transform(_missing()), "Y") == ["?", "b", "c", "c"]
    appended = SimpleImputer(columns=["X"], output_columns=["X_imputed"]).fit_transform(_missing()).to_pandas()
    assert appended["X_imputed"].tolist() == [0.0, 2.0, 3.0, 3.0]
    assert appended["X"][1] is pd.NA  # as Ray: a UDF's pandas output is an Arrow block, to_pandas gives Arrow dtypes
    with pytest.raises(ValueError, match="fill_value"):
        SimpleImputer(columns=["Y"], strategy="constant")
    with pytest.raises(ValueError, match="not supported"):
        SimpleImputer(columns=["Y"], strategy="median")


def test_ordinal_encoder(mode):
    encoder = OrdinalEncoder(columns=["sex", "level"])
    out = encoder.fit_transform(_people())
    assert out.schema().base_schema.field("sex").type == pa.int64()
    assert out.to_pandas().to_dict("list") == {"sex": [1, 0, 1, 0], "level": [1, 2, 0, 1]}
    assert encoder.stats_ == {
        "unique_values(sex)": {"female": 0, "male": 1},
        "unique_values(level)": {"L3": 0, "L4": 1, "L5": 2},
    }
    unseen = dataflow.from_pandas(pd.DataFrame({"sex": ["female"], "level": ["L6"]}))
    assert encoder.transform(unseen).take_all() == [{"sex": 0, "level": None}]
    lists = OrdinalEncoder(columns=["genre"]).fit_transform(_genres())
    assert _col(lists, "genre") == [[2, 0, 4], [1, 2, 0], [3]]


def test_one_hot_encoder(mode):
    ds = dataflow.from_pandas(pd.DataFrame({"color": ["red", "green", "red", "red", "blue", "green"]}))
    encoder = OneHotEncoder(columns=["color"])
    out = encoder.fit_transform(ds)
    assert out.schema().base_schema.field("color").type == pa.list_(pa.uint8(), 3)
    assert _col(out, "color") == [[0, 0, 1], [0, 1, 0], [0, 0, 1], [0, 0, 1], [1, 0, 0], [0, 1, 0]]
    assert encoder.stats_ == {"unique_values(color)": {"blue": 0, "green": 1, "red": 2}}
    unseen = dataflow.from_pandas(pd.DataFrame({"color": ["yellow"]}))
    assert _col(encoder.transform(unseen), "color") == [[0, 0, 0]]
    top2 = OneHotEncoder(columns=["color"], max_categories={"color": 2})
    # Ray 2.60 sorts the kept categories (green, red), whatever its docstring shows.
    assert _col(top2.fit_transform(ds), "color") == [[0, 1], [1, 0], [0, 1], [0, 1], [0, 0], [1, 0]]
    with pytest.raises(ValueError, match="max_categories"):
        OneHotEncoder(columns=["color"], max_categories={"other": 1}).fit(ds)


def test_multi_hot_encoder(mode):
    encoder = MultiHotEncoder(columns=["genre"])
    assert _col(encoder.fit_transform(_genres()), "genre") == [[1, 0, 1, 0, 1], [1, 1, 1, 0, 0], [0, 0, 0, 1, 0]]
    top3 = MultiHotEncoder(columns=["genre"], max_categories={"genre": 3})
    assert _col(top3.fit_transform(_genres()), "genre") == [[1, 1, 1], [1, 1, 0], [0, 0, 0]]
    assert top3.stats_ == {"unique_values(genre)": {"action": 0, "comedy": 1, "sports": 2}}


def test_label_encoder_and_inverse(mode):
    ds = dataflow.from_pandas(
        pd.DataFrame({"sepal_width": [5.1, 7, 4.9, 6.2], "species": ["setosa", "versicolor", "setosa", "virginica"]})
    )
    encoder = LabelEncoder(label_column="species", output_column="species_encoded")
    out = encoder.fit_transform(ds)
    assert _col(out, "species_encoded") == [0, 1, 0, 2]
    restored = encoder.inverse_transform(out.drop_columns(["species"]))
    assert _col(restored, "species") == ["setosa", "versicolor", "setosa", "virginica"]
    assert repr(encoder) == "LabelEncoder(label_column='species', output_column='species_encoded')"


def test_categorizer(mode):
    categorizer = Categorizer(columns=["sex", "level"])
    out = categorizer.fit_transform(_people())
    assert pa.types.is_dictionary(out.schema().base_schema.field("sex").type)
    assert list(categorizer.stats_["level"].categories) == ["L3", "L4", "L5"]
    assert out.to_pandas()["sex"].tolist() == ["male", "female", "male", "female"]
    given = Categorizer(columns=["level"], dtypes={"level": pd.CategoricalDtype(["L3", "L4", "L5", "L6"], ordered=True)})
    assert list(given.fit(_people()).stats_["level"].categories) == ["L3", "L4", "L5", "L6"]


def test_normalizer_and_concatenator(mode):
    ds = dataflow.from_pandas(pd.DataFrame({"X1": [1, 1], "X2": [1, 0], "X3": [0, 1]}))
    l2 = Normalizer(columns=["X1", "X2"]).transform(ds).to_pandas()
    np.testing.assert_allclose(l2["X1"], [0.707107, 1.0], atol=1e-6)
    assert _col(Normalizer(columns=["X1", "X2"], norm="l1").transform(ds), "X1") == [0.5, 1.0]
    assert _col(Normalizer(columns=["X1", "X2"], norm="max").transform(ds), "X2") == [1.0, 0.0]
    with pytest.raises(ValueError, match="not supported"):
        Normalizer(columns=["X1"], norm="l3")
    vectors = dataflow.from_pandas(pd.DataFrame({"X0": [0, 3, 1], "X1": [0.5, 0.2, 0.9], "Y": ["a", "b", "c"]}))
    out = Concatenator(columns=["X0", "X1"], output_column_name="tensor").transform(vectors)
    assert out.columns() == ["Y", "tensor"]
    assert _col(out, "tensor") == [[0.0, 0.5], [3.0, 0.2], [1.0, 0.9]]
    assert repr(out.materialize().schema()).endswith("tensor  ArrowTensorTypeV2(shape=(2,), dtype=double)")  # Ray's type
    with pytest.raises(ValueError, match="Missing columns"):
        Concatenator(columns=["nope"], raise_if_missing=True).transform(vectors).take_all()


def test_chain_fits_in_sequence(mode):
    ds = dataflow.from_pandas(pd.DataFrame({"X0": [0, 1, 2], "X1": [0, 1, 2], "Y": ["a", "b", "a"]}))
    chain = Chain(
        StandardScaler(columns=["X0", "X1"]),
        Concatenator(columns=["X0", "X1"], output_column_name="X"),
        LabelEncoder("Y"),
    )
    assert chain.fit_status() == Preprocessor.FitStatus.NOT_FITTED
    out = chain.fit_transform(ds).to_pandas()
    assert chain.fit_status() == Preprocessor.FitStatus.FITTED
    assert out["Y"].tolist() == [0, 1, 0]
    expected = [[-1.224745, -1.224745], [0.0, 0.0], [1.224745, 1.224745]]
    np.testing.assert_allclose(np.stack(out["X"]), expected, atol=1e-6)
    again = Preprocessor.deserialize(chain.serialize()).transform(ds).to_pandas()
    assert again["Y"].tolist() == [0, 1, 0]
    # the transform options reach every member's transform: none is dropped
    with pytest.raises(ResourceError, match=r"StandardScaler.*num_cpus=1000"):
        Chain(StandardScaler(columns=["X0"]), LabelEncoder("Y")).fit_transform(ds, transform_num_cpus=1000).take_all()


def test_transform_batch_keeps_the_batch_kind():
    scaler = StandardScaler(columns=["X1"]).fit(_xs())
    expected = pytest.approx([0.612372, 1.224745], abs=1e-6)
    frame = scaler.transform_batch(pd.DataFrame({"X1": [1, 2]}))
    assert isinstance(frame, pd.DataFrame)
    assert frame["X1"].tolist() == expected
    arrays = scaler.transform_batch({"X1": np.array([1, 2])})
    assert isinstance(arrays, dict)
    assert arrays["X1"].tolist() == expected
    table = scaler.transform_batch(pa.table({"X1": [1, 2]}))
    assert isinstance(table, pa.Table)
    assert table.column("X1").to_pylist() == expected
    one_hot = OneHotEncoder(columns=["sex"]).fit(_people()).transform_batch({"sex": np.array(["male", "x"])})
    assert one_hot["sex"].tolist() == [[0, 1], [0, 0]]
    with pytest.raises(ValueError, match="only implemented"):
        scaler.transform_batch([1, 2])


def test_not_fitted_refit_warning_and_errors(mode):
    scaler = StandardScaler(columns=["X1"])
    assert scaler.fit_status() == Preprocessor.FitStatus.NOT_FITTED
    with pytest.raises(PreprocessorNotFittedException):
        scaler.transform(_xs())
    with pytest.raises(PreprocessorNotFittedException):
        scaler.transform_batch(pd.DataFrame({"X1": [1]}))
    with pytest.raises(PreprocessorNotFittedException):
        LabelEncoder("X1").inverse_transform(_xs())
    scaler.fit(_xs())
    with pytest.warns(UserWarning, match="already been called"):
        scaler.fit(_xs())
    with pytest.raises(ValueError, match="nope"):
        StandardScaler(columns=["nope"]).fit(_xs())
    with pytest.raises(ValueError, match="nope"):
        OneHotEncoder(columns=["nope"]).fit(_xs())
    with pytest.raises(ValueError, match="X1"):
        scaler.transform_batch(pd.DataFrame({"nope": [1]}))
    with pytest.raises(ValueError, match="length of columns and output_columns"):
        MinMaxScaler(columns=["a", "b"], output_columns=["c"])
    with pytest.raises(ValueError, match="null values"):
        OrdinalEncoder(columns=["Y"]).fit(_missing())


def test_serialize_round_trip(mode):
    encoder = OneHotEncoder(columns=["sex"], output_columns=["sex_hot"]).fit(_people())
    serialized = encoder.serialize()
    assert isinstance(serialized, str)
    restored = Preprocessor.deserialize(serialized)
    assert type(restored) is OneHotEncoder
    assert restored.stats_ == encoder.stats_
    assert restored.fit_status() == Preprocessor.FitStatus.FITTED
    assert _col(restored.transform(_people()), "sex_hot") == [[0, 1], [1, 0], [0, 1], [1, 0]]


# discretizers, power transform, tokenizer, vectorizers and hasher -------------------------
# Values are Ray 2.60's, from its docstring examples or (where those are skipped) a probe of Ray.


def _values() -> dataflow.Dataset:
    return dataflow.from_pandas(
        pd.DataFrame({"value_1": [0.2, 1.4, 2.5, 6.2, 9.7, 2.1], "value_2": [10, 15, 13, 12, 23, 25]})
    )


def _counts(ds: dataflow.Dataset, name: str) -> list:
    """A list column's rows as Python lists, a null row as None."""
    return [None if v is pd.NA else v for v in _col(ds, name)]


def _corpus() -> dataflow.Dataset:
    return dataflow.from_pandas(
        pd.DataFrame({"corpus": ["Jimmy likes volleyball", "Bob likes volleyball too", "Bob also likes fruit jerky"]})
    )


def test_uniform_kbins_discretizer(mode):
    d = UniformKBinsDiscretizer(columns=["value_1", "value_2"], bins=4)
    out = d.fit_transform(_values()).to_pandas()
    assert out["value_1"].tolist() == [0, 0, 0, 2, 3, 0]
    assert out["value_2"].tolist() == [0, 1, 0, 0, 3, 3]
    assert str(out["value_1"].dtype) == "int64[pyarrow]"  # as Ray 2.60 (a UDF's output is an Arrow block)
    assert list(d.stats_) == ["value_1", "value_2"]
    np.testing.assert_allclose(d.stats_["value_1"], [0.1905, 2.575, 4.95, 7.325, 9.7])
    np.testing.assert_allclose(d.stats_["value_2"], [9.985, 13.75, 17.5, 21.25, 25.0])
    assert repr(d) == (
        "UniformKBinsDiscretizer(columns=['value_1', 'value_2'], bins=4, right=True, include_lowest=False, "
        "duplicates='raise', dtypes=None, output_columns=['value_1', 'value_2'])"
    )
    per_column = UniformKBinsDiscretizer(columns=["value_1", "value_2"], bins={"value_1": 4, "value_2": 3})
    out = per_column.fit_transform(_values()).to_pandas()
    assert out["value_1"].tolist() == [0, 0, 0, 2, 3, 0]
    assert out["value_2"].tolist() == [0, 0, 0, 0, 2, 2]
    appended = UniformKBinsDiscretizer(columns=["value_1", "value_2"], bins=4, output_columns=["v1", "v2"])
    out = appended.fit_transform(_values()).to_pandas()
    assert list(out.columns) == ["value_1", "value_2", "v1", "v2"]
    assert out["value_1"].tolist() == [0.2, 1.4, 2.5, 6.2, 9.7, 2.1]
    assert out["v2"].tolist() == [0, 1, 0, 0, 3, 3]
    labelled = UniformKBinsDiscretizer(
        columns=["value_1"], bins=3, dtypes={"value_1": pd.CategoricalDtype(["lo", "mid", "hi"], ordered=True)}
    )
    assert labelled.fit_transform(_values()).to_pandas()["value_1"].tolist() == ["lo", "lo", "lo", "mid", "hi", "lo"]


def test_uniform_kbins_discretizer_bad_bins(mode):
    with pytest.raises(ValueError, match="all elements of `columns` must be present"):
        UniformKBinsDiscretizer(columns=["value_1", "value_2"], bins={"value_1": 4}).fit(_values())
    with pytest.raises(TypeError, match=r"must be an integer or a dict of integers, got 2\.5"):
        UniformKBinsDiscretizer(columns=["value_1"], bins=2.5).fit(_values())
    with pytest.raises(ValueError, match="Column value_1 has no values to bin"):
        UniformKBinsDiscretizer(columns=["value_1"], bins=2).fit(_values().filter(lambda r: r["value_2"] > 100))


def test_custom_kbins_discretizer(mode):
    d = CustomKBinsDiscretizer(columns=["value_1", "value_2"], bins=[0, 1, 4, 10, 25])
    assert d.fit_status() == Preprocessor.FitStatus.NOT_FITTABLE
    out = d.transform(_values()).to_pandas()
    assert out["value_1"].tolist() == [0, 1, 1, 2, 2, 1]
    assert out["value_2"].tolist() == [2, 3, 3, 3, 3, 3]
    assert repr(d) == (
        "CustomKBinsDiscretizer(columns=['value_1', 'value_2'], bins=[0, 1, 4, 10, 25], right=True, "
        "include_lowest=False, duplicates='raise', dtypes=None, output_columns=['value_1', 'value_2'])"
    )
    per_column = CustomKBinsDiscretizer(
        columns=["value_1", "value_2"], bins={"value_1": [0, 1, 4], "value_2": [0, 18, 35, 70]}
    )
    out = per_column.transform(_values()).to_pandas()
    assert [None if v is pd.NA else v for v in out["value_1"]] == [0.0, 1.0, 1.0, None, None, 1.0]  # Ray's <NA>
    assert out["value_2"].tolist() == [0, 0, 0, 0, 1, 1]
    with pytest.raises(ValueError, match="all elements of `columns` must be present"):
        CustomKBinsDiscretizer(columns=["a", "b"], bins={"a": [0, 1]})


def test_power_transformer(mode):
    data = dataflow.from_pandas(pd.DataFrame({"X1": [-1.5, 0.0, 2.0, 3.5], "X2": [0.5, 1.0, 2.5, 4.0]}))
    cases = [
        ("yeo-johnson", 1.5, "X1", [-1.162278, 0.0, 2.797435, 5.697294]),
        ("yeo-johnson", 1.5, "X2", [0.558078, 1.218951, 3.6986, 6.786893]),
        ("yeo-johnson", 0, "X1", [-2.625, 0.0, 1.098612, 1.504077]),
        ("yeo-johnson", 2, "X1", [-0.916291, 0.0, 4.0, 9.625]),
        ("box-cox", 0.5, "X2", [-0.585786, 0.0, 1.162278, 2.0]),
        ("box-cox", 0, "X2", [-0.693147, 0.0, 0.916291, 1.386294]),
    ]
    for method, power, column, expected in cases:
        t = PowerTransformer(columns=[column], power=power, method=method, output_columns=["out"])
        np.testing.assert_allclose(t.transform(data).to_pandas()["out"], expected, rtol=1e-6)
    t = PowerTransformer(columns=["X1", "X2"], power=1.5)
    assert repr(t) == "PowerTransformer(columns=['X1', 'X2'], power=1.5, method='yeo-johnson', output_columns=['X1', 'X2'])"
    with pytest.raises(ValueError, match=r"Method nope is not supported.Supported values are: \['yeo-johnson', 'box-cox'\]"):
        PowerTransformer(columns=["X1"], power=1, method="nope")


def _strip_punctuation(s: str) -> list[str]:
    for character in string.punctuation:
        s = s.replace(character, "")
    return s.split()


def test_tokenizer(mode):
    text = dataflow.from_pandas(pd.DataFrame({"text": ["Hello, world!", "foo bar\nbaz", None]}))
    tokenizer = Tokenizer(columns=["text"])
    assert _col(tokenizer.transform(text), "text") == [["Hello,", "world!"], ["foo", "bar\nbaz"], None]
    assert repr(tokenizer) == "Tokenizer(columns=['text'], tokenization_fn=simple_split_tokenizer, output_columns=['text'])"
    custom = Tokenizer(columns=["text"], tokenization_fn=_strip_punctuation, output_columns=["tokens"])
    out = custom.transform(text)
    assert _col(out, "tokens") == [["Hello", "world"], ["foo", "bar", "baz"], None]
    assert _col(out, "text")[0] == "Hello, world!"
    assert "tokenization_fn=_strip_punctuation" in repr(custom)


# bucket of each token for 1000 features, computed by Ray 2.60's simple_hash
RAY_BUCKETS_OF_1000 = {
    "I": 540, "like": 535, "dislike": 223, "Python": 763, "Jimmy": 466, "likes": 683, "volleyball": 798,
    "Bob": 185, "too": 96, "also": 643, "fruit": 492, "jerky": 312, "": 549, "h\u00e9llo": 377,
    "\u65e5\u672c": 586, "1": 315, "None": 777, "3.5": 214,
}  # fmt: skip


def test_simple_hash_matches_ray():
    assert {token: simple_hash(token, 1000) for token in RAY_BUCKETS_OF_1000} == RAY_BUCKETS_OF_1000
    assert (simple_hash(1, 1000), simple_hash(3.5, 1000), simple_hash(None, 1000), simple_hash(True, 1000)) == (
        315, 214, 777, 640,
    )  # fmt: skip


def test_hashing_vectorizer(mode):
    v = HashingVectorizer(["corpus"], num_features=8)
    assert v.fit_status() == Preprocessor.FitStatus.NOT_FITTABLE
    out = v.transform(_corpus())
    # Ray 2.60's output (its docstring's example is skipped and shows other values)
    assert _col(out, "corpus") == [[0, 0, 1, 1, 0, 0, 1, 0], [1, 1, 0, 1, 0, 0, 1, 0], [1, 1, 0, 2, 1, 0, 0, 0]]
    assert out.schema().types[0] == pa.list_(pa.int64())
    assert repr(v) == (
        "HashingVectorizer(columns=['corpus'], num_features=8, tokenization_fn=simple_split_tokenizer, "
        "output_columns=['corpus'])"
    )
    docs = dataflow.from_pandas(pd.DataFrame({"corpus": ["a b a", None, "b c"]}))
    appended = HashingVectorizer(["corpus"], num_features=4, output_columns=["hashed"]).transform(docs)
    assert _counts(appended, "hashed") == [[0, 1, 0, 2], None, [0, 1, 1, 0]]


def test_count_vectorizer(mode):
    v = CountVectorizer(["corpus"])
    out = v.fit_transform(_corpus())
    assert _col(out, "corpus") == [[1, 1, 0, 1, 0, 0, 0, 0], [1, 1, 1, 0, 1, 0, 0, 0], [1, 0, 1, 0, 0, 1, 1, 1]]
    assert out.schema().types[0] == pa.list_(pa.int64())
    counts = v.stats_["token_counts(corpus)"]
    assert list(counts.items()) == [
        ("likes", 3), ("volleyball", 2), ("Bob", 2), ("Jimmy", 1), ("too", 1), ("also", 1), ("fruit", 1), ("jerky", 1),
    ]  # fmt: skip
    assert repr(v) == (
        "CountVectorizer(columns=['corpus'], tokenization_fn=simple_split_tokenizer, max_features=None, "
        "output_columns=['corpus'])"
    )
    top = CountVectorizer(["corpus"], max_features=3, output_columns=["counts"])
    out = top.fit_transform(_corpus())
    assert _col(out, "counts") == [[1, 1, 0], [1, 1, 1], [1, 0, 1]]
    assert _col(out, "corpus")[0] == "Jimmy likes volleyball"
    assert dict(top.stats_["token_counts(corpus)"]) == {"likes": 3, "volleyball": 2, "Bob": 2}
    docs = dataflow.from_pandas(pd.DataFrame({"corpus": ["a b a", None, "b c"]}))
    with_null = CountVectorizer(["corpus"])
    assert _counts(with_null.fit_transform(docs), "corpus") == [[2, 1, 0], None, [0, 1, 1]]
    assert dict(with_null.stats_["token_counts(corpus)"]) == {"a": 2, "b": 2, "c": 1}


def test_feature_hasher(mode):
    frequencies = pd.DataFrame({"I": [1, 1], "like": [1, 0], "dislike": [0, 1], "Python": [1, 1]})
    h = FeatureHasher(columns=["I", "like", "dislike", "Python"], num_features=8, output_column="hashed")
    out = h.fit_transform(dataflow.from_pandas(frequencies))
    # Ray 2.60's output (its docstring's example is skipped and shows other values)
    assert _col(out, "hashed") == [[0, 0, 0, 1, 1, 0, 0, 1], [0, 0, 0, 1, 1, 0, 0, 1]]
    assert _col(out, "I") == [1, 1]
    assert repr(out.schema()).endswith("hashed   ArrowTensorTypeV2(shape=(8,), dtype=int64)")  # Ray's type
    assert h.get_output_columns() == ["hashed"]
    assert repr(h) == "FeatureHasher(columns=['I', 'like', 'dislike', 'Python'], num_features=8, output_column='hashed')"
    batch = h.transform_batch(frequencies)
    assert [list(v) for v in batch["hashed"]] == [[0, 0, 0, 1, 1, 0, 0, 1], [0, 0, 0, 1, 1, 0, 0, 1]]


def test_new_preprocessors_serialize_round_trip(mode):
    vectorizer = CountVectorizer(["corpus"], max_features=3).fit(_corpus())
    restored = Preprocessor.deserialize(vectorizer.serialize())
    assert type(restored) is CountVectorizer
    assert restored.stats_ == vectorizer.stats_
    assert _col(restored.transform(_corpus()), "corpus") == [[1, 1, 0], [1, 1, 1], [1, 0, 1]]
    discretizer = UniformKBinsDiscretizer(columns=["value_1"], bins=4).fit(_values())
    restored = Preprocessor.deserialize(discretizer.serialize())
    assert restored.fit_status() == Preprocessor.FitStatus.FITTED
    assert restored.transform(_values()).to_pandas()["value_1"].tolist() == [0, 0, 0, 2, 3, 0]
    hasher = Preprocessor.deserialize(HashingVectorizer(["corpus"], num_features=8).serialize())
    assert _col(hasher.transform(_corpus()), "corpus")[0] == [0, 0, 1, 1, 0, 0, 1, 0]


class _Center(Preprocessor):
    """Written to Ray's contract: ``_fit`` sets ``self.stats_`` and returns ``self``."""

    def __init__(self, column: str) -> None:
        super().__init__()
        self.column = column

    def _fit(self, ds):
        self.stats_ = {"mean": ds.mean(self.column)}
        return self

    def _transform_pandas(self, df):
        df[self.column] -= self.stats_["mean"]
        return df


class _TwiceNumpy(Preprocessor):
    _is_fittable = False

    def _transform_numpy(self, data):
        return {"x": data["x"] * 2}


class _Both(Preprocessor):
    _is_fittable = False

    def _transform_pandas(self, df):
        return df.assign(kind="pandas")

    def _transform_numpy(self, data):
        return {**data, "kind": np.array(["numpy"] * len(data["x"]))}

    @classmethod
    def preferred_batch_format(cls):
        from dataflow.preprocessor import BatchFormat

        return BatchFormat.NUMPY


def test_custom_preprocessors_written_for_ray(mode):
    """A subclass whose ``_fit`` returns ``self`` had ``stats_`` replaced by itself ("object is
    not subscriptable"), and one with only ``_transform_numpy`` raised NotImplementedError;
    with several, ``preferred_batch_format()`` picks, as in Ray."""
    ds = dataflow.from_items([{"x": float(i)} for i in range(6)])
    centered = _Center("x")
    assert sorted(r["x"] for r in centered.fit_transform(ds).take_all()) == [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5]
    assert centered.stats_ == {"mean": 2.5}
    assert sorted(r["x"] for r in _TwiceNumpy().transform(ds).take_all()) == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert _TwiceNumpy().transform_batch(pd.DataFrame({"x": [1.5]}))["x"].tolist() == [3.0]
    assert {r["kind"] for r in _Both().transform(ds).take_all()} == {"numpy"}

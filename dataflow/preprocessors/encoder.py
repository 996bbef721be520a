"""Categorical encoders (Ray's ``ray.data.preprocessors.encoder``): ordinal, one-hot,
multi-hot, label and pandas-categorical. Each learns its sorted categories from one
value-counting aggregation pass; stats are ``unique_values(A)`` -> ``{category: index}``."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dataflow.preprocessor import Preprocessor, PreprocessorNotFittedException, check_columns
from dataflow.preprocessors._columnwise import ColumnwisePreprocessor, put_column
from dataflow.preprocessors._stats import category_index, fit_value_counts

if TYPE_CHECKING:
    from dataflow.dataset import Dataset


def _is_list(values: pa.ChunkedArray) -> bool:
    return pa.types.is_list(values.type) or pa.types.is_large_list(values.type)


def _check_no_nulls(table: pa.Table, columns: list[str]) -> None:
    null_columns = [c for c in columns if pc.any(pc.is_null(table.column(c), nan_is_null=True)).as_py()]
    if null_columns:
        msg = (
            f"Unable to transform columns {null_columns} because they contain "
            "null values. Consider imputing missing values first."
        )
        raise ValueError(msg)


def _positions(values: pa.ChunkedArray | pa.Array, index: dict[Any, int]) -> pa.Array:
    """Each scalar value's category index (int64), null where the value is unseen."""
    if not index:
        return pa.nulls(len(values), pa.int64())
    keys = pa.array(list(index))
    if keys.type != values.type:
        keys = pc.cast(keys, values.type)
    positions = pc.take(pa.array(list(index.values()), pa.int64()), pc.index_in(values, keys))
    return positions.combine_chunks() if isinstance(positions, pa.ChunkedArray) else positions


def _check_max_categories(columns: list[str], max_categories: dict[str, int]) -> None:
    for column in max_categories:
        if column not in columns:
            msg = f"You set `max_categories` for {column}, which is not present in {columns}."
            raise ValueError(msg)


class _CategoryEncoder(ColumnwisePreprocessor):
    """The fit the encoders share: each column's sorted categories (the top ``max_categories``
    most frequent where set), list elements counted one by one when ``_explode_lists``."""

    _batch_format = "pyarrow"
    _explode_lists = True
    _max_categories: dict[str, int]

    def _fit(self, ds: Dataset) -> dict[str, Any]:
        counts = fit_value_counts(ds, self._columns, explode_lists=self._explode_lists)
        limits = getattr(self, "_max_categories", {})
        return {f"unique_values({c})": category_index(counts[c], limits.get(c)) for c in self._columns}

    def _encode(self, table: pa.Table, encode: Any) -> pa.Table:
        check_columns(table.column_names, self._columns, type(self).__name__)
        _check_no_nulls(table, self._columns)
        encoded = [encode(table.column(c), self.stats_[f"unique_values({c})"]) for c in self._columns]
        for name, values in zip(self._output_columns, encoded, strict=True):
            table = put_column(table, name, values)
        return table


class OrdinalEncoder(_CategoryEncoder):
    """Each category as its index among the sorted categories (int64); an unseen one as null.
    List columns: each element encoded (``encode_lists=True``) or each whole list."""

    _repr_fields = ("encode_lists",)

    def __init__(self, columns: list[str], *, encode_lists: bool = True, output_columns: list[str] | None = None) -> None:
        super().__init__(columns, output_columns)
        self._encode_lists = encode_lists
        self._explode_lists = encode_lists

    @property
    def encode_lists(self) -> bool:
        """Whether list elements, rather than whole lists, are the categories."""
        return self._encode_lists

    def _transform_arrow(self, table: pa.Table) -> pa.Table:
        def encode(values: pa.ChunkedArray, index: dict[Any, int]) -> pa.Array:
            if not _is_list(values):
                return _positions(values, index)
            values = values.combine_chunks()
            if not self._encode_lists:
                return pa.array([index.get(tuple(v)) for v in values.to_pylist()], pa.int64())
            return pa.ListArray.from_arrays(values.offsets, _positions(values.flatten(), index))

        return self._encode(table, encode)


class _TopCategoryEncoder(_CategoryEncoder):
    """An encoder whose columns can keep only their ``max_categories`` most frequent values."""

    _repr_fields = ("max_categories",)

    def __init__(
        self,
        columns: list[str],
        *,
        max_categories: dict[str, int] | None = None,
        output_columns: list[str] | None = None,
    ) -> None:
        super().__init__(columns, output_columns)
        self._max_categories = dict(max_categories or {})

    @property
    def max_categories(self) -> dict[str, int]:
        """The most categories kept per column."""
        return self._max_categories

    def _fit(self, ds: Dataset) -> dict[str, Any]:
        _check_max_categories(self._columns, self._max_categories)
        return super()._fit(ds)


class OneHotEncoder(_TopCategoryEncoder):
    """Each category as a ``fixed_size_list<uint8>`` with a 1 at its index among the sorted
    categories (the top ``max_categories`` most frequent where set); unseen: all zeros. A list
    is one category."""

    _explode_lists = False

    def _transform_arrow(self, table: pa.Table) -> pa.Table:
        def encode(values: pa.ChunkedArray, index: dict[Any, int]) -> pa.Array:
            if _is_list(values):
                found = pa.array([index.get(tuple(v)) for v in values.to_pylist()], pa.int64())
            else:
                found = _positions(values, index)
            codes = pc.fill_null(found, -1).to_numpy(zero_copy_only=False)
            one_hot = np.zeros((len(codes), len(index)), dtype=np.uint8)
            rows = np.nonzero(codes != -1)[0]
            one_hot[rows, codes[rows]] = 1
            return pa.FixedSizeListArray.from_arrays(pa.array(one_hot.ravel()), len(index))

        return self._encode(table, encode)


class MultiHotEncoder(_TopCategoryEncoder):
    """Each list as a ``list<int64>`` counting how often each sorted category (the top
    ``max_categories`` most frequent where set) occurs in it; a scalar is a list of one."""

    def _transform_arrow(self, table: pa.Table) -> pa.Table:
        def encode(values: pa.ChunkedArray, index: dict[Any, int]) -> pa.Array:
            rows = []
            for value in values.to_pylist():
                counter = Counter(value if isinstance(value, list) else [value])
                rows.append([counter.get(category, 0) for category in index])
            return pa.array(rows, pa.list_(pa.int64()))

        return self._encode(table, encode)


class LabelEncoder(Preprocessor):
    """``label_column``'s labels as their index among the sorted labels (an unseen label: NaN),
    written to ``output_column`` (the label column unless given); ``inverse_transform`` maps
    back. Stats: ``unique_values(label)``."""

    def __init__(self, label_column: str, *, output_column: str | None = None) -> None:
        super().__init__()
        self._label_column = label_column
        self._output_column = output_column or label_column

    @property
    def label_column(self) -> str:
        """The column of labels."""
        return self._label_column

    @property
    def output_column(self) -> str:
        """The column the encoded labels go to."""
        return self._output_column

    def _fit(self, ds: Dataset) -> dict[str, Any]:
        counts = fit_value_counts(ds, [self._label_column], explode_lists=False)
        return {f"unique_values({self._label_column})": category_index(counts[self._label_column])}

    def _transform_pandas(self, df: pd.DataFrame) -> pd.DataFrame:
        check_columns(list(df.columns), [self._label_column], type(self).__name__)
        if df[self._label_column].isnull().to_numpy().any():
            msg = (
                f"Unable to transform columns {[self._label_column]} because they contain "
                "null values. Consider imputing missing values first."
            )
            raise ValueError(msg)
        df[self._output_column] = df[self._label_column].map(self.stats_[f"unique_values({self._label_column})"])
        return df

    def inverse_transform(self, ds: Dataset) -> Dataset:
        """``ds`` with the encoded ``output_column`` mapped back to labels in ``label_column``."""
        if self.fit_status() != Preprocessor.FitStatus.FITTED:
            raise PreprocessorNotFittedException("`fit` must be called before `inverse_transform`, ")
        return ds.map_batches(self._inverse_transform_pandas, batch_format="pandas")

    def _inverse_transform_pandas(self, df: pd.DataFrame) -> pd.DataFrame:
        index = self.stats_[f"unique_values({self._label_column})"]
        df[self._label_column] = df[self._output_column].map({v: k for k, v in index.items()})
        return df

    def get_input_columns(self) -> list[str]:
        """The label column."""
        return [self._label_column]

    def get_output_columns(self) -> list[str]:
        """The encoded column."""
        return [self._output_column]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(label_column={self._label_column!r}, output_column={self._output_column!r})"


class Categorizer(ColumnwisePreprocessor):
    """Each column as a ``pd.CategoricalDtype`` (a dictionary column in Arrow): ``dtypes``
    where given, else the sorted values seen by ``fit`` (nulls left out). Stats: ``{column:
    CategoricalDtype}``."""

    _repr_fields = ("dtypes",)

    def __init__(
        self,
        columns: list[str],
        dtypes: dict[str, pd.CategoricalDtype] | None = None,
        output_columns: list[str] | None = None,
    ) -> None:
        super().__init__(columns, output_columns)
        self._dtypes = dict(dtypes or {})

    @property
    def dtypes(self) -> dict[str, pd.CategoricalDtype]:
        """The categories given up front, by column."""
        return self._dtypes

    def _fit(self, ds: Dataset) -> dict[str, Any]:
        stats: dict[str, Any] = dict(self._dtypes)
        to_learn = [c for c in self._columns if c not in self._dtypes]
        if to_learn:
            counts = fit_value_counts(ds, to_learn, explode_lists=False)
            for c in to_learn:
                stats[c] = pd.CategoricalDtype(list(category_index(counts[c], drop_nulls=True)))
        return stats

    def _transform_pandas(self, df: pd.DataFrame) -> pd.DataFrame:
        return self._map_columns(df, lambda s, name: s.astype(self.stats_[name]))

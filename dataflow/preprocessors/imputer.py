"""``SimpleImputer`` (Ray's ``ray.data.preprocessors.imputer``): fill missing values."""

from __future__ import annotations

from numbers import Number
from typing import TYPE_CHECKING, Any

import pandas as pd

from dataflow.aggregate import Mean
from dataflow.preprocessors._columnwise import ColumnwisePreprocessor
from dataflow.preprocessors._stats import ValueCounts, value_counts

if TYPE_CHECKING:
    from dataflow.dataset import Dataset


class SimpleImputer(ColumnwisePreprocessor):
    """Fill the nulls of each column with its mean (``strategy="mean"``, stats ``mean(A)``), its
    most frequent value (``"most_frequent"``, stats ``most_frequent(A)``) or ``fill_value``
    (``"constant"``, which needs no fit). A column missing from a batch is added, filled."""

    _valid_strategies = ("mean", "most_frequent", "constant")

    def __init__(
        self,
        columns: list[str],
        strategy: str = "mean",
        fill_value: str | Number | None = None,
        *,
        output_columns: list[str] | None = None,
    ) -> None:
        if strategy not in self._valid_strategies:
            msg = f"Strategy {strategy} is not supported.Supported values are: {list(self._valid_strategies)}"
            raise ValueError(msg)
        if strategy == "constant" and fill_value is None:
            msg = '`fill_value` must be set when using "constant" strategy.'
            raise ValueError(msg)
        super().__init__(columns, output_columns)
        self._strategy = strategy
        self._fill_value = fill_value
        self._is_fittable = strategy != "constant"

    @property
    def strategy(self) -> str:
        """How fill values are chosen."""
        return self._strategy

    @property
    def fill_value(self) -> str | Number | None:
        """The value ``"constant"`` fills with."""
        return self._fill_value

    def _fit(self, ds: Dataset) -> dict[str, Any]:
        if self._strategy == "mean":
            return dict(ds.aggregate(*(Mean(c) for c in self._columns)) or {})
        aggs = [ValueCounts(c, explode_lists=False) for c in self._columns]
        result = ds.aggregate(*aggs) or {}
        stats = {}
        for c, agg in zip(self._columns, aggs, strict=True):
            counts = value_counts(result, agg.name)
            counts.pop(None, None)
            stats[f"most_frequent({c})"] = counts.most_common(1)[0][0] if counts else None
        return stats

    def _fill(self, column: str) -> Any:
        if self._strategy == "constant":
            return self._fill_value
        return self.stats_[f"{self._strategy}({column})"]

    def _transform_pandas(self, df: pd.DataFrame) -> pd.DataFrame:
        for column, output in zip(self._columns, self._output_columns, strict=True):
            value = self._fill(column)
            if value is None:
                msg = f"Column {column} has no fill value. Check the data used to fit the SimpleImputer."
                raise ValueError(msg)
            if column not in df.columns:
                df[output] = value
                continue
            values = df[column]
            if isinstance(values.dtype, pd.CategoricalDtype) and value not in values.cat.categories:
                values = values.cat.add_categories([value])
            df[output] = values.fillna(value)
        return df

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(columns={self._columns!r}, strategy={self._strategy!r}, "
            f"fill_value={self._fill_value!r}, output_columns={self._output_columns!r})"
        )

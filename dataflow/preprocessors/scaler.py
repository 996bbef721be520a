"""Column scalers (Ray's ``ray.data.preprocessors.scaler``): standard, min-max, max-abs and
robust. Each fits its statistics in one aggregation pass and rescales with vectorised pandas."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from dataflow.aggregate import AbsMax, ApproximateQuantile, Max, Mean, Min, Std
from dataflow.preprocessors._columnwise import ColumnwisePreprocessor

if TYPE_CHECKING:
    from dataflow.dataset import Dataset

_EPSILON = 1e-8  # as Ray's: a spread this small (a constant column) divides by 1 instead


def _nan_like(s: pd.Series) -> pd.Series:
    return pd.Series(np.nan, index=s.index, dtype="float64")


class StandardScaler(ColumnwisePreprocessor):
    """``(x - mean) / std`` per column, std with ``ddof=0``; a constant column becomes zeros
    (its std is taken as 1); a column with no values becomes nulls. Stats: ``mean(A)``,
    ``std(A)``."""

    def _fit(self, ds: Dataset) -> dict[str, Any]:
        aggs = [Mean(c) for c in self._columns] + [Std(c, ddof=0) for c in self._columns]
        return dict(ds.aggregate(*aggs) or {})

    def _transform_pandas(self, df: pd.DataFrame) -> pd.DataFrame:
        def scale(s: pd.Series, name: str) -> pd.Series:
            mean, std = self.stats_[f"mean({name})"], self.stats_[f"std({name})"]
            if mean is None or std is None:
                return _nan_like(s)
            return (s - mean) / (1 if std < _EPSILON else std)

        return self._map_columns(df, scale)


class MinMaxScaler(ColumnwisePreprocessor):
    """``(x - min) / (max - min)`` per column, into ``[0, 1]``; a constant column becomes zeros.
    Stats: ``min(A)``, ``max(A)``."""

    def _fit(self, ds: Dataset) -> dict[str, Any]:
        aggs = [Min(c) for c in self._columns] + [Max(c) for c in self._columns]
        return dict(ds.aggregate(*aggs) or {})

    def _transform_pandas(self, df: pd.DataFrame) -> pd.DataFrame:
        def scale(s: pd.Series, name: str) -> pd.Series:
            low, high = self.stats_[f"min({name})"], self.stats_[f"max({name})"]
            if low is None or high is None:
                return _nan_like(s)
            diff = high - low
            return (s - low) / (1 if diff < _EPSILON else diff)

        return self._map_columns(df, scale)


class MaxAbsScaler(ColumnwisePreprocessor):
    """``x / max(|x|)`` per column; an all-zero column is left as it is (as floats).
    Stats: ``abs_max(A)``."""

    def _fit(self, ds: Dataset) -> dict[str, Any]:
        return dict(ds.aggregate(*(AbsMax(c) for c in self._columns)) or {})

    def _transform_pandas(self, df: pd.DataFrame) -> pd.DataFrame:
        def scale(s: pd.Series, name: str) -> pd.Series:
            abs_max = self.stats_[f"abs_max({name})"]
            if abs_max is None:
                return _nan_like(s)
            return s / (1 if abs_max == 0 else abs_max)

        return self._map_columns(df, scale)


class RobustScaler(ColumnwisePreprocessor):
    """``(x - median) / (high quantile - low quantile)`` per column, quantiles as Ray's
    ``ApproximateQuantile`` gives them; a zero spread gives zeros. Stats: ``low_quantile(A)``,
    ``median(A)``, ``high_quantile(A)``."""

    _repr_fields = ("quantile_range",)
    DEFAULT_QUANTILE_PRECISION = 800

    def __init__(
        self,
        columns: list[str],
        quantile_range: tuple[float, float] = (0.25, 0.75),
        output_columns: list[str] | None = None,
        quantile_precision: int = DEFAULT_QUANTILE_PRECISION,
    ) -> None:
        super().__init__(columns, output_columns)
        self._quantile_range = quantile_range
        self._quantile_precision = quantile_precision

    @property
    def quantile_range(self) -> tuple[float, float]:
        """The (low, high) quantiles whose spread is the scale."""
        return self._quantile_range

    def _fit(self, ds: Dataset) -> dict[str, Any]:
        quantiles = [self._quantile_range[0], 0.5, self._quantile_range[1]]
        aggs = [ApproximateQuantile(c, quantiles, self._quantile_precision) for c in self._columns]
        result = ds.aggregate(*aggs) or {}
        stats: dict[str, Any] = {}
        for c in self._columns:
            found = result.get(f"approx_quantile({c})")
            low, median, high = found if found and len(found) == 3 else (None, None, None)
            stats |= {f"low_quantile({c})": low, f"median({c})": median, f"high_quantile({c})": high}
        return stats

    def _transform_pandas(self, df: pd.DataFrame) -> pd.DataFrame:
        def scale(s: pd.Series, name: str) -> pd.Series:
            low, median = self.stats_[f"low_quantile({name})"], self.stats_[f"median({name})"]
            high = self.stats_[f"high_quantile({name})"]
            if low is None or median is None or high is None:
                return _nan_like(s)
            if high - low == 0:
                return pd.Series(np.zeros(len(s)), index=s.index)
            return (s - median) / (high - low)

        return self._map_columns(df, scale)

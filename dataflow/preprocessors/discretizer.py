"""Ray's k-bins discretizers: each value becomes the index of its bin (``pd.cut``), or its
category where ``dtypes`` names a ``pd.CategoricalDtype``. ``CustomKBinsDiscretizer`` takes
the bin edges; ``UniformKBinsDiscretizer`` fits ``bins`` equal-width bins between each
column's min and max (one aggregation pass), the range widened by 0.1% as pandas does."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from dataflow.aggregate import Max, Min
from dataflow.preprocessors._columnwise import ColumnwisePreprocessor

if TYPE_CHECKING:
    from dataflow.dataset import Dataset

Bins = Iterable[float] | pd.IntervalIndex


class _KBinsDiscretizer(ColumnwisePreprocessor):
    """``pd.cut`` of each column by its bins: ``stats_[column]`` when fitted, else ``bins``
    (one set for every column, or a dict by column)."""

    _repr_fields = ("bins", "right", "include_lowest", "duplicates", "dtypes")

    def __init__(
        self,
        columns: list[str],
        bins: int | dict[str, int] | Bins | dict[str, Bins],
        *,
        right: bool = True,
        include_lowest: bool = False,
        duplicates: str = "raise",
        dtypes: dict[str, pd.CategoricalDtype | type[np.integer]] | None = None,
        output_columns: list[str] | None = None,
    ) -> None:
        super().__init__(columns, output_columns)
        self._bins = bins
        self._right = right
        self._include_lowest = include_lowest
        self._duplicates = duplicates
        self._dtypes = dtypes
        self._validate_on_init()

    def _validate_on_init(self) -> None:
        """Checks of the settings made on construction (Ray checks a custom ``bins`` dict then,
        a uniform one at ``fit``)."""

    @property
    def bins(self) -> Any:
        """The bins as given."""
        return self._bins

    @property
    def right(self) -> bool:
        """Whether each bin includes its right edge."""
        return self._right

    @property
    def include_lowest(self) -> bool:
        """Whether the first bin includes its left edge."""
        return self._include_lowest

    @property
    def duplicates(self) -> str:
        """``"raise"`` or ``"drop"``: what non-unique bin edges do."""
        return self._duplicates

    @property
    def dtypes(self) -> dict[str, pd.CategoricalDtype | type[np.integer]] | None:
        """Per column, a ``pd.CategoricalDtype`` whose categories label the bins (else indices)."""
        return self._dtypes

    def _validate_bins_columns(self) -> None:
        if isinstance(self._bins, dict) and not all(c in self._bins for c in self._columns):
            msg = "If `bins` is a dictionary, all elements of `columns` must be present in it."
            raise ValueError(msg)

    def _transform_pandas(self, df: pd.DataFrame) -> pd.DataFrame:
        return self._map_columns(df, self._bin_values)

    def _bin_values(self, s: pd.Series, name: str) -> pd.Series:
        labels: Any = self._dtypes.get(name) if self._dtypes else False
        ordered = True
        if labels:
            if isinstance(labels, pd.CategoricalDtype):
                ordered = labels.ordered
                labels = list(labels.categories)
            else:  # an integer type: bin indices, as without one
                labels = False
        bins = self.stats_ if self._is_fittable else self._bins
        return pd.cut(
            s,
            bins[name] if isinstance(bins, dict) else bins,
            right=self._right,
            labels=labels,
            ordered=ordered,
            retbins=False,
            include_lowest=self._include_lowest,
            duplicates=self._duplicates,
        )


class CustomKBinsDiscretizer(_KBinsDiscretizer):
    """Bin values by the given edges (``bins``: a list of numbers or a ``pd.IntervalIndex``, or
    a dict of them by column, which must name every column, checked on construction). A value
    outside every bin becomes null. Not fittable."""

    _is_fittable = False

    def _validate_on_init(self) -> None:
        self._validate_bins_columns()


class UniformKBinsDiscretizer(_KBinsDiscretizer):
    """Bin values into ``bins`` equal-width bins (an int, or a dict of ints by column) between
    each column's fitted min and max. Stats: ``stats_[column]``, the bin edges (numpy array)."""

    def _fit(self, ds: Dataset) -> dict[str, Any]:
        self._validate_bins_columns()
        columns = list(self._bins) if isinstance(self._bins, dict) else self._columns  # as Ray: a dict's keys
        for column in columns:
            count = self._bins[column] if isinstance(self._bins, dict) else self._bins
            if not isinstance(count, int):
                msg = f"`bins` must be an integer or a dict of integers, got {count}"
                raise TypeError(msg)
        result = ds.aggregate(*[Min(c) for c in columns], *[Max(c) for c in columns]) or {}
        stats = {}
        for column in columns:
            low, high = result.get(f"min({column})"), result.get(f"max({column})")
            if low is None or high is None:
                msg = f"Column {column} has no values to bin. Check the data used to fit the discretizer."
                raise ValueError(msg)
            count = self._bins[column] if isinstance(self._bins, dict) else self._bins
            stats[column] = _uniform_bin_edges(low, high, count, right=self._right)
        return stats


def _uniform_bin_edges(low: float, high: float, bins: int, *, right: bool) -> np.ndarray:
    """``bins + 1`` equal-width edges from ``low`` to ``high``, as pandas' ``cut`` makes them
    (Ray copied pandas 1.4.4): the range widened by 0.1% on the open side, or by 0.1% of the
    value on both sides when ``low == high``."""
    low, high = low + 0.0, high + 0.0
    if np.isinf(low) or np.isinf(high):
        msg = "Cannot specify integer `bins` when input data contains infinity."
        raise ValueError(msg)
    if low == high:
        low -= 0.001 * abs(low) if low != 0 else 0.001
        high += 0.001 * abs(high) if high != 0 else 0.001
        return np.linspace(low, high, bins + 1, endpoint=True)
    edges = np.linspace(low, high, bins + 1, endpoint=True)
    adjustment = (high - low) * 0.001
    if right:
        edges[0] -= adjustment
    else:
        edges[-1] += adjustment
    return edges

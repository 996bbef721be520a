"""``Dataset.summary()``: per-column statistics chosen by type, as Ray Data 2.60's
(``ray.data.stats``), with its names and shapes.

* numeric columns (integers, floats, decimals, booleans): ``count`` (every row, nulls too),
  ``mean``, ``min``, ``max``, ``std`` (population, ``ddof=0``), ``approx_quantile[0]`` (the
  median, by ``ApproximateQuantile``'s rule), ``missing_pct``, ``zero_pct``;
* temporal columns: ``count``, ``min``, ``max``, ``missing_pct``;
* null-typed columns: ``count``;
* everything else (strings, binaries, lists...): ``count``, ``missing_pct`` and
  ``approx_topk[0]`` ... ``approx_topk[9]``, the ten most frequent values as ``{column: value,
  "count": n}``.

The decomposable statistics of every column are one aggregation pass (partial states on the
map side); the medians one more pass over the numeric columns; each column's most frequent
values a ``groupby().count()`` and a top-k. The approximate statistics are exact here.
``override_dtype_agg_mapping`` (Ray's) replaces the statistics of the columns of a type:
``{DataType.int64(): lambda col: [Count(on=col), Sum(on=col)]}``; keys are Ray's ``DataType``
(``dataflow.datatype``), pyarrow types, or Ray's type category names (``"temporal"``...).
A list-valued statistic gives one row per item (``name[0]``, ``name[1]``...), as Ray's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from dataflow.aggregate import (
    AggregateFnV2,
    ApproximateQuantile,
    ApproximateTopK,
    Count,
    Max,
    Mean,
    Min,
    MissingValuePercentage,
    Std,
    ZeroPercentage,
    decomposable,
)
from engine.errors import ColumnNotFoundError

if TYPE_CHECKING:
    import pandas as pd

    from dataflow.dataset import Dataset

TOP_K = 10


def _numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t) or pa.types.is_boolean(t)


def numerical_aggregators(column: str) -> list[AggregateFnV2]:
    """Ray's statistics of a numeric column."""
    return [Count(column, ignore_nulls=False), Mean(column), Min(column), Max(column), Std(column, ddof=0),
            ApproximateQuantile(column, [0.5]), MissingValuePercentage(column), ZeroPercentage(column)]


def temporal_aggregators(column: str) -> list[AggregateFnV2]:
    """Ray's statistics of a temporal column."""
    return [Count(column, ignore_nulls=False), Min(column), Max(column), MissingValuePercentage(column)]


def basic_aggregators(column: str) -> list[AggregateFnV2]:
    """Ray's statistics of any other column."""
    return [Count(column, ignore_nulls=False), MissingValuePercentage(column), ApproximateTopK(column, k=TOP_K)]


def default_aggregators(column: str, t: pa.DataType) -> list[AggregateFnV2]:
    if pa.types.is_null(t):
        return [Count(column, ignore_nulls=False)]
    if _numeric(t):
        return numerical_aggregators(column)
    if pa.types.is_temporal(t):
        return temporal_aggregators(column)
    return basic_aggregators(column)


@dataclass
class DatasetSummary:
    """The statistics of each column: ``to_pandas()`` (one row per statistic, sorted, one
    column per dataset column) or ``get_column_stats(name)`` (``statistic`` and ``value``)."""

    dataset_schema: pa.Schema
    stats: dict[str, dict[str, Any]] = field(default_factory=dict)

    STATISTIC_COLUMN = "statistic"

    @property
    def columns(self) -> list[str]:
        """The columns summarized."""
        return list(self.stats)

    def _statistics(self) -> list[str]:
        return sorted({name for column_stats in self.stats.values() for name in column_stats})

    def to_pandas(self) -> pd.DataFrame:
        """Every statistic (sorted by name) of every column (sorted by name), as Ray's."""
        import pandas as pd

        names = self._statistics()
        frame: dict[str, list[Any]] = {self.STATISTIC_COLUMN: names}
        for column in sorted(self.stats):
            frame[column] = [self.stats[column].get(n) for n in names]
        return pd.DataFrame(frame)

    def get_column_stats(self, column: str) -> pd.DataFrame:
        """The statistics of ``column``: a ``statistic`` and a ``value`` column, as Ray's."""
        import pandas as pd

        if column not in self.stats:
            raise ValueError(f"Column '{column}' not found in summary tables (summarized: {self.columns})")
        names = self._statistics()
        return pd.DataFrame({self.STATISTIC_COLUMN: names, "value": [self.stats[column].get(n) for n in names]})

    def __repr__(self) -> str:
        return f"DatasetSummary(columns={self.columns})\n{self.to_pandas().to_string(index=False)}"


_CATEGORIES: dict[str, Callable[[pa.DataType], bool]] = {
    "list": pa.types.is_list,
    "large_list": pa.types.is_large_list,
    "struct": pa.types.is_struct,
    "map": pa.types.is_map,
    "tensor": lambda t: isinstance(t, pa.ExtensionType) and "tensor" in t.extension_name,
    "temporal": pa.types.is_temporal,
}
"""Ray's ``TypeCategory`` values, as keys of ``override_dtype_agg_mapping``."""


def _override(
    mapping: Mapping[Any, Callable[[str], list[AggregateFnV2]]] | None, name: str, t: pa.DataType
) -> list[AggregateFnV2] | None:
    """The aggregations ``mapping`` asks for column ``name`` of type ``t``, or None: a type key
    (Ray's ``DataType`` or a pyarrow type) matches that type exactly, a category name
    (``"temporal"``, ``"list"``...) every type of the category; the first match wins."""
    from dataflow.datatype import DataType

    for key, factory in (mapping or {}).items():
        category = getattr(key, "value", key)
        if isinstance(key, DataType) and key.is_arrow_type():
            matched = key.to_arrow_dtype() == t
        elif isinstance(key, DataType):
            matched = key.to_numpy_dtype() == DataType.from_arrow(t).to_numpy_dtype()
        elif isinstance(key, pa.DataType):
            matched = key == t
        elif isinstance(category, str) and category in _CATEGORIES:
            matched = _CATEGORIES[category](t)
        else:
            msg = (f"override_dtype_agg_mapping keys are DataType (DataType.int64()), pyarrow types (pa.int64()) "
                   f"or type categories ({', '.join(_CATEGORIES)}), got {key!r}")
            raise TypeError(msg)
        if matched:
            aggs = list(factory(name))
            if not all(isinstance(a, AggregateFnV2) for a in aggs):
                msg = f"override_dtype_agg_mapping[{key!r}]({name!r}) must return a list of aggregations"
                raise TypeError(msg)
            return aggs
    return None


def _stat_name(agg_name: str, column: str) -> str:
    """``sum`` for ``sum(v)``: the statistic's row in the summary table."""
    suffix = f"({column})"
    return agg_name[: -len(suffix)] if agg_name.endswith(suffix) else agg_name


def _entries(stat: str, value: Any) -> dict[str, Any]:
    """A list-valued statistic as one entry per item (``stat[0]``...), as Ray's summary."""
    if isinstance(value, list):
        return {f"{stat}[{i}]": item for i, item in enumerate(value)}
    return {stat: value}


def _top_values(ds: Dataset, column: str, agg: ApproximateTopK) -> list[dict[str, Any]]:
    """``agg``'s answer from a ``groupby().count()``: the column's distinct values are counted
    where they are, not gathered in one place."""
    counted = ds.select_columns([column]).groupby(column).count().sort("count()", descending=True).take(agg.k + 1)
    return [{column: r[column], "count": r["count()"]} for r in counted if r[column] is not None][: agg.k]


def summarize(
    ds: Dataset,
    columns: Sequence[str] | None,
    override_dtype_agg_mapping: Mapping[Any, Callable[[str], list[AggregateFnV2]]] | None = None,
) -> DatasetSummary:
    schema = ds.schema()
    arrow_schema: pa.Schema = getattr(schema, "base_schema", schema)
    if arrow_schema is None:
        return DatasetSummary(pa.schema([]))
    wanted = list(columns) if columns is not None else list(arrow_schema.names)
    missing = [name for name in wanted if name not in arrow_schema.names]
    if missing:
        raise ColumnNotFoundError(f"Columns {set(missing)} not found in dataset schema {arrow_schema.names}")
    plan: dict[str, list[AggregateFnV2]] = {}
    for name in wanted:
        t = arrow_schema.field(name).type
        overridden = _override(override_dtype_agg_mapping, name, t)
        plan[name] = overridden if overridden is not None else default_aggregators(name, t)
    # names unique across columns (a user's aggregation may not carry its column in its name)
    for name, aggs in plan.items():
        for agg in aggs:
            if not agg.name.endswith(f"({name})"):
                agg.name = f"{agg.name}({name})"
    values: dict[str, Any] = {}
    combined = [agg for aggs in plan.values() for agg in aggs if decomposable([agg])]
    if combined:
        values.update(ds.aggregate(*combined) or {})
    quantiles = [(n, a) for n, aggs in plan.items() for a in aggs if isinstance(a, ApproximateQuantile)]
    if quantiles:
        projected = ds.select_columns(sorted({n for n, _ in quantiles}))
        values.update(projected.aggregate(*(a for _, a in quantiles)) or {})
    for name, aggs in plan.items():
        for agg in aggs:
            if agg.name in values:
                continue
            if isinstance(agg, ApproximateTopK) and not agg.encode_lists:
                values[agg.name] = _top_values(ds, name, agg)
            else:  # a user's aggregation that needs whole groups: on that column alone
                values.update(ds.select_columns([name]).aggregate(agg) or {})
    summary = DatasetSummary(arrow_schema)
    for name, aggs in plan.items():
        column_stats: dict[str, Any] = {}
        for agg in aggs:
            column_stats.update(_entries(_stat_name(agg.name, name), values.get(agg.name)))
        summary.stats[name] = column_stats
    return summary

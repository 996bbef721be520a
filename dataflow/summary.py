"""``Dataset.summary()``: per-column statistics chosen by type, as Ray Data's.

Numeric columns (integers, floats, decimals, booleans): count, mean, min, max, std, median,
missing and zero percentages; strings and binaries: count, missing percentage and the ten most
frequent values; temporal columns: count, min, max, missing percentage; anything else: count and
missing percentage. The decomposable statistics of every column are one aggregation pass (partial
states on the map side); medians are one more pass over the numeric columns, and each string
column's top values a ``groupby().count()`` and a top-k. Values are exact, where Ray's median and
top values are approximate. ``override_dtype_agg_mapping`` (Ray's) replaces the statistics of
the columns whose type it names: ``{pa.int64(): lambda col: [Count(on=col), Sum(on=col)]}``; keys
are Arrow types (where Ray takes its ``DataType``) or Ray's type category names (``"temporal"``...).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from dataflow.aggregate import (
    AggregateFnV2,
    Count,
    Max,
    Mean,
    Min,
    MissingValuePercentage,
    Quantile,
    Std,
    ZeroPercentage,
)
from engine.errors import ColumnNotFoundError

if TYPE_CHECKING:
    import pandas as pd

    from dataflow.dataset import Dataset

TOP_K = 10


def _numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


def _temporal(t: pa.DataType) -> bool:
    return pa.types.is_temporal(t)


def _textual(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)


@dataclass
class DatasetSummary:
    """The statistics of each column: ``to_pandas()`` (one row per statistic, one column per
    dataset column) or ``get_column_stats(name)``."""

    dataset_schema: pa.Schema
    stats: dict[str, dict[str, Any]] = field(default_factory=dict)

    STATISTIC_COLUMN = "statistic"

    def get_column_stats(self, column: str) -> dict[str, Any]:
        if column not in self.stats:
            msg = f"no statistics for column {column!r}; summarized: {list(self.stats)}"
            raise KeyError(msg)
        return dict(self.stats[column])

    def to_pandas(self) -> pd.DataFrame:
        import pandas as pd

        names: list[str] = []
        for column_stats in self.stats.values():
            names += [n for n in column_stats if n not in names]
        frame = {self.STATISTIC_COLUMN: names}
        for column, column_stats in self.stats.items():
            frame[column] = [column_stats.get(n) for n in names]  # type: ignore[misc]
        return pd.DataFrame(frame)

    def __repr__(self) -> str:
        return f"DatasetSummary(columns={list(self.stats)})\n{self.to_pandas().to_string(index=False)}"


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
    """The aggregations ``mapping`` asks for column ``name`` of type ``t``, or None: an Arrow
    type key matches that type exactly, a category name (``"temporal"``, ``"list"``...) every
    type of the category; the first match wins."""
    for key, factory in (mapping or {}).items():
        category = getattr(key, "value", key)
        if isinstance(key, pa.DataType):
            matched = key == t
        elif isinstance(category, str) and category in _CATEGORIES:
            matched = _CATEGORIES[category](t)
        else:
            msg = (f"override_dtype_agg_mapping keys are pyarrow types (pa.int64()) or type categories "
                   f"({', '.join(_CATEGORIES)}), got {key!r}")
            raise TypeError(msg)
        if matched:
            aggs = list(factory(name))
            if not all(isinstance(a, AggregateFnV2) for a in aggs):
                msg = f"override_dtype_agg_mapping[{key!r}]({name!r}) must return a list of aggregations"
                raise TypeError(msg)
            return aggs
    return None


def _stat_name(agg: AggregateFnV2, column: str) -> str:
    """``sum`` for ``sum(v)``: the statistic's row in the summary table."""
    suffix = f"({column})"
    return agg.name[: -len(suffix)] if agg.name.endswith(suffix) else agg.name


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
    for name in wanted:
        if name not in arrow_schema.names:
            msg = f"column {name!r} not found; the dataset has {arrow_schema.names}"
            raise ColumnNotFoundError(msg)
    aggs: list[AggregateFnV2] = []
    plan: dict[str, list[tuple[str, str]]] = {}
    custom: set[str] = set()
    """Columns whose statistics ``override_dtype_agg_mapping`` chose: no median or top values."""
    for name in wanted:
        t = arrow_schema.field(name).type

        def add(stat: str, agg: AggregateFnV2, name: str = name) -> None:
            agg.name = f"{stat}({name})"
            aggs.append(agg)
            plan.setdefault(name, []).append((stat, agg.name))

        overridden = _override(override_dtype_agg_mapping, name, t)
        if overridden is not None:
            custom.add(name)
            for agg in overridden:
                add(_stat_name(agg, name), agg)
            continue
        add("count", Count(name, ignore_nulls=True))
        if _numeric(t) or pa.types.is_boolean(t):
            add("mean", Mean(name))
            add("min", Min(name))
            add("max", Max(name))
            if not pa.types.is_boolean(t):
                add("std", Std(name))
        elif _temporal(t):
            add("min", Min(name))
            add("max", Max(name))
        add("missing_pct", MissingValuePercentage(name))
        if _numeric(t):
            add("zero_pct", ZeroPercentage(name))
    summary = DatasetSummary(arrow_schema)
    values = ds.aggregate(*aggs) or {}
    for name in wanted:
        summary.stats[name] = {stat: values.get(agg_name) for stat, agg_name in plan.get(name, [])}
    numeric = [n for n in wanted if _numeric(arrow_schema.field(n).type) and n not in custom]
    if numeric:
        medians = ds.select_columns(numeric).aggregate(*(Quantile(n, q=0.5) for n in numeric)) or {}
        for n in numeric:
            summary.stats[n]["median"] = medians.get(f"quantile({n})")
    for name in wanted:
        if _textual(arrow_schema.field(name).type) and name not in custom:
            top = ds.select_columns([name]).groupby(name).count().sort("count()", descending=True).take(TOP_K + 1)
            summary.stats[name][f"top_{TOP_K}"] = [(r[name], r["count()"]) for r in top if r[name] is not None][:TOP_K]
    return summary

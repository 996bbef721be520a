"""Statistics the preprocessors fit that the engine has no built-in aggregation for.

``ValueCounts`` counts each value of a column, list elements one by one or whole lists as
values, and nulls under ``None``, so that an encoder learns its categories and an imputer its
most frequent value in the same single ``Dataset.aggregate`` pass as any other statistic.
``category_index`` turns counts into Ray's ``{value: index}`` map (sorted, top-k, no nulls).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from dataflow.aggregate import AggregateFnV2

if TYPE_CHECKING:
    from dataflow.dataset import Dataset


class ValueCounts(AggregateFnV2):
    """How many times each value of ``on`` appears, as ``{"values": [...], "counts": [...]}``
    (a null counted under None). ``explode_lists``: a list column's elements are the values;
    otherwise a whole list is one value (a tuple)."""

    def __init__(self, on: str, *, explode_lists: bool, alias_name: str | None = None) -> None:
        super().__init__(alias_name or f"value_counts({on})", dict, on=on, ignore_nulls=False)
        self.explode_lists = explode_lists

    def aggregate_block(self, block: pa.Table) -> dict[Any, int]:
        values = block.column(self.on)
        is_list = pa.types.is_list(values.type) or pa.types.is_large_list(values.type)
        if is_list and not self.explode_lists:
            return dict(Counter(tuple(v) if v is not None else None for v in values.to_pylist()))
        if is_list:
            values = pc.list_flatten(values)
        counted = pc.value_counts(values)
        return dict(zip(counted.field("values").to_pylist(), counted.field("counts").to_pylist(), strict=True))

    def combine(self, current_accumulator: dict[Any, int], new: dict[Any, int]) -> dict[Any, int]:
        merged = Counter(current_accumulator)
        merged.update(new)
        return dict(merged)

    def finalize(self, accumulator: dict[Any, int]) -> Any:
        values = list(accumulator)
        return {"values": [list(v) if isinstance(v, tuple) else v for v in values], "counts": list(accumulator.values())}


def value_counts(result: dict[str, Any], name: str) -> Counter:
    """The ``Counter`` of one ``ValueCounts`` result (lists back as tuples, NaN as None)."""
    found = result[name] or {"values": [], "counts": []}
    counter: Counter = Counter()
    for value, count in zip(found["values"], found["counts"], strict=True):
        key = tuple(value) if isinstance(value, list) else value
        counter[None if key != key else key] += count  # NaN != NaN: a null
    return counter


def category_index(counts: Counter, max_categories: int | None = None, *, drop_nulls: bool = False) -> dict[Any, int]:
    """Ray's encoding map: the (top ``max_categories`` most frequent) values sorted, each to its
    position. A null among the values is an error unless ``drop_nulls``, as Ray's."""
    if None in counts and not drop_nulls:
        msg = "Unable to fit column because it contains null values. Consider imputing missing values first."
        raise ValueError(msg)
    kept = Counter({v: c for v, c in counts.items() if v is not None})
    chosen = [v for v, _ in kept.most_common(max_categories)] if max_categories is not None else list(kept)
    return {value: i for i, value in enumerate(sorted(chosen))}


def fit_value_counts(ds: Dataset, columns: list[str], *, explode_lists: bool) -> dict[str, Counter]:
    """Each column's value counts, all in one aggregation pass."""
    aggs = [ValueCounts(c, explode_lists=explode_lists) for c in columns]
    result = ds.aggregate(*aggs) or {}
    return {c: value_counts(result, agg.name) for c, agg in zip(columns, aggs, strict=True)}

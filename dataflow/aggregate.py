"""Aggregations with Ray Data's names and semantics (``ray.data.aggregate``).

Built-ins (``Count``, ``Sum``, ``Min``, ``Max``, ``Mean``, ``Std``, ``AbsMax``) are
decomposable: each map task reduces its rows to partial states per group with Arrow's hash
aggregation, so only one row per group and block crosses the exchange, and reducers combine the
states and finish them. A map task whose keys are mostly distinct (``mostly_distinct``) sends
its rows instead, which the reduce side groups itself. The rest (``Quantile``, ``Unique``,
``AsList``, ``CountDistinct``, ``ValueCounter``, ``ApproximateQuantile`` and ``ApproximateTopK``
(exact here: no sketch library needed), a user's ``AggregateFnV2`` or ``AggregateFn``) see whole
groups: rows are partitioned by key and each group is aggregated where it lands. Output columns
are named as Ray names them (``count()``, ``sum(v)``, ``mean(v)``...), or ``alias_name``. Nulls
are skipped unless ``ignore_nulls=False``, which makes a group with a null aggregate to null, as
in Ray.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from engine.errors import ColumnNotFoundError
from engine.exchange import concat, grouped_rows
from engine.transform import USER_ERRORS, UDFFailure, udf_name

if TYPE_CHECKING:
    import pyarrow.compute as pc
else:
    from dataflow.lazy_compute import pc


class AggregateFnV2:
    """A user-defined aggregation, as Ray's: ``aggregate_block`` turns one group's rows (a
    pyarrow Table) into an accumulator, ``combine`` merges two, ``finalize`` gives the value."""

    def __init__(self, name: str, zero_factory: Callable[[], Any], *, on: str | None, ignore_nulls: bool) -> None:
        self.name = name
        self.zero_factory = zero_factory
        self.on = on
        self.ignore_nulls = ignore_nulls

    def get_target_column(self) -> str | None:
        return self.on

    def get_agg_name(self) -> str:
        """Its output column's name (Ray's)."""
        return self.name

    @property
    def _ignore_nulls(self) -> bool:  # (Ray's attribute, which code copied from its built-ins reads)
        return self.ignore_nulls

    @property
    def _target_col_name(self) -> str | None:  # (Ray's attribute, which its guide's examples read)
        return self.on

    def aggregate_block(self, block: pa.Table) -> Any:
        raise NotImplementedError

    def combine(self, current_accumulator: Any, new: Any) -> Any:
        raise NotImplementedError

    def finalize(self, accumulator: Any) -> Any:
        return accumulator

    # how dataflow runs it ---------------------------------------------------------------------
    partial_kind: str | None = None
    """For built-ins: the Arrow aggregation whose states combine (see ``_PARTIALS``)."""

    def columns(self) -> list[str] | None:
        """Columns it reads (None: all of them)."""
        return [self.on] if self.on is not None else []

    def of_group(self, group: pa.Table) -> Any:
        """The finished value for one whole group, with Ray's null rules around the user's
        methods: with ``ignore_nulls`` an accumulator that is None (or NaN) means "nothing
        yet" (the zero is None, and ``combine`` never sees one); without, it means "a null was
        seen" and is the result. A null accumulator is not finalized."""
        from dataflow._internal.util import is_null

        new = self.aggregate_block(group)
        if self.ignore_nulls:
            acc = None if is_null(new) else self.combine(self.zero_factory(), new)
        else:
            zero = self.zero_factory()
            acc = new if is_null(new) else zero if is_null(zero) else self.combine(zero, new)
        return acc if is_null(acc) else self.finalize(acc)


class AggregateFn(AggregateFnV2):
    """Ray's first aggregation interface: ``init(key)``, ``accumulate_row(acc, row)`` or
    ``accumulate_block(acc, block)``, ``merge(a, b)``, ``finalize(acc)``."""

    def __init__(
        self,
        init: Callable[[Any], Any],
        merge: Callable[[Any, Any], Any],
        accumulate_row: Callable[[Any, dict[str, Any]], Any] | None = None,
        accumulate_block: Callable[[Any, pa.Table], Any] | None = None,
        finalize: Callable[[Any], Any] | None = None,
        name: str | None = None,
    ) -> None:
        if (accumulate_row is None) == (accumulate_block is None):
            msg = "AggregateFn needs exactly one of accumulate_row and accumulate_block"
            raise ValueError(msg)
        super().__init__(name or udf_name(accumulate_row or accumulate_block), lambda: None, on=None, ignore_nulls=False)
        self.init, self.merge = init, merge
        self.accumulate_row, self.accumulate_block = accumulate_row, accumulate_block
        self._finalize = finalize

    def columns(self) -> list[str] | None:
        return None

    def of_group_keyed(self, group: pa.Table, key: Any) -> Any:
        acc = self.init(key)
        if self.accumulate_block is not None:
            acc = self.accumulate_block(acc, group)
        else:
            assert self.accumulate_row is not None
            for row in group.to_pylist():
                acc = self.accumulate_row(acc, row)
        return self._finalize(acc) if self._finalize is not None else acc


def _default_name(kind: str, on: str | None, alias_name: str | None) -> str:
    return alias_name or f"{kind}({on or ''})"


def nan_as_null(values: pa.ChunkedArray) -> pa.ChunkedArray:
    """A float column's NaNs as nulls: "Ray Data considers np.nan, None, and pd.NaT to be null
    values" (its aggregations' docs), so ``ignore_nulls=True`` skips them. Ray 2.60 itself skips
    a NaN or not depending on which block holds it; here the rule holds whatever the blocks."""
    if not pa.types.is_floating(values.type):
        return values
    return pc.if_else(pc.is_nan(values), pa.scalar(None, values.type), values)


class _BuiltIn(AggregateFnV2):
    kind = ""
    skips_nan = False
    """With ``ignore_nulls``, NaN is skipped as null (sum, min, max, abs max, mean, std): Arrow's
    min and max skip NaN too, but give NaN where a group has nothing else, and Ray's docs make
    that group's answer None, as for a group of nulls."""
    needs_on = False
    """Ray's block accessor refuses a column of None for it (sum, min, max, abs max, mean, std)."""

    def __init__(self, on: str | None = None, ignore_nulls: bool = True, alias_name: str | None = None) -> None:
        super().__init__(_default_name(self.kind, on, alias_name), lambda: None, on=on, ignore_nulls=ignore_nulls)

    def _values(self, block: pa.Table) -> pa.ChunkedArray:
        assert self.on is not None
        return block.column(self.on)

    def of_group(self, group: pa.Table) -> Any:
        values = self._values(group)
        if not self.ignore_nulls and values.null_count:
            return None
        if self.ignore_nulls and self.skips_nan:
            values = nan_as_null(values)
        return self._value(values.drop_null())

    def _value(self, values: pa.ChunkedArray) -> Any:
        raise NotImplementedError

    def aggregate_block(self, block: pa.Table) -> Any:
        return self.of_group(block)


class Count(_BuiltIn):
    kind = "count"
    partial_kind = "count"

    def __init__(self, on: str | None = None, ignore_nulls: bool = False, alias_name: str | None = None) -> None:
        super().__init__(on, ignore_nulls, alias_name)

    def of_group(self, group: pa.Table) -> Any:
        if self.on is None or not self.ignore_nulls:
            return group.num_rows
        return len(group.column(self.on)) - group.column(self.on).null_count


class Sum(_BuiltIn):
    kind = "sum"
    needs_on = True
    partial_kind = "sum"
    skips_nan = True

    def _value(self, values: pa.ChunkedArray) -> Any:
        return pc.sum(values).as_py() if len(values) else None


class Min(_BuiltIn):
    kind = "min"
    needs_on = True
    partial_kind = "min"
    skips_nan = True

    def _value(self, values: pa.ChunkedArray) -> Any:
        return pc.min(values).as_py() if len(values) else None


class Max(_BuiltIn):
    kind = "max"
    needs_on = True
    partial_kind = "max"
    skips_nan = True

    def _value(self, values: pa.ChunkedArray) -> Any:
        return pc.max(values).as_py() if len(values) else None


class AbsMax(_BuiltIn):
    kind = "abs_max"
    needs_on = True
    partial_kind = "abs_max"
    skips_nan = True

    def _value(self, values: pa.ChunkedArray) -> Any:
        return pc.max(pc.abs(values)).as_py() if len(values) else None


class Mean(_BuiltIn):
    kind = "mean"
    needs_on = True
    partial_kind = "mean"
    skips_nan = True

    def _value(self, values: pa.ChunkedArray) -> Any:
        return pc.mean(values).as_py() if len(values) else None


class Std(_BuiltIn):
    kind = "std"
    needs_on = True
    partial_kind = "std"
    skips_nan = True

    def __init__(self, on: str | None = None, ddof: int = 1, ignore_nulls: bool = True, alias_name: str | None = None) -> None:
        super().__init__(on, ignore_nulls, alias_name)
        self.ddof = ddof

    def _value(self, values: pa.ChunkedArray) -> Any:
        if len(values) - self.ddof <= 0:  # undefined: NaN, as Ray, pandas and numpy (none: null)
            return None if len(values) == 0 else math.nan
        return pc.stddev(values, ddof=self.ddof).as_py()


class MissingValuePercentage(_BuiltIn):
    """The percentage of missing values in a column: nulls and NaNs, as Ray counts them."""

    kind = "missing_pct"
    partial_kind = "missing_pct"

    def __init__(self, on: str, alias_name: str | None = None) -> None:
        super().__init__(on, False, alias_name)

    def of_group(self, group: pa.Table) -> Any:
        values = nan_as_null(self._values(group))
        return 100.0 * values.null_count / len(values) if len(values) else None


class ZeroPercentage(_BuiltIn):
    """The percentage of zeros among a numeric column's values: of the non-null ones, or with
    ``ignore_nulls=False`` of all of them (a null is then a value that is not zero), as Ray's."""

    kind = "zero_pct"
    partial_kind = "zero_pct"

    def __init__(self, on: str, ignore_nulls: bool = True, alias_name: str | None = None) -> None:
        super().__init__(on, ignore_nulls, alias_name)

    def of_group(self, group: pa.Table) -> Any:
        values = self._values(group)
        whole = len(values) - (values.null_count if self.ignore_nulls else 0)
        return 100.0 * (pc.sum(pc.equal(values, 0)).as_py() or 0) / whole if whole else None


class Quantile(_BuiltIn):
    kind = "quantile"

    def __init__(self, on: str | None = None, q: float = 0.5, ignore_nulls: bool = True, alias_name: str | None = None) -> None:
        super().__init__(on, ignore_nulls, alias_name)
        self.q = q

    def _value(self, values: pa.ChunkedArray) -> Any:
        if not len(values):
            return None
        ordered = sorted(values.to_pylist())
        index = (len(ordered) - 1) * self.q  # Ray: linear interpolation between the neighbours
        lo, hi = math.floor(index), math.ceil(index)
        if lo == hi:
            return ordered[int(index)]
        return round(ordered[lo] * (hi - index) + ordered[hi] * (index - lo), 5)  # (Ray rounds the interpolation)


class _Collects(_BuiltIn):
    """An aggregation of the values themselves: with ``ignore_nulls=False`` a null is one of
    them (as in Ray), not what makes the whole group null."""

    def of_group(self, group: pa.Table) -> Any:
        values = self._values(group)
        return self._value(values.drop_null() if self.ignore_nulls else values)


class Unique(_Collects):
    """The distinct values, in the order they first appear; nulls among them unless
    ``ignore_nulls=True`` (Ray's default keeps them). Lists are values too; with
    ``encode_lists=True`` (Ray's ``ListEncodingMode.FLATTEN``) a list column's elements are."""

    kind = "unique"

    class ListEncodingMode(enum.StrEnum):
        FLATTEN = "FLATTEN"
        HASH = "HASH"

    def __init__(self, on: str | None = None, ignore_nulls: bool = False, alias_name: str | None = None,
                 encode_lists: bool | Unique.ListEncodingMode | None = None) -> None:
        super().__init__(on, ignore_nulls, alias_name)
        if encode_lists == Unique.ListEncodingMode.HASH:
            msg = ("Unique(encode_lists=ListEncodingMode.HASH) gives Ray's own hashes of the lists, which dataflow "
                   "does not reproduce: use encode_lists=False (the lists themselves) or True (their elements)")
            raise NotImplementedError(msg)
        self.flatten = bool(encode_lists)

    def _values(self, block: pa.Table) -> pa.ChunkedArray:
        values = super()._values(block)
        return pc.list_flatten(values) if self.flatten and _is_list(values.type) else values

    def _value(self, values: pa.ChunkedArray) -> Any:
        return distinct(values)


class AsList(_Collects):
    kind = "list"

    def __init__(self, on: str | None = None, ignore_nulls: bool = False, alias_name: str | None = None) -> None:
        super().__init__(on, ignore_nulls, alias_name)

    def _value(self, values: pa.ChunkedArray) -> Any:
        return values.to_pylist()


class CountDistinct(Unique):
    """How many distinct values; a null counts as one with ``ignore_nulls=False``."""

    kind = "count_distinct"

    def __init__(self, on: str | None = None, ignore_nulls: bool = True, alias_name: str | None = None) -> None:
        super().__init__(on, ignore_nulls, alias_name)

    def _value(self, values: pa.ChunkedArray) -> Any:
        return len(distinct(values))


def _is_list(dtype: pa.DataType) -> bool:
    return pa.types.is_list(dtype) or pa.types.is_large_list(dtype) or pa.types.is_fixed_size_list(dtype)


def value_counts(values: pa.ChunkedArray | pa.Array) -> tuple[list[Any], list[int]]:
    """Each distinct value (null among them) and how many times it appears, in the order they
    first appear: Arrow's ``value_counts``, or the same through Python for values it has no
    kernel for (lists, structs, maps)."""
    try:
        counted = pc.value_counts(values)
        return counted.field("values").to_pylist(), counted.field("counts").to_pylist()
    except pa.ArrowNotImplementedError:
        firsts: dict[Any, Any] = {}
        counts: dict[Any, int] = {}
        for value in values.to_pylist():
            key = _hashable(value)
            firsts.setdefault(key, value)
            counts[key] = counts.get(key, 0) + 1
        return list(firsts.values()), list(counts.values())


def distinct(values: pa.ChunkedArray | pa.Array) -> list[Any]:
    """The distinct values in the order they first appear (lists, structs and maps too)."""
    return value_counts(values)[0]


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return ("list", tuple(_hashable(v) for v in value))
    if isinstance(value, tuple):
        return ("tuple", tuple(_hashable(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _hashable(v)) for k, v in value.items()))
    return value


class ValueCounter(_BuiltIn):
    """Ray's ``ValueCounter``: how many times each value appears, as ``{"values": [...],
    "counts": [...]}`` in the order values first appear (null among them, as in Ray)."""

    kind = "value_counter"

    def __init__(self, on: str, alias_name: str | None = None) -> None:
        super().__init__(on, True, alias_name)

    def of_group(self, group: pa.Table) -> Any:
        items, counts = value_counts(self._values(group))
        return {"values": items, "counts": counts}


class ApproximateQuantile(_BuiltIn):
    """Ray's ``ApproximateQuantile``: the value at each rank of ``quantiles``, as its KLL
    sketch answers with every value kept: the ``floor(q * n)``-th smallest of the ``n`` values
    (0-based, the last for ``q = 1``), so ``[20, 40, 60, 80, 100]`` gives 20, 60 and 100 at
    0.1, 0.5 and 0.9, and ``[50000, 60000]`` 60000 at 0.5, as Ray's documented results. Computed
    exactly here from the group's values, which is within any sketch's error; the group's
    values are held to do it (``quantile_precision`` is taken and has nothing to tune)."""

    kind = "approx_quantile"

    def __init__(self, on: str, quantiles: list[float], quantile_precision: int = 800, alias_name: str | None = None) -> None:
        if not quantiles or not all(isinstance(q, (int, float)) and 0 <= q <= 1 for q in quantiles):
            raise ValueError(f"quantiles must be a non-empty list of numbers in [0, 1], got {quantiles!r}")
        super().__init__(on, True, alias_name)
        self.quantiles, self.quantile_precision = list(quantiles), quantile_precision

    def _value(self, values: pa.ChunkedArray) -> Any:
        if not len(values):
            return None
        ordered = np.sort(nan_as_null(values).drop_null().to_numpy().astype(np.float64))
        if not len(ordered):
            return None
        n = len(ordered)
        return [float(ordered[min(n - 1, math.floor(q * n))]) for q in self.quantiles]


class ApproximateTopK(_BuiltIn):
    """Ray's ``ApproximateTopK``: the ``k`` most frequent values as ``[{on: value, "count":
    n}, ...]``, most frequent first (ties in the order values first appear). Counted exactly
    here, within any sketch's error (``log_capacity`` is taken and has nothing to tune).
    ``encode_lists=True`` counts a list column's items instead of whole lists."""

    kind = "approx_topk"

    def __init__(self, on: str, k: int, log_capacity: int = 15, alias_name: str | None = None,
                 encode_lists: bool = False) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
            raise ValueError(f"k must be a positive int, got {k!r}")
        super().__init__(on, True, alias_name)
        self.k, self.log_capacity, self.encode_lists = k, log_capacity, encode_lists

    def _value(self, values: pa.ChunkedArray) -> Any:
        if self.encode_lists and (pa.types.is_list(values.type) or pa.types.is_large_list(values.type)):
            values = pc.list_flatten(values).drop_null()
        items, counts = value_counts(values)
        top = np.argsort(-np.asarray(counts, dtype=np.int64), kind="stable")[: self.k]
        assert self.on is not None
        return [{self.on: items[i], "count": int(counts[i])} for i in top]


VectorizedAggregateFnV2 = AggregateFnV2
"""Ray's base class for aggregations whose ``aggregate_block`` works on a whole block at once:
the same interface as ``AggregateFnV2`` (every aggregation here gets whole blocks)."""


# partial aggregation of the built-ins ------------------------------------------------------
def _skip(agg: AggregateFnV2) -> pc.ScalarAggregateOptions:
    return pc.ScalarAggregateOptions(skip_nulls=agg.ignore_nulls, min_count=1)


def _partial_specs(i: int, agg: AggregateFnV2, on: str | None) -> list[tuple[Any, str, Any, str]]:
    """(column, arrow aggregation, options, state name) computing ``agg``'s states from rows of
    column ``on`` (``agg.on``, or its NaNs as nulls)."""
    kind = agg.partial_kind
    if kind == "count":
        if on is None or not agg.ignore_nulls:
            return [([], "count_all", None, f"s{i}")]
        return [(on, "count", pc.CountOptions(mode="only_valid"), f"s{i}")]
    if kind in ("sum", "min", "max"):
        return [(on, kind, _skip(agg), f"s{i}")]
    if kind == "abs_max":
        return [(f"__abs{i}", "max", _skip(agg), f"s{i}")]
    if kind == "missing_pct":
        return [([], "count_all", None, f"s{i}_all"), (on, "count", pc.CountOptions(mode="only_null"), f"s{i}_part")]
    if kind == "zero_pct":
        whole = (on, "count", pc.CountOptions(mode="only_valid"), f"s{i}_all") if agg.ignore_nulls else ([], "count_all", None, f"s{i}_all")
        return [whole, (f"__zero{i}", "sum", None, f"s{i}_part")]
    if kind in ("mean", "std"):
        specs = [
            (on, "sum", _skip(agg), f"s{i}_sum"),
            (on, "count", pc.CountOptions(mode="only_valid"), f"s{i}_n"),
        ]
        if kind == "std":
            specs.append((on, "variance", pc.VarianceOptions(ddof=0, skip_nulls=agg.ignore_nulls, min_count=1), f"s{i}_var"))
        return specs
    msg = f"{agg.name} has no partial aggregation"
    raise TypeError(msg)


def _prepared(table: pa.Table, aggs: Sequence[AggregateFnV2]) -> tuple[pa.Table, list[Any]]:
    """``table`` with the derived columns the aggregations' states read (NaN as null, booleans as
    numbers, absolute values, zero flags) and the column each aggregation reads."""
    columns_of: list[Any] = [agg.on for agg in aggs]
    for i, agg in enumerate(aggs):
        if getattr(agg, "skips_nan", False) and agg.ignore_nulls and pa.types.is_floating(table.schema.field(agg.on).type):
            table = table.append_column(f"__nonan{i}", nan_as_null(table.column(agg.on)))
            columns_of[i] = f"__nonan{i}"
        if (agg.partial_kind in ("sum", "mean", "std", "zero_pct") and agg.on is not None
                and pa.types.is_boolean(table.schema.field(agg.on).type)):  # True is 1, as numpy and pandas count it
            table = table.append_column(f"__num{i}", pc.cast(table.column(agg.on), pa.int64()))
            columns_of[i] = f"__num{i}"
        if agg.partial_kind == "missing_pct" and pa.types.is_floating(table.schema.field(agg.on).type):
            table = table.append_column(f"__nonan{i}", nan_as_null(table.column(agg.on)))  # a NaN is missing too
            columns_of[i] = f"__nonan{i}"
        if agg.partial_kind in ("mean", "std") and pa.types.is_null(table.schema.field(agg.on).type):
            # a column of nothing but nulls typed null (from rows): Arrow has no variance of it
            table = table.append_column(f"__num{i}", table.column(agg.on).cast(pa.float64()))
            columns_of[i] = f"__num{i}"
        if agg.partial_kind == "abs_max":
            table = table.append_column(f"__abs{i}", pc.abs(table.column(columns_of[i])))  # (NaN as null)
        if agg.partial_kind == "zero_pct":
            table = table.append_column(f"__zero{i}", pc.cast(pc.equal(table.column(columns_of[i]), 0), pa.int64()))
    return table, columns_of


def partial_states(table: pa.Table, keys: Sequence[str], aggs: Sequence[AggregateFnV2]) -> pa.Table:
    """One row per group of ``table`` with every aggregation's states (the map side)."""
    _check_columns(table, keys, aggs)
    table, columns_of = _prepared(table, aggs)
    specs = [spec for i, agg in enumerate(aggs) for spec in _partial_specs(i, agg, columns_of[i])]
    grouped = table.group_by(list(keys), use_threads=False).aggregate(
        [(column, func, opts) if opts is not None else (column, func) for column, func, opts, _ in specs]
    )
    # the keys first, then the aggregations in order (by position: names may repeat, "v_sum")
    columns = {k: grouped.column(k) for k in keys}
    for j, (*_, state) in enumerate(specs):
        columns[state] = grouped.column(len(keys) + j)
    return pa.table(columns)


def row_states(table: pa.Table, keys: Sequence[str], aggs: Sequence[AggregateFnV2]) -> pa.Table:
    """``partial_states`` of every row as a group of its own: the same columns and types, one
    row per input row, computed without grouping (a state of one row is its value, a count of
    one is 1 or 0, a variance 0). A pushed merge makes the rows a map task sent (its keys
    mostly distinct, so it did not group them) states this way, to merge them with others'."""
    schema = partial_states(table.slice(0, 0), keys, aggs).schema  # the types, and any error, of the grouped path
    table, columns_of = _prepared(table, aggs)
    columns: dict[str, Any] = {k: table.column(k) for k in keys}
    for i, agg in enumerate(aggs):
        for column, func, opts, state in _partial_specs(i, agg, columns_of[i]):
            columns[state] = _one_row_state(table, column, func, opts)
    return pa.table(columns).cast(schema)


def _one_row_state(table: pa.Table, column: Any, func: str, opts: Any) -> Any:
    """The state ``func`` (a hash aggregation of ``_partial_specs``) gives a group of one row."""
    if func == "count_all":
        return pa.array(np.ones(table.num_rows, dtype=np.int64))
    values = table.column(column)
    if func == "count":
        return pc.cast(pc.is_null(values) if opts == pc.CountOptions(mode="only_null") else pc.is_valid(values), pa.int64())
    if func == "variance":
        return pc.if_else(pc.is_valid(values), 0.0, pa.scalar(None, pa.float64()))
    return values  # sum, min, max of one value: the value (null if it is null)


MOSTLY_DISTINCT = 2 / 3
"""Map-side grouping is skipped when a block's effective number of keys (``mostly_distinct``)
is at least this fraction of its rows: for keys drawn evenly, grouping would then shrink the
block by about a fifth at most, less than it costs."""
_KEY_SAMPLE = 8192


def mostly_distinct(hashes: np.ndarray) -> bool:
    """Whether the keys (as 64-bit hashes) are mostly distinct, estimated from the repeated keys
    in a sample of 8,192 rows drawn with replacement (fixed seed): ``C(k, 2) / pairs`` is the
    inverse Simpson index of the sample, the effective number of keys (heavy keys count for
    more, so a skewed block is still grouped on the map side); exact on blocks no bigger than
    the sample."""
    n = len(hashes)
    if n <= _KEY_SAMPLE:  # exactly: n ** 2 / sum(count ** 2) keys
        _, counts = np.unique(hashes, return_counts=True)
        return n > 0 and n >= MOSTLY_DISTINCT * int((counts * counts).sum())
    sample = hashes[np.random.default_rng(n).integers(0, n, _KEY_SAMPLE)]
    _, counts = np.unique(sample, return_counts=True)
    pairs = int((counts * (counts - 1) // 2).sum())
    return _KEY_SAMPLE * (_KEY_SAMPLE - 1) // 2 >= MOSTLY_DISTINCT * n * pairs


def _state_skip(agg: AggregateFnV2) -> pc.ScalarAggregateOptions:
    return pc.ScalarAggregateOptions(skip_nulls=agg.ignore_nulls or agg.partial_kind == "count", min_count=1)


def _state_merges(i: int, agg: AggregateFnV2) -> list[tuple[str, str, Any]]:
    """(state column, arrow aggregation, options) merging ``agg``'s states of several parts:
    counts and sums add, minima and maxima take theirs (a std's variance aside)."""
    kind, skip = agg.partial_kind, _state_skip(agg)
    if kind == "count":
        return [(f"s{i}", "sum", skip)]
    if kind in ("sum", "min", "max", "abs_max"):
        return [(f"s{i}", {"abs_max": "max"}.get(kind or "", kind or ""), skip)]
    if kind in ("missing_pct", "zero_pct"):  # counts: a null part (one null row's) counts nothing
        counts = pc.ScalarAggregateOptions(skip_nulls=True, min_count=1)
        return [(f"s{i}_all", "sum", counts), (f"s{i}_part", "sum", counts)]
    return [(f"s{i}_sum", "sum", skip), (f"s{i}_n", "sum", skip)]


def combine_states(table: pa.Table, keys: Sequence[str], aggs: Sequence[AggregateFnV2]) -> pa.Table:
    """The finished aggregations from partial states (the reduce side): the states merged per
    group (``merge_states``), then each aggregation's value from its merged states."""
    return finish_states(merge_states(table, keys, aggs), keys, aggs)


def finish_states(merged: pa.Table, keys: Sequence[str], aggs: Sequence[AggregateFnV2]) -> pa.Table:
    """Each aggregation's value from states with one row per group."""
    columns = {k: merged.column(k) for k in keys}
    null = pa.scalar(None, pa.float64())
    for i, agg in enumerate(aggs):
        kind = agg.partial_kind
        if kind in ("count", "sum", "min", "max", "abs_max"):
            value = merged.column(f"s{i}")
            if kind == "count":
                value = pc.fill_null(value, 0)
        elif kind in ("missing_pct", "zero_pct"):
            whole = pc.cast(merged.column(f"s{i}_all"), pa.float64())
            part = pc.cast(pc.fill_null(merged.column(f"s{i}_part"), 0), pa.float64())
            value = pc.if_else(pc.greater(whole, 0), pc.multiply(pc.divide(part, whole), 100.0), null)
        else:
            n = pc.cast(merged.column(f"s{i}_n"), pa.float64())
            if kind == "mean":
                total = pc.cast(merged.column(f"s{i}_sum"), pa.float64())
                value = pc.if_else(pc.greater(n, 0), pc.divide(total, n), null)
            else:  # the pooled population variance, made a sample one (ddof)
                assert isinstance(agg, Std)
                var = pc.divide(pc.multiply(merged.column(f"s{i}_var"), n), pc.subtract(n, agg.ddof))
                value = pc.if_else(pc.greater(n, agg.ddof), pc.sqrt(var), pc.if_else(pc.greater(n, 0), math.nan, null))
        columns[agg.name] = value
    return pa.table(columns)


def merge_states(table: pa.Table, keys: Sequence[str], aggs: Sequence[AggregateFnV2]) -> pa.Table:
    """Partial states of several map tasks merged per group into states of the same columns
    (an exchange's pushed merge): counts and sums add, minima and maxima take theirs, and a
    standard deviation's population variances pool (Chan et al.) from each part's size and mean."""
    specs: list[tuple[str, str, Any]] = []
    derived: dict[str, pa.ChunkedArray] = {}
    for i, agg in enumerate(aggs):
        specs += _state_merges(i, agg)
        if agg.partial_kind == "std":  # n * var (the part's squared deviations) and sum^2 / n (n * mean^2)
            skip = _state_skip(agg)
            n = pc.cast(table.column(f"s{i}_n"), pa.float64())
            total = pc.cast(table.column(f"s{i}_sum"), pa.float64())
            derived[f"__m2_{i}"] = pc.fill_null(pc.multiply(table.column(f"s{i}_var"), n), 0.0)
            derived[f"__sq_{i}"] = pc.fill_null(pc.if_else(pc.greater(n, 0), pc.divide(pc.multiply(total, total), n), 0.0), 0.0)
            specs += [(f"__m2_{i}", "sum", skip), (f"__sq_{i}", "sum", skip)]
    for name, column in derived.items():
        table = table.append_column(name, column)
    grouped = table.group_by(list(keys), use_threads=False).aggregate(specs)
    columns = {k: grouped.column(k) for k in keys}
    for column, func, _ in specs:
        if not column.startswith("__"):
            columns[column] = grouped.column(f"{column}_{func}")
    for i, agg in enumerate(aggs):
        if agg.partial_kind == "std":
            n = pc.cast(columns[f"s{i}_n"], pa.float64())
            total = pc.cast(columns[f"s{i}_sum"], pa.float64())
            squares = pc.add(grouped.column(f"__m2_{i}_sum"), grouped.column(f"__sq_{i}_sum"))
            m2 = pc.subtract(squares, pc.if_else(pc.greater(n, 0), pc.divide(pc.multiply(total, total), n), 0.0))
            # (rounding can make m2 a hair below 0; a null or NaN m2, from a part with a null
            # under ignore_nulls=False or a NaN, stays one: max_element_wise would make it 0)
            m2 = pc.if_else(pc.less(m2, 0.0), 0.0, m2)
            columns[f"s{i}_var"] = pc.if_else(pc.greater(n, 0), pc.divide(m2, n), pa.scalar(None, pa.float64()))
    return pa.table({name: columns[name] for name in table.column_names if name in columns})


def decomposable(aggs: Sequence[AggregateFnV2]) -> bool:
    """True when every aggregation has partial states (the built-ins but Quantile and lists)."""
    return all(agg.partial_kind is not None for agg in aggs)


def _check_columns(table: pa.Table, keys: Sequence[str], aggs: Sequence[AggregateFnV2]) -> None:
    for name in [*keys, *(c for a in aggs for c in (a.columns() or []))]:
        if name not in table.column_names:
            msg = f"column {name!r} not found; the dataset has {table.column_names}"
            raise ColumnNotFoundError(msg)


def needed_columns(keys: Sequence[str], aggs: Sequence[AggregateFnV2]) -> list[str] | None:
    """The columns the aggregations read, keys first (None: every column)."""
    wanted = list(keys)
    for agg in aggs:
        columns = agg.columns()
        if columns is None:
            return None
        wanted += [c for c in columns if c not in wanted]
    return wanted


# whole groups ------------------------------------------------------------------------------
def groups(table: pa.Table, keys: Sequence[str]) -> Iterator[tuple[Any, pa.Table]]:
    """(key, rows) of each group of ``table``, in key order (nulls last), rows in input order."""
    grouped, group_keys, offsets = grouped_rows(table, keys)
    for i, key in enumerate(group_keys):
        yield key, grouped.slice(int(offsets[i]), int(offsets[i + 1] - offsets[i]))


def aggregate_groups(table: pa.Table, keys: Sequence[str], aggs: Sequence[AggregateFnV2]) -> pa.Table:
    """Every aggregation over every whole group of ``table`` (the path for non-built-ins)."""
    _check_columns(table, keys, aggs)
    out: dict[str, list[Any]] = {k: [] for k in keys}
    for agg in aggs:
        out[agg.name] = []
    for key, group in groups(table, keys):
        for k in keys:
            out[k].append(group.column(k)[0].as_py() if group.num_rows else None)
        for agg in aggs:
            try:
                if isinstance(agg, AggregateFn):
                    value = agg.of_group_keyed(group, key)
                else:
                    value = agg.of_group(group)
            except USER_ERRORS as err:
                raise UDFFailure(agg.name, err) from err
            out[agg.name].append(value)
    columns = {}
    for name, values in out.items():
        columns[name] = pa.array(values, type=table.schema.field(name).type) if name in keys else _to_array(values)
    return pa.table(columns)


def _to_array(values: list[Any]) -> pa.Array:
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array([repr(v) for v in values])


def sort_by_keys(table: pa.Table, keys: Sequence[str]) -> pa.Table:
    if not keys or table.num_rows < 2:
        return table
    from dataflow.sort import SortKey, sort_indices

    return table.take(sort_indices(table, SortKey.of(list(keys))))


ROWS_NOT_STATES = b"dataflow.aggregate_rows"
"""Schema metadata of a map output that holds the aggregated rows themselves (the columns the
aggregations read), not their partial states: the reduce side groups them (``prepare`` makes
them one-row states for a pushed merge)."""


class PartialAggPartitioner:
    """Map side of a decomposable aggregation, hash-partitioned by key: the partial states of
    each group of the block, or, when its keys are mostly distinct (grouping would shrink it
    little), the rows themselves, which the reduce side turns into states."""

    position_free = True
    """Partitions from the keys alone (see ``dataflow.shuffle.HashPartitioner``)."""

    def __init__(self, keys: Sequence[str], aggs: Sequence[AggregateFnV2], num_partitions: int) -> None:
        self.keys, self.aggs, self.num_partitions = tuple(keys), tuple(aggs), num_partitions

    def for_execution(self) -> PartialAggPartitioner:
        return self

    def assign(self, table: pa.Table, row_offset: int) -> tuple[pa.Table, np.ndarray]:
        from dataflow.shuffle import key_hashes, spread

        if not self.keys:
            states = partial_states(table, self.keys, self.aggs)
            return states, np.zeros(states.num_rows, dtype=np.intp)
        _check_columns(table, self.keys, self.aggs)
        hashes = key_hashes(table, self.keys)
        if mostly_distinct(hashes):  # the rows themselves: narrower than their states
            needed = needed_columns(self.keys, self.aggs)
            rows = table.select(needed) if needed is not None else table
            return rows.replace_schema_metadata({ROWS_NOT_STATES: b"1"}), spread(hashes, self.num_partitions)
        states = partial_states(table, self.keys, self.aggs)
        return states, spread(key_hashes(states, self.keys), self.num_partitions)


class AggregateReducer:
    """Reduce side of a groupby aggregation: one output row per group, sorted by key."""

    exact_blocks = False

    def __init__(self, keys: Sequence[str], aggs: Sequence[AggregateFnV2], partial: bool) -> None:
        self.keys, self.aggs, self.partial = tuple(keys), tuple(aggs), partial

    def for_execution(self) -> AggregateReducer:
        return self

    def prepare(self, table: pa.Table) -> pa.Table:
        """One map output as partial states (rows the map side did not group become states)."""
        if self.partial and _rows_not_states(table):
            return row_states(table.replace_schema_metadata(None), self.keys, self.aggs)
        return table

    def merge(self, table: pa.Table, group_keys: Sequence[str]) -> pa.Table:
        """Several map tasks' outputs as one (a pushed merge): states merged per group."""
        return merge_states(table, group_keys, self.aggs) if self.partial else table

    def __call__(self, sides: list[list[pa.Table]], index: int) -> Iterator[pa.Table]:
        if not sides[0]:
            return
        if not self.partial:
            yield aggregate_groups(concat(sides[0]), self.keys, self.aggs)
            return
        states = [t for t in sides[0] if not _rows_not_states(t)]
        rows = [t.replace_schema_metadata(None) for t in sides[0] if _rows_not_states(t)]
        if rows:  # grouped here in one go, as the map side would have
            grouped = partial_states(concat(rows), self.keys, self.aggs)
            if not states:
                yield sort_by_keys(finish_states(grouped, self.keys, self.aggs), self.keys)
                return
            states.append(grouped)
        yield sort_by_keys(combine_states(concat(states), self.keys, self.aggs), self.keys)


def _rows_not_states(table: pa.Table) -> bool:
    return bool(table.schema.metadata) and ROWS_NOT_STATES in table.schema.metadata

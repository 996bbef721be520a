"""The ``.list``, ``.struct``, ``.dt``, ``.map`` and ``.arr`` functions of an expression,
named and behaving as Ray Data 2.60's (``ray.data.namespace_expressions``).

Each method makes a ``KernelExpr`` naming one of ``KERNELS``: a function of Arrow values
(``pyarrow.compute`` where it has one). ``col("items").list.len()``, ``col("items").list[0]``,
``col("items").list[1:3]``, ``col("point").struct["x"]``, ``col("at").dt.year()``,
``col("at").dt.floor("day")``, ``col("tags").map.keys()``, ``col("features").arr.to_list()``.
An expression using one is evaluated on the data (a filter of it is not pushed into a read).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from dataflow.expressions import Expr, KernelExpr

if TYPE_CHECKING:
    import pyarrow.compute as pc
else:
    from dataflow.lazy_compute import pc

TEMPORAL_UNITS = ("year", "quarter", "month", "week", "day", "hour", "minute", "second", "millisecond",
                  "microsecond", "nanosecond")


def _each_chunk(fn: Callable[[pa.Array], pa.Array]) -> Callable[..., Any]:
    """``fn`` of one array, applied to every chunk of a chunked one."""

    def apply(values: Any) -> Any:
        if isinstance(values, pa.ChunkedArray):
            return pa.chunked_array([fn(chunk) for chunk in values.chunks], type=None if values.num_chunks else values.type)
        return fn(values)

    return apply


def _as_list(values: pa.Array) -> pa.Array:
    """A fixed-size list as a variable one (the list kernels take those)."""
    if pa.types.is_fixed_size_list(values.type):
        return values.cast(pa.list_(values.type.value_type))
    if not (pa.types.is_list(values.type) or pa.types.is_large_list(values.type)):
        raise pa.ArrowInvalid(f"a list function on a column of {values.type}, which is not a list")
    return values


def _rebuild(lengths: np.ndarray, values: pa.Array, like: pa.Array) -> pa.Array:
    """A list array of ``lengths`` over ``values``, null where ``like`` is."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64 if pa.types.is_large_list(like.type) else np.int32)
    np.cumsum(lengths, out=offsets[1:])
    mask = like.is_null() if like.null_count else None
    kind = pa.LargeListArray if pa.types.is_large_list(like.type) else pa.ListArray
    return kind.from_arrays(pa.array(offsets), values, mask=mask)


def _list_sort(values: pa.Array, order: str = "ascending", null_placement: str = "at_end") -> pa.Array:
    original = values.type
    lists = _as_list(values)
    flat = pc.list_flatten(lists)
    if len(flat):
        rows = pc.list_parent_indices(lists)
        keyed = pa.StructArray.from_arrays([rows, flat], ["row", "value"])
        flat = flat.take(pc.sort_indices(keyed, sort_keys=[("row", "ascending", "at_end"),
                                                           ("value", order, null_placement)]))
    lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False)
    out = _rebuild(lengths, flat, lists)
    return out.cast(original) if pa.types.is_fixed_size_list(original) else out


def _list_get(values: pa.Array, index: int) -> pa.Array:
    """The element at ``index`` of each list, a negative one counting from the end; null where
    a list is too short or null (Arrow's ``list_element`` raises on the first short list and
    takes no negative index)."""
    lists = _as_list(values)
    lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    starts = np.asarray(lists.offsets, dtype=np.int64)[:-1]
    at = lengths + index if index < 0 else np.full(len(lengths), index, dtype=np.int64)
    ok = (at >= 0) & (at < lengths) & ~np.asarray(lists.is_null(), dtype=bool)
    positions = pa.array(np.where(ok, starts + at, 0), mask=~ok)
    return lists.values.take(positions)


def _list_flatten(values: pa.Array) -> pa.Array:
    """``[[1, 2], [3]] -> [1, 2, 3]`` in each row (one level; a null inner list adds nothing)."""
    outer = _as_list(values)
    inner = _as_list(pc.list_flatten(outer))
    scalars = pc.list_flatten(inner)
    rows = pc.list_parent_indices(outer).to_numpy()[pc.list_parent_indices(inner).to_numpy()] if len(scalars) else []
    lengths = np.bincount(np.asarray(rows, dtype=np.int64), minlength=len(outer))
    return _rebuild(lengths, scalars, outer)


def _map_part(values: pa.Array, part: str) -> pa.Array:
    if pa.types.is_map(values.type):
        offsets = np.asarray(values.offsets, dtype=np.int64)
        child = (values.keys if part == "keys" else values.items).slice(offsets[0], offsets[-1] - offsets[0])
        return _rebuild(np.diff(offsets), child, values)
    # a list of {key, value} structs, as a map reads from some files
    lists = _as_list(values)
    entries = pc.list_flatten(lists)
    if not pa.types.is_struct(entries.type) or entries.type.num_fields != 2:
        raise pa.ArrowInvalid(f"map.{part}() on a column of {values.type}, which is not a map")
    field = pc.struct_field(entries, [0 if part == "keys" else 1])
    lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False)
    return _rebuild(lengths, field, lists)


def _to_list(values: pa.Array) -> pa.Array:
    if isinstance(values.type, pa.FixedShapeTensorType):
        values = values.storage
    if pa.types.is_fixed_size_list(values.type):
        return values.cast(pa.list_(values.type.value_type))
    if pa.types.is_list(values.type) or pa.types.is_large_list(values.type):
        return values
    raise pa.ArrowInvalid(f"to_list() can only be called on list-like columns, but got {values.type}")


KERNELS: dict[str, Callable[..., Any]] = {
    "list.len": lambda v: pc.list_value_length(v),
    "list.get": lambda v, index: _each_chunk(lambda a: _list_get(a, index))(v),
    "list.slice": lambda v, start, stop, step: pc.list_slice(v, start=start, stop=stop, step=step),
    "list.sort": lambda v, order, null_placement: _each_chunk(lambda a: _list_sort(a, order, null_placement))(v),
    "list.flatten": _each_chunk(_list_flatten),
    "struct.field": lambda v, name: pc.struct_field(v, [name] if isinstance(name, int) else name),
    "dt.year": lambda v: pc.year(v),
    "dt.month": lambda v: pc.month(v),
    "dt.day": lambda v: pc.day(v),
    "dt.hour": lambda v: pc.hour(v),
    "dt.minute": lambda v: pc.minute(v),
    "dt.second": lambda v: pc.second(v),
    "dt.strftime": lambda v, fmt: pc.strftime(v, format=fmt),
    "dt.ceil": lambda v, unit: pc.ceil_temporal(v, multiple=1, unit=unit),
    "dt.floor": lambda v, unit: pc.floor_temporal(v, multiple=1, unit=unit),
    "dt.round": lambda v, unit: pc.round_temporal(v, multiple=1, unit=unit),
    "map.keys": _each_chunk(lambda a: _map_part(a, "keys")),
    "map.values": _each_chunk(lambda a: _map_part(a, "values")),
    "arr.to_list": _each_chunk(_to_list),
}


class _Namespace:
    _name = ""

    def __init__(self, expr: Expr) -> None:
        self._expr = expr

    def _kernel(self, method: str, **options: Any) -> Expr:
        return KernelExpr(f"{self._name}.{method}", self._expr, tuple(options.items()))


class ListNamespace(_Namespace):
    """``expr.list``: functions of each row's list."""

    _name = "list"

    def len(self) -> Expr:
        """The length of each list (int32; null for a null list)."""
        return self._kernel("len")

    def __getitem__(self, key: int | slice) -> Expr:
        """``[i]``: the element at ``i``; ``[a:b:c]``: a slice of each list."""
        if isinstance(key, int) and not isinstance(key, bool):
            return self.get(key)
        if isinstance(key, slice):
            return self.slice(key.start, key.stop, key.step)
        raise TypeError(f"List indices must be integers or slices, not {type(key).__name__}")

    def get(self, index: int) -> Expr:
        """The element at ``index`` of each list (a negative index counts from its end; null
        where a list is too short for it)."""
        return self._kernel("get", index=index)

    def slice(self, start: int | None = None, stop: int | None = None, step: int | None = None) -> Expr:
        """Elements ``start:stop:step`` of each list."""
        return self._kernel("slice", start=0 if start is None else start, stop=stop, step=1 if step is None else step)

    def sort(self, order: str = "ascending", null_placement: str = "at_end") -> Expr:
        """Each list sorted (its type kept)."""
        if order not in ("ascending", "descending"):
            raise ValueError(f"order must be either 'ascending' or 'descending', got {order!r}")
        if null_placement not in ("at_start", "at_end"):
            raise ValueError(f"null_placement must be 'at_start' or 'at_end', got {null_placement!r}")
        return self._kernel("sort", order=order, null_placement=null_placement)

    def flatten(self) -> Expr:
        """Each row's list of lists made one list (one level)."""
        return self._kernel("flatten")


class StructNamespace(_Namespace):
    """``expr.struct``: fields of each struct."""

    _name = "struct"

    def __getitem__(self, key: str | int) -> Expr:
        if isinstance(key, str):
            return self.field(key)
        if isinstance(key, int) and not isinstance(key, bool):
            return self.field_by_index(key)
        raise TypeError(f"Struct indices must be strings or integers, not {type(key).__name__}")

    def field(self, field_name: str) -> Expr:
        return self._kernel("field", name=field_name)

    def field_by_index(self, index: int) -> Expr:
        return self._kernel("field", name=index)


class DatetimeNamespace(_Namespace):
    """``expr.dt``: parts, formatting and rounding of dates and timestamps."""

    _name = "dt"

    def year(self) -> Expr:
        return self._kernel("year")

    def month(self) -> Expr:
        return self._kernel("month")

    def day(self) -> Expr:
        return self._kernel("day")

    def hour(self) -> Expr:
        return self._kernel("hour")

    def minute(self) -> Expr:
        return self._kernel("minute")

    def second(self) -> Expr:
        return self._kernel("second")

    def strftime(self, fmt: str) -> Expr:
        return self._kernel("strftime", fmt=fmt)

    def _rounded(self, how: str, unit: str) -> Expr:
        if unit not in TEMPORAL_UNITS:
            raise ValueError(f"unit must be one of {TEMPORAL_UNITS}, got {unit!r}")
        return self._kernel(how, unit=unit)

    def ceil(self, unit: str) -> Expr:
        return self._rounded("ceil", unit)

    def floor(self, unit: str) -> Expr:
        return self._rounded("floor", unit)

    def round(self, unit: str) -> Expr:
        return self._rounded("round", unit)


class MapNamespace(_Namespace):
    """``expr.map``: the keys or the values of each map (or list of key-value structs)."""

    _name = "map"

    def keys(self) -> Expr:
        return self._kernel("keys")

    def values(self) -> Expr:
        return self._kernel("values")


class ArrayNamespace(_Namespace):
    """``expr.arr``: conversions of array columns."""

    _name = "arr"

    def to_list(self) -> Expr:
        """Fixed-size lists (and fixed-shape tensors' storage) as variable-length lists."""
        return self._kernel("to_list")

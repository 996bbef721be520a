"""``Dataset.join`` (a hash exchange of both sides) and ``Dataset.zip`` (aligned row ranges).

Both sides of a join are partitioned by a hash of their keys with the same function (equal
keys of int32 and int64, or string and large_string, land together), and each reduce task joins
its range of partitions with Arrow's hash join. Null keys never match, as in SQL and Ray.
Columns Arrow's join cannot carry (lists, structs) are joined through row indices and taken
afterwards. ``zip`` needs no partitioning: the inputs arrive in order and each task gets the
same range of rows from every input.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa

from dataflow.plan import Exchange, LogicalNode
from dataflow.shuffle import HashPartitioner
from engine.errors import ColumnNotFoundError
from engine.exchange import FINE_PARTITIONS, concat

JOIN_TYPES = {
    "inner": "inner",
    "left_outer": "left outer",
    "right_outer": "right outer",
    "full_outer": "full outer",
    "left_semi": "left semi",
    "right_semi": "right semi",
    "left_anti": "left anti",
    "right_anti": "right anti",
}
_LEFT_ROW, _RIGHT_ROW = "__dataflow_left_row", "__dataflow_right_row"


def _nested(table: pa.Table, keys: Sequence[str]) -> bool:
    return any(
        pa.types.is_nested(f.type) or pa.types.is_dictionary(f.type) or isinstance(f.type, pa.ExtensionType)
        for f in table.schema if f.name not in keys
    )


class JoinReducer:
    exact_blocks = False

    def __init__(self, join_type: str, on: tuple[str, ...], right_on: tuple[str, ...],
                 left_suffix: str | None, right_suffix: str | None) -> None:
        self.join_type, self.on, self.right_on = join_type, on, right_on
        self.left_suffix, self.right_suffix = left_suffix, right_suffix

    def for_execution(self) -> JoinReducer:
        return self

    def __call__(self, sides: list[list[pa.Table]], index: int) -> Iterator[pa.Table]:
        left, right = sides
        if not left or not right:  # an empty input: the planner gave no schema to join with
            return
        lt, rt = concat(left), concat(right)
        for side, keys, table in (("left", self.on, lt), ("right", self.right_on, rt)):
            missing = [k for k in keys if k not in table.column_names]
            if missing:
                msg = f"join key {missing[0]!r} not found in the {side} dataset, which has {table.column_names}"
                raise ColumnNotFoundError(msg)
        self._check_collisions(lt.column_names, rt.column_names)
        for lk, rk in zip(self.on, self.right_on, strict=True):
            lt, rt = _aligned(lt, lk, rt, rk)
        how = JOIN_TYPES[self.join_type]
        if not _nested(lt, self.on) and not _nested(rt, self.right_on):
            yield lt.join(rt, list(self.on), list(self.right_on), join_type=how,
                          left_suffix=self.left_suffix, right_suffix=self.right_suffix)
            return
        # Arrow's join takes no nested payload: join keys and row numbers, then take the rows
        lk = lt.select(list(self.on)).append_column(_LEFT_ROW, pa.array(np.arange(lt.num_rows)))
        rk = rt.select(list(self.right_on)).append_column(_RIGHT_ROW, pa.array(np.arange(rt.num_rows)))
        joined = lk.join(rk, list(self.on), list(self.right_on), join_type=how)
        columns = {name: joined.column(name) for name in joined.column_names if name not in (_LEFT_ROW, _RIGHT_ROW)}
        if _LEFT_ROW in joined.column_names:
            rows = joined.column(_LEFT_ROW)
            for name in lt.column_names:
                if name not in self.on:
                    columns[_suffixed(name, rt.column_names, self.left_suffix)] = lt.column(name).take(rows)
        if _RIGHT_ROW in joined.column_names:
            rows = joined.column(_RIGHT_ROW)
            for name in rt.column_names:
                if name not in self.right_on:
                    columns[_suffixed(name, lt.column_names, self.right_suffix)] = rt.column(name).take(rows)
        yield pa.table(columns)

    def _check_collisions(self, left: list[str], right: list[str]) -> None:
        """A column name on both sides needs a suffix (Ray's error when neither has one); before,
        the right side's column silently replaced the left's."""
        if self.join_type.endswith(("semi", "anti")):  # one side's columns only
            return
        both = set(left) & (set(right) - set(self.right_on))
        if both and self.left_suffix is None and self.right_suffix is None:
            msg = f"Left and right columns suffixes cannot be both None (overlapping columns: {sorted(both)})"
            raise ValueError(msg)
        names = [_suffixed(n, right, self.left_suffix) if n not in self.on else n for n in left]
        names += [_suffixed(n, left, self.right_suffix) for n in right if n not in self.right_on]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            msg = (f"join: the suffixes {self.left_suffix!r} and {self.right_suffix!r} give more than one "
                   f"column named {repeated}; the left columns are {left}, the right {right}")
            raise ValueError(msg)


def _aligned(lt: pa.Table, lk: str, rt: pa.Table, rk: str) -> tuple[pa.Table, pa.Table]:
    """Both tables with key columns of one type (int32 and int64 keys join, as in Ray)."""
    a, b = lt.schema.field(lk).type, rt.schema.field(rk).type
    if a == b:
        return lt, rt
    if pa.types.is_dictionary(a):
        a = a.value_type
    if pa.types.is_dictionary(b):
        b = b.value_type
    if pa.types.is_integer(a) and pa.types.is_integer(b):
        common = pa.int64() if not (pa.types.is_unsigned_integer(a) and pa.types.is_unsigned_integer(b)) else pa.uint64()
    elif (pa.types.is_integer(a) or pa.types.is_floating(a)) and (pa.types.is_integer(b) or pa.types.is_floating(b)):
        common = pa.float64()
    elif (pa.types.is_string(a) or pa.types.is_large_string(a)) and (pa.types.is_string(b) or pa.types.is_large_string(b)):
        common = pa.large_string()
    else:
        common = a
    lt = lt.set_column(lt.schema.get_field_index(lk), lk, lt.column(lk).cast(common))
    rt = rt.set_column(rt.schema.get_field_index(rk), rk, rt.column(rk).cast(common))
    return lt, rt


def _suffixed(name: str, other: list[str], suffix: str | None) -> str:
    return name + (suffix or "") if name in other else name


def join_node(left: LogicalNode, right: LogicalNode, join_type: str, num_partitions: int | None,
              on: Sequence[str] | str, right_on: Sequence[str] | str | None,
              left_suffix: str | None, right_suffix: str | None) -> Exchange:
    if join_type not in JOIN_TYPES:
        msg = f"join_type must be one of {sorted(JOIN_TYPES)}, got {join_type!r}"
        raise ValueError(msg)
    left_keys = (on,) if isinstance(on, str) else tuple(on)
    right_keys = left_keys if right_on is None else (right_on,) if isinstance(right_on, str) else tuple(right_on)
    if not left_keys or len(left_keys) != len(right_keys):
        msg = f"join needs as many right keys as left keys: {left_keys} and {right_keys}"
        raise ValueError(msg)
    if num_partitions is not None and num_partitions < 1:
        msg = f"num_partitions must be >= 1, got {num_partitions}"
        raise ValueError(msg)
    partitions = max(FINE_PARTITIONS, num_partitions or 0)
    return Exchange(
        (left, right), f"Join[{join_type}]",
        (HashPartitioner(left_keys, partitions), HashPartitioner(right_keys, partitions)),
        JoinReducer(join_type, left_keys, right_keys, left_suffix, right_suffix),
        num_tasks=num_partitions,
    )


class ZipReducer:
    """The columns of every input side by side; a name seen before gets ``_1``, ``_2``..."""

    exact_blocks = False

    def for_execution(self) -> ZipReducer:
        return self

    def __call__(self, sides: list[list[pa.Table]], index: int) -> Iterator[pa.Table]:
        tables = [concat(side) for side in sides if side]
        if len(tables) != len(sides):
            return
        columns: dict[str, pa.ChunkedArray] = {}
        for i, table in enumerate(tables):
            for name in table.column_names:
                out = name
                if out in columns:
                    out = f"{name}_{i}"
                    while out in columns:
                        out += "_"
                columns[out] = table.column(name)
        yield pa.table(columns)


def zip_node(plans: Sequence[LogicalNode]) -> Exchange:
    return Exchange(tuple(plans), "Zip", reducer=ZipReducer(), grouping="rows", ordered_input=True,
                    preserves_rows=True)

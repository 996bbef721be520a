"""``Dataset.join`` (a hash exchange of both sides) and ``Dataset.zip`` (aligned row ranges).

Both sides of a join are partitioned by a hash of their keys with the same function (equal
keys of int32 and int64, or string and large_string, land together), and each reduce task joins
its range of partitions with Arrow's hash join. Null keys never match, as in SQL and Ray.
Columns Arrow's join cannot carry (lists, structs, tensors and other extension types) are
joined through row indices and taken afterwards. A side with no rows at all reaches the reduce
tasks as no blocks: its columns come from the schema its plan tells (``side_schema``), so an
outer join still gives them as nulls. ``zip`` needs no partitioning: the inputs arrive in order
and each task gets the same range of rows from every input.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa

from dataflow.plan import Exchange, LogicalNode, Resources
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
KEPT_SIDES = {
    "inner": (), "left_semi": (), "right_semi": (),
    "left_outer": (0,), "left_anti": (0,), "right_outer": (1,), "right_anti": (1,), "full_outer": (0, 1),
}
"""The sides whose rows the join keeps when the other side has no match (or no rows)."""
_LEFT_ROW, _RIGHT_ROW = "__dataflow_left_row", "__dataflow_right_row"
_SIDES = ("left", "right")


def _nested(table: pa.Table, keys: Sequence[str]) -> bool:
    return any(
        pa.types.is_nested(f.type) or pa.types.is_dictionary(f.type) or isinstance(f.type, pa.BaseExtensionType)
        for f in table.schema if f.name not in keys
    )


def needs_schemas(join_type: str) -> tuple[bool, bool]:
    """The sides whose columns an outer join gives as nulls when that side has no rows."""
    kept = KEPT_SIDES.get(join_type, ())
    outer = join_type.endswith("outer")
    return (outer and 1 in kept, outer and 0 in kept)


class JoinReducer:
    exact_blocks = False

    def __init__(self, join_type: str, on: tuple[str, ...], right_on: tuple[str, ...],
                 left_suffix: str | None, right_suffix: str | None,
                 schemas: tuple[pa.Schema | None, pa.Schema | None] = (None, None)) -> None:
        self.join_type, self.on, self.right_on = join_type, on, right_on
        self.left_suffix, self.right_suffix = left_suffix, right_suffix
        self.schemas = schemas
        """Each side's schema as its plan tells it (None: unknown), for a side with no rows."""

    def for_execution(self) -> JoinReducer:
        return self

    def __call__(self, sides: list[list[pa.Table]], index: int) -> Iterator[pa.Table]:
        if any(not side and (1 - i) not in KEPT_SIDES[self.join_type] for i, side in enumerate(sides)):
            return  # the other side's rows need a match, and this side has none
        lt, rt = (concat(side) if side else self._no_rows(i, sides) for i, side in enumerate(sides))
        for side, keys, table in (("left", self.on, lt), ("right", self.right_on, rt)):
            missing = [k for k in keys if k not in table.column_names]
            if missing:
                msg = f"join key {missing[0]!r} not found in the {side} dataset, which has {table.column_names}"
                raise ColumnNotFoundError(msg)
        left_names, right_names = self._output_names(lt.column_names, rt.column_names)
        lt, rt = lt.rename_columns(left_names), rt.rename_columns(right_names)
        for lk, rk in zip(self.on, self.right_on, strict=True):
            lt, rt = _aligned(lt, lk, rt, rk)
        how = JOIN_TYPES[self.join_type]
        if not _nested(lt, self.on) and not _nested(rt, self.right_on):
            yield lt.join(rt, list(self.on), list(self.right_on), join_type=how, use_threads=False)
            return
        # Arrow's join takes no nested payload: join keys and row numbers, then take the rows
        lk = lt.select(list(self.on)).append_column(_LEFT_ROW, pa.array(np.arange(lt.num_rows)))
        rk = rt.select(list(self.right_on)).append_column(_RIGHT_ROW, pa.array(np.arange(rt.num_rows)))
        joined = lk.join(rk, list(self.on), list(self.right_on), join_type=how, use_threads=False)
        columns = {name: joined.column(name) for name in joined.column_names if name not in (_LEFT_ROW, _RIGHT_ROW)}
        for row, table, keys in ((_LEFT_ROW, lt, self.on), (_RIGHT_ROW, rt, self.right_on)):
            if row in joined.column_names:
                rows = joined.column(row)
                columns.update((name, table.column(name).take(rows)) for name in table.column_names if name not in keys)
        yield pa.table(columns)

    def _no_rows(self, i: int, sides: list[list[pa.Table]]) -> pa.Table:
        """An empty table for side ``i``, which has no rows anywhere (a filter or limit emptied
        it): its plan's schema, or for a semi or anti join, its keys typed as the other side's."""
        schema = self.schemas[i]
        if schema is not None:
            return schema.empty_table()
        keys, other_keys = (self.on, self.right_on)[i], (self.right_on, self.on)[i]
        if self.join_type.endswith(("semi", "anti")):
            other = concat(sides[1 - i]).schema
            missing = [k for k in other_keys if k not in other.names]
            if missing:
                msg = f"join key {missing[0]!r} not found in the {_SIDES[1 - i]} dataset, which has {other.names}"
                raise ColumnNotFoundError(msg)
            return pa.schema([other.field(o).with_name(k) for k, o in zip(keys, other_keys, strict=True)]).empty_table()
        msg = (f"join: the {_SIDES[i]} dataset has no rows, and its columns cannot be told from its plan, so the "
               f"{self.join_type} join cannot give them as nulls; select its columns (select_columns) or "
               f"materialize() it first")
        raise ValueError(msg)

    def _output_names(self, left: list[str], right: list[str]) -> tuple[dict[str, str], dict[str, str]]:
        """Ray's names for columns on both sides: a left non-key column also among the right's
        non-key columns gets ``left_suffix``; such a right column gets ``right_suffix`` (with
        only ``left_suffix`` given, one named as a left key gets ``_right``); keys keep theirs.
        Both suffixes None with such a column is Ray's error (before, the right side's column
        silently replaced the left's)."""
        if self.join_type.endswith(("semi", "anti")):  # one side's columns only
            return {}, {}
        both = set(left) & (set(right) - set(self.right_on))
        # a left non-key column named as a right key: Arrow's join would keep one of the two
        keyed = (set(left) - set(self.on)) & (set(self.right_on) - set(self.on))
        if (both or keyed) and self.left_suffix is None and self.right_suffix is None:
            msg = f"Left and right columns suffixes cannot be both None (overlapping columns: {sorted(both | keyed)})"
            raise ValueError(msg)
        if keyed and not self.left_suffix:
            msg = (f"join: the left column {sorted(keyed)[0]!r} is named as a right key (right_on); give "
                   f"left_suffix= to rename it, or rename it first")
            raise ValueError(msg)
        left_names = {n: n + self.left_suffix if (n in both or n in keyed) and n not in self.on and self.left_suffix
                      else n for n in left}
        right_suffix = self.right_suffix or "_right"
        right_names = {n: n + right_suffix if n in both and (self.right_suffix or n in self.on) else n
                       for n in right}
        names = list(left_names.values()) + [right_names[n] for n in right if n not in self.right_on]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            msg = (f"join: the suffixes {self.left_suffix!r} and {self.right_suffix!r} give more than one "
                   f"column named {repeated}; the left columns are {left}, the right {right}")
            raise ValueError(msg)
        return left_names, right_names


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


def key_tuple(keys: Sequence[str] | str) -> tuple[str, ...]:
    return (keys,) if isinstance(keys, str) else tuple(keys)


def validate_key_types(left: pa.Schema | None, right: pa.Schema | None,
                       on: tuple[str, ...], right_on: tuple[str, ...]) -> None:
    """``join(validate_schemas=True)``: every key on its side, of the same type on both (Ray's
    check and error, which also refuses int32 against int64 keys that join without it)."""
    for lk, rk in zip(on, right_on, strict=True):
        types = [s.field(k).type if s is not None and k in s.names else None for s, k in ((left, lk), (right, rk))]
        if None in types or types[0] != types[1]:
            got = " and ".join(f"{side} {k!r}: {t if t is not None else 'missing'}"
                               for side, k, t in zip(_SIDES, (lk, rk), types, strict=True))
            msg = (f"Key columns are expected to be present and have the same types in both left and right "
                   f"operands of the join operation: {got}; left has {_columns(left)}, but right has {_columns(right)}")
            raise ValueError(msg)


def _columns(schema: pa.Schema | None) -> str:
    return "no schema" if schema is None else "{" + ", ".join(f"{f.name}: {f.type}" for f in schema) + "}"


def join_node(left: LogicalNode, right: LogicalNode, join_type: str, num_partitions: int | None,
              on: Sequence[str] | str, right_on: Sequence[str] | str | None,
              left_suffix: str | None, right_suffix: str | None,
              schemas: tuple[pa.Schema | None, pa.Schema | None] = (None, None),
              resources: Resources | None = None) -> Exchange:
    if join_type not in JOIN_TYPES:
        msg = f"join_type must be one of {sorted(JOIN_TYPES)}, got {join_type!r}"
        raise ValueError(msg)
    left_keys = key_tuple(on)
    right_keys = left_keys if right_on is None else key_tuple(right_on)
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
        JoinReducer(join_type, left_keys, right_keys, left_suffix, right_suffix, schemas),
        num_tasks=num_partitions, resources=resources,
    )


class ZipReducer:
    """The columns of every input side by side; a name seen before gets the first free one of
    ``_1``, ``_2``... (as Ray's: ``x``, ``x_1``, ``x_2``, and ``x_1_1`` for a later ``x_1``)."""

    exact_blocks = False

    def for_execution(self) -> ZipReducer:
        return self

    def __call__(self, sides: list[list[pa.Table]], index: int) -> Iterator[pa.Table]:
        tables = [concat(side) for side in sides if side]
        if len(tables) != len(sides):
            return
        columns: dict[str, pa.ChunkedArray] = {}
        for table in tables:
            for name in table.column_names:
                out, n = name, 1
                while out in columns:
                    out, n = f"{name}_{n}", n + 1
                columns[out] = table.column(name)
        yield pa.table(columns)


def zip_node(plans: Sequence[LogicalNode]) -> Exchange:
    return Exchange(tuple(plans), "Zip", reducer=ZipReducer(), grouping="rows", ordered_input=True,
                    preserves_rows=True)

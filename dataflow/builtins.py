"""The column operations dataflow provides, as picklable batch functions on Arrow tables.

Each fails with a message naming the column and listing what exists.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from engine.block_format import repeated_names
from engine.errors import ColumnNotFoundError

if TYPE_CHECKING:
    import pyarrow.compute as pc


def _missing(table: pa.Table, names: list[str], what: str) -> None:
    missing = [n for n in names if n not in table.column_names]
    if missing:
        msg = f"{what}: no column {missing[0]!r}; the columns are {table.column_names}"
        raise ColumnNotFoundError(msg)


def pass_through(table: pa.Table) -> pa.Table:
    """The rows as they are: the step a write with tasks of its own (``concurrency``,
    ``ray_remote_args``) runs before writing."""
    return table


class RangeTensor:
    """Column ``id`` as column ``data`` of ``shape``-d int64 tensors filled with it (Ray's
    ``range_tensor``); on no rows, a table of that schema (the plan's schema without a run)."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape

    def __call__(self, table: pa.Table) -> pa.Table:
        from engine.block_format import tensor_array

        ids = table.column("id").to_numpy()
        if len(ids) == 0:
            kind = pa.fixed_shape_tensor(pa.int64(), list(self.shape))
            storage = pa.array([], pa.list_(pa.int64(), int(np.prod(self.shape))))
            return pa.table({"data": pa.ExtensionArray.from_storage(kind, storage)})
        data = np.broadcast_to(ids.reshape(-1, *(1 for _ in self.shape)), (len(ids), *self.shape))
        return pa.table({"data": tensor_array(np.ascontiguousarray(data, dtype=np.int64))})


class SelectColumns:
    def __init__(self, cols: list[str]) -> None:
        self.cols = cols

    def __call__(self, table: pa.Table) -> pa.Table:
        _missing(table, self.cols, "select_columns")
        return table.select(self.cols)


class DropColumns:
    def __init__(self, cols: list[str]) -> None:
        self.cols = cols

    def __call__(self, table: pa.Table) -> pa.Table:
        _missing(table, self.cols, "drop_columns")
        return table.drop_columns(self.cols)


class RenameColumns:
    def __init__(self, mapping: dict[str, str] | list[str]) -> None:
        # checked at the call, as Ray does: a function here failed in the job as "object of type
        # 'function' has no len()"
        if isinstance(mapping, dict):
            names = [n for pair in mapping.items() for n in pair]
        else:
            names = list(mapping) if isinstance(mapping, (list, tuple)) else [mapping]
        if not isinstance(mapping, (dict, list, tuple)) or not all(isinstance(n, str) for n in names):
            msg = f"rename_columns takes a dict of old to new names or a list of new names (str), got {mapping!r}"
            raise TypeError(msg)
        twice = repeated_names(list(mapping.values()) if isinstance(mapping, dict) else names)
        if twice:
            msg = f"rename_columns({mapping!r}) gives two columns the name {twice[0]!r}"
            raise ValueError(msg)
        self.mapping = mapping

    def __call__(self, table: pa.Table) -> pa.Table:
        if isinstance(self.mapping, dict):
            _missing(table, list(self.mapping), "rename_columns")
            names = [self.mapping.get(n, n) for n in table.column_names]
            twice = repeated_names(names)  # a new name that a column kept already has
            if twice:
                # Ray 2.60 keeps one of the two and drops the other's values without a word
                msg = (f"rename_columns({self.mapping!r}) would give two columns named {twice[0]!r} "
                       f"(the columns are {table.column_names}): drop one first, or choose another name")
                raise ValueError(msg)
            return table.rename_columns(names)
        if len(self.mapping) != table.num_columns:
            msg = f"rename_columns got {len(self.mapping)} names for {table.num_columns} columns {table.column_names}"
            raise ValueError(msg)
        return table.rename_columns(list(self.mapping))  # (no name twice: checked at the call)


class AddColumn:
    """``add_column(col, fn)``: ``fn`` gets the batch in ``batch_format`` and returns the values."""

    def __init__(self, col: str, fn: Callable[[Any], Any], batch_format: str, arrow_backed_pandas: bool = True) -> None:
        self.col, self.fn, self.batch_format = col, fn, batch_format
        self.arrow_backed_pandas = arrow_backed_pandas

    def __call__(self, table: pa.Table) -> pa.Table:
        from engine.block_format import column_from_values, to_batch

        values = self.fn(to_batch(table, self.batch_format, self.arrow_backed_pandas))
        if values is None or isinstance(values, (str, bytes, bool, int, float, complex, pa.Scalar, np.generic)):
            # a constant, broadcast to every row as Ray does (a str is not a sequence of values)
            scalar = values if isinstance(values, pa.Scalar) else pa.scalar(values)
            values = pa.repeat(scalar, table.num_rows)
        column = column_from_values(self.col, values)
        if len(column) != table.num_rows:
            msg = f"add_column({self.col!r}): the function returned {len(column)} values for {table.num_rows} rows"
            raise ValueError(msg)
        if self.col in table.column_names:
            return table.set_column(table.column_names.index(self.col), self.col, column)
        return table.append_column(self.col, column)


class FilterExpression:
    def __init__(self, expr: pc.Expression) -> None:
        self.expr = expr

    def __call__(self, table: pa.Table) -> pa.Table:
        return table.filter(self.expr)


class PartialAggregate:
    """Per-block (count, sum, min, max, mean, M2) of one column, combined on the driver."""

    def __init__(self, on: str, ignore_nulls: bool = True) -> None:
        self.on, self.ignore_nulls = on, ignore_nulls

    def __call__(self, table: pa.Table) -> pa.Table:
        import pyarrow.compute as pc

        _missing(table, [self.on], "aggregate")
        col = table.column(self.on)
        nulls = col.null_count
        valid = pc.drop_null(col)
        n = len(valid)
        total = pc.sum(valid).as_py() if n else None
        mean = total / n if n else None
        m2 = pc.sum(pc.power(pc.subtract(pc.cast(valid, pa.float64()), mean), 2)).as_py() if n else None
        minmax = pc.min_max(valid) if n else None
        return pa.table(
            {
                "count": [n],
                "nulls": [nulls],
                "sum": [total],
                "min": [minmax["min"].as_py() if minmax else None],
                "max": [minmax["max"].as_py() if minmax else None],
                "mean": [mean],
                "m2": [m2],
            }
        )

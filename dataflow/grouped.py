"""``Dataset.groupby``: aggregations per group and ``map_groups``, as hash exchanges.

``GroupedData`` mirrors Ray's: ``count``, ``sum``, ``min``, ``max``, ``mean``, ``std`` (one
column, several, or all but the keys), ``aggregate(*aggs)`` and ``map_groups(fn)``. Output rows
of an aggregation come sorted by key within each reduce task's range of groups; ``map_groups``
calls ``fn`` once per whole group, the group's rows in input order.
"""

from __future__ import annotations

import copy
import inspect
import itertools
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from dataflow.aggregate import (
    AggregateFnV2,
    AggregateReducer,
    Count,
    Max,
    Mean,
    Min,
    PartialAggPartitioner,
    Std,
    Sum,
    decomposable,
    grouped_rows,
    needed_columns,
)
from dataflow.plan import Exchange, LogicalNode
from dataflow.shuffle import HashPartitioner
from dataflow.udf import map_node
from engine.block_format import column_to_numpy, to_batch, to_block
from engine.errors import ColumnNotFoundError
from engine.exchange import FINE_PARTITIONS, concat
from engine.transform import USER_ERRORS, Stage, UDFFailure, call_stage, writable_batch

if TYPE_CHECKING:
    from dataflow.dataset import Dataset


def keys_of(key: str | Sequence[str] | None) -> tuple[str, ...]:
    if key is None:
        return ()
    keys = (key,) if isinstance(key, str) else tuple(key)
    if not all(isinstance(k, str) for k in keys):
        msg = f"group key must be a column name or a list of them, got {key!r}"
        raise ValueError(msg)
    return keys


class _Projecting(HashPartitioner):
    """Hash partitioning of the columns an aggregation reads (the rest is dropped at once)."""

    def __init__(self, keys: Sequence[str], columns: list[str] | None, num_partitions: int) -> None:
        super().__init__(keys, num_partitions)
        self.columns = columns

    def assign(self, table: pa.Table, row_offset: int) -> tuple[pa.Table, Any]:
        if self.columns is not None:
            missing = [c for c in self.columns if c not in table.column_names]
            if missing:
                msg = f"column {missing[0]!r} not found; the dataset has {table.column_names}"
                raise ColumnNotFoundError(msg)
            table = table.select(self.columns)
        if not self.keys:
            import numpy as np

            return table, np.zeros(table.num_rows, dtype=np.intp)
        return super().assign(table, row_offset)


def check_num_partitions(num_partitions: int | None) -> None:
    if num_partitions is not None and (isinstance(num_partitions, bool) or not isinstance(num_partitions, int)
                                       or num_partitions < 1):
        msg = f"num_partitions must be a positive int or None, got {num_partitions!r}"
        raise ValueError(msg)


_GROUPS_ONLY = "__dataflow_group_rows"
"""The count ``GroupedData.aggregate()`` with no aggregation computes, and drops."""


def aggregate_node(plan: LogicalNode, keys: tuple[str, ...], aggs: Sequence[AggregateFnV2],
                   num_partitions: int | None = None) -> Exchange:
    """``num_partitions``: the reduce tasks (the output's blocks) of a keyed aggregation; None:
    as many as the data's size asks for."""
    if not aggs:
        msg = "aggregate() needs at least one aggregation"
        raise ValueError(msg)
    for agg in aggs:
        if not isinstance(agg, AggregateFnV2):
            msg = f"aggregations must be AggregateFn or AggregateFnV2 objects, got {type(agg).__name__}"
            raise TypeError(msg)
        if getattr(agg, "needs_on", False) and agg.on is None:  # Ray's message and type
            msg = f"Provided `on` value has to be non-null (got 'None') for {type(agg).__name__}"
            raise ValueError(msg)
    aggs = unique_names(aggs)
    partitions = max(FINE_PARTITIONS, num_partitions or 0) if keys else 1
    partial = decomposable(aggs)
    columns = needed_columns(keys, aggs)
    partitioner: Any = (PartialAggPartitioner(keys, aggs, partitions) if partial
                        else _Projecting(keys, columns, partitions))
    label = f"Aggregate[{', '.join(keys)}]" if keys else "Aggregate"
    return Exchange((plan,), label, (partitioner,), AggregateReducer(keys, aggs, partial), small_in_one_task=True,
                    columns=tuple(columns) if columns else None, num_tasks=num_partitions if keys else None)


def unique_names(aggs: Sequence[AggregateFnV2]) -> list[AggregateFnV2]:
    """Aggregations whose output names repeat get Ray's suffixes (``count(v)``,
    ``count(v)_2``): before, one column silently held the last one's value."""
    taken: set[str] = set()
    counts: dict[str, int] = {}
    named = []
    for agg in aggs:
        name = agg.name
        while name in taken:
            counts[agg.name] = counts.get(agg.name, 1) + 1
            name = f"{agg.name}_{counts[agg.name]}"
        taken.add(name)
        if name != agg.name:
            agg = copy.copy(agg)
            agg.name = name
        named.append(agg)
    return named


class MapGroupsReducer:
    """Calls the user's function once per whole group (a callable class once per worker)."""

    exact_blocks = False

    def __init__(self, keys: tuple[str, ...], stage: Stage) -> None:
        self.keys = keys
        self.stage = stage
        self.name = stage.name

    def for_execution(self) -> MapGroupsReducer:
        return self

    def __call__(self, sides: list[list[pa.Table]], index: int) -> Iterator[pa.Table]:
        if not sides[0]:
            return
        fn = self.stage.prepare()
        table = concat(sides[0])
        missing = [k for k in self.keys if k not in table.column_names]
        if missing:
            msg = f"group key column {missing[0]!r} not found; the dataset has {table.column_names}"
            raise ColumnNotFoundError(msg)
        grouped, _, offsets = grouped_rows(table, self.keys)
        for batch in group_batches(grouped, offsets, self.stage.batch_format, self.stage.arrow_backed_pandas):
            result = call_stage(self.stage, fn, batch if self.stage.zero_copy_batch else writable_batch(batch))
            try:
                for out in result if inspect.isgenerator(result) else (result,):
                    yield to_block(out)
            except (UDFFailure, GeneratorExit):
                raise
            except USER_ERRORS as err:
                raise UDFFailure(self.name, err) from err


def group_batches(grouped: pa.Table, offsets: np.ndarray, batch_format: str | None, arrow_backed_pandas: bool) -> Iterator[Any]:
    """Each group of ``grouped`` (rows ``offsets[i]:offsets[i + 1]``) as a batch, the one a
    batch of the group alone would be, converted once for all groups where no rows change the
    result: in numpy format a column of numbers and booleans without nulls, strings or
    fixed-shape tensors (each group gets a view of it; nulls would make a group's ints floats,
    equal-length lists a 2-d array, so such columns convert group by group); in pandas format
    a frame whose columns are all ``pd.ArrowDtype`` (each group gets its rows, indexed from 0)."""
    if batch_format == "pandas" and arrow_backed_pandas and _arrow_dtypes_only(grouped):
        frame = to_batch(grouped, "pandas", True)  # every column a pd.ArrowDtype: a group's slice is its batch
        for a, b in itertools.pairwise(offsets.tolist()):
            yield frame.iloc[a:b].reset_index(drop=True)
        return
    if batch_format not in ("default", "numpy"):
        for a, b in itertools.pairwise(offsets.tolist()):
            yield to_batch(grouped.slice(a, b - a), batch_format, arrow_backed_pandas)
        return
    names = grouped.column_names
    whole = {name: column_to_numpy(grouped.column(name)) for name in names if _same_in_any_rows(grouped.column(name))}
    for a, b in itertools.pairwise(offsets.tolist()):
        piece = grouped.slice(a, b - a)  # (zero-copy)
        yield {name: whole[name][a:b] if name in whole else column_to_numpy(piece.column(name)) for name in names}


def _arrow_dtypes_only(table: pa.Table) -> bool:
    """Whether every column of ``table``'s pandas batch is a ``pd.ArrowDtype`` column, whose
    dtype no rows change (not pandas' own dtypes, tensors, dictionaries or extension types)."""
    if table.schema.metadata and b"pandas" in table.schema.metadata:
        return False
    return not any(isinstance(f.type, pa.BaseExtensionType) or pa.types.is_dictionary(f.type)
                   or pa.types.is_null(f.type) or pa.types.is_fixed_size_list(f.type) for f in table.schema)


def _same_in_any_rows(column: pa.ChunkedArray) -> bool:
    """Whether ``column_to_numpy`` gives the same dtype and shape per row for any rows of it."""
    typ = column.type
    if pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_boolean(typ):
        return column.null_count == 0
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return True
    return isinstance(typ, pa.FixedShapeTensorType) and column.null_count == 0


class GroupedData:
    """Rows grouped by ``key`` (``Dataset.groupby``); each method returns a new Dataset."""

    def __init__(self, dataset: Dataset, key: str | Sequence[str] | None, num_partitions: int | None = None) -> None:
        check_num_partitions(num_partitions)
        self._dataset = dataset
        self._keys = keys_of(key)
        self._num_partitions = num_partitions

    def __repr__(self) -> str:
        return f"GroupedData(dataset={self._dataset!r}, key={list(self._keys)!r})"

    def aggregate(self, *aggs: AggregateFnV2) -> Dataset:
        if not aggs and self._keys:  # the groups alone, one row each, as Ray 2.60 gives them
            return self.aggregate(Count(alias_name=_GROUPS_ONLY)).drop_columns([_GROUPS_ONLY])
        return self._dataset._derive(aggregate_node(self._dataset._plan, self._keys, aggs, self._num_partitions))

    def count(self) -> Dataset:
        return self.aggregate(Count())

    def _columns(self, on: str | Sequence[str] | None) -> list[str]:
        if on is None:
            return [c for c in self._dataset.columns() if c not in self._keys]
        return [on] if isinstance(on, str) else list(on)

    def sum(self, on: str | Sequence[str] | None = None, ignore_nulls: bool = True) -> Dataset:
        return self.aggregate(*(Sum(c, ignore_nulls=ignore_nulls) for c in self._columns(on)))

    def min(self, on: str | Sequence[str] | None = None, ignore_nulls: bool = True) -> Dataset:
        return self.aggregate(*(Min(c, ignore_nulls=ignore_nulls) for c in self._columns(on)))

    def max(self, on: str | Sequence[str] | None = None, ignore_nulls: bool = True) -> Dataset:
        return self.aggregate(*(Max(c, ignore_nulls=ignore_nulls) for c in self._columns(on)))

    def mean(self, on: str | Sequence[str] | None = None, ignore_nulls: bool = True) -> Dataset:
        return self.aggregate(*(Mean(c, ignore_nulls=ignore_nulls) for c in self._columns(on)))

    def std(self, on: str | Sequence[str] | None = None, ddof: int = 1, ignore_nulls: bool = True) -> Dataset:
        return self.aggregate(*(Std(c, ddof=ddof, ignore_nulls=ignore_nulls) for c in self._columns(on)))

    def with_column(self, column_name: str, expr: Any, **ray_remote_args: Any) -> Dataset:
        """Ray's ``GroupedData.with_column``: every row with ``column_name`` set to ``expr``'s
        value, computed group by group (the output holds each group's rows together)."""
        from dataflow import expressions as ex

        if not isinstance(column_name, str) or not column_name:
            msg = f"column_name must be a non-empty string, got: {column_name!r}"
            raise ValueError(msg)
        if not isinstance(expr, ex.Expr):
            msg = "expr must be a dataflow (Ray Data) expression created via the expression API"
            raise TypeError(msg)
        project = ex.WithColumns(ex.named_exprs({column_name: expr}, "with_column"))
        return self.map_groups(project, batch_format="pyarrow", **ray_remote_args)

    def map_groups(
        self,
        fn: Any,
        *,
        compute: Any = None,
        batch_format: str | None = "default",
        zero_copy_batch: bool = True,
        fn_args: Any = None,
        fn_kwargs: Any = None,
        fn_constructor_args: Any = None,
        fn_constructor_kwargs: Any = None,
        num_cpus: float | None = None,
        num_gpus: float | None = None,
        memory: float | None = None,
        concurrency: int | tuple[int, ...] | None = None,
        **ray_remote_args: Any,
    ) -> Dataset:
        """``fn`` applied to each whole group (a batch in ``batch_format``); it returns a batch,
        or yields several. It runs in the reduce tasks, with the resources, ``concurrency``
        (a cap on the reduce tasks at once; a callable class is constructed once per worker)
        and Ray remote arguments given, as ``map_batches`` takes them.

        ``batch_format="default"`` gives each group as a pandas DataFrame, as Ray Data 2.60 runs
        it (its docstring says NumPy, but its ``to_default`` always makes Arrow groups pandas);
        None gives the pyarrow Table (Ray: the block as it is)."""
        if not callable(fn):
            msg = f"map_groups needs a function or a callable class, got {type(fn).__name__}"
            raise TypeError(msg)
        batch_format = {"default": "pandas", None: "pyarrow"}.get(batch_format, batch_format)
        # checked and resolved as map_batches' arguments are; the stage then runs in the reducers
        maps = map_node(self._dataset._plan, "map_groups", fn, kind="batches", batch_format=batch_format,
                        fn_args=fn_args, fn_kwargs=fn_kwargs, fn_constructor_args=fn_constructor_args,
                        fn_constructor_kwargs=fn_constructor_kwargs, num_cpus=num_cpus, num_gpus=num_gpus,
                        concurrency=concurrency, compute=compute, memory=memory, zero_copy_batch=zero_copy_batch,
                        ray_remote_args=ray_remote_args)
        reducer = MapGroupsReducer(self._keys, maps.stages[0])
        partitions = max(FINE_PARTITIONS, self._num_partitions or 0)
        cap = maps.actor_pool.max_size if maps.actor_pool is not None else maps.max_concurrency
        node = Exchange((self._dataset._plan,), reducer.name,
                        (HashPartitioner(self._keys, partitions) if self._keys else _Projecting((), None, 1),),
                        reducer, num_tasks=self._num_partitions if self._keys else None,
                        resources=maps.resources, max_concurrency=cap)
        return self._dataset._derive(node)

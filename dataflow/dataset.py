"""Dataset: a lazy, immutable plan. Transformations return new Datasets; consumers run them.

Nothing executes until a consuming call (``iter_*``, ``take*``, ``count``, ``schema`` when not
known from metadata, ``show``, ``materialize``, ``to_*``, ``write_*``, aggregates). Every
consuming call runs the plan again, except on a MaterializedDataset.
"""

from __future__ import annotations

import inspect
import numbers
import os
import uuid
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

import pyarrow as pa

from connectors.base import WriteResult
from dataflow import all_to_all, progress, ray_api
from dataflow import builtins as bi
from dataflow import expressions as ex
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
)
from dataflow.context import DataContext
from dataflow.grouped import GroupedData, aggregate_node, unique_names
from dataflow.iterator import DataIterator
from dataflow.join import join_node, key_tuple, needs_schemas, validate_key_types, zip_node
from dataflow.mixing import MixStoppingCondition, mix_node
from dataflow.optimizer import count_from_metadata, optimize
from dataflow.plan import Exchange, InputBlocks, Limit, LogicalNode, MapStages, Read, Union, explain, walk
from dataflow.random_seed import RandomSeedConfig, StepSeed
from dataflow.schema import Schema
from dataflow.shuffle import RandomSample
from dataflow.sources import input_sources
from dataflow.summary import DatasetSummary
from dataflow.udf import builtin_node, map_node, task_resources, with_remote_args
from engine import runner
from engine.block_format import concat_blocks
from engine.errors import ColumnNotFoundError, DataflowError
from engine.runner import ExecutionHandle, HeldBlocks
from engine.stats import ExecutionStats
from engine.task import OUTPUT_BLOCKS, OUTPUT_COUNT, OUTPUT_WRITE

if TYPE_CHECKING:
    from dataflow.random_access import RandomAccessDataset


def _datasets(method: str, others: Sequence[Any]) -> None:
    """Refuse what is not a dataset where ``method`` takes datasets (Ray fails on it with an
    ``AttributeError`` about a private attribute)."""
    for other in others:
        if not isinstance(other, Dataset):
            msg = f"{method}() takes datasets, got {type(other).__name__}: {other!r}"
            raise TypeError(msg)


class Dataset:
    """A distributed collection of rows, computed lazily and streamed block by block."""

    _dataset_name: str | None = None
    """``set_name``'s name; datasets derived from this one (and ``materialize()``) inherit it."""
    _uuid: str | None = None
    """This Dataset object's part of ``get_dataset_id``, made the first time it is asked for."""
    _run_index = 0
    """How many times this Dataset object has run a plan."""

    def __init__(self, plan: LogicalNode) -> None:
        self._plan = plan
        self._last_stats: ExecutionStats | None = None
        self._cached_schema: pa.Schema | None = None
        """The schema of the first block a run of this dataset gave (a later ``schema()`` and
        ``repr`` use it instead of running the plan again, as Ray caches it)."""
        self._cached_num_rows: int | None = None
        """The rows a whole run of this dataset gave (``repr`` shows them, as Ray's)."""

    # running ------------------------------------------------------------------------------
    def _execute(
        self, plan: LogicalNode | None = None, output: str = OUTPUT_BLOCKS, sink: Any = None, optimized: bool = False
    ) -> ExecutionHandle:
        from dataflow.compile import compile_plan

        ctx = DataContext.get_current()
        options = ctx.execution_options
        runner.reclaim_abandoned(options.spill_dir)  # a killed driver's blocks: first run only
        backend = runner.backend(options, ctx.execution_mode)
        options = backend.execution_options(options)
        logical = plan or self._plan
        _check_pinned_reads(logical, backend)
        ops = compile_plan(logical if optimized else optimize(logical), options, output, sink, ctx.kv_configs(),
                           ctx.map_error_retries(), ctx.actor_init_retries())
        handle = backend.execute(ops, options)
        self._run_index += 1
        self._last_handle = handle
        progress.track(handle, self._dataset_name)  # bars or log lines, and the execution's log
        return handle

    def _derive(self, plan: LogicalNode) -> Dataset:
        derived = Dataset(plan)
        derived._dataset_name = self._dataset_name
        return derived

    # transformations ------------------------------------------------------------------------
    def map(
        self,
        fn: Callable[..., Any],
        *,
        compute: Any = None,
        fn_args: Any = None,
        fn_kwargs: Any = None,
        fn_constructor_args: Any = None,
        fn_constructor_kwargs: Any = None,
        num_cpus: float | None = None,
        num_gpus: float | None = None,
        concurrency: int | tuple[int, int] | None = None,
        resources: dict[str, float] | None = None,
        task_timeout_s: float | None = None,
        memory: float | None = None,
        on_error: str = "raise",
        error_sink: str | None = None,
        **ray_remote_args: Any,
    ) -> Dataset:
        """Apply ``fn`` to each row (a dict) and keep the row it returns.

        ``on_error="skip"`` drops the rows ``fn`` raises on instead of failing the job (counted
        in ``stats()``); ``error_sink`` (a folder path or URL) then receives them as Parquet
        rows with their errors. Same for ``map_batches``, ``flat_map`` and ``filter``.
        """
        return self._derive(
            map_node(self._plan, "map", fn, compute=compute, kind="rows", row_mode="map", fn_args=fn_args, fn_kwargs=fn_kwargs,
                     fn_constructor_args=fn_constructor_args, fn_constructor_kwargs=fn_constructor_kwargs,
                     num_cpus=num_cpus, num_gpus=num_gpus, concurrency=concurrency, resources=resources, task_timeout_s=task_timeout_s,
                     preserves_rows=True, memory=memory, ray_remote_args=ray_remote_args, on_error=on_error, error_sink=error_sink)
        )

    def map_batches(
        self,
        fn: Callable[..., Any],
        *,
        batch_size: int | str | None = None,
        compute: Any = None,
        batch_format: str = "default",
        zero_copy_batch: bool = True,
        fn_args: Any = None,
        fn_kwargs: Any = None,
        fn_constructor_args: Any = None,
        fn_constructor_kwargs: Any = None,
        num_cpus: float | None = None,
        num_gpus: float | None = None,
        concurrency: int | tuple[int, int] | None = None,
        resources: dict[str, float] | None = None,
        task_timeout_s: float | None = None,
        udf_modifying_row_count: bool = True,
        memory: float | None = None,
        on_error: str = "raise",
        error_sink: str | None = None,
        **ray_remote_args: Any,
    ) -> Dataset:
        """Apply ``fn`` to batches of ``batch_size`` rows (None: whole blocks).

        ``fn`` may be a function or a callable class (run on an actor pool: constructed once per
        actor); it may return a batch or yield several; the row count may change.
        ``on_error="skip"``: a batch ``fn`` raises on is split in halves and retried until the
        failing rows are alone, and those are dropped (see ``map``); ``fn`` may then see a row
        more than once.
        """
        return self._derive(
            map_node(self._plan, "map_batches", fn, compute=compute, kind="batches", batch_size=batch_size,
                     batch_format=batch_format, fn_args=fn_args, fn_kwargs=fn_kwargs,
                     fn_constructor_args=fn_constructor_args, fn_constructor_kwargs=fn_constructor_kwargs,
                     num_cpus=num_cpus, num_gpus=num_gpus, concurrency=concurrency, resources=resources, task_timeout_s=task_timeout_s,
                     preserves_rows=not udf_modifying_row_count, zero_copy_batch=zero_copy_batch, memory=memory,
                     ray_remote_args=ray_remote_args, on_error=on_error, error_sink=error_sink)
        )

    def flat_map(
        self,
        fn: Callable[..., Any],
        *,
        compute: Any = None,
        fn_args: Any = None,
        fn_kwargs: Any = None,
        fn_constructor_args: Any = None,
        fn_constructor_kwargs: Any = None,
        num_cpus: float | None = None,
        num_gpus: float | None = None,
        concurrency: int | tuple[int, int] | None = None,
        resources: dict[str, float] | None = None,
        task_timeout_s: float | None = None,
        memory: float | None = None,
        on_error: str = "raise",
        error_sink: str | None = None,
        **ray_remote_args: Any,
    ) -> Dataset:
        """Apply ``fn`` to each row; it returns a list (or iterable) of rows (``on_error``: see ``map``)."""
        return self._derive(
            map_node(self._plan, "flat_map", fn, compute=compute, kind="rows", row_mode="flat_map", fn_args=fn_args,
                     fn_kwargs=fn_kwargs, fn_constructor_args=fn_constructor_args,
                     fn_constructor_kwargs=fn_constructor_kwargs, num_cpus=num_cpus, num_gpus=num_gpus,
                     concurrency=concurrency, resources=resources, task_timeout_s=task_timeout_s, memory=memory,
                     ray_remote_args=ray_remote_args, on_error=on_error, error_sink=error_sink)
        )

    def filter(
        self,
        fn: Callable[..., Any] | None = None,
        expr: Any = None,
        *,
        compute: Any = None,
        fn_args: Any = None,
        fn_kwargs: Any = None,
        fn_constructor_args: Any = None,
        fn_constructor_kwargs: Any = None,
        num_cpus: float | None = None,
        num_gpus: float | None = None,
        concurrency: int | tuple[int, int] | None = None,
        resources: dict[str, float] | None = None,
        task_timeout_s: float | None = None,
        memory: float | None = None,
        on_error: str = "raise",
        error_sink: str | None = None,
        **ray_remote_args: Any,
    ) -> Dataset:
        """Keep rows for which ``fn(row)`` is true, or which match ``expr``.

        ``expr`` is an expression (``dataflow.col("x") > 3``, see ``dataflow.expressions``), a
        string such as ``"x > 3 and y == 'a'"``, or a ``pyarrow.compute`` expression; it is
        pushed into readers that support it (Parquet skips row groups by their statistics).
        ``on_error="skip"`` drops the rows ``fn`` raises on (see ``map``).
        """
        if (fn is None) == (expr is None):
            msg = "filter() takes exactly one of fn or expr"
            raise ValueError(msg)
        if expr is not None:
            if fn_args or fn_kwargs or fn_constructor_args or fn_constructor_kwargs:
                msg = "fn_args, fn_kwargs, fn_constructor_args and fn_constructor_kwargs are for fn, not expr"
                raise ValueError(msg)
            if on_error != "raise" or error_sink is not None:
                msg = "on_error and error_sink are for fn: an expression raises on no single row"
                raise ValueError(msg)
            name, step, pushable = ex.filter_step(expr)
            node = builtin_node(self._plan, name, step, preserves_rows=False, filter_expr=pushable)
            return self._derive(with_remote_args(node, "filter", compute=compute, concurrency=concurrency,
                                                 num_cpus=num_cpus, num_gpus=num_gpus, memory=memory, resources=resources,
                                                 task_timeout_s=task_timeout_s, ray_remote_args=ray_remote_args))
        return self._derive(
            map_node(self._plan, "filter", fn, compute=compute, kind="rows", row_mode="filter", fn_args=fn_args,
                     fn_kwargs=fn_kwargs, fn_constructor_args=fn_constructor_args,
                     fn_constructor_kwargs=fn_constructor_kwargs, num_cpus=num_cpus, num_gpus=num_gpus,
                     concurrency=concurrency, resources=resources, task_timeout_s=task_timeout_s, memory=memory,
                     ray_remote_args=ray_remote_args, on_error=on_error, error_sink=error_sink)
        )

    def add_column(self, col: str, fn: Callable[[Any], Any], *, batch_format: str = "pandas", **remote: Any) -> Dataset:
        """Add (or replace) column ``col`` with ``fn(batch)``. ``**remote``: Ray's task
        arguments (``concurrency``, ``num_cpus``, ``num_gpus``, ``memory``, ``resources``,
        ``compute`` with tasks, and Ray's remote arguments), as ``map_batches`` takes them."""
        if not isinstance(col, str):  # (Ray names it str(col); here a number failed in the job)
            msg = f"add_column: the column name must be a str, got {type(col).__name__}: {col!r}"
            raise TypeError(msg)
        arrow_backed = DataContext.get_current().enable_arrow_backed_pandas_conversion
        return self._column_step("add_column", f"AddColumn({col})", bi.AddColumn(col, fn, batch_format, arrow_backed), remote)

    def with_column(self, column_name: str, expr: ex.Expr, **remote: Any) -> Dataset:
        """Add (or replace) ``column_name`` with the values of ``expr``: ``col("a") * 2``
        (``**remote``: as ``add_column``)."""
        exprs = ex.named_exprs({column_name: expr}, "with_column")
        return self._column_step("with_column", f"WithColumn({column_name}={expr})", ex.WithColumns(exprs), remote)

    def with_columns(self, exprs: Any = None, *more_exprs: Any, **remote: Any) -> Dataset:
        """Add (or replace) several columns at once; every expression reads the input columns.

        Each of ``exprs`` and ``more_exprs`` is ``{name: expr}``, an ``unnest(expr)`` (one column
        per field of a struct) or a list of named expressions (``col("a").alias("b")``), in
        order; ``**remote``: as ``add_column``.
        """
        items = ex.with_columns_items((exprs, *more_exprs), "with_columns")
        names = [name if name is not None else repr(expr) for name, expr in items]
        return self._column_step("with_columns", f"WithColumns({names})", ex.WithColumns(items), remote)

    def drop_columns(self, cols: list[str], **remote: Any) -> Dataset:
        if len(set(cols)) != len(cols):
            msg = f"drop_columns expects unique column names, got: {cols}"
            raise ValueError(msg)
        return self._column_step("drop_columns", f"DropColumns({cols})", bi.DropColumns(list(cols)), remote)

    def select_columns(self, cols: list[str] | str, **remote: Any) -> Dataset:
        cols = [cols] if isinstance(cols, str) else list(cols)
        if len(set(cols)) != len(cols):
            msg = f"select_columns expected unique column names, got duplicate column names: {cols}"
            raise ValueError(msg)
        return self._column_step("select_columns", f"SelectColumns({cols})", bi.SelectColumns(cols), remote,
                                 projection=tuple(cols))

    def rename_columns(self, names: dict[str, str] | list[str], **remote: Any) -> Dataset:
        return self._column_step("rename_columns", "RenameColumns", bi.RenameColumns(names), remote)

    def _column_step(self, method: str, name: str, fn: Any, remote: dict[str, Any], **node_args: Any) -> Dataset:
        """A column step of dataflow's own, with the task arguments its call passed."""
        node = builtin_node(self._plan, name, fn, **node_args)
        remote = {**(remote.pop("ray_remote_args", None) or {}), **remote}  # named ones win, as in Ray
        if remote:
            named = {k: remote.pop(k) for k in ("compute", "concurrency", "num_cpus", "num_gpus", "memory",
                                                 "resources", "task_timeout_s") if k in remote}
            node = with_remote_args(node, method, ray_remote_args=remote, **named)
        return self._derive(node)

    def limit(self, limit: int) -> Dataset:
        """The first ``limit`` rows; upstream work stops once they have been produced."""
        if isinstance(limit, bool) or not isinstance(limit, numbers.Integral):
            msg = f"limit must be an int, got {limit!r}"
            raise TypeError(msg)
        if limit < 0:
            msg = f"limit must be >= 0, got {limit}"
            raise ValueError(msg)
        return self._derive(Limit(self._plan, limit))

    def union(self, *other: Dataset) -> Dataset:
        """The rows of this dataset and the others."""
        _datasets("union", other)
        return self._derive(Union((self._plan, *(o._plan for o in other))))

    def mix(
        self,
        *other: Dataset,
        weights: list[float] | None = None,
        stopping_condition: MixStoppingCondition = MixStoppingCondition.STOP_ON_LONGEST_DROP,
    ) -> Dataset:
        """This dataset's blocks interleaved with the others' so that the rows drawn from each
        follow ``weights`` (the first for this dataset; normalized; default equal), as Ray's.

        Each output block comes whole from one input: the one furthest behind its share of the
        rows so far. The order depends only on the blocks each input hands over, so a plan that
        produces them in order (``preserve_order``, a materialized input) mixes the same way
        every time. ``stopping_condition``: ``STOP_ON_LONGEST_DROP`` (an input that runs out
        drops out; every row comes once) or ``STOP_ON_SHORTEST`` (the first to run out ends it;
        the others are read no further; each input then hands over its blocks in order, so the
        rows it keeps are the same on every run). An input far ahead of its share pauses at its
        byte budget.
        """
        return self._derive(mix_node((self._plan, *(o._plan for o in other)), weights, stopping_condition))

    # all-to-all ------------------------------------------------------------------------------
    def random_shuffle(
        self, *, seed: int | RandomSeedConfig | None = None, num_blocks: int | None = None, **ray_remote_args: Any
    ) -> Dataset:
        """The rows in a uniformly random order: with ``seed``, the same order on every run
        (any number of workers, any block sizes); without, a different one each time. A
        ``RandomSeedConfig(seed)`` gives each execution (each epoch) its own order, the same
        from one run of the program to the next (``dataflow.random_seed``).

        ``ray_remote_args`` (``num_cpus``, ``num_gpus``, ``resources``, ``accelerator_type``)
        are what each of its reduce tasks holds while it runs, as Ray gives them to the
        shuffle's tasks; the other remote arguments have no meaning for it and are refused."""
        step_seed = StepSeed(seed)
        resources = task_resources("random_shuffle", ray_remote_args, "ray_remote_args")
        return self._derive(all_to_all.random_shuffle(self._plan, step_seed, num_blocks, resources))

    def randomize_block_order(self, *, seed: int | RandomSeedConfig | None = None) -> Dataset:
        """The blocks in a random order; rows inside a block keep theirs (no data moves). The
        seed as ``random_shuffle``'s."""
        return self._derive(all_to_all.randomize_block_order(self._plan, StepSeed(seed)))

    def random_sample(self, fraction: float, *, seed: int | RandomSeedConfig | None = None) -> Dataset:
        """Each row kept with probability ``fraction`` (about ``fraction`` of the rows). The seed
        as ``random_shuffle``'s."""
        step_seed = StepSeed(seed)
        if not 0 <= fraction <= 1:
            msg = f"fraction must be between 0 and 1, got {fraction}"
            raise ValueError(msg)
        sample = RandomSample(fraction, step_seed)
        return self._derive(builtin_node(self._plan, "RandomSample", sample, preserves_rows=False))

    def sort(self, key: str | list[str], descending: bool | list[bool] = False, boundaries: list[Any] | None = None) -> Dataset:
        """Rows sorted by ``key`` (one column or several, ``descending`` per key); nulls and
        NaNs last. Stable: rows with equal keys keep their order."""
        return self._derive(all_to_all.sort(self._plan, key, descending, boundaries))

    def repartition(
        self,
        num_blocks: int | None = None,
        target_num_rows_per_block: int | None = None,
        *,
        strict: bool = False,
        shuffle: bool = False,
        keys: str | list[str] | None = None,
        sort: bool = False,
    ) -> Dataset:
        """``num_blocks`` blocks of about equal rows (in order; ``shuffle=True``: each block
        takes rows from every input block; ``keys``: rows with equal keys together), or blocks
        of ``target_num_rows_per_block``. A ``write_*`` after it writes one file per block.

        ``shuffle=True`` deals the rows out in turn, as Ray does not randomize them either: row
        ``k`` of the input goes to block ``k % num_blocks``, so the blocks' sizes differ by one
        at most and every run gives the same blocks (Ray cuts each input block into equal
        slices, so its small inputs fill the first blocks only).

        With ``target_num_rows_per_block`` every block but the last has exactly that many rows,
        with ``strict`` or without (Ray's ``strict=False`` allows a short block per input
        block; here blocks are cut from the rows in order, so none is short)."""
        return self._derive(all_to_all.repartition(self._plan, num_blocks, target_num_rows_per_block, shuffle, keys, sort))

    def join(
        self,
        ds: Dataset,
        join_type: str = "inner",
        num_partitions: int | None = None,
        on: tuple[str, ...] | list[str] | str = ("id",),
        right_on: tuple[str, ...] | list[str] | str | None = None,
        left_suffix: str | None = None,
        right_suffix: str | None = None,
        partition_size_hint: int | None = None,
        aggregator_ray_remote_args: dict[str, Any] | None = None,
        validate_schemas: bool = False,
    ) -> Dataset:
        """Rows of this dataset and ``ds`` whose ``on`` keys match (hash-partitioned;
        ``join_type`` inner, left_outer, right_outer, full_outer, or a semi or anti join).

        ``validate_schemas``: check now that the keys are on both sides with equal types (Ray's
        ``ValueError``; fetches the schemas as ``schema()`` does). ``aggregator_ray_remote_args``
        (``num_cpus``, ``num_gpus``, ``resources``, ``accelerator_type``) is what each join task
        holds. ``partition_size_hint`` is deprecated in Ray and ignored there as here: it warns."""
        _datasets("join", (ds,))
        if partition_size_hint is not None:
            warnings.warn("join(partition_size_hint=...) is deprecated and ignored: the join's tasks are sized "
                          "from the partition bytes that arrive (as in Ray 2.60)", DeprecationWarning, stacklevel=2)
        if validate_schemas:
            right_keys = on if right_on is None else right_on
            validate_key_types(self._arrow_schema(), ds._arrow_schema(), key_tuple(on), key_tuple(right_keys))
        left_needed, right_needed = needs_schemas(join_type)  # an outer join's nulls for a side with no rows
        schemas = (self._arrow_schema(fetch_if_missing=False) if left_needed else None,
                   ds._arrow_schema(fetch_if_missing=False) if right_needed else None)
        return self._derive(join_node(self._plan, ds._plan, join_type, num_partitions, on, right_on,
                                      left_suffix, right_suffix, schemas, task_resources("join", aggregator_ray_remote_args, "aggregator_ray_remote_args")))

    def zip(self, *other: Dataset) -> Dataset:
        """The columns of this dataset and the others, row by row (equal row counts, or
        ``ValueError``); a duplicate column name gets a suffix (``id_1``)."""
        if not other:
            msg = "zip() needs at least one other dataset"
            raise ValueError(msg)
        _datasets("zip", other)
        return self._derive(zip_node([self._plan, *(o._plan for o in other)]))

    # consuming ------------------------------------------------------------------------------
    def iterator(self) -> DataIterator:
        return DataIterator(self._execute, explain(self._plan).splitlines()[0], dataset=self)

    def iter_batches(
        self,
        *,
        prefetch_batches: int = 1,
        batch_size: int | None = 256,
        batch_format: str = "default",
        drop_last: bool = False,
        local_shuffle_buffer_size: int | None = None,
        local_shuffle_seed: int | None = None,
    ) -> Iterator[Any]:
        """Stream batches of exactly ``batch_size`` rows (the last may be short)."""
        return self.iterator().iter_batches(
            prefetch_batches=prefetch_batches, batch_size=batch_size, batch_format=batch_format,
            drop_last=drop_last, local_shuffle_buffer_size=local_shuffle_buffer_size,
            local_shuffle_seed=local_shuffle_seed,
        )

    def iter_torch_batches(
        self,
        *,
        prefetch_batches: int = 1,
        batch_size: int | None = 256,
        dtypes: Any = None,
        device: Any = "auto",
        collate_fn: Callable[[dict[str, Any]], Any] | None = None,
        drop_last: bool = False,
        local_shuffle_buffer_size: int | None = None,
        local_shuffle_seed: int | None = None,
        pin_memory: bool = False,
    ) -> Iterator[Any]:
        """Stream batches as dicts of torch tensors, on ``device`` ("auto": CUDA if present, else CPU).

        Numeric and fixed-shape columns become tensors without a copy; see
        ``dataflow.torch_batches.sized_torch_batches`` for dtypes, collate_fn and pinning.
        """
        return self.iterator().iter_torch_batches(
            prefetch_batches=prefetch_batches, batch_size=batch_size, dtypes=dtypes, device=device,
            collate_fn=collate_fn, drop_last=drop_last, local_shuffle_buffer_size=local_shuffle_buffer_size,
            local_shuffle_seed=local_shuffle_seed, pin_memory=pin_memory,
        )

    def iter_jax_batches(
        self,
        *,
        prefetch_batches: int = 1,
        batch_size: int = 256,
        dtypes: Any = None,
        collate_fn: Any = None,
        drop_last: bool = False,
        local_shuffle_buffer_size: int | None = None,
        local_shuffle_seed: int | None = None,
        synchronize_batches: bool = False,
        paddings: Any = None,
    ) -> Iterator[Any]:
        """Stream batches as dicts of ``jax.Array``s, each sharded along its rows over every JAX
        device (``batch_size`` rows per host, a multiple of the local device count).

        ``dtypes`` and ``paddings`` (for a short last batch) are one value or one per column; see
        ``dataflow.jax_batches.iter_jax_batches`` for collate_fn and ``synchronize_batches``.
        """
        return self.iterator().iter_jax_batches(
            prefetch_batches=prefetch_batches, batch_size=batch_size, dtypes=dtypes, collate_fn=collate_fn,
            drop_last=drop_last, local_shuffle_buffer_size=local_shuffle_buffer_size,
            local_shuffle_seed=local_shuffle_seed, synchronize_batches=synchronize_batches, paddings=paddings,
        )

    def iter_tf_batches(
        self,
        *,
        prefetch_batches: int = 1,
        batch_size: int | None = 256,
        dtypes: Any = None,
        drop_last: bool = False,
        local_shuffle_buffer_size: int | None = None,
        local_shuffle_seed: int | None = None,
    ) -> Iterator[Any]:
        """Stream batches as dicts of TensorFlow tensors (``dataflow.tf_batches.iter_tf_batches``).

        Deprecated in Ray Data in favour of ``to_tf``, and here too: it warns as Ray's does.
        """
        warnings.warn(
            "`iter_tf_batches` is deprecated and will be removed after May 2025. Use `to_tf` instead.",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.iterator().iter_tf_batches(
            prefetch_batches=prefetch_batches, batch_size=batch_size, dtypes=dtypes, drop_last=drop_last,
            local_shuffle_buffer_size=local_shuffle_buffer_size, local_shuffle_seed=local_shuffle_seed,
        )

    def to_tf(
        self,
        feature_columns: str | list[str],
        label_columns: str | list[str],
        *,
        additional_columns: str | list[str] | None = None,
        prefetch_batches: int = 1,
        batch_size: int = 1,
        drop_last: bool = False,
        local_shuffle_buffer_size: int | None = None,
        local_shuffle_seed: int | None = None,
        feature_type_spec: Any = None,
        label_type_spec: Any = None,
        additional_type_spec: Any = None,
    ) -> Any:
        """A ``tf.data.Dataset`` of ``(features, labels)`` batches (``(features, labels,
        additional)`` with ``additional_columns``): one tensor per part named by a string, a dict
        of them for a list; type specs from the schema unless given (``dataflow.tf_batches.to_tf``)."""
        return self.iterator().to_tf(
            feature_columns, label_columns, additional_columns=additional_columns,
            prefetch_batches=prefetch_batches, batch_size=batch_size, drop_last=drop_last,
            local_shuffle_buffer_size=local_shuffle_buffer_size, local_shuffle_seed=local_shuffle_seed,
            feature_type_spec=feature_type_spec, label_type_spec=label_type_spec,
            additional_type_spec=additional_type_spec,
        )

    def to_torch_iterable(self, *, batch_size: int | None = 256, **kwargs: Any) -> Any:
        """A ``torch.utils.data.IterableDataset`` of batches, sharded across DataLoader workers and ranks.

        Use it with ``DataLoader(it, batch_size=None, num_workers=k)``; every row is read exactly
        once across all workers and ranks. See ``dataflow.torch_batches.TorchIterableDataset``.
        """
        from dataflow.torch_batches import TorchIterableDataset

        return TorchIterableDataset(self, batch_size=batch_size, **kwargs)

    def iter_rows(self) -> Iterator[dict[str, Any]]:
        return self.iterator().iter_rows()

    def streaming_split(self, n: int, *, equal: bool = False, locality_hints: Any = None) -> list[Any]:
        """``n`` iterators sharing one execution per epoch, e.g. one per training rank.

        The iterators pickle, so they can be sent to other processes. With ``equal=True`` each
        gets exactly ``floor(rows / n)`` rows and the remainder (fewer than ``n`` rows) is
        dropped and reported. A split that reads slower holds the others back by at most one
        block, so memory stays bounded.

        With ``preserve_order=True`` (or right after a sort or a seeded ``random_shuffle``) rows
        are dealt by position instead of to whichever split asks first (``engine.split.OrderedSplitDealer``): each split gets the same rows in the
        same order every epoch, so its ``state_dict`` resumes it exactly.
        """
        from dataflow.split import SplitIterator

        if not isinstance(n, int) or n < 1:
            msg = f"streaming_split needs n >= 1, got {n!r}"
            raise ValueError(msg)
        ctx = DataContext.get_current()
        backend = runner.backend(ctx.execution_options, ctx.execution_mode)
        options = ctx.execution_options
        # the same order every epoch: kept by preserve_order, or made by a sort or a seeded shuffle
        top = self._plan
        ordered = options.preserve_order or (isinstance(top, Exchange) and (top.orders_output or top.ordered_input))
        start: Callable[[], Any] = self._execute
        if ctx.execution_mode == "ray":  # epochs run in the coordinator's actor, with these settings
            from dataflow.split import EpochInAnotherProcess

            start = EpochInAnotherProcess(self._plan, ctx.execution_mode, options)
        # a materialized input's blocks, which a coordinator in another process must be able to read
        inputs = [ref for node in walk(self._plan) if isinstance(node, InputBlocks) for ref in node.refs]
        coordinator = backend.split_coordinator(
            start, n, equal, max_pending_bytes=options.consumer_buffer_bytes, ordered=ordered, inputs=inputs
        )
        schema = self.schema(fetch_if_missing=False)
        return [SplitIterator(coordinator, coordinator.key, coordinator.address, i, n, schema, self.schema)
                for i in range(n)]

    # splitting into materialized parts (dataflow.splitting) ----------------------------------
    def split(self, n: int, *, equal: bool = False, locality_hints: list[Any] | None = None) -> list[MaterializedDataset]:
        """Materialize and split into ``n`` disjoint MaterializedDatasets.

        As Ray Data: ``equal=False`` deals whole blocks, ``n`` runs of consecutive blocks whose
        block counts differ by at most one (a part may be empty when there are fewer blocks
        than ``n``); ``equal=True`` gives each part exactly ``floor(rows / n)`` rows, in order,
        and drops the remainder. ``locality_hints`` (``n`` actors) only has its length checked:
        on one machine every block is local. Parts share the blocks (only a block a cut runs
        through is sliced into new ones).
        """
        from dataflow import splitting

        return splitting.split(self, n, equal=equal, locality_hints=locality_hints)

    def split_at_indices(self, indices: list[int]) -> list[MaterializedDataset]:
        """Materialize and split at the row ``indices`` (sorted, >= 0), as ``np.split``:
        ``len(indices) + 1`` parts; an index past the end gives empty parts."""
        from dataflow import splitting

        return splitting.split_at_indices(self, indices)

    def split_proportionately(self, proportions: list[float]) -> list[MaterializedDataset]:
        """Materialize and split by ``proportions`` (each > 0, summing to less than 1; the last
        part gets the rest): ``len(proportions) + 1`` parts, cut at ``int(rows * cumulative
        proportion)`` and moved so that each has at least one row (ValueError if impossible)."""
        from dataflow import splitting

        return splitting.split_proportionately(self, proportions)

    def train_test_split(
        self, test_size: float, *, shuffle: bool = False, seed: int | None = None, stratify: str | None = None
    ) -> tuple[MaterializedDataset, MaterializedDataset]:
        """Materialize and split into train and test parts.

        ``test_size``: a float in (0, 1), the test fraction (train gets ``int(rows * (1 -
        test_size))`` rows: ``range(8)`` with 0.25 gives 6 and 2), or an int in (0, rows), the
        test rows. ``shuffle=True`` runs ``random_shuffle(seed=seed)`` first. ``stratify``: a
        column; each of its classes is split in the same proportion (its first ``n - int(n *
        fraction)`` rows train), the rows keeping their order; not with ``shuffle``.
        """
        from dataflow import splitting

        return splitting.train_test_split(self, test_size, shuffle=shuffle, seed=seed, stratify=stratify)

    def streaming_train_test_split(
        self,
        test_size: float,
        *,
        split_type: str = "random",
        hash_column: str | None = None,
        seed: int | None = None,
        **ray_remote_kwargs: Any,
    ) -> tuple[Dataset, Dataset]:
        """Lazy train and test datasets: each row goes to test with probability ``test_size``.

        ``split_type="random"``: drawn per row, seeded with ``seed`` (and, per block, with the
        block's first, middle and last rows), so the two datasets, each its own execution, agree
        on every row. ``"hash"``: by the hash of ``hash_column``'s value, as Ray Data (equal
        values on the same side). ``ray_remote_kwargs`` go to ``map_batches`` (``num_cpus``...).
        """
        from dataflow import splitting

        return splitting.streaming_train_test_split(
            self, test_size, split_type=split_type, hash_column=hash_column, seed=seed, **ray_remote_kwargs
        )

    def take(self, limit: int = 20) -> list[dict[str, Any]]:
        """The first ``limit`` rows as dicts."""
        return list(self.limit(limit).iter_rows())

    def take_all(self, limit: int | None = None) -> list[dict[str, Any]]:
        rows = []
        for row in self.iter_rows():
            rows.append(row)
            if limit is not None and len(rows) > limit:
                msg = f"The dataset has more than the given limit of {limit} records."  # Ray's words
                raise ValueError(msg)
        return rows

    def take_batch(self, batch_size: int = 20, *, batch_format: str = "default") -> Any:
        """One batch of up to ``batch_size`` rows."""
        for batch in self.limit(batch_size).iter_batches(batch_size=batch_size, batch_format=batch_format,
                                                         prefetch_batches=0):
            return batch
        msg = "the dataset is empty"
        raise ValueError(msg)

    def count(self) -> int:
        """Rows in the dataset; from metadata (e.g. Parquet footers) when nothing changes the count."""
        runner.reclaim_abandoned(DataContext.get_current().execution_options.spill_dir)  # metadata counts skip _execute
        known = count_from_metadata(optimize(self._plan))
        if known is not None:
            return known
        handle = self._execute(output=OUTPUT_COUNT)
        for ref in handle.iter_refs():
            handle.release(ref)
        self._last_stats = handle.stats()
        progress.settle(handle)  # the summary is out before the call returns
        return handle.row_count()

    def schema(self, fetch_if_missing: bool = True) -> Schema | None:
        """The schema (Ray's ``Schema``; ``.base_schema`` is the ``pyarrow.Schema``). From the
        plan when it tells (a source's schema, what column selections, renames, filters, limits,
        sorts and shuffles make of it), from the first block of a materialized dataset, else by
        running the plan for its first block (with ``fetch_if_missing=False``: None instead, as
        Ray's). A union's is its inputs' schemas unified (int64 and double give double), and a
        filter or limit that leaves no rows has its input's."""
        schema = self._arrow_schema(fetch_if_missing)
        return Schema(schema) if schema is not None else None

    def _arrow_schema(self, fetch_if_missing: bool = True) -> pa.Schema | None:
        if isinstance(self._plan, Union):
            schemas = [self._derive(child)._arrow_schema(fetch_if_missing) for child in self._plan.children]
            known = [schema for schema in schemas if schema is not None]
            return pa.unify_schemas(known, promote_options="permissive") if known else None
        plan = optimize(self._plan)
        if isinstance(plan, Read):
            known = plan.datasource.schema()
            if known is not None:
                return known
        if isinstance(plan, InputBlocks) and not plan.refs:
            return None
        cached = getattr(self, "_cached_schema", None)
        if cached is not None:
            return cached
        if not fetch_if_missing and not isinstance(plan, InputBlocks):
            return _schema_from_plan(self)
        empty = None
        for table in self.limit(1).iterator().iter_blocks():
            if table.num_rows == 0:  # (a header-only CSV file: its columns typed null) a later block says more
                empty = empty or table.schema
                continue
            self._cached_schema = table.schema
            return table.schema
        if empty is not None:
            return empty
        same = _same_schema_input(self._plan)
        if same is not None:
            return self._derive(same)._arrow_schema(fetch_if_missing)
        return _schema_from_plan(self)  # no rows came: a column selection or rename of its input's

    def columns(self, fetch_if_missing: bool = True) -> list[str] | None:
        schema = self._arrow_schema(fetch_if_missing)
        return list(schema.names) if schema is not None else None

    def show(self, limit: int = 20) -> None:
        for row in self.take(limit):
            print(row)  # noqa: T201 - show() prints by definition

    def to_arrow(self) -> pa.Table:
        tables = [t for t in self.iterator().iter_blocks()]
        if not tables:
            schema = self._arrow_schema() if not isinstance(self._plan, InputBlocks) else None
            return schema.empty_table() if schema is not None else pa.table({})
        return concat_blocks(tables)

    def to_pandas(self, limit: int | None = None) -> Any:
        """The rows as one pandas DataFrame, with Ray Data 2.60's dtypes (``pd.ArrowDtype``
        columns unless ``DataContext.enable_arrow_backed_pandas_conversion`` is False; tensor
        columns of numpy arrays; a dataset from pandas gets pandas' dtypes back)."""
        from engine.block_format import table_to_pandas

        if limit is not None and (count := self.count()) > limit:
            msg = (
                f"the dataset has more than the given limit of {limit} rows: {count}. If you are sure "
                f"that a DataFrame with {count} rows will fit in local memory, set "
                "ds.to_pandas(limit=None) to disable limits."
            )
            raise ValueError(msg)
        return table_to_pandas(self.to_arrow(), DataContext.get_current().enable_arrow_backed_pandas_conversion)

    def to_polars(self) -> Any:
        import polars as pl

        return pl.from_arrow(self.to_arrow())

    def to_dask(self, meta: Any = None, verify_meta: bool = True) -> Any:
        """The rows as a Dask DataFrame, one partition per block (``dataflow.dask_interop``):
        the dataset runs once and its blocks are held in this process, so any Dask scheduler
        computes it (Ray requires its own, set globally). ``meta`` overrides the partitions'
        empty frame; ``verify_meta`` has Dask check every partition against it."""
        from dataflow.dask_interop import to_dask

        return to_dask(self, meta, verify_meta)

    def to_numpy(self, column: str | None = None) -> Any:
        from engine.block_format import to_batch

        batch = to_batch(self.to_arrow(), "numpy")
        return batch[column] if column is not None else batch

    def to_random_access_dataset(self, key: str, num_workers: int | None = None) -> RandomAccessDataset:
        """Rows looked up by the value of ``key``: the dataset sorted by it and materialized,
        its blocks mapped once into this process (``dataflow.random_access``).

        ``get_async(k)`` returns a ``concurrent.futures.Future`` of the row (a dict, as ``take``
        gives) or None; call ``.result()`` where Ray's code calls ``ray.get``. ``multiget(keys)``
        returns the rows in the keys' order. Of rows with equal keys, the first in the dataset's
        order is found. ``num_workers`` threads (default 4, Ray's per node) serve the lookups,
        where Ray starts actors. A key column the dataset lacks raises ``ColumnNotFoundError``
        (a ``ValueError``, as Ray's).
        """
        from dataflow.random_access import RandomAccessDataset

        return RandomAccessDataset(self, key, num_workers)

    def materialize(self) -> MaterializedDataset:
        """Run the plan once and keep its blocks; the result can be iterated many times."""
        handle = self._execute()
        refs, owned = [], []
        try:
            for ref in handle.iter_refs():
                if handle.detach(ref):
                    owned.append(ref)
                refs.append(ref)
        except BaseException:  # a failed or interrupted run: what it kept so far is nobody's
            for ref in owned:
                handle.free_detached(ref)
            raise
        self._last_stats = handle.stats()
        progress.settle(handle)  # the summary is out before the call returns
        # blocks passed through from a materialized input stay that dataset's: keep it alive
        inputs = [node.owner for node in walk(self._plan) if isinstance(node, InputBlocks)] if len(owned) < len(refs) else []
        result = MaterializedDataset(refs, handle, self._last_stats, owned=owned, keepalive=inputs)
        result._blocks.sources = input_sources(self._plan)  # for input_files()
        result._dataset_name = self._dataset_name
        return result

    # writing --------------------------------------------------------------------------------
    def write_datasink(
        self, datasink: Any, *, ray_remote_args: dict[str, Any] | None = None, concurrency: int | None = None
    ) -> None:
        """Write every block with ``datasink``: ``write`` on workers, the commit on the driver.

        ``concurrency`` caps the write tasks running at once, and ``ray_remote_args`` gives
        them resources (``num_cpus``, ``memory``...), as Ray's: the writes then run in an
        operator of their own rather than in the tasks of the step before them.
        """
        if ray_remote_args is not None or concurrency is not None:
            if ray_remote_args is not None and not isinstance(ray_remote_args, dict):
                msg = f"ray_remote_args must be a dict, got {type(ray_remote_args).__name__}"
                raise TypeError(msg)
            if getattr(datasink, "min_bytes_per_write", None) or getattr(datasink, "resumes", False):
                msg = ("concurrency and ray_remote_args cannot be combined with min_bytes_per_file or "
                       "mode='resume' yet: those writes run in an operator of their own that would not get them")
                raise ValueError(msg)
            in_given_tasks = getattr(datasink, "write_in_given_tasks", None)
            if in_given_tasks is not None:
                in_given_tasks()  # (a partitioned write's default grouping would run the writes elsewhere)
            node = with_remote_args(builtin_node(self._plan, "WriteTasks", bi.pass_through), "write",
                                    concurrency=concurrency, ray_remote_args=ray_remote_args)
            writing = self._derive(node)
            try:
                writing.write_datasink(datasink)
            finally:
                self._last_stats = getattr(writing, "_last_stats", None)
            return
        _check_reachable(datasink)  # before on_write_start, which may create or clear the folder
        _start_write(datasink, self)
        if getattr(datasink, "skip_write", False):  # SaveMode.IGNORE and the destination exists
            return
        handle = None
        try:
            if getattr(datasink, "resumes", False):  # mode="resume": only the units not committed yet
                from dataflow.compile import default_read_parallelism
                from dataflow.resume import plan_units

                default = default_read_parallelism(DataContext.get_current().execution_options)
                units = plan_units(self._plan, optimize(self._plan), datasink, default)
                handle = self._execute(units, output=OUTPUT_WRITE, sink=datasink, optimized=True)
            else:
                handle = self._execute(output=OUTPUT_WRITE, sink=datasink)
            for ref in handle.iter_refs():
                handle.release(ref)
            self._last_stats = handle.stats()
            progress.settle(handle)  # the summary is out before the call returns
            writes = self._last_stats.operators[-1] if self._last_stats.operators else None
            result = WriteResult(handle.results(), writes.rows_out if writes else 0, writes.bytes_out if writes else 0)
            datasink.on_write_complete(result)  # inside the try, as Ray's: a commit that raises is a failed write
        except BaseException as err:
            if handle is not None:
                handle.wait_stopped(60.0)  # no write task may still be staging files
                progress.settle(handle)  # its summary is out, and the progress thread holds it no more
            datasink.on_write_failed(err)
            raise

    def _write_files(self, sink: Any, try_create_dir: bool, arrow_open_stream_args: dict[str, Any] | None,
                     ray_remote_args: dict[str, Any] | None, concurrency: int | None) -> None:
        """A file sink's write with Ray's arguments common to every ``write_*`` of files."""
        sink.set_output_options(try_create_dir, arrow_open_stream_args)
        self.write_datasink(sink, ray_remote_args=ray_remote_args, concurrency=concurrency)

    def write_parquet(
        self,
        path: str,
        *,
        partition_cols: list[str] | None = None,
        min_rows_per_file: int | None = None,
        max_rows_per_file: int | None = None,
        filesystem: Any = None,
        compression: str = "snappy",
        row_group_size: int | None = None,
        mode: Any = "append",
        filename_provider: Any = None,
        num_rows_per_file: int | None = None,
        min_bytes_per_file: int | None = None,
        arrow_parquet_args_fn: Callable[[], dict[str, Any]] | None = None,
        try_create_dir: bool = True,
        arrow_open_stream_args: dict[str, Any] | None = None,
        ray_remote_args: dict[str, Any] | None = None,
        concurrency: int | None = None,
        **arrow_parquet_args: Any,
    ) -> None:
        """Write Parquet files under ``path`` (a folder, local or ``s3://``), atomically.

        ``partition_cols`` writes hive ``key=value`` folders (those columns are left out of the
        files); ``min_rows_per_file`` groups small blocks so each file holds at least that many
        rows (except the last); ``max_rows_per_file`` caps a file; ``min_bytes_per_file`` groups
        blocks until a file has that many bytes in memory. Files are staged in a hidden folder and
        moved into place only when every write task succeeded; a failed job leaves nothing behind.
        ``mode`` (Ray's ``SaveMode``, APPEND by default) says what to do with an existing folder;
        ``filename_provider`` names the files; ``**arrow_parquet_args`` and
        ``arrow_parquet_args_fn()`` go to ``pyarrow.parquet.write_table``. See
        ``connectors.parquet_format.ParquetDatasink``.
        """
        from connectors.file_datasink import rows_per_file
        from connectors.parquet_format import ParquetDatasink

        ray_api.refuse_catalog("write_parquet", arrow_parquet_args.pop("catalog", None))
        self._write_files(ParquetDatasink(
            path, partition_cols=partition_cols, min_rows_per_file=rows_per_file(num_rows_per_file, min_rows_per_file),
            max_rows_per_file=max_rows_per_file, filesystem=filesystem, compression=compression,
            row_group_size=row_group_size, mode=mode, filename_provider=filename_provider,
            min_bytes_per_file=min_bytes_per_file, arrow_parquet_args=arrow_parquet_args,
            arrow_parquet_args_fn=arrow_parquet_args_fn,
        ), try_create_dir, arrow_open_stream_args, ray_remote_args, concurrency)

    def write_csv(
        self,
        path: str,
        *,
        partition_cols: list[str] | None = None,
        min_rows_per_file: int | None = None,
        max_rows_per_file: int | None = None,
        filesystem: Any = None,
        write_options: Any = None,
        mode: Any = "append",
        filename_provider: Any = None,
        num_rows_per_file: int | None = None,
        try_create_dir: bool = True,
        arrow_open_stream_args: dict[str, Any] | None = None,
        ray_remote_args: dict[str, Any] | None = None,
        concurrency: int | None = None,
        arrow_csv_args_fn: Callable[[], dict[str, Any]] | None = None,
        **arrow_csv_args: Any,
    ) -> None:
        """Write CSV files (with a header) under ``path``, atomically, as ``write_parquet``.

        ``write_options`` is a ``pyarrow.csv.WriteOptions``; as in Ray it may also come from
        ``arrow_csv_args_fn()``, called in each write task (for options that do not pickle).
        """
        from connectors.csv_format import CSVDatasink, check_csv_write_args
        from connectors.file_datasink import rows_per_file

        check_csv_write_args("write_csv()", arrow_csv_args)  # only write_options, named above
        self._write_files(CSVDatasink(
            path, partition_cols=partition_cols, min_rows_per_file=rows_per_file(num_rows_per_file, min_rows_per_file),
            max_rows_per_file=max_rows_per_file, filesystem=filesystem, write_options=write_options,
            mode=mode, filename_provider=filename_provider, arrow_csv_args_fn=arrow_csv_args_fn,
        ), try_create_dir, arrow_open_stream_args, ray_remote_args, concurrency)

    def write_json(
        self,
        path: str,
        *,
        partition_cols: list[str] | None = None,
        min_rows_per_file: int | None = None,
        max_rows_per_file: int | None = None,
        filesystem: Any = None,
        mode: Any = "append",
        filename_provider: Any = None,
        num_rows_per_file: int | None = None,
        try_create_dir: bool = True,
        arrow_open_stream_args: dict[str, Any] | None = None,
        ray_remote_args: dict[str, Any] | None = None,
        concurrency: int | None = None,
        pandas_json_args_fn: Callable[[], dict[str, Any]] | None = None,
        **pandas_json_args: Any,
    ) -> None:
        """Write JSON Lines files (one object per row) under ``path``, atomically, as ``write_parquet``.

        As Ray: ``**pandas_json_args`` (and what ``pandas_json_args_fn()`` returns, called in each
        write task) go to ``pandas.DataFrame.to_json(orient="records", lines=True, ...)``; without
        them dataflow's own encoder writes the same JSON Lines without pandas.
        """
        from connectors.file_datasink import rows_per_file
        from connectors.json_format import JSONDatasink

        self._write_files(JSONDatasink(
            path, partition_cols=partition_cols, min_rows_per_file=rows_per_file(num_rows_per_file, min_rows_per_file),
            max_rows_per_file=max_rows_per_file, filesystem=filesystem, mode=mode, filename_provider=filename_provider,
            pandas_json_args_fn=pandas_json_args_fn, pandas_json_args=pandas_json_args,
        ), try_create_dir, arrow_open_stream_args, ray_remote_args, concurrency)

    def write_lance(
        self,
        path: str,
        *,
        schema: pa.Schema | None = None,
        mode: str = "create",
        min_rows_per_file: int = 1024 * 1024,
        max_rows_per_file: int = 64 * 1024 * 1024,
        data_storage_version: str | None = None,
        storage_options: dict[str, str] | None = None,
        table_id: list[str] | None = None,
        namespace_impl: str | None = None,
        namespace_properties: dict[str, str] | None = None,
        ray_remote_args: dict[str, Any] | None = None,
        concurrency: int | None = None,
    ) -> None:
        """Write a Lance dataset (needs the ``lance`` extra): tasks write fragments, one commit at the end.

        ``mode``: ``"create"``, ``"append"`` or ``"overwrite"``. A failed job commits nothing, so
        the dataset keeps its versions and rows. With ``table_id`` and ``namespace_impl`` (and
        ``namespace_properties``), as in Ray, the table is declared in that Lance namespace, which
        gives its location (``path`` is ignored) and storage options; only ``mode="create"``
        then. See ``connectors.lance_format.LanceDatasink``.
        """
        from connectors.lance_format import LanceDatasink

        self.write_datasink(LanceDatasink(
            path, schema=schema, mode=mode, min_rows_per_file=min_rows_per_file, max_rows_per_file=max_rows_per_file,
            data_storage_version=data_storage_version, storage_options=storage_options, table_id=table_id,
            namespace_impl=namespace_impl, namespace_properties=namespace_properties,
        ), ray_remote_args=ray_remote_args, concurrency=concurrency)

    def write_delta(
        self,
        path: str,
        *,
        mode: Any = "append",
        partition_by: list[str] | None = None,
        partition_cols: list[str] | None = None,
        storage_options: dict[str, str] | None = None,
        filesystem: Any = None,
        name: str | None = None,
        description: str | None = None,
        min_rows_per_file: int | None = None,
        max_rows_per_file: int | None = None,
        ray_remote_args: dict[str, Any] | None = None,
        concurrency: int | None = None,
        catalog: Any = None,
        schema_mode: str = "merge",
    ) -> None:
        """Write a Delta Lake table (needs the ``delta`` extra): Parquet files, one Delta commit at the end.

        ``mode``: ``"append"`` (creates the table when missing), ``"overwrite"``, ``"error"`` or
        ``"ignore"`` (strings or ``SaveMode``). ``partition_by`` (or ``partition_cols``, as
        ``write_parquet`` calls it) partitions a new table. ``schema_mode`` (Ray's): an append
        with a column the table lacks adds it (``"merge"``) or fails (``"error"``). A failed job
        leaves the table as it was. See ``connectors.delta_format.DeltaDatasink``.
        """
        from connectors.delta_format import DeltaDatasink

        ray_api.refuse_catalog("write_delta", catalog)
        if partition_by is not None and partition_cols is not None and list(partition_by) != list(partition_cols):
            raise ValueError("pass partition_by or partition_cols, not both")
        self.write_datasink(DeltaDatasink(
            path, mode=mode, partition_by=partition_by if partition_by is not None else partition_cols,
            storage_options=storage_options, filesystem=filesystem, name=name, description=description,
            min_rows_per_file=min_rows_per_file, max_rows_per_file=max_rows_per_file, schema_mode=schema_mode,
        ), ray_remote_args=ray_remote_args, concurrency=concurrency)

    def write_iceberg(
        self,
        table_identifier: str,
        catalog_kwargs: dict[str, Any] | None = None,
        snapshot_properties: dict[str, str] | None = None,
        mode: Any = "append",
        overwrite_filter: Any = None,
        upsert_kwargs: dict[str, Any] | None = None,
        overwrite_kwargs: dict[str, Any] | None = None,
        ray_remote_args: dict[str, Any] | None = None,
        concurrency: int | None = None,
        catalog: Any = None,
    ) -> None:
        """Write to an existing Iceberg table (needs the ``iceberg`` extra): data files, one commit at the end.

        ``mode``: ``"append"``, ``"overwrite"`` (deletes the rows matching ``overwrite_filter``,
        all by default, in the same commit) or ``"upsert"`` (``SaveMode.UPSERT``: the table's rows
        whose ``upsert_kwargs["join_cols"]`` match a written row are replaced by it, the others
        added, in one commit). ``upsert_kwargs`` / ``overwrite_kwargs`` also take Ray's
        ``case_sensitive`` and ``branch``. See ``connectors.iceberg_format.IcebergDatasink``.
        """
        from connectors.iceberg_format import IcebergDatasink

        ray_api.refuse_catalog("write_iceberg", catalog)
        self.write_datasink(IcebergDatasink(
            table_identifier, catalog_kwargs=catalog_kwargs, snapshot_properties=snapshot_properties, mode=mode,
            overwrite_filter=overwrite_filter, upsert_kwargs=upsert_kwargs, overwrite_kwargs=overwrite_kwargs,
        ), ray_remote_args=ray_remote_args, concurrency=concurrency)

    def write_orc(
        self,
        path: str,
        *,
        filesystem: Any = None,
        min_rows_per_file: int | None = None,
        max_rows_per_file: int | None = None,
        mode: Any = "append",
        filename_provider: Any = None,
        num_rows_per_file: int | None = None,
        arrow_orc_args_fn: Callable[[], dict[str, Any]] | None = None,
        try_create_dir: bool = True,
        arrow_open_stream_args: dict[str, Any] | None = None,
        ray_remote_args: dict[str, Any] | None = None,
        concurrency: int | None = None,
        **arrow_orc_args: Any,
    ) -> None:
        """Write ORC files under ``path``, atomically, as ``write_parquet``.

        ``arrow_orc_args`` (``compression="zstd"``, ``stripe_size``...) and what
        ``arrow_orc_args_fn()`` returns go to ``pyarrow.orc.write_table``. See
        ``connectors.orc_format.ORCDatasink``.
        """
        from connectors.file_datasink import rows_per_file
        from connectors.orc_format import ORCDatasink

        self._write_files(ORCDatasink(
            path, filesystem=filesystem, min_rows_per_file=rows_per_file(num_rows_per_file, min_rows_per_file),
            max_rows_per_file=max_rows_per_file, mode=mode, filename_provider=filename_provider,
            arrow_orc_args_fn=arrow_orc_args_fn, **arrow_orc_args,
        ), try_create_dir, arrow_open_stream_args, ray_remote_args, concurrency)

    def write_numpy(
        self,
        path: str,
        *,
        column: str,
        filesystem: Any = None,
        min_rows_per_file: int | None = None,
        max_rows_per_file: int | None = None,
        mode: Any = "append",
        filename_provider: Any = None,
        num_rows_per_file: int | None = None,
        try_create_dir: bool = True,
        arrow_open_stream_args: dict[str, Any] | None = None,
        ray_remote_args: dict[str, Any] | None = None,
        concurrency: int | None = None,
    ) -> None:
        """Write ``column`` as ``.npy`` files under ``path``, one per write task, atomically.

        Tensor columns become ``(n, ...)`` arrays; ``mode`` and ``filename_provider`` as for
        ``write_parquet``. See ``connectors.numpy_format.NumpyDatasink``.
        """
        from connectors.file_datasink import rows_per_file
        from connectors.numpy_format import NumpyDatasink

        self._write_files(NumpyDatasink(
            path, column=column, filesystem=filesystem, min_rows_per_file=rows_per_file(num_rows_per_file, min_rows_per_file),
            max_rows_per_file=max_rows_per_file, mode=mode, filename_provider=filename_provider,
        ), try_create_dir, arrow_open_stream_args, ray_remote_args, concurrency)

    def write_images(
        self,
        path: str,
        column: str,
        file_format: str = "png",
        *,
        filesystem: Any = None,
        mode: Any = "append",
        filename_provider: Any = None,
        try_create_dir: bool = True,
        arrow_open_stream_args: dict[str, Any] | None = None,
        ray_remote_args: dict[str, Any] | None = None,
        concurrency: int | None = None,
    ) -> None:
        """Write one image file per row of ``column`` (``uint8`` arrays) under ``path``, atomically.

        ``file_format`` is any format Pillow writes (``png``, ``jpg``...). Needs Pillow.
        """
        from connectors.image_format import ImageDatasink

        self._write_files(ImageDatasink(
            path, column=column, file_format=file_format, filesystem=filesystem, mode=mode,
            filename_provider=filename_provider,
        ), try_create_dir, arrow_open_stream_args, ray_remote_args, concurrency)

    def write_sql(
        self,
        sql: str,
        connection_factory: Callable[[], Any],
        *,
        ray_remote_args: dict[str, Any] | None = None,
        concurrency: int | None = None,
    ) -> None:
        """Insert every row with ``sql`` (``INSERT ... VALUES (?, ?)``, one placeholder per column).

        Each write task runs ``executemany`` on its own connection and commits once; see
        ``connectors.sql.SQLDatasink``.
        """
        from connectors.sql import SQLDatasink

        self.write_datasink(SQLDatasink(sql, connection_factory), ray_remote_args=ray_remote_args, concurrency=concurrency)

    def write_webdataset(
        self,
        path: str,
        *,
        filesystem: Any = None,
        min_rows_per_file: int | None = None,
        max_rows_per_file: int | None = None,
        encoder: Any = True,
        try_create_dir: bool = True,
        arrow_open_stream_args: dict[str, Any] | None = None,
        ray_remote_args: dict[str, Any] | None = None,
        concurrency: int | None = None,
        **file_options: Any,
    ) -> None:
        """Write WebDataset ``.tar`` shards under ``path``, one sample per row, atomically.

        A row's ``__key__`` names its members (``<key>.<column>``); ``encoder`` (as Ray Data's:
        True encodes by each column's extension, ``jpg``/``png`` arrays as images, ``json``, ``npy``,
        ``txt``, ``cls``...; a callable or list; False/None: bytes and strings as they are).
        ``file_options`` are the file sinks' others (``mode``...). See
        ``connectors.webdataset_format.WebDatasetDatasink``.
        """
        from connectors.file_datasink import rows_per_file
        from connectors.webdataset_format import WebDatasetDatasink

        min_rows = rows_per_file(file_options.pop("num_rows_per_file", None), min_rows_per_file)
        self._write_files(WebDatasetDatasink(
            path, encoder=encoder, filesystem=filesystem, min_rows_per_file=min_rows,
            max_rows_per_file=max_rows_per_file, **file_options,
        ), try_create_dir, arrow_open_stream_args, ray_remote_args, concurrency)

    def write_tfrecords(
        self,
        path: str,
        *,
        tf_schema: Any = None,
        filesystem: Any = None,
        min_rows_per_file: int | None = None,
        max_rows_per_file: int | None = None,
        compression: str | None = None,
        try_create_dir: bool = True,
        arrow_open_stream_args: dict[str, Any] | None = None,
        ray_remote_args: dict[str, Any] | None = None,
        concurrency: int | None = None,
        **file_options: Any,
    ) -> None:
        """Write ``tf.train.Example`` records (one per row) in ``.tfrecords`` files under ``path``, atomically.

        Ints and bools become ``int64_list``, floats ``float_list``, bytes and strings
        ``bytes_list``, list and tensor columns lists of those. ``compression="gzip"`` (or
        ``arrow_open_stream_args={"compression": "gzip"}``, as Ray) writes ``.tfrecords.gz``.
        TensorFlow is not needed. See ``connectors.tfrecords_format.TFRecordDatasink``.
        """
        from connectors.file_datasink import rows_per_file
        from connectors.tfrecords_format import TFRecordDatasink

        open_args = dict(arrow_open_stream_args or {})
        compression = compression or open_args.pop("compression", None)  # the sink compresses itself
        min_rows = rows_per_file(file_options.pop("num_rows_per_file", None), min_rows_per_file)
        self._write_files(TFRecordDatasink(
            path, tf_schema=tf_schema, compression=compression, filesystem=filesystem,
            min_rows_per_file=min_rows, max_rows_per_file=max_rows_per_file, **file_options,
        ), try_create_dir, open_args, ray_remote_args, concurrency)

    # aggregates -----------------------------------------------------------------------------
    def groupby(self, key: str | list[str] | None, num_partitions: int | None = None) -> GroupedData:
        """Rows grouped by ``key`` (a column or several; None: one group of all rows).
        ``num_partitions``: how many reduce tasks (and output blocks) the groups are hashed
        into; by default as many as the data's size asks for.

        As Ray: a key column missing from a schema known without running is an error here, at
        the call (``ValueError``, also a ``KeyError``); otherwise when the plan runs."""
        keys = [key] if isinstance(key, str) else key
        if key is not None and not (isinstance(keys, (list, tuple)) and all(isinstance(k, str) for k in keys)):
            msg = f"Key must be a string or a list of strings, but got {key!r}."  # (Ray's ValueError)
            raise ValueError(msg)
        if key is not None:
            schema = self.schema(fetch_if_missing=False)
            names = schema.names if schema is not None else []
            for column in [key] if isinstance(key, str) else list(key):
                if names and column not in names:
                    msg = (f"You specified the column '{column}', but there's no such column in the dataset. "
                           f"The dataset has columns: {names}")
                    raise ColumnNotFoundError(msg)
        return GroupedData(self, key, num_partitions)

    def aggregate(self, *aggs: AggregateFnV2) -> dict[str, Any] | None:
        """Each aggregation over the whole dataset, as ``{name: value}`` (Ray's ``aggregate``)."""
        rows = self._derive(aggregate_node(self._plan, (), aggs)).take_all()
        if not rows:  # an empty dataset: what each aggregation gives for no rows
            return {agg.name: (0 if isinstance(agg, Count) else None) for agg in unique_names(aggs)}
        return rows[0]

    def _column_aggs(self, make: Callable[[str], AggregateFnV2], on: str | list[str] | None) -> Any:
        if on is None:
            columns = self.columns() or []
        else:
            columns = [on] if isinstance(on, str) else list(on)
        result = self.aggregate(*(make(c) for c in columns))
        if result is not None and len(result) == 1:  # one column, however named: its value, as Ray
            return next(iter(result.values()))
        return result

    def sum(self, on: str | list[str] | None = None, ignore_nulls: bool = True) -> Any:
        """The sum of a column (a value), or of several (a dict ``{"sum(c)": ...}``; one column
        however asked for, ``on=None`` included: its value, as Ray)."""
        return self._column_aggs(lambda c: Sum(c, ignore_nulls=ignore_nulls), on)

    def min(self, on: str | list[str] | None = None, ignore_nulls: bool = True) -> Any:
        return self._column_aggs(lambda c: Min(c, ignore_nulls=ignore_nulls), on)

    def max(self, on: str | list[str] | None = None, ignore_nulls: bool = True) -> Any:
        return self._column_aggs(lambda c: Max(c, ignore_nulls=ignore_nulls), on)

    def mean(self, on: str | list[str] | None = None, ignore_nulls: bool = True) -> Any:
        return self._column_aggs(lambda c: Mean(c, ignore_nulls=ignore_nulls), on)

    def std(self, on: str | list[str] | None = None, ddof: int = 1, ignore_nulls: bool = True) -> Any:
        """Standard deviation (sample, ``ddof=1``, as Ray Data)."""
        return self._column_aggs(lambda c: Std(c, ddof=ddof, ignore_nulls=ignore_nulls), on)

    def summary(
        self, columns: list[str] | None = None, override_dtype_agg_mapping: dict[Any, Any] | None = None
    ) -> DatasetSummary:
        """Statistics of each column, chosen by its type as Ray 2.60's (count, mean, min, max,
        std, approx_quantile[0] (the median), missing and zero percentages, approx_topk[0..9]):
        ``.to_pandas()`` to see them, ``.get_column_stats(name)`` for one column
        (``dataflow.summary``). ``override_dtype_agg_mapping``: ``{DataType.int64(): lambda col:
        [Sum(on=col)]}`` picks the aggregations of the columns of a type (a pyarrow type, or a
        type category such as ``"temporal"``, also works)."""
        from dataflow.summary import summarize

        return summarize(self, columns, override_dtype_agg_mapping)

    def unique(self, column: str, ignore_nulls: bool = False) -> list[Any]:
        """The distinct values of ``column``, null among them unless ``ignore_nulls=True``.
        Lists, structs and maps (which Arrow cannot group by) are compared as whole values."""
        from dataflow.aggregate import Unique

        selected = self.select_columns([column])
        known = selected._arrow_schema(fetch_if_missing=False)
        nested = known is not None and column in known.names and pa.types.is_nested(known.field(column).type)
        if not nested:
            try:
                rows = selected.groupby(column).count().take_all()
            except pa.ArrowNotImplementedError as err:  # a key Arrow cannot group by, seen only now
                if known is not None or "Keys of type" not in str(err):
                    raise
            else:
                values = [r[column] for r in rows]
                return [v for v in values if v is not None] if ignore_nulls else values
        return selected.aggregate(Unique(column, ignore_nulls, alias_name="unique"))["unique"]

    # introspection --------------------------------------------------------------------------
    @overload
    def stats(self, format: Literal["text"] = "text") -> str: ...

    @overload
    def stats(self, format: Literal["dict"]) -> dict[str, Any]: ...

    def stats(self, format: str = "text") -> str | dict[str, Any]:
        """Per-operator time, rows, bytes, tasks and why each operator waited (last execution).

        ``format="dict"``: the same as plain data for programs (``json.dumps`` takes it):
        ``dataset``, ``wall_s``, ``operators`` (one dict each), ``long_running``. Before the
        first execution: ``""`` (as Ray's) and ``{}``."""
        if format not in ("text", "dict"):
            msg = f"format must be 'text' or 'dict', got {format!r}"
            raise ValueError(msg)
        handle = getattr(self, "_last_handle", None)
        if handle is not None:
            self._last_stats = handle.stats()
        if format == "dict":
            return {} if self._last_stats is None else {"dataset": self._dataset_name, **self._last_stats.to_dict()}
        if self._last_stats is None:
            return ""  # as Ray's: nothing has run yet
        heading = f"Dataset {self._dataset_name}:\n" if self._dataset_name else ""
        return heading + str(self._last_stats)

    @property
    def name(self) -> str | None:
        """The name given with ``set_name`` (None if none)."""
        return self._dataset_name

    @property
    def context(self) -> DataContext:
        """The ``DataContext`` this dataset runs with: the current one. dataflow reads its
        settings when a dataset runs, not when it is made (Ray snapshots one per dataset), so a
        setting changed here applies to every dataset run after the change."""
        return DataContext.get_current()

    def set_name(self, name: str | None) -> None:
        """Name this dataset (and what is derived from it from now on); ``stats()`` shows it."""
        self._dataset_name = name

    def has_serializable_lineage(self) -> bool:
        """Whether ``serialize_lineage`` can save this dataset: its plan reads only from outside
        this process (``read_*``, ``range``), not from blocks held here (``from_*``,
        ``materialize()``, ``split`` parts), as Ray's."""
        return not any(isinstance(node, InputBlocks) for node in walk(self._plan))

    def serialize_lineage(self) -> bytes:
        """The plan as bytes, with no data, to rebuild the dataset elsewhere (another process
        or machine) with ``Dataset.deserialize_lineage``; it then runs from its sources again.
        Functions are pickled by value (cloudpickle). Raises ``ValueError`` when the plan reads
        blocks held in this process (see ``has_serializable_lineage``)."""
        import cloudpickle

        if not self.has_serializable_lineage():
            msg = (
                "Lineage-based serialization is not supported for this dataset: its plan reads "
                "blocks held in this process (from a from_*() call, materialize() or split()), which "
                "will not exist where it is deserialized. Only datasets read with the read_*() APIs "
                "(and range()) support it. Write the data to persistent storage with a write_*() "
                "method and serialize a dataset that reads it back."
            )
            raise ValueError(msg)
        lineage = Dataset(self._plan)
        lineage._dataset_name = self._dataset_name
        return cloudpickle.dumps(lineage)

    @staticmethod
    def deserialize_lineage(serialized_ds: bytes) -> Dataset:
        """The dataset ``serialize_lineage`` saved (nothing runs until it is consumed)."""
        import pickle

        ds = pickle.loads(serialized_ds)
        if not isinstance(ds, Dataset):
            raise TypeError(f"the bytes hold a {type(ds).__name__}, not a Dataset saved by serialize_lineage()")
        return ds

    @staticmethod
    def copy(ds: Dataset, _deep_copy: bool = False, _as: type | None = None) -> Dataset:
        """Another Dataset object for the same plan, as Ray's ``Dataset.copy(ds)`` (a static
        method): for a materialized dataset, another one sharing its blocks. Plans are
        immutable, so ``_deep_copy`` changes nothing; ``_as`` is a class ``ds`` is an instance of."""
        cls = _as or type(ds)
        if not isinstance(ds, cls):
            msg = f"copy(_as=...) must be a class the dataset is an instance of, got {cls.__name__} for {type(ds).__name__}"
            raise TypeError(msg)
        twin = cls.__new__(cls)
        twin.__dict__.update(ds.__dict__)
        twin._uuid = None  # another Dataset object: another id
        return twin

    def get_dataset_id(self) -> str:
        """A unique ID, as Ray's: the name (``"dataset"`` without one), a UUID of this Dataset
        object and how many times it has run."""
        if self._uuid is None:
            self._uuid = uuid.uuid4().hex
        return f"{self._dataset_name or 'dataset'}_{self._uuid}_{self._run_index}"

    def num_blocks(self) -> int:
        """Only a MaterializedDataset knows its blocks (as in Ray Data): NotImplementedError."""
        msg = (
            "the number of blocks is only known for a MaterializedDataset, because it may change "
            "during execution; call ds.materialize() to get one"
        )
        raise NotImplementedError(msg)

    def size_bytes(self) -> int:
        """Bytes of the dataset's blocks in memory (runs the plan unless it is materialized)."""
        if isinstance(self._plan, InputBlocks):
            return sum(ref.size_bytes for ref in self._plan.refs)
        handle = self._execute()
        total = 0
        for ref in handle.iter_refs():
            total += ref.size_bytes
            handle.release(ref)
        self._last_stats = handle.stats()
        progress.settle(handle)  # the summary is out before the call returns
        return total

    def input_files(self) -> list[str]:
        """The files the dataset's rows are read from (also after ``materialize()``); [] if none."""
        from dataflow.sources import input_files

        return input_files(self._plan)

    def __getattr__(self, name: str) -> Any:
        # only reached for a name the dataset lacks: say so when it is one of Ray Data's
        raise ray_api.attribute_error(self, name, ray_api.RAY_DATASET_API)

    def explain(self) -> str:
        """The logical plan, and the plan after optimization (fused maps, pushdowns)."""
        text = f"-------- Logical Plan --------\n{explain(self._plan)}\n"
        text += f"-------- Optimized Plan --------\n{explain(optimize(self._plan))}"
        print(text)  # noqa: T201 - explain() prints, as in Ray Data
        return text

    def __bool__(self) -> bool:
        return True  # (not ``__len__``, which raises)

    def __len__(self) -> int:
        msg = "Use `ds.count()` to compute the length of a distributed Dataset. This may be an expensive operation."
        raise AttributeError(msg)  # Ray's type and words: len() would run the whole plan

    def __iter__(self) -> Iterator[Any]:
        msg = ("`Dataset` objects aren't iterable. To iterate records, call `ds.iter_rows()` or "
               "`ds.iter_batches()`.")
        raise TypeError(msg)

    def __repr__(self) -> str:
        """Ray 2.60's: a table of the columns (and rows, when materialized) where the schema
        is known without running anything, else the steps above the source (``dataset_repr``)."""
        from dataflow.dataset_repr import dataset_repr

        return dataset_repr(self)

    def __str__(self) -> str:
        return repr(self)


class _Blocks:
    """Owns a materialized dataset's blocks; frees them when the dataset is collected.

    ``owned`` are the blocks its execution produced; the others belong to the materialized
    datasets it read (``keepalive``), which stay alive as long as this one does.
    """

    sources: tuple[Any, ...] = ()
    """The datasources the blocks were read from (``Dataset.input_files``; set by ``materialize``)."""

    def __init__(self, refs: list[Any], handle: ExecutionHandle | HeldBlocks, owned: list[Any], keepalive: list[Any]) -> None:
        self.refs = refs
        self._keepalive = keepalive
        self._handle = handle
        weakref.finalize(self, _release_all, handle, list(owned))

    def __getstate__(self) -> dict[str, Any]:
        # a plan sent to another process (the Ray runner's split coordinator) carries its blocks'
        # refs, not the handle of the execution that made them (locks, sockets)
        return {**self.__dict__, "_handle": None}

    def check_alive(self) -> None:
        """Raise if the session that held these blocks has ended (``dataflow.shutdown()``)."""
        for blocks in self._keepalive:  # (the materialized datasets these blocks came from)
            blocks.check_alive()
        if self._handle is not None and not self._handle.blocks_alive:
            msg = ("this materialized dataset's blocks were in a session that dataflow.shutdown() ended: "
                   "materialize() it again in the new session")
            raise DataflowError(msg)


def _release_all(handle: ExecutionHandle | HeldBlocks, refs: list[Any]) -> None:
    try:
        for ref in refs:
            handle.free_detached(ref)
    except Exception:  # the backend may already be gone at interpreter exit
        pass


class MaterializedDataset(Dataset):
    """A dataset whose blocks are computed and held; iterating it does not recompute."""

    def __init__(
        self,
        refs: list[Any],
        handle: ExecutionHandle | HeldBlocks,
        stats: ExecutionStats | None,
        owned: list[Any] | None = None,
        keepalive: list[Any] | None = None,
    ) -> None:
        self._blocks = _Blocks(refs, handle, refs if owned is None else owned, keepalive or [])
        super().__init__(InputBlocks(tuple(refs), self._blocks))
        self._last_stats = stats

    def num_blocks(self) -> int:
        return len(self._blocks.refs)


__all__ = ["Dataset", "MapStages", "MaterializedDataset"]


def _start_write(sink: Any, ds: Dataset) -> None:
    """``sink.on_write_start``, given the rows' schema when it is known without running
    anything, as Ray 2.60 passes it; a sink written for earlier versions takes no argument."""
    try:
        params = [p for p in inspect.signature(sink.on_write_start).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    except (TypeError, ValueError):  # no signature to read (a builtin): call it as Ray does
        params = [None]
    if params:
        sink.on_write_start(ds._arrow_schema(fetch_if_missing=False))
    else:
        sink.on_write_start()


def _check_pinned_reads(plan: LogicalNode, backend: Any) -> None:
    """On a multi-node cluster, refuse a source whose reads must all run on the driver's node
    (``supports_distributed_reads`` False): the Ray runner does not pin tasks to a node."""
    if not getattr(backend, "multi_node", lambda: False)():
        return
    for node in walk(plan):
        source = getattr(node, "datasource", None)
        if source is not None and not getattr(source, "supports_distributed_reads", True):
            msg = (f"{source.get_name()} has supports_distributed_reads=False, and dataflow's Ray runner "
                   "does not pin read tasks to the driver's node: on a cluster of several nodes, read "
                   "with a source whose reads may run anywhere")
            raise ValueError(msg)


def _check_reachable(sink: Any) -> None:
    """On a multi-node cluster, refuse a sink that would write to each node's own disk, or
    whose writes must all run on the driver's node (``supports_distributed_writes`` False)."""
    ctx = DataContext.get_current()
    pinned = not getattr(sink, "supports_distributed_writes", True)
    if ctx.execution_mode != "ray" or not (getattr(sink, "writes_local_files", False) or pinned):
        return  # only the Ray runner spans nodes: nothing to start or check on one machine
    backend = runner.backend(ctx.execution_options, ctx.execution_mode)
    if pinned and getattr(backend, "multi_node", lambda: False)():
        msg = (f"{sink.get_name()} has supports_distributed_writes=False, and dataflow's Ray runner "
               "does not pin write tasks to the driver's node: on a cluster of several nodes, write "
               "from a sink whose writes may run anywhere")
        raise ValueError(msg)
    if not getattr(sink, "writes_local_files", False):
        return
    if getattr(backend, "multi_node", lambda: False)() and not _on_shared_path(sink.local_root, ctx.shared_filesystem_paths):
        msg = (f"this Ray cluster has several nodes: write to storage they all reach (s3://..., or a "
               f"folder every node mounts, declared in DataContext.shared_filesystem_paths or "
               f"DATAFLOW_SHARED_PATHS), not to a local path ({sink.local_root})")
        raise ValueError(msg)


def _on_shared_path(path: str, shared: tuple[str, ...]) -> bool:
    """Whether local ``path`` lies in one of the ``shared`` folders (every node mounts them)."""
    real = os.path.realpath(path)
    for folder in shared:
        base = os.path.realpath(folder)
        if real == base or real.startswith(base.rstrip(os.sep) + os.sep):
            return True
    return False


def _schema_from_plan(ds: Dataset) -> pa.Schema | None:
    """The schema the plan's nodes tell without running anything: the input's through steps
    that keep the columns (filters, limits, sorts, shuffles), and dataflow's own column steps
    (select, drop, rename, expression filters) applied to an empty table of it."""
    node = ds._plan
    same = _same_schema_input(node)
    if same is not None:
        return ds._derive(same)._arrow_schema(fetch_if_missing=False)
    if isinstance(node, Exchange) and _is_builtin_aggregation(node):
        steps = [lambda t: node.partitioners[0].assign(t, 0)[0], lambda t: next(iter(node.reducer([[t]], 0)))]
    elif isinstance(node, MapStages) and all(_schema_only(s.fn) for s in node.stages):
        steps = [stage.fn for stage in node.stages]
    else:
        return None
    schema = ds._derive(node.inputs[0])._arrow_schema(fetch_if_missing=False)
    if schema is None:
        return None
    table = schema.empty_table()
    try:
        for step in steps:
            table = step(table)
    except Exception:  # a missing column: the run raises it, naming the column
        return None
    return table.schema


def _is_builtin_aggregation(node: Exchange) -> bool:
    """A groupby of built-in aggregations, whose output types its steps give on no rows."""
    return (len(node.children) == 1 and isinstance(node.reducer, AggregateReducer) and node.reducer.partial
            and bool(node.partitioners) and isinstance(node.partitioners[0], PartialAggPartitioner))


_SCHEMA_ONLY_STEPS = (bi.SelectColumns, bi.DropColumns, bi.RenameColumns, bi.FilterExpression, bi.RangeTensor)
_PLAIN_EXPRESSIONS = (ex.ColumnExpr, ex.LiteralExpr, ex.BinaryExpr, ex.UnaryExpr, ex.AliasExpr, ex.CastExpr,
                      ex.FunctionExpr, ex.UnnestExpr)


def _schema_only(step: Any) -> bool:
    """Whether ``step`` may run on an empty table to tell its output's schema: a column step,
    or expressions of Arrow kernels only (not a UDF's, which would be called on no rows)."""
    if isinstance(step, _SCHEMA_ONLY_STEPS):
        return True
    if isinstance(step, ex.WithColumns):
        exprs = [expr for _, expr in step.items]
    elif isinstance(step, ex.FilterExpr):
        exprs = [step.expr]
    else:
        return False
    return all(isinstance(node, _PLAIN_EXPRESSIONS) for expr in exprs for node in expr._walk())


def _same_schema_input(node: LogicalNode) -> LogicalNode | None:
    """The input whose schema ``node``'s output has, when ``node`` only drops or reorders rows
    (a filter, a limit, a sort or shuffle); None when it may change the columns."""
    if isinstance(node, Limit):
        return node.input
    if isinstance(node, MapStages) and (
        node.filter_expr is not None or all(s.kind == "rows" and s.row_mode == "filter" for s in node.stages)
    ):
        return node.input
    if isinstance(node, Exchange) and node.preserves_rows and len(node.children) == 1:
        return node.children[0]
    return None

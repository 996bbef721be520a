"""Logical plan -> engine operators, through one table of build functions.

Each node becomes one operator; what is fused was decided by the optimizer (``can_fuse``),
never here, but for exchanges straight over a read, whose choice depends on the execution's
options and the source: a small one runs whole in the one task that reads
(``_whole_in_one_read``), a sort samples a key-only read, then partitions as it reads
(``_sampled_read``), a join, groupby, top-k or shuffle partitions as it reads
(``_partitioned_read``), and a hash or top-k exchange after map steps partitions in their tasks
(``_partitioned_map``). A ``FusedRead`` becomes one MapOperator whose tasks read and transform
in one go (``source=`` read tasks); a bare ``Read`` only reads; a ``MapStages`` reads its
upstream's blocks.
The last operator can count rows instead of producing blocks (``count()``), or write them to a
Datasink (``write_*``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from connectors.base import planning
from dataflow import plan
from dataflow.expressions import FilterExpr, WithColumns
from dataflow.plan import Exchange, FusedRead, InputBlocks, Limit, LogicalNode, MapStages, Mix, Read, Union
from dataflow.random_seed import StepSeed, compiling
from dataflow.shuffle import RandomSample
from engine.exchange import MappedPartitionTransform, PartitionTransform, ReduceTransform, WholeExchangeTransform
from engine.operators.base import PhysicalOperator
from engine.operators.exchange import (
    MERGE_FAN_IN,
    PartitionOperator,
    PositionedReadPartitionOperator,
    ReduceOperator,
    SampledReadPartitionOperator,
)
from engine.operators.input import InputOperator
from engine.operators.limit import LimitOperator
from engine.operators.map import ActorPoolSpec, MapOperator, Resources
from engine.operators.mix import MixOperator
from engine.operators.union import UnionOperator
from engine.options import ExecutionOptions
from engine.task import OUTPUT_BLOCKS, OUTPUT_PARTITIONS, ReadAll
from engine.transform import BlockTransform, Stage


class _Compiler:
    def __init__(self, options: ExecutionOptions) -> None:
        self.options = options
        self.ops: list[PhysicalOperator] = []
        self.ordering: set[int] = set()
        """Operators whose output order is the result (a sort's reduce)."""
        self._estimates: dict[int, int | None] = {}

    def estimate(self, datasource: Any) -> int | None:
        """The source's decoded size, asked once (a Parquet source reads a footer for it)."""
        key = id(datasource)
        if key not in self._estimates:
            self._estimates[key] = datasource.estimate_inmemory_data_size()
        return self._estimates[key]

    def add(self, op: PhysicalOperator) -> PhysicalOperator:
        if isinstance(op, MapOperator):
            op.max_task_output_bytes = self.options.target_max_block_size
        self.ops.append(op)
        return op

    def transform(self, stages: tuple[Any, ...] | list[Any]) -> BlockTransform:
        return BlockTransform([_bound(stage) for stage in stages], self.options.target_max_block_size)

    def bundle_bytes(self, datasource: Any) -> int:
        """Small reads are bundled, but never into fewer than ~2 tasks per worker."""
        total = self.estimate(datasource)
        target = self.options.min_task_input_bytes
        if total:
            target = min(target, max(1, total // (2 * self.options.resolved_num_cpus())))
        return target

    def build(self, node: LogicalNode) -> PhysicalOperator:
        return BUILDERS[type(node)](self, node)


def _bound(stage: Stage) -> Stage:
    """``stage`` for one execution: an expression step gets its copy for the execution (a
    ``random()`` in it draws new values in each execution)."""
    if isinstance(stage.fn, (WithColumns, FilterExpr, RandomSample)):
        return dataclasses.replace(stage, fn=stage.fn.for_execution())
    return stage


def _read(c: _Compiler, node: Read) -> PhysicalOperator:
    return _read_with(c, node, None)


def _fused_read(c: _Compiler, node: FusedRead) -> PhysicalOperator:
    return _read_with(c, node.read, node.maps)


def default_read_parallelism(options: ExecutionOptions) -> int:
    """As Ray: at least 200 read tasks or 2 per CPU (sources merge tasks smaller than they like)."""
    return max(200, 2 * options.resolved_num_cpus())


def _read_tasks(c: _Compiler, node: Read, datasource: Any = None) -> Any:
    """``node``'s read tasks (of ``datasource``, a projection of its source, when given), as
    many as ``override_num_blocks`` asked for, else Ray's default parallelism."""
    parallelism = node.parallelism if node.parallelism > 0 else default_read_parallelism(c.options)
    return (datasource or node.datasource).get_read_tasks(parallelism)


def _read_bundle_bytes(c: _Compiler, node: Read) -> int:
    """Input bytes per read task: one read task each when ``override_num_blocks`` was given, the
    source sizes its own tasks or failed tasks may be let go (``max_errored_blocks``: a failure
    then drops one read's rows, as one of Ray's blocks), else small ones bundled."""
    if node.parallelism > 0 or getattr(node.datasource, "sizes_own_tasks", False) or c.options.max_errored_blocks:
        return 1
    return c.bundle_bytes(node.datasource)


def _read_with(c: _Compiler, node: Read, maps: MapStages | None) -> PhysicalOperator:
    stages = maps.stages if maps is not None else ()
    name = node.name + ("->" + maps.name if maps is not None else "")
    return c.add(
        MapOperator(
            name,
            c.transform(stages),
            source=_read_tasks(c, node),
            resources=_resources(maps.resources) if maps is not None else _read_resources(node),
            actor_pool=_actor_pool(maps.actor_pool) if maps is not None else None,
            max_concurrency=maps.max_concurrency if maps is not None else node.max_concurrency,
            task_timeout_s=maps.task_timeout_s if maps is not None else None,
            min_bundle_bytes=_read_bundle_bytes(c, node),
            min_batch_rows=maps.task_batch_rows if maps is not None else None,
        )
    )


def _read_resources(node: Read) -> Any:
    """What ``node``'s tasks hold: what its call asked for (``read_*(num_cpus=...)``), or None
    (a read's own)."""
    return _resources(node.resources) if node.resources is not None else None


def _map(c: _Compiler, node: MapStages) -> PhysicalOperator:
    upstream = c.build(node.input)
    return c.add(
        MapOperator(
            node.name,
            c.transform(node.stages),
            upstream=upstream,
            resources=_resources(node.resources),
            actor_pool=_actor_pool(node.actor_pool),
            max_concurrency=node.max_concurrency,
            task_timeout_s=node.task_timeout_s,
            # (one block a task where failed tasks may be let go: a failure drops that block's rows)
            min_bundle_bytes=1 if c.options.max_errored_blocks else _bundle_after(upstream, c.options.min_task_input_bytes),
            exact_batch_rows=node.exact_batch_rows,
            min_batch_rows=node.task_batch_rows,
        )
    )


def _bundle_after(upstream: PhysicalOperator, default: int) -> int:
    """Input bytes per task after ``upstream``: one block per task after a repartition (its
    blocks are the ones asked for, and a write after it writes one file per block)."""
    op = upstream
    while type(op) is MapOperator and op.min_bundle_bytes == 1 and op.upstream:
        op = op.upstream[0]  # maps that already take one block per task keep the blocks
    reducer = getattr(getattr(op, "transform", None), "reducer", None)
    return 1 if isinstance(op, ReduceOperator) and getattr(reducer, "exact_blocks", False) else default


def _resources(wanted: plan.Resources) -> Resources:
    return Resources(wanted.num_cpus, wanted.num_gpus, wanted.custom)


def _actor_pool(pool: plan.ActorPool | None) -> ActorPoolSpec | None:
    return ActorPoolSpec(pool.min_size, pool.max_size) if pool is not None else None


def _input(c: _Compiler, node: InputBlocks) -> PhysicalOperator:
    check = getattr(node.owner, "check_alive", None)  # (a materialized dataset's blocks)
    if check is not None:
        check()
    return c.add(InputOperator(list(node.refs)))


def _limit(c: _Compiler, node: Limit) -> PhysicalOperator:
    return c.add(LimitOperator(node.limit, c.build(node.input)))


def _exchange(c: _Compiler, node: Exchange) -> PhysicalOperator:
    whole = _whole_in_one_read(c, node)
    if whole is not None:
        return whole
    sampled = _sampled_read(c, node)
    one_task = _may_fit_one_task(c, node) and len(node.children) == 1
    partitioners = (node.partitioners or (None,) * len(node.children)) if sampled is None else ()
    bounds = [p.for_execution() if p is not None else None for p in partitioners]
    # each input, in order: its read with the map side in it, or its operator (a map side follows)
    inputs: list[PhysicalOperator | None] = []
    children: list[PhysicalOperator] = []
    for child, bound in zip(node.children if sampled is None else (), bounds, strict=True):
        fused = _partitioned_read(c, node, child, bound, one_task) or _partitioned_map(c, node, child, bound, one_task)
        inputs.append(fused)
        children.append(c.build(child) if fused is None else fused)
    if node.ordered_input:
        for child in children:
            _emit_in_order(child)
    fed: list[PhysicalOperator] = [sampled] if sampled is not None else []
    direct_partitioner = None
    for i, (child, bound, fused) in enumerate(zip(children, bounds, inputs, strict=True)):
        if bound is None or fused is not None:
            fed.append(child)
            continue
        sampler = bound.sample if node.sampler and i == 0 else None
        if sampler is not None and isinstance(child, MapOperator) and child.output == OUTPUT_BLOCKS:
            child.output_sampler = sampler  # its tasks sample their blocks: the driver reads none
        small = c.options.small_exchange_bytes if one_task else 0
        fed.append(c.add(PartitionOperator(
            f"{node.label}Map", PartitionTransform(f"{node.label}Map", bound), child,
            sampler=sampler, min_bundle_bytes=c.options.min_task_input_bytes, small_bytes=small,
        )))
        if small:
            direct_partitioner = bound
    reducer = node.reducer.for_execution() if node.reducer is not None else None
    transform = (ReduceTransform(node.label, reducer, c.options.target_max_block_size, direct_partitioner)
                 if reducer is not None else None)
    partitioned = len(fed) == 1 and isinstance(fed[0], MapOperator) and fed[0].output == OUTPUT_PARTITIONS
    merges = MERGE_FAN_IN if partitioned and reducer is not None else 0
    reduce = ReduceOperator(node.label, transform, fed, grouping=node.grouping, num_tasks=node.num_tasks,
                            rows_per_task=node.rows_per_task, seed=_seed_for_execution(node.seed), merge_fan_in=merges,
                            resources=_resources(node.resources) if node.resources is not None else None)
    reduce.max_concurrency = node.max_concurrency
    reduce.keep_empty_blocks = node.keep_empty_blocks
    if node.orders_output:
        c.ordering.add(id(reduce))
    return c.add(reduce)


def _writes_in_reduce(last: PhysicalOperator, sink: Any) -> bool:
    """Whether the write that follows ``last`` runs in its tasks: a repartition's reduce task
    hands its input blocks to the file it writes one by one, instead of concatenating them into
    one block that a write task then reads (``repartition(1).write_parquet``: the whole dataset
    copied twice in memory). Same rows, same order, same files."""
    if sink is None or not isinstance(last, ReduceOperator) or len(last.upstream) != 1:
        return False
    transform = last.transform
    as_pieces = getattr(getattr(transform, "reducer", None), "as_pieces", None)
    if not isinstance(transform, ReduceTransform) or as_pieces is None or transform.partitioner is not None:
        return False
    transform.reducer = as_pieces()
    return True


def _seed_for_execution(seed: StepSeed | int | None) -> int | None:
    return seed.for_execution() if isinstance(seed, StepSeed) else seed


def _may_fit_one_task(c: _Compiler, node: Exchange) -> bool:
    """Whether the exchange may run as one task when its input is small."""
    return bool(node.small_in_one_task and node.num_tasks in (None, 1) and c.options.small_exchange_bytes)


def _whole_in_one_read(c: _Compiler, node: Exchange) -> PhysicalOperator | None:
    """A small exchange straight over a read, as one task that reads every file (several at
    once, on as many threads as there are CPUs) and reduces: no block crosses the store before
    the result, and no task waits for another. Chosen when the source can bound the decoded
    size under ``small_exchange_bytes``; the result is the one the partitioned path gives."""
    read = node.children[0] if len(node.children) == 1 else None
    limit = c.options.small_exchange_bytes
    if (not isinstance(read, Read) or not node.small_in_one_task or node.num_tasks not in (None, 1)
            or not limit or node.reducer is None or not node.partitioners or node.partitioners[0] is None):
        return None
    # a sound bound from the source, not the estimate that sizes read tasks: compressed and
    # dictionary-encoded files can decode to far more than their footers suggest, and this one
    # task would hold all of it
    sized = getattr(read.datasource, "decoded_bytes_at_most", None)
    if sized is None or sized(limit) is None:
        return None
    tasks = list(_read_tasks(c, read))
    cpus = c.options.resolved_num_cpus()
    reduce = ReduceTransform(node.label, node.reducer.for_execution(), c.options.target_max_block_size,
                             node.partitioners[0].for_execution())
    op = c.add(MapOperator(f"{read.name}->{node.label}", WholeExchangeTransform(reduce),
                           source=[ReadAll(tasks, threads=cpus)] if tasks else [], min_bundle_bytes=1))
    op.ordered_output = True
    if node.orders_output:
        c.ordering.add(id(op))
    return op


def _sampled_read(c: _Compiler, node: Exchange) -> PhysicalOperator | None:
    """A sort straight over a read that can read its key columns alone: the map side fused into
    the read (``SampledReadPartitionOperator``: a key-only read fits the ranges first). None
    where that does not apply: another step, other inputs, a source without projection or a
    schema that names every key column (the sort then reports a missing key as it always does),
    a file order that changes with each listing, or a listing too long to list twice up front."""
    read = node.children[0] if len(node.children) == 1 else None
    bound = node.partitioners[0].for_execution() if node.partitioners and node.partitioners[0] is not None else None
    columns = getattr(bound, "sample_columns", None)
    if (not node.sampler or not isinstance(read, Read) or bound is None or columns is None
            or getattr(read.datasource, "lists_anew_each_execution", False)):
        return None
    try:
        schema = read.datasource.schema()
        keys_only = read.datasource.apply_projection(list(columns)) if schema is not None else None
    except Exception:  # a source that cannot say: the plain path reports whatever is wrong
        return None
    if (keys_only is None or schema is None or not set(columns) <= set(schema.names)
            or c.estimate(read.datasource) is None):  # (None past a few thousand files)
        return None
    sized = getattr(read.datasource, "decoded_bytes_at_most", None)
    limit = c.options.small_exchange_bytes
    if _may_fit_one_task(c, node) and sized is not None and sized(limit, guess_dictionaries=True) is not None:
        # probably small, not provably (``_whole_in_one_read`` declined: dictionary-encoded
        # strings): the plain path sees the bytes that arrive and gives them to one reduce
        # task when they are small; reading the keys twice would cost more than it saves
        return None
    label = f"{node.label}Map"
    return c.add(SampledReadPartitionOperator(
        f"{read.name}->{label}", PartitionTransform(label, bound), _read_tasks(c, read, keys_only),
        _read_tasks(c, read), bound.sample, min_bundle_bytes=_read_bundle_bytes(c, read),
    ))


def _partitioned_read(c: _Compiler, node: Exchange, child: LogicalNode, bound: Any,
                      one_task: bool) -> PhysicalOperator | None:
    """An exchange's map side fused into the read that feeds it (a join's, a groupby's, a top-k's
    or a shuffle's input straight from files): each read task partitions the rows it read, so no
    block crosses the store between the read and the map side, and no map task waits for a read's
    output. A partitioner that needs each row's global position (a random shuffle's, a round-robin
    repartition's: not ``position_free``) gets it where the source counts each read task's rows up
    front (``counted_read_tasks``; ``PositionedReadPartitionOperator``). None where that does not
    apply: another input, a position the source cannot count, a sort's sampling, failed reads that
    may be let go (an error while partitioning must fail the job, not drop a read's rows), or an
    exchange that may run as one task over an input that is probably small (the plain map side
    holds what arrives and gives it to one reduce task)."""
    if not isinstance(child, Read) or bound is None or node.sampler or c.options.max_errored_blocks:
        return None
    if one_task and not _large_input(c, child):
        return None
    label = f"{node.label}Map"
    if not getattr(bound, "position_free", False):
        counted = getattr(child.datasource, "counted_read_tasks", None)
        parallelism = child.parallelism if child.parallelism > 0 else default_read_parallelism(c.options)
        tasks = counted(parallelism) if callable(counted) else None
        if tasks is None:
            return None
        return c.add(PositionedReadPartitionOperator(
            f"{child.name}->{label}", PartitionTransform(label, bound), tasks,
            resources=_read_resources(child), max_concurrency=child.max_concurrency,
            min_bundle_bytes=_read_bundle_bytes(c, child),
        ))
    op = c.add(MapOperator(
        f"{child.name}->{label}", PartitionTransform(label, bound), source=_read_tasks(c, child),
        resources=_read_resources(child), max_concurrency=child.max_concurrency,
        min_bundle_bytes=_read_bundle_bytes(c, child), output=OUTPUT_PARTITIONS,
    ))
    op.ordered_output = True  # map outputs reach the reduce in read order: the same result every run
    return op


def _partitioned_map(c: _Compiler, node: Exchange, child: LogicalNode, bound: Any,
                     one_task: bool) -> PhysicalOperator | None:
    """An exchange's map side fused into the tasks of the map steps that feed it (a join, a
    groupby, a top-k after ``map_batches``...; ``MappedPartitionTransform``): their blocks are
    partitioned where they are made, so none crosses the store to a map task of its own. For the
    partitioners a row's keys alone place (``position_free``), not a sort's sampling, not with
    ``max_errored_blocks``, and only for steps that run as plain CPU tasks (an actor pool's, a
    GPU's or a custom resource's time is not spent partitioning). An exchange that may run as one
    task over a small input keeps its own map side unless the steps read more than that
    (``_large_input``)."""
    maps = child.maps if isinstance(child, FusedRead) else child if isinstance(child, MapStages) else None
    if (maps is None or bound is None or not getattr(bound, "position_free", False) or node.sampler
            or c.options.max_errored_blocks or maps.actor_pool is not None or maps.resources.num_gpus
            or maps.resources.custom):
        return None
    if one_task and not _large_input(c, child):
        return None
    op = c.build(child)
    if type(op) is not MapOperator or op.output != OUTPUT_BLOCKS:  # (as built today, never)
        msg = f"{child.name} built as {type(op).__name__} ({op.output}), not a map of blocks"
        raise AssertionError(msg)
    label = f"{node.label}Map"
    op.transform = MappedPartitionTransform(op.transform, PartitionTransform(label, bound))
    op.output = OUTPUT_PARTITIONS
    op.name = op.stats.name = f"{op.name}->{label}"
    _emit_in_order(op)  # map outputs reach the reduce in input order: the same result every run
    return op


def _large_input(c: _Compiler, child: Read | FusedRead | MapStages) -> bool:
    """Whether a read, or map steps, take in more than ``small_exchange_bytes``, as far as can
    be told before they run: from the source's footers (``decoded_bytes_at_most``: large when
    they cannot bound it; a source without that measure counts as small), or the sizes of a
    materialized dataset's blocks."""
    limit = c.options.small_exchange_bytes
    read = child if isinstance(child, Read) else child.read if isinstance(child, FusedRead) else None
    if read is not None:
        sized = getattr(read.datasource, "decoded_bytes_at_most", None)
        return sized is not None and sized(limit, guess_dictionaries=True) is None
    if isinstance(child, MapStages) and isinstance(child.input, InputBlocks):
        return sum(getattr(ref, "size_bytes", 0) or 0 for ref in child.input.refs) > limit
    return False


def _emit_in_order(op: PhysicalOperator) -> None:
    """``op`` and what feeds it emit in input order (an exchange's output is ordered already)."""
    if op.ordered_output:
        return
    op.ordered_output = True
    for up in op.upstream:
        _emit_in_order(up)


def _union(c: _Compiler, node: Union) -> PhysicalOperator:
    children = [c.build(child) for child in node.children]
    return c.add(UnionOperator(children))


def _mix(c: _Compiler, node: Mix) -> PhysicalOperator:
    children = [c.build(child) for child in node.children]
    if node.stop_on_shortest:  # where it stops depends on each input's block order: fix it
        for child in children:
            _emit_in_order(child)
    return c.add(MixOperator(children, node.weights, node.stop_on_shortest, node.name))


BUILDERS: dict[type, Callable[[_Compiler, Any], PhysicalOperator]] = {
    Read: _read,
    FusedRead: _fused_read,
    MapStages: _map,
    InputBlocks: _input,
    Limit: _limit,
    Union: _union,
    Mix: _mix,
    Exchange: _exchange,
}


def compile_plan(
    node: LogicalNode,
    options: ExecutionOptions,
    output: str = OUTPUT_BLOCKS,
    sink: Any = None,
    configs: dict[str, Any] | None = None,
    error_retries: Any = None,
    init_retries: int = 0,
) -> list[PhysicalOperator]:
    """Engine operators for ``node``, in topological order (the last is the output).
    ``configs``: the context's key-value settings, which every task of the execution sees;
    ``error_retries``: an ``engine.task.ErrorRetries`` every task follows; ``init_retries``:
    how many more times a callable class's constructor that raised is called (-1: no limit)."""
    options.check()
    c = _Compiler(options)
    # one execution number per random step, and one read of each file's footer, however often asked
    with compiling(), planning():
        last = c.build(node)
    for op in c.ops:  # what follows a sort keeps its order
        if any(id(up) in c.ordering for up in op.upstream):
            op.ordered_output = True
            c.ordering.add(id(op))
    if output != OUTPUT_BLOCKS:
        min_rows = getattr(sink, "min_rows_per_write", None) if sink is not None else None
        min_bytes = getattr(sink, "min_bytes_per_write", None) if sink is not None else None
        if min_bytes is None and sink is not None and _bundle_after(last, 0) != 1:
            # a partitioned write's default grouping; not after a repartition, whose blocks
            # are the write tasks the user asked for
            min_bytes = getattr(sink, "write_task_bytes", None)
        # a sink that wants a minimum of rows per write bundles blocks, whose row counts are
        # known; fused into a read it would be handed read tasks of unknown size. One that wants
        # a minimum of bytes gets a write operator of its own, whose inputs it bundles (as Ray)
        reads_directly = isinstance(last, MapOperator) and not last.upstream
        # a resumable write takes each input unit whole (engine.units): fused into the read, a
        # task reads one unit; after other operators, a write operator of its own collects each
        # unit's blocks, which arrive in order
        resumes = bool(getattr(sink, "resumes", False))
        if resumes:
            _emit_in_order(last)
        # an actor pool's tasks are its batches: a minimum of rows per file may span several
        batched = isinstance(last, MapOperator) and last.actor_pool is not None
        in_reduce = not (min_rows or min_bytes or resumes) and _writes_in_reduce(last, sink)
        if not in_reduce and (type(last) is not MapOperator or last.output != OUTPUT_BLOCKS
                              or (min_rows and (reads_directly or batched)) or min_bytes or (resumes and not reads_directly)):
            # a materialized dataset's blocks are written one file each, as Ray writes them
            bundle = 1 if isinstance(last, InputOperator) else _bundle_after(last, options.min_task_input_bytes)
            last = c.add(MapOperator("Write" if sink else "Count", c.transform([]), upstream=last,
                                     min_bundle_bytes=min_bytes or bundle, whole_units=resumes))
        assert isinstance(last, MapOperator)
        last.output = output
        last.sink = sink
        if sink is not None:
            last.name = f"{last.name}->Write[{sink.get_name()}]"
            last.stats.name = last.name
            last.min_rows_per_task = getattr(sink, "min_rows_per_write", None)
    for op in c.ops if configs or error_retries is not None or init_retries else ():
        transform = getattr(op, "transform", None)
        if transform is not None:
            transform.configs = dict(configs) if configs else None
            transform.error_retries = error_retries
            transform.init_retries = init_retries
    return c.ops

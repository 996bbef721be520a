"""The logical plan: immutable nodes a Dataset appends to, and how ``explain()`` prints them.

Nodes say *what* to compute. ``optimizer`` rewrites them (fusing maps, fusing a read into the
maps after it, pushing columns and filters into reads), ``compile`` turns them into engine
operators, one per node.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from engine.transform import Stage


@dataclass(frozen=True)
class Resources:
    """What one task (or actor) of a map node asks for. The compiler turns it into the engine's
    own type; the plan carries no engine operator types (a ``Stage`` is the description of a
    user step, shared with the engine that runs it)."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    custom: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class ActorPool:
    """A map node that runs on a pool of ``min_size`` to ``max_size`` actors."""

    min_size: int = 1
    max_size: int = 1


class LogicalNode:
    """Base of all nodes. ``inputs`` are the nodes this one reads from."""

    inputs: tuple[LogicalNode, ...] = ()

    @property
    def name(self) -> str:
        return type(self).__name__


@dataclass(frozen=True, eq=False)
class Read(LogicalNode):
    datasource: Any
    parallelism: int = -1
    resources: Any = None
    """What each read task holds (``read_*(num_cpus=...)``); None: what a read needs."""
    max_concurrency: int | None = None
    """At most this many read tasks at once (``read_*(concurrency=...)``)."""

    @property
    def name(self) -> str:
        return str(self.datasource.get_name())


@dataclass(frozen=True, eq=False)
class InputBlocks(LogicalNode):
    """Blocks already computed (a materialized dataset); the owner keeps them alive."""

    refs: tuple[Any, ...]
    owner: Any

    @property
    def name(self) -> str:
        return f"InputBlocks[{len(self.refs)}]"


@dataclass(frozen=True, eq=False)
class MapStages(LogicalNode):
    """One or more fused stages running with the same compute and resources."""

    input: LogicalNode
    stages: tuple[Stage, ...]
    resources: Resources = field(default_factory=Resources)
    actor_pool: ActorPool | None = None
    max_concurrency: int | None = None
    preserves_rows: bool = False
    filter_expr: Any = None
    """A pyarrow compute expression this node applies (filter(expr=...)); pushable into reads."""
    projection: tuple[str, ...] | None = None
    """Columns this node selects (select_columns); pushable into reads."""
    task_timeout_s: float | None = None
    """A task of this node running longer fails the job (``TaskTimeoutError``)."""

    @property
    def inputs(self) -> tuple[LogicalNode, ...]:  # type: ignore[override]
        return (self.input,)

    @property
    def name(self) -> str:
        return "->".join(s.name for s in self.stages)

    @property
    def task_batch_rows(self) -> int | None:
        """For tasks (no actor pool) whose first batch step is ``map_batches(batch_size=n)``,
        after row-for-row ``map`` steps only: n, the rows a task gets at least while more input
        comes (``MapOperator.min_batch_rows``)."""
        if self.actor_pool is not None:
            return None
        for stage in self.stages:
            if stage.kind == "batches":
                return stage.batch_size
            if getattr(stage, "row_mode", None) != "map":
                return None
        return None

    @property
    def exact_batch_rows(self) -> int | None:
        """For an actor pool whose first step is ``map_batches(batch_size=n)``: n.

        Such a node is fed exact multiples of n rows (blocks are sliced), so the model sees
        exactly ``batch_size`` rows per call except the very last; it is therefore never
        fused with what comes before it.
        """
        first = self.stages[0]
        if self.actor_pool is not None and first.kind == "batches" and first.batch_size is not None:
            return first.batch_size
        return None


@dataclass(frozen=True, eq=False)
class FusedRead(LogicalNode):
    """A read whose tasks also run ``maps`` (``maps.input`` is the read): one operator.

    Only the optimizer makes these, when ``optimizer.can_fuse(read, maps)`` says so; the
    compiler translates them as they are. It is a leaf: nothing runs before its tasks.
    """

    maps: MapStages

    def __post_init__(self) -> None:
        if not isinstance(self.maps.input, Read):
            msg = f"FusedRead needs maps over a Read, got maps over {type(self.maps.input).__name__}"
            raise TypeError(msg)

    @property
    def read(self) -> Read:
        assert isinstance(self.maps.input, Read)
        return self.maps.input

    @property
    def name(self) -> str:
        return f"{self.read.name}->{self.maps.name}"


@dataclass(frozen=True, eq=False)
class Limit(LogicalNode):
    input: LogicalNode
    limit: int

    @property
    def inputs(self) -> tuple[LogicalNode, ...]:  # type: ignore[override]
        return (self.input,)

    @property
    def name(self) -> str:
        return f"Limit[{self.limit}]"


@dataclass(frozen=True, eq=False)
class Union(LogicalNode):
    children: tuple[LogicalNode, ...]

    @property
    def inputs(self) -> tuple[LogicalNode, ...]:  # type: ignore[override]
        return self.children


@dataclass(frozen=True, eq=False)
class Mix(LogicalNode):
    """The blocks of several inputs interleaved so that the rows drawn from each follow
    ``weights`` (normalized); ``stop_on_shortest``: end when the first input runs out, else
    an input that runs out drops out and the others go on (``dataflow.mix``)."""

    children: tuple[LogicalNode, ...]
    weights: tuple[float, ...]
    stop_on_shortest: bool = False

    @property
    def inputs(self) -> tuple[LogicalNode, ...]:  # type: ignore[override]
        return self.children

    @property
    def name(self) -> str:
        return f"Mix[{', '.join(f'{w:.3g}' for w in self.weights)}]"


@dataclass(frozen=True, eq=False)
class Exchange(LogicalNode):
    """An all-to-all step: each input is partitioned (or, without a partitioner, fed as it is),
    then reduced together after the last row is in (``engine.operators.exchange``)."""

    children: tuple[LogicalNode, ...]
    label: str
    partitioners: tuple[Any, ...] = ()
    """One per input (None: its blocks go straight to the reducer); empty: none at all."""
    reducer: Any = None
    grouping: str = "partitions"
    """"partitions" (by the partitioners), "rows" (by global row ranges), "blocks" (no task:
    the blocks in a random order)."""
    num_tasks: int | None = None
    keep_empty_blocks: bool = False
    """Exactly ``num_tasks`` output blocks, empty ones included (``repartition(n)``, as Ray)."""
    rows_per_task: int | None = None
    """With "rows": tasks of this many rows each (the last one shorter)."""
    sampler: bool = False
    """The first input's partitioner samples keys and partitions after the last block (sort)."""
    ordered_input: bool = False
    """What feeds it must emit in input order (a seeded shuffle, a stable sort, zip, repartition)."""
    orders_output: bool = False
    """Its output order is the result (sort): what follows keeps it."""
    seed: Any = None
    """``randomize_block_order``'s ``dataflow.random_seed.StepSeed`` (bound at each compile)."""
    preserves_rows: bool = False
    """Its output has exactly its first input's rows (shuffle, sort, repartition)."""
    columns: tuple[str, ...] | None = None
    """The only columns of its input it reads (a groupby aggregation's keys and inputs), pushed
    into the read that feeds it; None: every column."""
    small_in_one_task: bool = False
    """A small input (``ExecutionOptions.small_exchange_bytes``) may be reduced by one task with no map tasks:
    set where the reducer is cheap (not a user's function that wants the CPUs)."""
    resources: Any = None
    """What each reduce task holds while it runs (``map_groups(num_cpus=...)``); None: one CPU."""
    max_concurrency: int | None = None
    """At most this many reduce tasks at once (``map_groups(concurrency=...)``)."""

    @property
    def inputs(self) -> tuple[LogicalNode, ...]:  # type: ignore[override]
        return self.children

    @property
    def name(self) -> str:
        return self.label


def explain(node: LogicalNode, indent: int = 0) -> str:
    """The plan as an indented tree, output at the top. Each node compiles to one operator, so
    a read fused with its maps is one line (``ReadX->Map(f)``) and a read apart is its own."""
    pad = "  " * indent
    extra = ""
    maps = node.maps if isinstance(node, FusedRead) else node
    if isinstance(maps, MapStages):
        parts = []
        if maps.actor_pool is not None:
            parts.append(f"actors={maps.actor_pool.min_size}..{maps.actor_pool.max_size}")
        if maps.resources.num_cpus != Resources().num_cpus:
            parts.append(f"num_cpus={maps.resources.num_cpus}")
        if maps.resources.num_gpus:
            parts.append(f"num_gpus={maps.resources.num_gpus}")
        parts.extend(f"{name}={amount}" for name, amount in maps.resources.custom)
        if maps.max_concurrency is not None:
            parts.append(f"concurrency={maps.max_concurrency}")
        extra = f" [{', '.join(parts)}]" if parts else ""
    lines = [f"{pad}{'+- ' if indent else ''}{node.name}{extra}"]
    for child in node.inputs:
        lines.append(explain(child, indent + 1))
    return "\n".join(lines)


def walk(node: LogicalNode) -> Iterator[LogicalNode]:
    """``node`` and every node it reads from, depth first."""
    yield node
    for child in node.inputs:
        yield from walk(child)

"""The logical plan: immutable nodes a Dataset appends to, and how ``explain()`` prints them.

Nodes say *what* to compute. ``optimizer`` rewrites them (fusing maps, pushing columns and
filters into reads), ``compile`` turns them into engine operators.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from engine.operators.map import ActorPoolSpec, Resources
from engine.transform import Stage


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
    actor_pool: ActorPoolSpec | None = None
    max_concurrency: int | None = None
    preserves_rows: bool = False
    filter_expr: Any = None
    """A pyarrow compute expression this node applies (filter(expr=...)); pushable into reads."""
    projection: tuple[str, ...] | None = None
    """Columns this node selects (select_columns); pushable into reads."""

    @property
    def inputs(self) -> tuple[LogicalNode, ...]:  # type: ignore[override]
        return (self.input,)

    @property
    def name(self) -> str:
        return "->".join(s.name for s in self.stages)

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


def explain(node: LogicalNode, indent: int = 0) -> str:
    """The plan as an indented tree, output at the top."""
    pad = "  " * indent
    extra = ""
    if isinstance(node, MapStages):
        parts = []
        if node.actor_pool is not None:
            parts.append(f"actors={node.actor_pool.min_size}..{node.actor_pool.max_size}")
        if node.resources.num_gpus:
            parts.append(f"num_gpus={node.resources.num_gpus}")
        if node.max_concurrency is not None:
            parts.append(f"concurrency={node.max_concurrency}")
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

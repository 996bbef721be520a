"""Rewrite rules over the logical plan, each a small pure function.

* push a projection (``select_columns``) or an expression filter into a read that supports it;
* fuse adjacent map nodes that share resources into one node (one task runs them all);
* answer ``count()`` from metadata when every node after the read keeps the row count.
"""

from __future__ import annotations

from dataclasses import replace

from dataflow.plan import InputBlocks, Limit, LogicalNode, MapStages, Read, Union


def optimize(node: LogicalNode) -> LogicalNode:
    """Apply every rule bottom-up."""
    if isinstance(node, MapStages):
        node = replace(node, input=optimize(node.input))
        return fuse_maps(push_into_read(node))
    if isinstance(node, Limit):
        return replace(node, input=optimize(node.input))
    if isinstance(node, Union):
        return Union(tuple(optimize(c) for c in node.children))
    return node


def push_into_read(node: MapStages) -> LogicalNode:
    """A projection or expression filter right after a read becomes part of the read."""
    child = node.input
    if not isinstance(child, Read) or len(node.stages) != 1:
        return node
    if node.projection is not None:
        pushed = child.datasource.apply_projection(list(node.projection))
        if pushed is not None:
            return replace(child, datasource=pushed)
    if node.filter_expr is not None:
        pushed = child.datasource.apply_filter(node.filter_expr)
        if pushed is not None:
            return replace(child, datasource=pushed)
    return node


def _fusable(upstream: MapStages, downstream: MapStages) -> bool:
    if downstream.exact_batch_rows is not None:
        return False
    if upstream.resources != downstream.resources:
        return False
    if upstream.actor_pool is not None and downstream.actor_pool is not None:
        return False
    return upstream.max_concurrency == downstream.max_concurrency or (
        downstream.actor_pool is not None or upstream.actor_pool is not None
    )


def fuse_maps(node: LogicalNode) -> LogicalNode:
    """``MapStages(MapStages(x))`` -> one ``MapStages(x)`` when they can share a task."""
    if not isinstance(node, MapStages) or not isinstance(node.input, MapStages):
        return node
    up = node.input
    if not _fusable(up, node):
        return node
    return MapStages(
        input=up.input,
        stages=up.stages + node.stages,
        resources=node.resources,
        actor_pool=node.actor_pool or up.actor_pool,
        max_concurrency=node.max_concurrency if node.actor_pool is None and up.actor_pool is None else None,
        preserves_rows=up.preserves_rows and node.preserves_rows,
    )


def count_from_metadata(node: LogicalNode) -> int | None:
    """The row count without running anything, when the plan allows it."""
    if isinstance(node, Read):
        count = node.datasource.count_rows()
        return int(count) if count is not None else None
    if isinstance(node, InputBlocks):
        return sum(r.num_rows for r in node.refs)
    if isinstance(node, MapStages) and node.preserves_rows:
        return count_from_metadata(node.input)
    if isinstance(node, Limit):
        inner = count_from_metadata(node.input)
        return min(inner, node.limit) if inner is not None else None
    if isinstance(node, Union):
        counts = [count_from_metadata(c) for c in node.children]
        return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)
    return None

"""Rewrite rules over the logical plan, each a small pure function.

* push a projection (``select_columns``, or the columns a groupby aggregation reads) or an
  expression filter into a read that supports it;
* fuse adjacent map nodes that share resources into one node (one task runs them all);
* fuse a read into the map node after it when that node runs as plain default tasks (a
  ``FusedRead``: its tasks read and transform in one go);
* answer ``count()`` from metadata when every node after the read keeps the row count.

``can_fuse`` is the only place that decides whether two nodes fuse; the compiler turns each
node it is given into one operator and decides nothing.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from connectors.base import push_filter
from dataflow.expr_statistics import statistics_filter
from dataflow.expressions import FilterExpr
from dataflow.plan import Exchange, FusedRead, InputBlocks, Limit, LogicalNode, MapStages, Mix, Read, Resources, Union

READ_RESOURCES = Resources()
"""What a read task needs: the default (one CPU, no GPU, no custom resource)."""


def optimize(node: LogicalNode) -> LogicalNode:
    """Push-downs and map+map fusion bottom-up, then read+map fusion on the result.

    Maps are fused first so the read sees the whole chain it would join: ``read -> map(f) ->
    map_batches(Model, num_gpus=1)`` keeps ``f`` apart from the model (other resources), so the
    read fuses with ``f``; ``read -> map(f) -> map_batches(Model)`` puts ``f`` on the actors, so
    the read stays apart.
    """
    return fuse_reads(_rewrite(node))


def _rewrite(node: LogicalNode) -> LogicalNode:
    if isinstance(node, MapStages):
        node = replace(node, input=_rewrite(node.input))
        return fuse_maps(push_into_read(node))
    if isinstance(node, Limit):
        inner = _rewrite(node.input)
        if isinstance(inner, Exchange):  # sort(...).limit(k): a top-k
            from dataflow.all_to_all import top_k

            inner = top_k(inner, node.limit) or inner
        return replace(node, input=inner)
    if isinstance(node, (Union, Mix)):
        return replace(node, children=tuple(_rewrite(c) for c in node.children))
    if isinstance(node, Exchange):
        children = tuple(_rewrite(c) for c in node.children)
        if node.columns is not None and len(children) == 1 and isinstance(children[0], Read):
            children = (_read_only(children[0], node.columns),)
        return replace(node, children=children)
    return node


def _read_only(read: Read, columns: tuple[str, ...]) -> Read:
    """``read`` reading only ``columns`` (a groupby's keys and aggregated columns), where its
    source can skip the others and has them all (a missing one is left for the step to name,
    as without the pushdown)."""
    try:
        schema = read.datasource.schema()
    except Exception:  # no schema, no pushdown: the read reports its own errors
        return read
    if schema is None or any(c not in schema.names for c in columns):
        return read
    pushed = read.datasource.apply_projection(list(columns))
    return read if pushed is None else replace(read, datasource=pushed)


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
        step = node.stages[0].fn
        # a dataflow expression's tree gives the part that row-group statistics may prune with
        statistics = functools.partial(statistics_filter, step.expr) if isinstance(step, FilterExpr) else None
        pushed = push_filter(child.datasource, node.filter_expr, statistics)
        if pushed is not None:
            return replace(child, datasource=pushed)
    return node


def can_fuse(upstream: LogicalNode, downstream: MapStages) -> bool:
    """Whether ``downstream`` may run in the same task (or actor) as ``upstream``.

    Read -> map: only when the map runs as plain tasks that need what a read task needs (or
    what the read asked for: ``read_*(num_cpus=..., concurrency=...)``, the same). Not
    into an actor pool (its few processes, GPU ones included, would do all the file reading;
    a class without ``concurrency`` is one actor), not with other ``num_cpus``, ``num_gpus`` or
    custom resources, not under a ``concurrency`` cap (it would cap the reads too), and not
    when the map is fed exact ``batch_size`` slices (those need blocks whose row counts are
    known, not read tasks). Ray Data likewise fuses a read only into a map with the same
    resources and the same task concurrency; it would also fuse one into a CPU actor pool with
    default resources, which is stricter here on purpose.

    A read fused into a map with ``task_timeout_s`` counts its reading within that limit.

    Map -> map: the same resources and ``task_timeout_s``, at most one of the two on an actor pool (a task step
    joins the pool), no exact ``batch_size`` slicing downstream, and no ``concurrency`` cap
    loosened: two task maps fuse only with the same cap, and a capped task map joins an actor
    pool only when the pool is no bigger than the cap.
    """
    if downstream.exact_batch_rows is not None:
        return False
    if isinstance(upstream, Read):
        return (
            downstream.actor_pool is None
            and downstream.resources == (upstream.resources or READ_RESOURCES)
            and downstream.max_concurrency == upstream.max_concurrency
        )
    if not isinstance(upstream, MapStages):
        return False
    if upstream.resources != downstream.resources or upstream.task_timeout_s != downstream.task_timeout_s:
        return False
    pools = [m.actor_pool for m in (upstream, downstream) if m.actor_pool is not None]
    if not pools:
        return upstream.max_concurrency == downstream.max_concurrency
    if len(pools) > 1:
        return False
    cap = upstream.max_concurrency if upstream.actor_pool is None else downstream.max_concurrency
    return cap is None or pools[0].max_size <= cap


def fuse_maps(node: LogicalNode) -> LogicalNode:
    """``MapStages(MapStages(x))`` -> one ``MapStages(x)`` when they can share a task."""
    if not isinstance(node, MapStages) or not isinstance(node.input, MapStages):
        return node
    up = node.input
    if not can_fuse(up, node):
        return node
    return MapStages(
        input=up.input,
        stages=up.stages + node.stages,
        resources=node.resources,
        actor_pool=node.actor_pool or up.actor_pool,
        max_concurrency=node.max_concurrency if node.actor_pool is None and up.actor_pool is None else None,
        preserves_rows=up.preserves_rows and node.preserves_rows,
        task_timeout_s=node.task_timeout_s,
    )


def fuse_reads(node: LogicalNode) -> LogicalNode:
    """``MapStages(Read)`` -> ``FusedRead`` wherever ``can_fuse`` allows it."""
    if isinstance(node, MapStages):
        if isinstance(node.input, Read):
            return FusedRead(node) if can_fuse(node.input, node) else node
        return replace(node, input=fuse_reads(node.input))
    if isinstance(node, Limit):
        return replace(node, input=fuse_reads(node.input))
    if isinstance(node, (Union, Mix)):
        return replace(node, children=tuple(fuse_reads(c) for c in node.children))
    if isinstance(node, Exchange):
        return replace(node, children=tuple(fuse_reads(c) for c in node.children))
    return node


def count_from_metadata(node: LogicalNode) -> int | None:
    """The row count without running anything, when the plan allows it."""
    if isinstance(node, Read):
        count = node.datasource.count_rows()
        return int(count) if count is not None else None
    if isinstance(node, InputBlocks):
        return sum(r.num_rows for r in node.refs)
    if isinstance(node, MapStages) and node.preserves_rows:
        return count_from_metadata(node.input)
    if isinstance(node, FusedRead):
        return count_from_metadata(node.maps)
    if isinstance(node, Limit):
        inner = count_from_metadata(node.input)
        return min(inner, node.limit) if inner is not None else None
    if isinstance(node, Union) or (isinstance(node, Mix) and not node.stop_on_shortest):
        counts = [count_from_metadata(c) for c in node.children]
        return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)
    if isinstance(node, Exchange) and node.preserves_rows and len(node.children) > 1:  # zip
        counts = [count_from_metadata(c) for c in node.children]
        if any(c is None for c in counts):  # the run counts them, and checks
            return None
        if len(set(counts)) > 1:  # as the run raises: a mismatch is an error, not the first count
            msg = f"Cannot zip datasets of different number of rows: {', '.join(map(str, counts))}"
            raise ValueError(msg)
        return counts[0]
    if isinstance(node, Exchange) and node.preserves_rows:
        return count_from_metadata(node.children[0])
    return None

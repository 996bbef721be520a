"""The plan nodes of the all-to-all steps of ``Dataset`` (shuffle, sort, repartition...).

Each is one ``Exchange`` node: which partitioner feeds it, which reducer finishes it, whether
its input must arrive in order. The kernels live in ``dataflow.shuffle`` and ``dataflow.sort``;
the operators that run them in ``engine.operators.exchange``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dataflow.plan import Exchange, LogicalNode
from dataflow.random_seed import StepSeed
from dataflow.shuffle import ConcatReducer, HashPartitioner, RandomPartitioner, RoundRobinPartitioner, ShuffleReducer
from dataflow.sort import RangePartitioner, SortKey, SortReducer, TopKPartitioner, TopKReducer
from engine.exchange import FINE_PARTITIONS


def random_shuffle(plan: LogicalNode, seed: StepSeed, num_blocks: int | None = None, resources: Any = None) -> Exchange:
    partitions = max(FINE_PARTITIONS, num_blocks or 0)
    return Exchange(
        (plan,), "RandomShuffle", (RandomPartitioner(seed, partitions),), ShuffleReducer(exact_blocks=num_blocks is not None),
        # with a seed the order is the result: the steps after it keep it, as after a sort
        num_tasks=num_blocks, ordered_input=seed.given, orders_output=seed.given, preserves_rows=True,
        small_in_one_task=num_blocks is None, resources=resources,
    )


def randomize_block_order(plan: LogicalNode, seed: StepSeed) -> Exchange:
    return Exchange((plan,), "RandomizeBlockOrder", grouping="blocks", seed=seed,
                    ordered_input=seed.given, orders_output=seed.given, preserves_rows=True)


def sort(plan: LogicalNode, key: str | Sequence[str], descending: bool | Sequence[bool],
         boundaries: Sequence[Any] | None) -> Exchange:
    sort_key = SortKey.of(key, descending)
    partitioner = RangePartitioner(sort_key)
    if boundaries is not None:
        partitioner = partitioner.with_boundaries(list(boundaries))
    return Exchange(
        (plan,), "Sort", (partitioner,), SortReducer(sort_key), sampler=boundaries is None,
        ordered_input=True, orders_output=True, preserves_rows=True,
        num_tasks=len(boundaries) + 1 if boundaries is not None else None, small_in_one_task=boundaries is None,
    )


def top_k(sort_node: Exchange, k: int) -> Exchange | None:
    """``sort(...).limit(k)`` as a top-k: no exchange of all rows, no full sort. None when
    ``sort_node`` is not a plain sort."""
    reducer = sort_node.reducer
    if not isinstance(reducer, SortReducer) or isinstance(reducer, TopKReducer) or not sort_node.sampler:
        return None
    return Exchange(
        sort_node.children, f"TopK[{k}]", (TopKPartitioner(reducer.key, k),), TopKReducer(reducer.key, k),
        num_tasks=1, ordered_input=True, orders_output=True, small_in_one_task=True,
    )


def repartition(
    plan: LogicalNode,
    num_blocks: int | None,
    target_num_rows_per_block: int | None,
    shuffle: bool,
    keys: Sequence[str] | str | None,
    sort: bool,
) -> Exchange:
    if (num_blocks is None) == (target_num_rows_per_block is None):
        msg = "repartition() needs exactly one of num_blocks and target_num_rows_per_block"
        raise ValueError(msg)
    if num_blocks is not None and num_blocks < 1:
        msg = f"num_blocks must be >= 1, got {num_blocks}"
        raise ValueError(msg)
    if target_num_rows_per_block is not None:
        if target_num_rows_per_block < 1:
            msg = f"target_num_rows_per_block must be >= 1, got {target_num_rows_per_block}"
            raise ValueError(msg)
        if shuffle or keys:
            msg = "target_num_rows_per_block cannot be combined with shuffle or keys"
            raise ValueError(msg)
        return Exchange((plan,), f"Repartition[rows={target_num_rows_per_block}]", reducer=ConcatReducer(),
                        grouping="rows", rows_per_task=target_num_rows_per_block, ordered_input=True, preserves_rows=True)
    assert num_blocks is not None
    if keys:
        columns = [keys] if isinstance(keys, str) else list(keys)
        reducer: Any = SortReducer(SortKey.of(columns)) if sort else ConcatReducer()
        if sort:
            reducer.exact_blocks = True
        return Exchange((plan,), f"Repartition[{num_blocks}, keys]",
                        (HashPartitioner(columns, max(FINE_PARTITIONS, num_blocks)),), reducer,
                        num_tasks=num_blocks, keep_empty_blocks=True, preserves_rows=True)
    if shuffle:
        return Exchange((plan,), f"Repartition[{num_blocks}, shuffle]", (RoundRobinPartitioner(num_blocks),),
                        ConcatReducer(), num_tasks=num_blocks, keep_empty_blocks=True, ordered_input=True,
                        preserves_rows=True)
    return Exchange((plan,), f"Repartition[{num_blocks}]", reducer=ConcatReducer(), grouping="rows",
                    num_tasks=num_blocks, keep_empty_blocks=True, ordered_input=True, preserves_rows=True)

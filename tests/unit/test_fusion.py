"""Which nodes fuse: ``optimizer.can_fuse`` decides, ``compile`` only translates (no execution here)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dataflow
from dataflow.compile import compile_plan
from dataflow.optimizer import can_fuse, count_from_metadata, optimize
from dataflow.plan import FusedRead, MapStages, Read, explain
from engine.operators.map import ActorPoolSpec, MapOperator
from engine.options import ExecutionOptions


class Model:
    def __call__(self, batch):
        return batch


def same(batch):
    return batch


def keep(row):
    return True


def ops_of(ds) -> list[MapOperator]:
    ops = compile_plan(optimize(ds._plan), ExecutionOptions(num_cpus=2))
    assert all(isinstance(op, MapOperator) for op in ops)
    return ops  # type: ignore[return-value]


def optimized(ds) -> str:
    return explain(optimize(ds._plan))


def test_read_fuses_into_a_plain_task_map():
    ds = dataflow.range(10).map(same)
    plan = optimize(ds._plan)
    assert isinstance(plan, FusedRead) and isinstance(plan.read, Read)
    [op] = ops_of(ds)
    assert op.name == "ReadRange->Map(same)" and not op.upstream and op.actor_pool is None
    assert optimized(ds) == "ReadRange->Map(same)"


def test_read_does_not_fuse_into_an_actor_pool():
    ds = dataflow.range(10).map_batches(Model, concurrency=2)
    plan = optimize(ds._plan)
    assert isinstance(plan, MapStages) and isinstance(plan.input, Read)
    read, pool = ops_of(ds)
    assert read.name == "ReadRange" and read.actor_pool is None and not read.upstream
    assert pool.upstream == [read] and pool.actor_pool == ActorPoolSpec(2, 2)
    assert optimized(ds) == "MapBatches(Model) [actors=2..2]\n  +- ReadRange"


def test_read_does_not_fuse_into_a_map_with_other_resources():
    for ds in (
        dataflow.range(10).map_batches(same, num_gpus=1),  # a GPU function: GPU workers
        dataflow.range(10).map_batches(same, resources={"X": 1}),
        dataflow.range(10).map_batches(same, num_cpus=2),
        dataflow.range(10).map_batches(same, num_cpus=0.5),
    ):
        plan = optimize(ds._plan)
        assert isinstance(plan, MapStages) and isinstance(plan.input, Read), explain(plan)
        assert [op.name for op in ops_of(ds)] == ["ReadRange", "MapBatches(same)"]
    assert "X=1" in optimized(dataflow.range(10).map_batches(same, resources={"X": 1}))
    assert "num_cpus=2.0" in optimized(dataflow.range(10).map_batches(same, num_cpus=2))


def test_read_does_not_fuse_under_a_concurrency_cap():
    ds = dataflow.range(10).map(same, concurrency=2)  # fused, the cap would hold the reads too
    read, capped = ops_of(ds)
    assert read.max_concurrency is None and capped.max_concurrency == 2


def test_read_does_not_fuse_into_exact_batches():
    ds = dataflow.range(10).map_batches(Model, batch_size=4)
    plan = optimize(ds._plan)
    assert isinstance(plan, MapStages) and plan.exact_batch_rows == 4
    assert not can_fuse(plan.input, plan)


def test_maps_with_the_same_resources_fuse_and_then_into_the_read():
    ds = dataflow.range(10).map(same).filter(keep).map_batches(same, batch_size=3)
    plan = optimize(ds._plan)
    assert isinstance(plan, FusedRead) and len(plan.maps.stages) == 3
    assert count_from_metadata(optimize(dataflow.range(10).map(same).map(same)._plan)) == 10


def test_maps_with_different_resources_stay_apart():
    ds = dataflow.range(10).map_batches(same, num_gpus=1, concurrency=1).map(same)
    plan = optimize(ds._plan)
    assert isinstance(plan, MapStages) and isinstance(plan.input, MapStages)
    assert isinstance(plan.input.input, Read)
    assert [op.name for op in ops_of(ds)] == ["ReadRange", "MapBatches(same)", "Map(same)"]


def test_a_mixed_chain():
    ds = (
        dataflow.range(10)
        .map(same)
        .filter(keep)
        .map_batches(Model, num_gpus=1, concurrency=2)
        .map(same, num_cpus=0.5)
        .map(same, num_cpus=0.5)
    )
    assert optimized(ds) == (
        "Map(same)->Map(same) [num_cpus=0.5]\n"
        "  +- MapBatches(Model) [actors=2..2, num_gpus=1.0]\n"
        "    +- ReadRange->Map(same)->Filter(keep)"
    )
    read, pool, last = ops_of(ds)
    assert read.name == "ReadRange->Map(same)->Filter(keep)" and read.actor_pool is None
    assert pool.upstream == [read] and pool.actor_pool == ActorPoolSpec(2, 2)
    assert last.upstream == [pool] and last.actor_pool is None


def test_a_task_map_before_an_actor_pool_joins_the_pool_and_the_read_stays_apart():
    ds = dataflow.range(10).map(same).map_batches(Model, concurrency=2)
    assert optimized(ds) == "Map(same)->MapBatches(Model) [actors=2..2]\n  +- ReadRange"


def test_a_concurrency_cap_is_never_loosened_by_fusion():
    def node(concurrency=None, cls=False):
        return optimize(dataflow.range(10).map_batches(Model if cls else same, concurrency=concurrency)._plan)

    pool = node(2, cls=True)
    assert can_fuse(node(4), pool)  # the pool's 2 actors respect the cap of 4
    assert not can_fuse(node(1), pool)  # 2 actors would run a step capped at 1 twice at once
    assert not can_fuse(node(3).input, node(3))  # a read under a cap
    capped = optimize(dataflow.range(10).map(same, concurrency=3).map(same, concurrency=3)._plan)
    assert isinstance(capped, MapStages) and len(capped.stages) == 2 and capped.max_concurrency == 3
    apart = optimize(dataflow.range(10).map(same, concurrency=3).map(same, concurrency=2)._plan)
    assert isinstance(apart, MapStages) and isinstance(apart.input, MapStages)


def test_parquet_reads_stay_in_tasks_before_a_gpu_actor_pool(tmp_path):
    for i in range(4):
        pq.write_table(pa.table({"x": np.arange(i * 10, i * 10 + 10)}), tmp_path / f"{i}.parquet")
    ds = dataflow.read_parquet(str(tmp_path)).map_batches(Model, concurrency=2, num_gpus=1)
    read, pool = ops_of(ds)
    assert read.name == "ReadParquet" and not read.upstream
    assert read.actor_pool is None and read.resources.num_gpus == 0
    assert pool.upstream == [read] and pool.actor_pool == ActorPoolSpec(2, 2)
    assert pool.resources.num_gpus == 1
    # a projection is still pushed into the read, and a plain map still fuses with it
    projected = dataflow.read_parquet(str(tmp_path)).select_columns(["x"]).map(same)
    assert optimized(projected) == "ReadParquet->Map(same)"


def test_a_groupby_reads_only_its_keys_and_aggregated_columns(tmp_path):
    from dataflow.aggregate import Count, Mean, Sum
    from dataflow.plan import Exchange

    table = pa.table({"k": np.arange(100) % 7, "v": np.arange(100.0), "w": np.ones(100), "payload": ["x" * 50] * 100})
    pq.write_table(table, tmp_path / "0.parquet")
    ds = dataflow.read_parquet(str(tmp_path))
    plan = optimize(ds.groupby("k").aggregate(Sum("v"), Count(), Mean("v"))._plan)
    assert isinstance(plan, Exchange) and isinstance(plan.children[0], Read)
    assert plan.children[0].datasource.schema().names == ["k", "v"]
    assert ds.groupby("k").sum("v").sort("k").take(2) == [{"k": 0, "sum(v)": 735.0}, {"k": 1, "sum(v)": 750.0}]
    # a key the data lacks is refused at the call (the read's schema is known), as Ray does
    with pytest.raises(ValueError, match="no such column"):
        ds.groupby("nope")
    # the rows of a sort are whole rows: nothing to skip
    assert optimize(ds.sort("k")._plan).children[0].datasource.schema().names == table.column_names


def test_planning_a_small_sort_reads_each_footer_once(tmp_path, monkeypatch):
    """Planning a small sort over files sizes the input from their footers, then samples the
    schema from them: one read of each footer, and afresh for the next execution."""
    from connectors import parquet_format
    from engine.options import ExecutionOptions

    for k in range(4):
        pq.write_table(pa.table({"k": np.arange(k, 400, 4), "s": ["x"] * 100}), tmp_path / f"{k}.parquet",
                       use_dictionary=False)
    reads = []
    real = parquet_format._read_footer_now
    monkeypatch.setattr(parquet_format, "_read_footer_now", lambda fs, entry, *a: reads.append(entry.path) or real(fs, entry, *a))
    plan = optimize(dataflow.read_parquet(str(tmp_path)).sort("k")._plan)
    ops = compile_plan(plan, ExecutionOptions())
    assert [op.name for op in ops] == ["ReadParquet->Sort"]  # the one-task plan, which sizes its input
    assert sorted(reads) == sorted(str(p) for p in tmp_path.glob("*.parquet"))
    compile_plan(plan, ExecutionOptions())
    assert len(reads) == 8


def test_an_exchange_s_map_side_fuses_into_plain_cpu_map_steps_only():
    """A groupby after a plain task map partitions in the map's tasks; after an actor pool, GPU
    steps or steps holding a custom resource it keeps a map side of its own (with
    ``small_exchange_bytes=0``, so the one-task path for small input is out of the way)."""
    def names(ds) -> list[str]:
        ops = compile_plan(optimize(ds._plan), ExecutionOptions(num_cpus=2, small_exchange_bytes=0))
        return [op.name for op in ops]

    base = dataflow.range(10)
    assert names(base.map_batches(same).groupby("id").count()) == [
        "ReadRange->MapBatches(same)->Aggregate[id]Map", "Aggregate[id]"]
    for steps in (base.map_batches(Model, concurrency=1), base.map_batches(same, num_gpus=1),
                  base.map_batches(same, resources={"TPU": 1})):
        got = names(steps.groupby("id").count())
        assert got[-2:] == ["Aggregate[id]Map", "Aggregate[id]"], got

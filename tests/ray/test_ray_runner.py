"""The same plans on a multi-node Ray cluster (``tests/ray/conftest.py``): results, placement,
all-to-all steps, writes, and the faults Ray recovers from."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pyarrow as pa
import pytest

import dataflow
from engine.errors import ResourceError

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.timeout(300)


def _node(_: object = None) -> str:
    return ray.get_runtime_context().get_node_id()


def _node_of_resource(name: str) -> str:
    return next(n["NodeID"] for n in ray.nodes() if n["Alive"] and name in n["Resources"])


def test_maps_filters_and_consumers(on_ray):
    ds = dataflow.range(20_000, override_num_blocks=12)
    out = ds.map(lambda r: {"id": r["id"], "sq": r["id"] ** 2}).filter(lambda r: r["id"] % 2 == 0)
    out = out.flat_map(lambda r: [r, r]).map_batches(lambda b: {"id": b["id"], "sq": b["sq"] + 1}, batch_size=500)
    assert out.count() == 20_000
    rows = out.take_all()
    assert sorted({r["id"] for r in rows}) == list(range(0, 20_000, 2))
    assert all(r["sq"] == r["id"] ** 2 + 1 for r in rows)
    batches = list(out.iter_batches(batch_size=1000, batch_format="numpy"))
    assert sum(len(b["id"]) for b in batches) == 20_000 and all(len(b["id"]) == 1000 for b in batches)
    m = out.materialize()
    assert m.count() == 20_000 and m.count() == 20_000


def test_tasks_spread_over_nodes(on_ray):
    nodes = dataflow.range(4000, override_num_blocks=24).map_batches(
        lambda b: {"node": [_node()] * len(b["id"])}
    ).unique("node")
    assert len(nodes) >= 2


def test_pinning_by_custom_resource(on_ray):
    target = _node_of_resource("node1")
    nodes = dataflow.range(2000, override_num_blocks=8).map(lambda r: {"node": _node()}, resources={"node1": 0.25}).unique("node")
    assert nodes == [target]


def test_fractional_gpus_go_to_the_gpu_node(on_ray):
    target = _node_of_resource("GPU")
    nodes = dataflow.range(1000, override_num_blocks=4).map(lambda r: {"node": _node()}, num_gpus=0.5).unique("node")
    assert nodes == [target]


def test_a_request_no_node_fits_fails_at_once(on_ray):
    started = time.monotonic()
    with pytest.raises(ResourceError, match="no node"):
        dataflow.range(10).map(lambda r: r, num_gpus=3).take_all()
    with pytest.raises(ResourceError):
        dataflow.range(10).map(lambda r: r, resources={"node1": 2}).take_all()
    assert time.monotonic() - started < 5


class _Tag:
    def __init__(self):
        self.pid = os.getpid()
        self.calls = 0

    def __call__(self, batch):
        self.calls += 1
        n = len(batch["id"])
        return {"id": batch["id"], "pid": np.full(n, self.pid), "calls": np.full(n, self.calls)}


def test_actor_pool_constructs_once_per_actor(on_ray):
    out = dataflow.range(6000, override_num_blocks=12).map_batches(_Tag, concurrency=2, batch_size=500).take_all()
    assert sorted(r["id"] for r in out) == list(range(6000))
    assert len({r["pid"] for r in out}) <= 2
    assert max(r["calls"] for r in out) > 1  # the same instance served several batches


def test_an_actor_pool_leaves_cpus_to_the_tasks_that_feed_it(on_ray):
    """Ray actors keep their CPUs while they live: a pool as large as the cluster would starve
    the tasks feeding it (the job would hang). The pool stops one task's CPUs short while they
    run; a minimum that cannot fit fails at once, naming the step."""
    from engine import runner

    def wide(batch):  # 128 KiB rows: the actors start long before the last input is read
        time.sleep(0.2)
        return {"id": batch["id"], "pad": np.zeros((len(batch["id"]), 16384))}

    def feeding():  # a step of its own (other resources), one task per block
        return dataflow.range(1200, override_num_blocks=48).map_batches(wide, num_cpus=0.5)

    with dataflow.options(min_task_input_bytes=1):
        out = feeding().map_batches(_Tag, concurrency=(1, 6), batch_size=64).select_columns(["id"]).take_all()
        assert sorted(r["id"] for r in out) == list(range(1200))
        with pytest.raises(ResourceError, match=r"_Tag.*asks for 6 actors of 1 CPU"):
            feeding().map_batches(_Tag, concurrency=6, batch_size=64).count()
    assert runner._ray.executor._actor_cpus == 0  # every pool's actors ended with its execution


class _SlowTag(_Tag):
    def __call__(self, batch):
        time.sleep(0.15)
        return super().__call__(batch)


def test_idle_actors_retire_and_a_busy_pool_grows(on_ray, caplog):
    """The local engine's pool policy on Ray: the pool grows, one actor at a time, when work
    waits and every actor is busy, and actors idle past actor_idle_timeout_s retire down to the
    minimum while the step before them is slow. (The fast blocks come first, and the actors are
    slower than the step that feeds them, so both happen whatever the timing: with the slow
    blocks first and fast actors, one actor kept up and neither happened in a full run.)"""
    import logging

    from engine import runner

    executor = runner._ray.executor
    saved = executor.options
    executor.options = saved.with_(actor_idle_timeout_s=0.3)

    def fast_then_slow(batch):
        time.sleep(4.0 if batch["id"][0] >= 4500 else 0.0)  # the last blocks are slow: the actors idle
        return batch

    try:
        with caplog.at_level(logging.INFO, logger="dataflow.ray"):
            ds = dataflow.range(6000, override_num_blocks=24).map_batches(fast_then_slow, num_cpus=0.5)
            out = ds.map_batches(_SlowTag, concurrency=(1, 3), batch_size=250, num_cpus=0.5).take_all()
    finally:
        executor.options = saved
    assert sorted(r["id"] for r in out) == list(range(6000))
    messages = [r.getMessage() for r in caplog.records]
    assert any("actor pool grown" in m for m in messages), messages
    assert any("idle actor retired" in m for m in messages), messages


def test_udf_errors_keep_their_type(on_ray):
    def bad(row):
        if row["id"] == 77:
            raise KeyError("missing thing")
        return row

    with pytest.raises(KeyError, match="missing thing"):
        dataflow.range(200).map(bad).take_all()


def test_all_to_all_steps(on_ray):
    ds = dataflow.range(30_000, override_num_blocks=10).map(lambda r: {"id": r["id"], "k": r["id"] % 11})
    assert [r["id"] for r in ds.sort("id", descending=True).take(3)] == [29_999, 29_998, 29_997]
    ids = [r["id"] for r in ds.random_shuffle(seed=5).take_all()]
    assert sorted(ids) == list(range(30_000)) and ids == [r["id"] for r in ds.random_shuffle(seed=5).take_all()]
    counts = {r["k"]: r["count()"] for r in ds.groupby("k").count().take_all()}
    assert counts == {k: len(range(k, 30_000, 11)) for k in range(11)}
    with dataflow.options(small_exchange_bytes=0):  # partitioned; every key distinct: rows cross, not states
        sums = {r["id"]: r["sum(k)"] for r in ds.groupby("id").sum("k").take_all()}
    assert sums == {i: i % 11 for i in range(30_000)}
    other = dataflow.range(1000).map(lambda r: {"id": r["id"] * 3, "x": r["id"]})
    assert ds.join(other, "inner", on=("id",)).count() == 1000
    assert ds.repartition(4).materialize().num_blocks() == 4


def test_a_repartition_writes_its_files_in_its_reduce_tasks(on_ray, tmp_path):
    """As on the local engine: the reduce task of ``repartition(n)`` writes its file itself."""
    import pyarrow.parquet as pq

    ds = dataflow.range(10_000, override_num_blocks=8).repartition(1)
    ds.write_parquet(str(tmp_path / "one"))
    files = list((tmp_path / "one").glob("*.parquet"))
    assert len(files) == 1 and sorted(pq.read_table(files[0]).column("id").to_pylist()) == list(range(10_000))
    assert ds._last_stats.operators[-1].name == "Repartition[1]->Write[WriteParquet]"
    dataflow.range(10_000, override_num_blocks=8).repartition(3, shuffle=True).write_csv(str(tmp_path / "three"))
    assert len(list((tmp_path / "three").glob("*.csv"))) == 3
    assert dataflow.read_csv(str(tmp_path / "three")).count() == 10_000


def test_a_sort_samples_its_keys_on_the_cluster(on_ray, monkeypatch):
    """The tasks feeding a sort sample their own blocks: the driver fetches none of them."""
    from dataflow.sort import RangePartitioner

    driver, real = os.getpid(), RangePartitioner.sample

    def sample(self, table):  # travels to the workers by value (cloudpickle), so it checks where it runs
        if os.getpid() == driver:
            raise AssertionError("the driver fetched a block to sample it")
        return real(self, table)

    monkeypatch.setattr(RangePartitioner, "sample", sample)
    ds = dataflow.range(30_000, override_num_blocks=10).map_batches(lambda b: {"k": (b["id"] * 7919) % 30_011})
    keys = [r["k"] for r in ds.sort("k", descending=True).take_all()]
    assert len(keys) == 30_000 and keys == sorted(keys, reverse=True)


def test_seeded_shuffle_matches_the_local_engine(on_ray):
    ds = dataflow.range(5000, override_num_blocks=5)
    on_cluster = [r["id"] for r in ds.random_shuffle(seed=9).take_all()]
    with dataflow.options(execution_mode="local"):
        assert [r["id"] for r in ds.random_shuffle(seed=9).take_all()] == on_cluster


def test_sources_and_sinks_pinned_to_the_driver_node_are_refused_on_several_nodes(on_ray):
    """Ray's supports_distributed_reads/writes=False keep tasks on the driver's node; this runner
    cannot pin them, so it says so instead of running them anywhere."""
    from dataflow.block import BlockMetadata
    from dataflow.datasource import Datasink, Datasource, ReadTask

    class LocalOnly(Datasource):
        supports_distributed_reads = False

        def get_read_tasks(self, parallelism, per_task_row_limit=None):
            return [ReadTask(lambda: [pa.table({"x": [1]})], BlockMetadata(num_rows=1, size_bytes=8))]

    class DriverOnly(Datasink):
        supports_distributed_writes = False

        def write(self, blocks, ctx):
            return None

    with pytest.raises(ValueError, match="supports_distributed_reads=False"):
        dataflow.read_datasource(LocalOnly()).take_all()
    with pytest.raises(ValueError, match="supports_distributed_writes=False"):
        dataflow.range(3).write_datasink(DriverOnly())
    with dataflow.options(execution_mode="local"):  # one machine: every node is the driver's
        assert dataflow.read_datasource(LocalOnly()).take_all() == [{"x": 1}]


def test_writes_need_shared_storage(on_ray, tmp_path, s3, monkeypatch):
    ds = dataflow.range(1000, override_num_blocks=4)
    ctx = dataflow.DataContext.get_current()
    monkeypatch.setattr(ctx, "shared_filesystem_paths", ())
    with pytest.raises(ValueError, match="several nodes") as info:
        ds.write_parquet(str(tmp_path / "out"))
    assert str(tmp_path / "out") in str(info.value) and "shared_filesystem_paths" in str(info.value)
    assert not (tmp_path / "out").exists()
    # a folder every node mounts (here the nodes share this machine), declared: written as s3:// is
    monkeypatch.setattr(ctx, "shared_filesystem_paths", (str(tmp_path / "mnt"),))
    with pytest.raises(ValueError, match="several nodes"):  # a sibling of the mount is still local
        ds.write_parquet(str(tmp_path / "mnt-other"))
    ds.write_parquet(str(tmp_path / "mnt" / "out"))
    assert dataflow.read_parquet(str(tmp_path / "mnt" / "out")).count() == 1000
    import pyarrow.fs as pafs

    # the cluster's workers do not share the test's environment: the credentials travel with the sink
    fs = pafs.S3FileSystem(endpoint_override=s3.endpoint, access_key="testing", secret_key="testing",
                           region="us-east-1", scheme="http")
    ds.write_parquet("test-bucket/ray-out", filesystem=fs)
    assert dataflow.read_parquet("s3://test-bucket/ray-out").count() == 1000


def test_spills_past_the_object_store(on_ray):
    # ~290 MiB through a shuffle on three 80 MiB object stores: Ray spills, results are exact
    def wide(batch):
        n = len(batch["id"])
        return {"id": batch["id"], "pad": np.ones((n, 1024), dtype=np.float64)}

    ds = dataflow.range(36_000, override_num_blocks=24).map_batches(wide)
    ids = ds.random_shuffle(seed=1).map_batches(lambda b: {"id": b["id"]}).take_all()
    assert sorted(r["id"] for r in ids) == list(range(36_000))


def test_a_crashed_worker_is_retried(on_ray, tmp_path):
    marker = tmp_path / "crashed"

    def crash_once(batch):
        if batch["id"][0] == 0 and not marker.exists():
            marker.write_text("x")
            os._exit(1)
        return batch

    ds = dataflow.range(5000, override_num_blocks=10).map_batches(crash_once)
    out = ds.take_all()
    assert marker.exists()
    assert sorted(r["id"] for r in out) == list(range(5000))
    stats = ds._last_handle.stats()
    assert sum(op.tasks_retried for op in stats.operators) == 1  # Ray ran it again; stats() says so


def test_a_crashed_actor_is_restarted_and_its_task_retried(on_ray, tmp_path):
    marker = tmp_path / "actor-crashed"

    class CrashOnce:
        def __call__(self, batch):
            if batch["id"][0] >= 2000 and not marker.exists():
                marker.write_text("x")
                os._exit(1)
            return {"id": batch["id"], "v": batch["id"] * 3}

    ds = dataflow.range(5000, override_num_blocks=10).map_batches(CrashOnce, concurrency=2, batch_size=500)
    rows = ds.take_all()
    assert marker.exists()
    assert sorted(r["id"] for r in rows) == list(range(5000))
    assert sum(r["v"] for r in rows) == 3 * sum(range(5000))
    stats = ds._last_handle.stats()
    assert sum(op.tasks_retried for op in stats.operators) >= 1


def _where(batch):
    import ray

    return {"id": batch["id"], "node": [ray.get_runtime_context().get_node_id()] * len(batch["id"])}


def test_locality_with_output_places_tasks_on_the_nodes_asked(on_ray):
    """Ray's ``execution_options.locality_with_output``: a list of node ids is where the tasks
    go (softly: two tasks at a time fit the node here, so none has to run elsewhere); True,
    the driver's node, falls back to the others on this cluster, whose head has no CPU."""
    import ray

    target = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and "node1" in n["Resources"])
    limits = dataflow.ExecutionResources(cpu=2)
    with dataflow.options(locality_with_output=[target], resource_limits=limits):
        rows = dataflow.range(400, override_num_blocks=8).map_batches(_where).take_all()
    assert sorted(r["id"] for r in rows) == list(range(400))
    assert {r["node"] for r in rows} == {target}
    with dataflow.options(locality_with_output=True):
        assert dataflow.range(100, override_num_blocks=4).map_batches(_where).count() == 100
    with pytest.raises(ValueError, match="locality_with_output"), dataflow.options(locality_with_output="node1"):
        dataflow.range(3).take_all()


def test_node_removed_mid_job(on_ray):
    cluster = on_ray
    extra = cluster.add_node(num_cpus=2, resources={"doomed": 4}, object_store_memory=80 << 20)
    cluster.wait_for_nodes()
    try:
        def slow(batch):
            time.sleep(0.3)
            return {"id": batch["id"], "v": batch["id"] * 2}

        with dataflow.options(execution_mode="ray"):
            ds = dataflow.range(12_000, override_num_blocks=40).map_batches(slow)
            killer = threading.Timer(2.0, lambda: cluster.remove_node(extra, allow_graceful=False))
            killer.start()
            rows = ds.take_all()
            killer.join()
        assert sorted(r["id"] for r in rows) == list(range(12_000))
        assert sum(r["v"] for r in rows) == 2 * sum(range(12_000))
    finally:
        if extra in cluster.worker_nodes:
            cluster.remove_node(extra)


def _time_connecting(setup: str, call: str, cwd) -> tuple[str, float, str]:
    """In a fresh process: ``setup``, then ``call`` timed; the error's type, seconds and text."""
    code = (
        f"import time\n{setup}\n"
        "t = time.monotonic()\n"
        "try:\n"
        f"    {call}\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, round(time.monotonic() - t, 1), e)\n"
    )
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=cwd)
    line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-2000:]
    kind, seconds, text = [*line.split(" ", 2), "", ""][:3]
    assert seconds.replace(".", "", 1).isdigit(), line
    return kind, float(seconds), text


def test_unreachable_cluster_fails_within_seconds(tmp_path):
    kind, seconds, text = _time_connecting("import dataflow", "dataflow.init(runner='ray', address='127.0.0.1:1')", tmp_path)
    assert kind == "ConnectionError" and "127.0.0.1:1" in text, text
    assert seconds < 3, seconds  # nothing listens there: said at once, not after CONNECT_TIMEOUT_S


def test_a_port_that_answers_but_is_not_ray_fails_at_the_timeout(tmp_path):
    setup = ("import socket\nfrom engine.ray_backend import _connect\n"
             "listener = socket.socket(); listener.bind(('127.0.0.1', 0)); listener.listen()\n"
             "address = '127.0.0.1:%d' % listener.getsockname()[1]")
    kind, seconds, text = _time_connecting(setup, "_connect(address, 2.0)", tmp_path)
    assert kind == "ConnectionError" and "no answer within 2 s" in text, text
    assert seconds < 6, seconds


@pytest.mark.parametrize("caller", ["main", "thread"])
def test_no_address_starts_a_local_ray_that_outlives_init(caller):
    # ray.init ran in a helper thread (to bound a connect), and Ray has what it starts killed
    # when the thread that started it exits: the new GCS died as init returned, and the driver
    # exited 60 s later ("Failed to connect to GCS"). The same from a user's thread that ends.
    # Run where no cluster is set.
    start = ("dataflow.init(runner='ray', num_cpus=1)" if caller == "main" else
             "t = threading.Thread(target=dataflow.init, kwargs=dict(runner='ray', num_cpus=1)); t.start(); t.join()")
    script = (
        "import threading, time, psutil, ray, dataflow\n"
        f"{start}\n"
        "time.sleep(1)\n"
        "gcs = [p for p in psutil.Process().children(recursive=True) if 'gcs_server' in ' '.join(p.cmdline())]\n"
        "print('gcs', len(gcs), all(p.status() != psutil.STATUS_ZOMBIE for p in gcs))\n"
        "print('cpus', ray.cluster_resources().get('CPU'))\n"
        "print('rows', dataflow.range(5).map(lambda r: r).count())\n"
        "dataflow.shutdown()\n"
    )
    temp = tempfile.mkdtemp(prefix="dfl-", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_TMPDIR=temp, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    try:
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env, cwd=temp)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    lines = out.stdout.splitlines()
    assert "gcs 1 True" in lines and "cpus 1.0" in lines and "rows 5" in lines, out.stdout + out.stderr[-3000:]


def test_a_killed_driver_leaves_nothing_on_the_cluster(ray_cluster, tmp_path):
    from ray._private.state import actors

    script = tmp_path / "driver.py"
    script.write_text(
        "import time, numpy as np, dataflow\n"
        "def wide(b):\n"
        "    return {'id': b['id'], 'pad': np.ones((len(b['id']), 131072))}\n"
        "class Keep:\n"
        "    def __call__(self, b):\n"
        "        return b\n"
        f"dataflow.init(runner='ray', address={ray_cluster.address!r})\n"
        "# 1 MiB rows, 10 MiB blocks: the job fills its budget and waits for a consumer that never comes back\n"
        "ds = dataflow.range(2000, override_num_blocks=200).map_batches(wide, num_cpus=0.5).map_batches(Keep, concurrency=2)\n"
        "it = ds.iter_batches(batch_size=1)\n"
        "batches = iter(it); next(batches); print('running', flush=True)\n"
        "time.sleep(600)\n"
    )
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    driver = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        assert driver.stdout is not None
        assert driver.stdout.readline().strip() == "running"

        def alive() -> list:
            return [a for a in actors().values() if a["State"] == "ALIVE" and a.get("ActorClassName", "").endswith("_PoolActor")]

        assert alive(), [(a["State"], a["ActorClassName"]) for a in actors().values()]
        driver.kill()
        driver.wait(10)
        deadline = time.monotonic() + 60
        while alive() and time.monotonic() < deadline:
            time.sleep(1)
        assert not alive(), "the killed driver's actors are still alive"
    finally:
        driver.kill()
        driver.wait(10)
        if driver.stdout is not None:
            driver.stdout.close()


def test_streaming_split_feeds_ddp_ranks_on_three_nodes(on_ray):
    """streaming_split(3, equal=True) to rank actors pinned to three nodes, each running a
    gloo DDP loop on iter_torch_batches: every row once, equal shares, ranks in lockstep."""
    import socket

    class Rank:  # defined here so Ray ships it by value (workers cannot import the test module)
        """A training rank: a DDP loop (gloo) fed by its streaming_split iterator."""

        def train(self, iterator, rank: int, world: int, port: int) -> dict:
            from datetime import timedelta

            import torch
            import torch.distributed as dist

            torch.manual_seed(0)
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                    timeout=timedelta(seconds=120))
            try:
                model = torch.nn.Linear(1, 1)
                ddp = torch.nn.parallel.DistributedDataParallel(model)
                opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
                ids, steps = [], 0
                for batch in iterator.iter_torch_batches(batch_size=50, dtypes={"x": torch.float32}):
                    x = batch["x"].unsqueeze(1)
                    loss = ((ddp(x) - (2 * x + 1)) ** 2).mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    ids.extend(batch["id"].tolist())
                    steps += 1
                weights = [p.detach().flatten().tolist() for p in model.parameters()]
            finally:
                dist.destroy_process_group()
            node = ray.get_runtime_context().get_node_id()
            return {"node": node, "ids": ids, "steps": steps, "weights": weights, "loss": float(loss)}

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ds = dataflow.range(6000, override_num_blocks=30).map_batches(lambda b: {"id": b["id"], "x": (b["id"] % 100) / 100})
    splits = ds.streaming_split(3, equal=True)
    ranks = [ray.remote(num_cpus=0)(Rank).options(resources={f"node{i}": 0.01}).remote() for i in range(3)]
    results = ray.get([r.train.remote(splits[i], i, 3, port) for i, r in enumerate(ranks)], timeout=240)
    assert sorted({r["node"] for r in results}) == sorted(_node_of_resource(f"node{i}") for i in range(3))
    assert [len(r["ids"]) for r in results] == [2000, 2000, 2000]
    assert sorted(i for r in results for i in r["ids"]) == list(range(6000))
    assert len({r["steps"] for r in results}) == 1
    assert all(r["weights"] == results[0]["weights"] for r in results)  # DDP kept the replicas equal
    assert results[0]["loss"] < 0.1
    stats = splits[0].split_stats()
    assert stats["rows"] == [2000, 2000, 2000]
    assert "rows per split [2000, 2000, 2000]" in splits[0].stats()
    # each rank is handed the blocks its node holds first, while dealing and in the final equal
    # deal: all it could read locally, 5 runs of 5 (before the final deal went by node: 39-67%).
    # How many it can depends on where Ray ran the tasks that made the blocks: all on one node once
    nodes = [_node_of_resource(f"node{i}") for i in range(3)]
    local_at_most = sum(min(2000, stats["rows_by_node"].get(node, 0)) for node in nodes)
    assert sum(stats["rows_on_own_node"]) >= 0.75 * local_at_most, stats
    for r in ranks:
        ray.kill(r)


def test_streaming_split_hands_small_blocks_in_the_answer(on_ray, monkeypatch):
    """A block of at most ``INLINE_ANSWER_BYTES`` comes in the answer to the rank's poll (the
    actor reads it from its own memory); a bigger one is read by its object ref. Every row once
    either way."""
    import ray

    from engine import ray_split

    e2e = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "e2e")
    if e2e not in sys.path:
        sys.path.insert(0, e2e)
    from test_split import _drain

    how: list[tuple[int, bool]] = []
    real_get = ray_split.RaySplitClient.get

    def spy(self, ref):
        how.append((ref.size_bytes, isinstance(self._held[ref.block_id][0], ray.ObjectRef)))
        return real_get(self, ref)

    monkeypatch.setattr(ray_split.RaySplitClient, "get", spy)
    small = dataflow.range(4000, override_num_blocks=20)  # 200 ids a block: 1.6 KB
    big = dataflow.range(400, override_num_blocks=4).map_batches(
        lambda b: {"id": b["id"], "pad": np.zeros((len(b["id"]), 256))})  # 100 rows of 2 KiB: 200 KB
    for ds, n, by_ref in ((small, 4000, False), (big, 400, True)):
        how.clear()
        seen = _drain(ds.streaming_split(2), batch_size=None)  # both ranks at once, on threads
        assert sorted(seen[0] + seen[1]) == list(range(n))
        assert how and all(ref == by_ref for _, ref in how), how
        assert all((size <= ray_split.INLINE_ANSWER_BYTES) != by_ref for size, _ in how), how


@pytest.mark.parametrize("seed", [5013])
def test_random_plans_are_exact_on_ray(on_ray, seed, tmp_path):
    """Random plans of the local engine's stress test (tests/engine/plan_fuzz.py) on the
    cluster, without kills. Seed 5013 (two unions, a filter between them, a write) hung here: the
    write waited for a fuller bundle from a union whose inputs were all held at their budget."""
    engine_tests = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "engine")
    if engine_tests not in sys.path:
        sys.path.insert(0, engine_tests)
    from plan_fuzz import make_case, run

    case = make_case(seed, max_block_bytes=8 << 20, kills=False)
    with dataflow.options(preserve_order=case.preserve_order):
        run(case, str(tmp_path))


def test_a_task_failing_outside_its_udf_is_not_reported_as_a_death():
    from ray.exceptions import NodeDiedError, RayTaskError, WorkerCrashedError

    from engine.errors import EngineError, WorkerDiedError
    from engine.ray_backend import _cluster_failure

    shipped = RayTaskError("_remote_task", "Traceback (most recent call last): ...", KeyError("b"))
    error = _cluster_failure("RenameColumns", shipped)
    assert isinstance(error, EngineError) and "outside its UDF" in str(error) and error.__cause__ is shipped
    for death in (WorkerCrashedError(), NodeDiedError("node gone")):
        assert isinstance(_cluster_failure("Map", death), WorkerDiedError)

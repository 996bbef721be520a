"""dataflow's Ray runner against Ray Data 2.60, on the same local multi-node Ray cluster.

The orchestrator starts one ``ray.cluster_utils.Cluster`` (a 0-CPU head and ``--nodes`` nodes
declaring ``--cpus-per-node`` CPUs (2) each, every node's raylet and workers pinned to a core of
its own, ``--store-mib`` of object store each; two CPUs per node so that an actor and a read task
fit on one node, as on real clusters), then runs each case in a fresh driver process per side, sides alternating,
``--runs`` timed runs after one untimed warm-up per driver (median reported). Both sides connect
to the same cluster, so the ratio in one run is what counts on a shared machine.

Cases (rows per second of the whole job, and the Ray runner's per-task overhead):

* ``read_map_iter``: ``read_parquet`` of 16 files (2M rows: ``id`` int64, ``x`` float64, ``s``
  a 16-byte string), ``map_batches`` adding a column, drained by the driver with
  ``iter_batches(batch_size=4096)``.
* ``many_blocks``: ``range(400_000, override_num_blocks=400).map_batches(identity).count()``
  with one task per block (dataflow: ``min_task_input_bytes=1``; Ray: one block per task
  anyway): tasks per second, and ``us/task`` of the whole job.
* ``actor_inference``: the same 2M rows through ``map_batches(Model, concurrency=<nodes>,
  batch_size=1024)``, a numpy 64x64 "model" built once per actor (one CPU each), ``count()`` of
  the output.
* ``streaming_split``: ``streaming_split(2, equal=True)`` of ``read_parquet -> map_batches``,
  each split drained by a thread of the driver with ``iter_batches(batch_size=4096)``.

``--scaling`` runs only ``read_map_iter``, on a fresh cluster of 1 node, then 2, ... up to
``--nodes`` nodes, for the per-node scaling of each side. Target: dataflow at least 2x Ray Data's throughput on each
case. Run: ``python benchmarks/bench_ray_runner.py`` (needs the ``ray`` extra).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "raybench"
ROWS = 2_000_000
FILES = 16
RESULT_TAG = "@@BENCH@@"
CASES = ("read_map_iter", "many_blocks", "actor_inference", "streaming_split")


# ----------------------------------------------------------------------------------------------
# the data


def make_data() -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    marker = DATA / "_DONE"
    if marker.exists():
        return
    DATA.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    per = ROWS // FILES
    for i in range(FILES):
        ids = np.arange(i * per, (i + 1) * per, dtype=np.int64)
        strings = pa.array([f"{v:016x}" for v in rng.integers(0, 2**62, per)])
        pq.write_table(pa.table({"id": ids, "x": rng.random(per), "s": strings}), DATA / f"part-{i:03d}.parquet")
    marker.write_text("ok")


# ----------------------------------------------------------------------------------------------
# the workloads (run in a driver process of their own)


def add_column(batch):
    batch["y"] = batch["x"] * 2.0 + 1.0
    return batch


def identity(batch):
    return batch


class Model:
    def __init__(self):
        import numpy as np

        self.w = np.random.default_rng(0).random((64, 64))

    def __call__(self, batch):
        import numpy as np

        features = np.repeat(batch["x"][:, None], 64, axis=1)
        batch["score"] = (features @ self.w).sum(axis=1)
        return batch


def _drain(ds) -> int:
    return sum(len(b["id"]) for b in ds.iter_batches(batch_size=4096, batch_format="numpy"))


def _drain_splits(splits) -> int:
    counts = [0] * len(splits)

    def run(i: int) -> None:
        counts[i] = sum(len(b["id"]) for b in splits[i].iter_batches(batch_size=4096, batch_format="numpy"))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(splits))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts)


def run_case(side: str, case: str, nodes: int, address: str, runs: int) -> dict:
    import logging

    import ray

    ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    if side == "dataflow":
        import dataflow as lib

        lib.init(runner="ray", address=address)
        ctx = lib.DataContext.get_current()
        ctx.enable_progress_bars = False
    else:
        import ray.data as lib

        ctx = lib.DataContext.get_current()
        ctx.enable_progress_bars = False
        ctx.print_on_execution_start = False

    def job() -> int:
        if case == "read_map_iter":
            return _drain(lib.read_parquet(str(DATA)).map_batches(add_column, batch_format="numpy"))
        if case == "many_blocks":
            ds = lib.range(400_000, override_num_blocks=400).map_batches(identity, batch_size=None)
            if side == "dataflow":
                with lib.options(min_task_input_bytes=1):
                    count = ds.count()
                # it must run one task per block, or it does not measure what it says
                tasks = max(op.tasks for op in ds._last_handle.stats().operators)
                if tasks < 400:
                    raise RuntimeError(f"many_blocks ran {tasks} tasks, not one per block (400)")
                return count
            return ds.count()
        if case == "actor_inference":
            ds = lib.read_parquet(str(DATA)).map_batches(Model, concurrency=nodes, batch_size=1024, batch_format="numpy")
            return ds.count()
        if case == "streaming_split":
            ds = lib.read_parquet(str(DATA)).map_batches(add_column, batch_format="numpy")
            return _drain_splits(ds.streaming_split(2, equal=True))
        raise ValueError(case)

    rows = job()  # warm-up: workers, actors and the page cache
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        rows = job()
        times.append(time.perf_counter() - started)
    out = {"side": side, "case": case, "nodes": nodes, "rows": rows, "times": times, "median_s": statistics.median(times)}
    if case == "many_blocks":
        out["tasks"] = 400
    return out


# ----------------------------------------------------------------------------------------------
# the orchestrator


def start_cluster(nodes: int, store_mib: int, cpus_per_node: int):
    from ray.cluster_utils import Cluster

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    temp = tempfile.mkdtemp(prefix="dfbench-", dir="/tmp")
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "temp_dir": temp, "object_store_memory": store_mib << 20, "include_dashboard": False})
    cores = sorted(os.sched_getaffinity(0))
    for i in range(nodes):
        node = cluster.add_node(num_cpus=cpus_per_node, object_store_memory=store_mib << 20)
        core = {cores[i % len(cores)]}
        for info in node.all_processes.get("raylet", []):  # the raylet, and the workers it forks
            os.sched_setaffinity(info.process.pid, core)
    cluster.wait_for_nodes()
    return cluster


def run_side(side: str, case: str, nodes: int, address: str, runs: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", side, "--case", case, "--nodes-used", str(nodes),
           "--address", address, "--runs", str(runs)]
    path = os.pathsep.join(p for p in (str(HERE.parent), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", PYTHONPATH=path)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    return {"side": side, "case": case, "error": (proc.stderr or proc.stdout)[-2000:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--store-mib", type=int, default=400)
    ap.add_argument("--cpus-per-node", type=int, default=2,
                    help="CPUs each node declares to Ray (its raylet and workers share one core)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--scaling", action="store_true")
    ap.add_argument("--worker")
    ap.add_argument("--case")
    ap.add_argument("--nodes-used", type=int)
    ap.add_argument("--address")
    args = ap.parse_args()
    if args.worker:
        print(RESULT_TAG + json.dumps(run_case(args.worker, args.case, args.nodes_used, args.address, args.runs)), flush=True)
        return 0

    make_data()
    if args.scaling:  # one cluster per process: 1 node, 2 nodes, ... --nodes
        for nodes in range(1, args.nodes + 1):
            subprocess.run([sys.executable, __file__, "--nodes", str(nodes), "--cases", "read_map_iter",
                            "--runs", str(args.runs), "--store-mib", str(args.store_mib),
                            "--cpus-per-node", str(args.cpus_per_node)], check=False)
        return 0
    cluster = start_cluster(args.nodes, args.store_mib, args.cpus_per_node)
    results = []
    try:
        for case in args.cases.split(","):
            pair = {side: run_side(side, case, args.nodes, cluster.address, args.runs) for side in ("dataflow", "ray")}
            results.append({"case": case, "nodes": args.nodes, **pair})
            show(case, args.nodes, pair)
    finally:
        try:
            cluster.shutdown()
        except Exception as err:  # a node that will not drain: its processes are killed anyway
            print(f"cluster shutdown: {err}", file=sys.stderr)
    print(RESULT_TAG + json.dumps(results))
    return 0


def show(case: str, nodes: int, pair: dict) -> None:
    df, ray_ = pair["dataflow"], pair["ray"]
    if "error" in df or "error" in ray_:
        print(f"{case} ({nodes} nodes): error\n{df.get('error', '')}\n{ray_.get('error', '')}", flush=True)
        return
    rate = {side: r["rows"] / r["median_s"] for side, r in pair.items()}
    line = (f"{case:16s} nodes={nodes}  dataflow {df['median_s']:.2f} s ({rate['dataflow'] / 1e6:.2f} M rows/s)  "
            f"ray {ray_['median_s']:.2f} s ({rate['ray'] / 1e6:.2f} M rows/s)  ratio {ray_['median_s'] / df['median_s']:.2f}x")
    if case == "many_blocks":
        line += (f"  tasks/s dataflow {400 / df['median_s']:.0f} ray {400 / ray_['median_s']:.0f}"
                 f"  us/task dataflow {df['median_s'] / 400 * 1e6:.0f} ray {ray_['median_s'] / 400 * 1e6:.0f}")
    print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())

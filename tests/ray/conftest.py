"""A multi-node Ray cluster on this machine for the ray runner's tests.

A 0-CPU head and three nodes of 2 CPUs, each with its own custom resource (``node0``..``node2``),
two fake GPUs on ``node2``, a small object store per node (so large jobs spill), fast node-death
detection, and a short per-run temp dir. dataflow connects to it with
``dataflow.init(runner="ray", address=...)``.

The leak check of these tests: after each test, the driver holds no block (every object ref it
owned was dropped) and no execution is running. Ray's own processes come and go, so the process
check of the other tiers does not apply.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

ray = pytest.importorskip("ray")

import dataflow  # noqa: E402
from engine import runner  # noqa: E402

NODE_STORE = 80 << 20


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    temp_dir = tempfile.mkdtemp(prefix="dfray-", dir="/tmp")
    # Ray writes the cluster's address to <system temp>/ray/ray_current_cluster whatever the
    # nodes' temp_dir, and only creates that folder when a node uses it: a machine where Ray
    # never ran fails without it
    from ray._common.utils import get_default_ray_temp_dir

    os.makedirs(get_default_ray_temp_dir(), exist_ok=True)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "temp_dir": temp_dir,
            "object_store_memory": NODE_STORE,
            "_system_config": {
                "health_check_period_ms": 500,
                "health_check_failure_threshold": 3,
                "health_check_initial_delay_ms": 0,
            },
        },
    )
    nodes = [
        cluster.add_node(num_cpus=2, resources={f"node{i}": 1}, num_gpus=2 if i == 2 else 0, object_store_memory=NODE_STORE)
        for i in range(3)
    ]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
    dataflow.init(runner="ray", address=cluster.address)
    # every node of this cluster runs on this machine: its temp folders (the tests' tmp_path) are
    # a folder all nodes mount, as an NFS mount would be on a real cluster
    ctx = dataflow.DataContext.get_current()
    saved_shared = ctx.shared_filesystem_paths
    ctx.shared_filesystem_paths = (tempfile.gettempdir(),)
    cluster.worker_nodes_list = nodes
    yield cluster
    ctx.shared_filesystem_paths = saved_shared
    runner.shutdown()
    ray.shutdown()
    cluster.shutdown()
    shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture
def on_ray(ray_cluster: Any) -> Iterator[Any]:
    """Run the test's plans on the Ray cluster."""
    with dataflow.options(execution_mode="ray"):
        yield ray_cluster


@pytest.fixture
def mode(ray_cluster: Any) -> Iterator[str]:
    """The e2e tests' execution mode, here the Ray runner (``test_e2e_on_ray.py``)."""
    with dataflow.options(execution_mode="ray"):
        yield "ray"


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """The driver holds no block and runs no execution after the test (overrides the tiers' check)."""
    yield
    import gc

    gc.collect()
    backend = runner._ray
    if backend is None or backend.closed:
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (backend.executor._executions or len(backend.store)):
        time.sleep(0.05)
        gc.collect()
    assert not backend.executor._executions, "an execution is still running after the test"
    assert len(backend.store) == 0, f"{len(backend.store)} blocks still held by the driver"

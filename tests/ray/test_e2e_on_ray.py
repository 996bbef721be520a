"""The user-level e2e suites, run again on the Ray runner (the ``mode`` fixture of
``tests/ray/conftest.py`` is the Ray cluster): the same pipelines, the same answers."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

E2E = Path(__file__).parents[1] / "e2e"
SUITES = ("test_api", "test_all_to_all", "test_errors")
NOT_ON_THIS_CLUSTER = {
    # writing to a local folder is refused on a multi-node cluster (test_ray_runner checks it)
    "test_api__test_parquet_round_trip": "writes to a local folder",
    "test_all_to_all__test_repartition_sets_blocks_and_files": "writes to a local folder",
    # num_gpus=1 fits here: node2 has two GPUs (test_ray_runner checks a request no node fits)
    "test_errors__test_impossible_resources_fail_at_once": "the cluster has GPUs",
    # a statistical test of the partitioner, the same code on every runner: 11 s here for nothing new
    "test_all_to_all__test_shuffle_is_uniform_enough": "runner-independent statistics",
}


def _load(name: str) -> dict:
    # imported under its own name, from its folder (as pytest imports it): Ray workers, which get
    # the driver's sys.path, can then import the classes and functions the tests define
    if str(E2E) not in sys.path:
        sys.path.insert(0, str(E2E))
    module = importlib.import_module(name)
    return {f"{name}__{key}": value for key, value in vars(module).items()
            if key.startswith("test_") and callable(value)}


_tests: dict = {}
for _suite in SUITES:
    _tests.update(_load(_suite))
assert set(NOT_ON_THIS_CLUSTER) <= set(_tests), set(NOT_ON_THIS_CLUSTER) - set(_tests)
globals().update({name: test for name, test in _tests.items() if name not in NOT_ON_THIS_CLUSTER})

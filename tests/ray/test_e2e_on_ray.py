"""The user-level e2e suites, run again on the Ray runner (the ``mode`` fixture of
``tests/ray/conftest.py`` is the Ray cluster): the same pipelines, the same answers. ``NOT_ON_THIS_CLUSTER`` names the tests that do not
apply to a multi-node cluster, and why."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

E2E = Path(__file__).parents[1] / "e2e"
# not here, for the default run's time: test_with_column and test_dataset_info (planning and
# metadata on the driver), test_on_error (row errors are handled inside the task): the same
# code on every runner; and the suites that write local files
SUITES = ("test_api", "test_all_to_all", "test_errors", "test_split", "test_split_materialized",
          "test_iterator_resume", "test_torch", "test_custom_io", "test_ray_kwargs")
NOT_ON_THIS_CLUSTER = {
    # writing to a local folder is refused on a multi-node cluster (test_ray_runner checks it)
    "test_api__test_parquet_round_trip": "writes to a local folder",
    "test_all_to_all__test_repartition_sets_blocks_and_files": "writes to a local folder",
    # num_gpus=1 fits here: node2 has two GPUs (test_ray_runner checks a request no node fits)
    "test_errors__test_impossible_resources_fail_at_once": "the cluster has GPUs",
    # these also write their inputs or outputs to a local folder
    "test_ray_kwargs__test_partition_filter_picks_files_before_reading": "writes to a local folder",
    "test_ray_kwargs__test_json_round_trip_of_a_written_dataset": "writes to a local folder",
    "test_ray_kwargs__test_comparing_a_partition_column_with_a_number_says_why": "writes to a local folder",
    "test_torch__test_num_gpus_without_gpus_fails_at_once": "the cluster has GPUs",
    # forked DataLoader workers cannot use the driver's Ray connection (RayStore says so)
    "test_torch__test_dataloader_workers_leave_the_parent_engine_alone": "forked DataLoader workers",
    "test_torch__test_torch_iterable_from_a_materialized_dataset": "forked DataLoader workers",
    # the local engine's busy workers and torch threads; the cluster's CPUs are not the driver's
    "test_torch__test_torch_threads_make_room_for_busy_workers_and_are_restored_after": "local CPUs only",
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

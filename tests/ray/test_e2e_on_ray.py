"""The user-level e2e suites, run again on the Ray runner (the ``mode`` fixture of
``tests/ray/conftest.py`` is the Ray cluster): the same pipelines, the same answers. ``NOT_ON_THIS_CLUSTER`` names the tests that do not
apply to a multi-node cluster, and why."""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")

E2E = Path(__file__).parents[1] / "e2e"
# the e2e suites whose tests take ``mode`` (random plans with their default seeds), by default or
# in the slow tier; the notebooks run below, in kernels that reach the cluster through the environment
SUITES = ("test_api", "test_all_to_all", "test_all_to_all_fuzz", "test_errors", "test_split", "test_split_materialized",
          "test_iterator_resume", "test_torch", "test_ray_kwargs", "test_on_error", "test_tracebacks", "test_mix",
          "test_ray_answers", "test_partitioned_reads")
SLOW_SUITES = ("test_formats", "test_dataset_info", "test_file_based_io", "test_progress", "test_with_column",
               "test_custom_io", "test_random_access", "test_dask", "test_lineage", "test_tf", "test_filter_fuzz",
               "test_plan_steps_fuzz")
"""Suites whose Ray runs are in the ``slow`` tier (``-m slow``): what they check (readers, schemas,
progress lines, expressions, random filters and chains of steps) is the same plan and code on
both runners, and the default run has to stay within its time; the Ray-specific paths
(resources, actors, splits, exchanges across nodes, errors and tracebacks from Ray workers) run
by default."""
NOT_ON_THIS_CLUSTER = {
    # num_gpus=1 fits here: node2 has two GPUs (test_ray_runner checks a request no node fits)
    "test_errors__test_impossible_resources_fail_at_once": "the cluster has GPUs",
    "test_torch__test_num_gpus_without_gpus_fails_at_once": "the cluster has GPUs",
    # forked DataLoader workers cannot use the driver's Ray connection (RayStore says so)
    "test_torch__test_dataloader_workers_leave_the_parent_engine_alone": "forked DataLoader workers",
    "test_torch__test_torch_iterable_from_a_materialized_dataset": "forked DataLoader workers",
    # the local engine's busy workers and torch threads; the cluster's CPUs are not the driver's
    "test_torch__test_torch_threads_make_room_for_busy_workers_and_are_restored_after": "local CPUs only",
}


def _load(name: str) -> dict:
    """The tests of ``name`` that run on the ``mode`` fixture's runner (here Ray): the others
    (argument checks, the local engine's own workers through ``streaming`` or ``fresh_engine``)
    would only run the local engine a second time."""
    # imported under its own name, from its folder (as pytest imports it): Ray workers, which get
    # the driver's sys.path, can then import the classes and functions the tests define
    if str(E2E) not in sys.path:
        sys.path.insert(0, str(E2E))
    module = importlib.import_module(name)
    tests = {f"{name}__{key}": value for key, value in vars(module).items()
             if key.startswith("test_") and callable(value) and "mode" in inspect.signature(value).parameters}
    fixtures = {key: value for key, value in vars(module).items() if _is_fixture(value)}
    return {**tests, **fixtures}


def _is_fixture(value: object) -> bool:
    return hasattr(value, "_fixture_function_marker") or hasattr(value, "_pytestfixturefunction")


def _slow(test: Any) -> Any:
    """``test`` in the slow tier here only: a wrapper carries the mark (and its own copy of the
    test's parametrize marks), so the same test in its own module stays in the default tier."""
    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> Any:
        return test(*args, **kwargs)

    run.pytestmark = [*getattr(test, "pytestmark", []), pytest.mark.slow]  # type: ignore[attr-defined]
    return run


_tests: dict = {}
for _suite in SUITES:
    _tests.update(_load(_suite))
for _suite in SLOW_SUITES:
    _tests.update({name: _slow(value) if name.startswith(f"{_suite}__test_") else value
                   for name, value in _load(_suite).items()})
assert set(NOT_ON_THIS_CLUSTER) <= set(_tests), set(NOT_ON_THIS_CLUSTER) - set(_tests)
globals().update({name: test for name, test in _tests.items() if name not in NOT_ON_THIS_CLUSTER})


@pytest.fixture
def exchange(mode: str):
    """The all-to-all tests that run on both exchange paths locally take the partitioned one
    here (blocks cross nodes between map and reduce tasks); the suite's other tests run the
    one-task path of small inputs on the cluster."""
    import dataflow

    with dataflow.options(small_exchange_bytes=0):
        yield "partitioned"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", sorted((E2E.parents[1] / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_notebook_runs_in_a_kernel_on_ray(ray_cluster, path, tmp_path, monkeypatch):
    """Each notebook, top to bottom in a real kernel whose plans run on the cluster (the runner
    and its address from the environment, as a notebook on a cluster's head node would get them)."""
    from test_notebooks import test_notebook_runs_in_a_kernel

    monkeypatch.setenv("DATAFLOW_RUNNER", "ray")
    monkeypatch.setenv("DATAFLOW_RAY_ADDRESS", ray_cluster.address)
    monkeypatch.setenv("DATAFLOW_SHARED_PATHS", tempfile.gettempdir())  # the nodes share this machine's disk
    monkeypatch.setenv("RAY_LOG_TO_DRIVER", "0")
    test_notebook_runs_in_a_kernel(path, tmp_path, monkeypatch)

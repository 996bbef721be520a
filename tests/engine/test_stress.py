"""Randomized plans on both execution modes, with worker SIGKILLs in the multi-process one.

Every case ends with the exact multiset of rows (the exact order with preserve_order), within
its time limit, with no block, file or process left (the conftest leak checks run after each).
The seeds are fixed, so a failure names a case that can be rerun; ``benchmarks/soak.py`` runs
thousands more with blocks up to 256 MiB.
"""

from __future__ import annotations

import pytest
from plan_fuzz import make_case, run

import dataflow

SEEDS = list(range(24))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("seed", SEEDS)
def test_random_plan_is_exact(mode, seed, tmp_path):
    case = make_case(seed, kills=mode == "streaming")
    with dataflow.options(preserve_order=case.preserve_order, max_task_attempts=10):
        run(case, str(tmp_path))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("seed", [5013, 100])
def test_random_plan_is_exact_in_a_small_store(fresh_engine, seed, tmp_path):
    """The same plans with a 256 MiB store, where budgets bind. Seed 5013 (two unions, a filter
    between them, a write) hung: the write waited for a fuller bundle while the union feeding it
    counted as busy, though everything behind the union was held at its budget."""
    dataflow.init(num_cpus=2, object_store_memory=256 << 20)
    case = make_case(seed, max_block_bytes=8 << 20, kills=True)
    with dataflow.options(preserve_order=case.preserve_order, max_task_attempts=10):
        run(case, str(tmp_path))

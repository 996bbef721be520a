"""Random plans with a model of their result: the generator behind the stress test and the soak.

A case is a seeded random plan (range or a materialized input; map, map_batches with and without
batch_size, filter, flat_map, actor pools, union, mix, limit, materialize and reuse, and the
exchanges: sort, random_shuffle, repartition with and without a shuffle), a row width (block
sizes from bytes to hundreds of MiB), ``preserve_order``, a consumer (take_all, a slow or fast
iter_batches, count, a Parquet write read back, a groupby count) and, in the multi-process
engine, worker SIGKILLs at random moments. The model applies the same operations to a Python
list of ids, so every case checks the exact multiset of rows (the exact order with
``preserve_order``, and right after a sort).

``tests/engine/test_stress.py`` runs a fixed set of seeds; ``benchmarks/soak.py`` runs many more,
with bigger blocks.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow.parquet as pq

import dataflow

MiB = 1 << 20


class AddFive:
    """An actor-pool UDF (a callable class)."""

    def __init__(self) -> None:
        self.pid = os.getpid()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"id": batch["id"] + 5, "payload": batch["payload"]}


def _double(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"id": batch["id"] * 2, "payload": batch["payload"]}


def _checked_double(limit: int):
    def udf(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        assert len(batch["id"]) <= limit, (len(batch["id"]), limit)
        return {"id": batch["id"] * 2, "payload": batch["payload"]}

    return udf


def _plus_seven(row: dict[str, Any]) -> dict[str, Any]:
    return {"id": row["id"] + 7, "payload": row["payload"]}


def _keep(row: dict[str, Any]) -> bool:
    return row["id"] % 3 != 1


def _twice(row: dict[str, Any]) -> list[dict[str, Any]]:
    return [row, {"id": -row["id"] - 1, "payload": row["payload"]}]


@dataclass
class Case:
    seed: int
    rows: int
    blocks: int
    row_bytes: int
    preserve_order: bool
    steps: list[tuple[Any, ...]]
    consumer: str
    kills: int
    description: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return (
            f"seed={self.seed} rows={self.rows} blocks={self.blocks} row_bytes={self.row_bytes} "
            f"preserve_order={self.preserve_order} consumer={self.consumer} kills={self.kills} "
            f"plan={' -> '.join(self.description)}"
        )


def make_case(seed: int, max_block_bytes: int = 4 * MiB, kills: bool = True) -> Case:
    rng = random.Random(seed)
    blocks = rng.choice([1, 2, 7, 16, 40])
    row_bytes = rng.choice([1, 8, 200, 4096, 64 << 10, 1 << 20])
    rows_per_block = max(1, min(rng.choice([1, 10, 100, 1000]), max_block_bytes // row_bytes))
    rows = blocks * rows_per_block
    preserve_order = rng.random() < 0.4
    steps: list[tuple[Any, ...]] = []
    for _ in range(rng.randint(1, 5)):
        kind = rng.choice(
            ["map", "map_batches", "map_batches_n", "filter", "flat_map", "actor", "union", "materialize"]
        )
        if kind == "map_batches_n" or kind == "actor":
            steps.append((kind, rng.choice([1, 3, 64, 500, 4096])))
        elif kind == "union":
            steps.append((kind, rng.randint(1, 300), rng.choice([1, 3, 8])))
        else:
            steps.append((kind,))
    # exchanges come from a generator of their own, so that every seed keeps the plan it had
    # before they were added, with an exchange inserted into about a third of them
    exchange_rng = random.Random(seed * 7919 + 1)
    if exchange_rng.random() < 0.35:
        kind = exchange_rng.choice(["sort", "sort", "random_shuffle", "repartition"])
        if kind == "sort":
            step: tuple[Any, ...] = (kind, exchange_rng.random() < 0.5)
        elif kind == "random_shuffle":
            step = (kind, exchange_rng.randrange(1000))
        else:
            step = (kind, exchange_rng.choice([1, 2, 5, 13]), exchange_rng.random() < 0.5)
        steps.insert(exchange_rng.randint(0, len(steps)), step)
    # so do weighted mixes (Dataset.mix, an input dropping out when it ends), in about a fifth
    mix_rng = random.Random(seed * 15485863 + 2)
    if mix_rng.random() < 0.2:
        step = ("mix", mix_rng.randint(1, 300), mix_rng.choice([1, 3, 8]), mix_rng.choice([0.2, 1.0, 5.0]))
        steps.insert(mix_rng.randint(0, len(steps)), step)
    if rng.random() < 0.3:
        steps.append(("limit", rng.randint(0, rows * 2)))
    consumer = rng.choice(["take_all", "iter_fast", "iter_slow", "count", "write", "materialize_twice"])
    n_kills = rng.choice([0, 0, 1, 2]) if kills else 0
    if exchange_rng.random() < 0.12:
        consumer = "groupby_count"  # an aggregation over everything the plan produced
    return Case(seed, rows, blocks, row_bytes, preserve_order, steps, consumer, n_kills)


def _source(rows: int, blocks: int, row_bytes: int, start: int = 0) -> dataflow.Dataset:
    width = row_bytes

    def payload(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"id": batch["id"] + start, "payload": np.ones((len(batch["id"]), width), dtype=np.uint8)}

    return dataflow.range(rows, override_num_blocks=blocks).map_batches(payload)


def build(case: Case) -> tuple[dataflow.Dataset, list[int], bool, list[Any]]:
    """The dataset, the model's ids (in order), whether the order is exact, and datasets to keep alive."""
    ds = _source(case.rows, case.blocks, case.row_bytes)
    ids = list(range(case.rows))
    keep: list[Any] = []
    known = True  # the model's order is the plan's (under preserve_order)
    sorted_tail = False  # the last steps were a sort (and perhaps a limit): ordered whatever the options
    for step in case.steps:
        kind = step[0]
        sorted_tail = sorted_tail and kind == "limit"
        if kind == "limit" and not (sorted_tail or (case.preserve_order and known)):
            known = False  # which rows a limit keeps is not defined then
        if kind == "map":
            ds, ids = ds.map(_plus_seven), [i + 7 for i in ids]
        elif kind == "map_batches":
            ds, ids = ds.map_batches(_double), [i * 2 for i in ids]
        elif kind == "map_batches_n":
            ds, ids = ds.map_batches(_checked_double(step[1]), batch_size=step[1]), [i * 2 for i in ids]
        elif kind == "filter":
            ds, ids = ds.filter(_keep), [i for i in ids if i % 3 != 1]
        elif kind == "flat_map":
            ds, ids = ds.flat_map(_twice), [x for i in ids for x in (i, -i - 1)]
        elif kind == "actor":
            ds = ds.map_batches(AddFive, batch_size=step[1], concurrency=(1, 2))
            ids = [i + 5 for i in ids]
        elif kind == "union":
            other_rows, other_blocks = step[1], step[2]
            start = 10**9
            ds = ds.union(_source(other_rows, min(other_blocks, other_rows), case.row_bytes, start))
            ids = ids + [start + i for i in range(other_rows)]
        elif kind == "mix":  # every row of both, interleaved by weight: the order is the mix's
            other_rows, other_blocks = step[1], step[2]
            start = 2 * 10**9
            ds = ds.mix(_source(other_rows, min(other_blocks, other_rows), case.row_bytes, start), weights=[1.0, step[3]])
            ids, known = ids + [start + i for i in range(other_rows)], False
        elif kind == "materialize":
            ds = ds.materialize()
            keep.append(ds)
        elif kind == "limit":
            ds = ds.limit(step[1])
            ids = ids[: step[1]]
        elif kind == "sort":
            ds, ids = ds.sort("id", descending=step[1]), sorted(ids, reverse=step[1])
            known = sorted_tail = True
        elif kind == "random_shuffle":
            ds, known = ds.random_shuffle(seed=step[1]), False
        elif kind == "repartition":
            ds = ds.repartition(step[1], shuffle=step[2])
            known = known and not step[2]
        case.description.append(kind + (f"({', '.join(str(x) for x in step[1:])})" if len(step) > 1 else ""))
    exact_order = known and (sorted_tail or case.preserve_order) and case.consumer != "groupby_count"
    return ds, ids, exact_order, keep


def run(case: Case, tmp_dir: str) -> None:
    """Run ``case`` and check its rows against the model (raises AssertionError)."""
    ds, expected, exact_order, _keep_alive = build(case)
    has_limit = any(step[0] == "limit" for step in case.steps)
    killer = Killer(case.kills, random.Random(case.seed)) if case.kills else None
    errors = _EngineErrors()
    logging.getLogger("dataflow.engine").addHandler(errors)
    if killer is not None:
        killer.start()
    try:
        got = consume(ds, case.consumer, tmp_dir, random.Random(case.seed + 1))
    finally:
        if killer is not None:
            killer.stop()
        logging.getLogger("dataflow.engine").removeHandler(errors)
    # the engine logs an error where it catches its own inconsistency (outputs waiting for a
    # task that no longer exists): the rows may still come out right, the case fails anyway
    assert not errors.messages, f"{case}: the engine logged {errors.messages}"
    if isinstance(got, int):
        assert got == len(expected), f"{case}: counted {got}, expected {len(expected)}"
        return
    if has_limit and not exact_order:
        # which rows a limit keeps is not defined without preserve_order: the count is, and every
        # row must be one the plan produces
        assert len(got) == len(expected), f"{case}: {len(got)} rows, expected {len(expected)}"
        _, full, _, _ = build_without_limit(case)
        missing = Counter(got) - Counter(full)
        assert not missing, f"{case}: rows the plan never produces: {list(missing)[:10]}"
        return
    if exact_order:
        assert got == expected, f"{case}: order or rows differ (first difference at {_first_difference(got, expected)})"
    else:
        assert sorted(got) == sorted(expected), f"{case}: rows differ ({len(got)} against {len(expected)})"


def build_without_limit(case: Case) -> tuple[dataflow.Dataset, list[int], bool, list[Any]]:
    trimmed = Case(
        case.seed,
        case.rows,
        case.blocks,
        case.row_bytes,
        case.preserve_order,
        [s for s in case.steps if s[0] != "limit"],
        case.consumer,
        0,
    )
    return build(trimmed)


def _first_difference(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def consume(ds: dataflow.Dataset, consumer: str, tmp_dir: str, rng: random.Random) -> list[int] | int:
    if consumer == "take_all":
        return [r["id"] for r in ds.take_all()]
    if consumer == "count":
        return ds.count()
    if consumer == "groupby_count":  # each id as many times as its group counted it
        return [row["id"] for row in ds.groupby("id").count().take_all() for _ in range(row["count()"])]
    if consumer in ("iter_fast", "iter_slow"):
        out: list[int] = []
        batch_size = rng.choice([None, 1, 7, 256, 10_000])
        for batch in ds.iter_batches(batch_size=batch_size, batch_format="numpy"):
            out.extend(batch["id"].tolist())
            if consumer == "iter_slow":
                time.sleep(0.002)
        return out
    if consumer == "write":
        path = os.path.join(tmp_dir, f"out-{rng.randrange(10**9)}")
        ds.write_parquet(path)
        if not os.path.exists(path):  # no rows: as Ray, a write leaves no destination it would have made
            return []
        files = sorted(f for f in os.listdir(path) if f.endswith(".parquet"))
        return [i for f in files for i in pq.read_table(os.path.join(path, f), columns=["id"])["id"].to_pylist()]
    if consumer == "materialize_twice":
        mat = ds.materialize()
        first = [r["id"] for r in mat.take_all()]
        second = [r["id"] for r in mat.take_all()]
        assert first == second
        return first
    raise ValueError(consumer)


class _EngineErrors(logging.Handler):
    """Collects what the engine logs at ERROR."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


class Killer:
    """SIGKILLs ``n`` random worker processes of the current session at random moments."""

    def __init__(self, n: int, rng: random.Random) -> None:
        self.n = n
        self.rng = rng
        self.killed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        from engine import session as engine_session

        while self.killed < self.n and not self._stop.wait(self.rng.uniform(0.01, 0.3)):
            current = engine_session.current_session()
            if current is None:
                continue
            try:
                pids = [h.pid for h in list(current.executor.pool.workers.values()) if h.pid is not None]
            except RuntimeError:  # the table changed while we copied it
                continue
            if not pids:
                continue
            try:
                os.kill(self.rng.choice(pids), signal.SIGKILL)
                self.killed += 1
            except ProcessLookupError:
                pass

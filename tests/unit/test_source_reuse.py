"""A worker unpickles a built-in file source once for all the read tasks that carry it, and a
user's source once per task (it may keep state between reads)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from connectors import base
from connectors.parquet_format import ParquetDatasource
from engine.serialization import dumps_for_worker, loads


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    for i in range(4):
        pq.write_table(pa.table({"id": list(range(i * 10, i * 10 + 10))}), tmp_path / f"part-{i}.parquet")
    return tmp_path


def _as_a_worker_gets_them(source) -> list:
    """Each read task pickled on its own, as a task spec carries it, and unpickled."""
    return [loads(dumps_for_worker(task)) for task in source.get_read_tasks(4)]


def _source_of(task):
    return task.read_fn.func.__self__.source


def test_a_builtin_source_is_unpickled_once_per_process(folder):
    base._REUSED.clear()
    tasks = _as_a_worker_gets_them(ParquetDatasource(str(folder)))
    assert len(tasks) == 4 and len({id(_source_of(t)) for t in tasks}) == 1
    ids = sorted(i for t in tasks for block in t() for i in block.column("id").to_pylist())
    assert ids == list(range(40))
    other = _as_a_worker_gets_them(ParquetDatasource(str(folder), columns=["id"]))  # other bytes: its own
    assert _source_of(other[0]) is not _source_of(tasks[0])
    again = loads(dumps_for_worker(tasks[0]))  # the reused source pickles as it came
    assert _source_of(again) is _source_of(tasks[0])


def test_a_subclass_is_unpickled_for_each_task(folder):
    class MyParquet(ParquetDatasource):  # may keep state: the flag is not inherited
        pass

    import cloudpickle

    tasks = [cloudpickle.loads(cloudpickle.dumps(t)) for t in MyParquet(str(folder)).get_read_tasks(4)]
    assert len({id(_source_of(t)) for t in tasks}) == 4


def test_the_process_keeps_a_few_sources(tmp_path):
    base._REUSED.clear()
    for i in range(base._REUSED_MAX + 3):
        pq.write_table(pa.table({"x": [i]}), tmp_path / f"f{i}.parquet")
        task = next(iter(ParquetDatasource(str(tmp_path / f"f{i}.parquet")).get_read_tasks(1)))
        pickle.loads(pickle.dumps(task))
    assert len(base._REUSED) == base._REUSED_MAX


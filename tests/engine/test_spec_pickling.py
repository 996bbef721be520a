"""Task specs go to workers through the C pickler when every name in them imports on the worker,
and through cloudpickle otherwise: a script's own datasource, sink or lambda still runs there."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

from connectors.parquet_format import ParquetDatasource
from engine import serialization

REPO = Path(__file__).resolve().parents[2]


def test_an_importable_read_task_takes_the_c_pickler(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": [1, 2, 3]}), tmp_path / "a.parquet")
    task = next(iter(ParquetDatasource(str(tmp_path)).get_read_tasks(1)))
    data = serialization.dumps_for_worker(task)
    assert data == pickle.dumps(task, protocol=pickle.HIGHEST_PROTOCOL)
    assert pa.concat_tables(list(serialization.loads(data)())).column("id").to_pylist() == [1, 2, 3]


def test_what_has_no_importable_name_goes_by_value():
    captured = 7
    data = serialization.dumps_for_worker({"fn": lambda x: x + captured})
    assert serialization.loads(data)["fn"](1) == 8


def test_modules_registered_by_value_go_by_value(tmp_path, monkeypatch):
    import importlib

    import cloudpickle

    (tmp_path / "shipped_helpers.py").write_text("def double(x):\n    return 2 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("shipped_helpers")
    assert serialization.dumps_for_worker(module.double) == pickle.dumps(module.double, protocol=pickle.HIGHEST_PROTOCOL)
    cloudpickle.register_pickle_by_value(module)
    try:
        data = serialization.dumps_for_worker(module.double)
    finally:
        cloudpickle.unregister_pickle_by_value(module)
    monkeypatch.undo()  # the module can no longer be imported: only its code, sent by value, runs
    del __import__("sys").modules["shipped_helpers"]
    assert serialization.loads(data)(4) == 8


SCRIPT = '''
import functools
import os
import pyarrow as pa
import dataflow
from dataflow import BlockMetadata, Datasink, Datasource, ReadTask


def read(i):
    return [pa.table({"id": list(range(i * 10, i * 10 + 10)), "pid": [os.getpid()] * 10})]


class Numbers(Datasource):
    """Defined in __main__, as its read function: a worker has neither as a module attribute."""

    def get_read_tasks(self, parallelism):
        return [ReadTask(functools.partial(read, i), BlockMetadata(num_rows=10)) for i in range(8)]


class Collect(Datasink):
    def __init__(self, folder):
        self.folder = folder

    def write(self, blocks, ctx):
        rows = sum(block.num_rows for block in blocks)
        with open(os.path.join(self.folder, f"{os.getpid()}-{ctx.task_idx}"), "w") as f:
            f.write(str(rows))


if __name__ == "__main__":
    from engine import session
    dataflow.init(num_cpus=2)
    assert session.current_session().executor.wait_for_workers()
    with dataflow.options(min_task_input_bytes=1):
        rows = dataflow.read_datasource(Numbers()).take_all()
        assert sorted(r["id"] for r in rows) == list(range(80)), rows
        assert {r["pid"] for r in rows} - {os.getpid()}, "every read ran in the driver"
        dataflow.read_datasource(Numbers()).write_datasink(Collect(os.getcwd()))
    written = [name for name in os.listdir(".") if name[0].isdigit()]
    assert sum(int(open(name).read()) for name in written) == 80
    assert any(not name.startswith(f"{os.getpid()}-") for name in written), written
    print("ok")
'''


def test_a_scripts_own_datasource_and_sink_run_on_workers(tmp_path):
    (tmp_path / "job.py").write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "job.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("ok")



def test_an_unpicklable_udf_fails_the_first_job_as_it_fails_later_ones(fresh_engine):
    """A new session runs its first tasks in the driver, where nothing needs pickling: the UDF
    is pickled all the same, so a quick first test does not pass where the next run fails."""
    import threading

    import pytest

    import dataflow

    lock = threading.Lock()

    def holds_a_lock(row):  # a local function: pickled by value, with the lock it closes over
        with lock:
            return row

    dataflow.init(num_cpus=2)
    for _ in range(2):
        with pytest.raises(TypeError, match=r"cannot pickle '_thread\.lock'"):
            dataflow.range(10).map(holds_a_lock).take_all()

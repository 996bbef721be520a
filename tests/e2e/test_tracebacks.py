"""A UDF's traceback from a worker names its real file and line and shows the source text.

Each test runs a script in a subprocess, as a user runs ``python script.py``: a UDF defined in
``__main__`` travels to the workers pickled by value, one in a module by reference, and a
notebook cell's exists only in the driver's ``linecache``. Tasks run on worker processes
(``inline_cold_start=False``), which is where the file name used to be lost.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).parents[2]

MAIN_SCRIPT = '''
import dataflow


def parse_price(row):
    price = row["id"]
    if price == 3:
        raise ValueError(f"bad price {price}")
    return row


class Model:
    def __call__(self, batch):
        raise KeyError("model weights missing")


if __name__ == "__main__":
    dataflow.init(num_cpus=1, inline_cold_start=False)
    try:
        dataflow.range(10).map(parse_price).take_all()
    except ValueError as err:
        print(err)
    dataflow.range(10).map_batches(Model, concurrency=1).take_all()
'''

MODULE = '''
def parse_price(row):
    if row["id"] == 3:
        raise ValueError("module says no")
    return row
'''

MODULE_AND_CELL_SCRIPT = '''
import linecache
import os

import dataflow
import pricing

dataflow.init(num_cpus=1, inline_cold_start=False)
try:
    dataflow.range(10).map(pricing.parse_price).take_all()
except ValueError as err:
    print(err)

# what IPython does with a cell: compiled under a file name that exists only in linecache
cell = f"/tmp/ipykernel_{os.getpid()}/2783457.py"
source = "def in_a_cell(row):\\n    value = row['id']\\n    if value == 4:\\n        raise KeyError('cell says no')\\n    return row\\n"
linecache.cache[cell] = (len(source), None, source.splitlines(True), cell)
exec(compile(source, cell, "exec"), globals())
try:
    dataflow.range(10).map(in_a_cell).take_all()
except KeyError as err:
    print(err)
'''


def run_script(folder: Path, name: str, text: str) -> subprocess.CompletedProcess[str]:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, str(path)], cwd=folder, env=env, capture_output=True, text=True, timeout=120
    )


def test_a_main_udf_shows_its_file_line_and_source(tmp_path):
    script = tmp_path / "job.py"
    done = run_script(tmp_path, "job.py", MAIN_SCRIPT)
    assert done.returncode == 1, done.stderr

    # a function: the printed error (also what an uncaught one prints after its type)
    assert "ValueError in Map(parse_price) (operator ReadRange->Map(parse_price)): bad price 3" in done.stdout
    assert f'File "{script}", line 8, in parse_price\n    raise ValueError(f"bad price {{price}}")' in done.stdout

    # an actor's callable class, uncaught: Python prints the worker's frames in the message
    assert "KeyError in MapBatches(Model)" in done.stderr
    assert f'File "{script}", line 14, in __call__\n    raise KeyError("model weights missing")' in done.stderr
    for output in (done.stdout, done.stderr):
        assert "<dynamic-code>" not in output
        remote = output.split("Traceback from the worker (engine frames removed):", 1)[-1]
        assert f"{os.sep}engine{os.sep}" not in remote and f"{os.sep}dataflow{os.sep}" not in remote


def test_a_module_udf_and_a_notebook_cell_udf(tmp_path):
    (tmp_path / "pricing.py").write_text(textwrap.dedent(MODULE))
    done = run_script(tmp_path, "job.py", MODULE_AND_CELL_SCRIPT)
    assert done.returncode == 0, done.stderr
    module = tmp_path / "pricing.py"
    assert f'File "{module}", line 4, in parse_price\n    raise ValueError("module says no")' in done.stdout
    # the worker cannot read the cell's "file": the driver fills the line in from its linecache
    assert "line 4, in in_a_cell\n    raise KeyError('cell says no')" in done.stdout
    assert "ipykernel_" in done.stdout

"""Tracebacks across processes: code keeps its file name, the driver fills in unread lines."""

from __future__ import annotations

import linecache
import sys
import types

from engine import serialization
from engine.tracebacks import format_frames, user_frames

SOURCE = "def outer(x):\n    def inner():\n        return 1 / x\n    return inner()\n"


def test_code_pickled_by_value_keeps_its_file_name():
    namespace = {"__name__": "a_module_no_worker_can_import"}
    exec(compile(SOURCE, "/home/someone/job.py", "exec"), namespace)
    copy = serialization.loads(serialization.dumps(namespace["outer"]))
    assert copy.__code__.co_filename == "/home/someone/job.py"
    nested = next(c for c in copy.__code__.co_consts if isinstance(c, types.CodeType))
    assert nested.co_filename == "/home/someone/job.py"
    assert copy(2) == 0.5
    try:
        copy(0)
    except ZeroDivisionError as err:
        assert [(f[0], f[1], f[2]) for f in user_frames(err)][-2:] == [
            ("/home/someone/job.py", 4, "outer"),
            ("/home/someone/job.py", 3, "inner"),
        ]


def test_a_line_the_worker_could_not_read_is_read_by_the_driver(monkeypatch):
    cell = "/tmp/ipykernel_1/77.py"
    frames = [(cell, 3, "inner", "", 3, 15, 20)]  # sent without its line: the worker had no file
    monkeypatch.setitem(linecache.cache, cell, (len(SOURCE), None, SOURCE.splitlines(True), cell))
    text = format_frames(frames)
    assert text == f'  File "{cell}", line 3, in inner\n    return 1 / x\n           ~~^~~\n'  # with its marks


def test_a_notebook_cell_is_named_as_ipython_names_it(monkeypatch):
    class Compiler:
        @staticmethod
        def format_code_name(name):
            return ("Cell", "In[7]") if name == "/tmp/ipykernel_1/77.py" else None

    shell = types.SimpleNamespace(compile=Compiler())
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    text = format_frames([
        ("/tmp/ipykernel_1/77.py", 3, "inner", "        return 1 / x\n", None, None, None),
        ("/home/someone/job.py", 9, "main", "    run()\n", None, None, None),
    ])
    assert text == (
        "  Cell In[7], line 3, in inner\n    return 1 / x\n"
        '  File "/home/someone/job.py", line 9, in main\n    run()\n'
    )

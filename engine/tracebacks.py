"""Tracebacks of user code that crossed a process boundary, shown as they would be locally.

A worker keeps only the user's frames (engine and API frames are dropped) and sends each as a
plain record with its source line when it can read the file. The driver renders them: a line
the worker could not read (a notebook cell, which lives in the driver's ``linecache`` only, or
a file the worker's machine lacks) comes from the driver's own ``linecache``, and a notebook
cell is named as IPython names it (``Cell In[3], line 5``). Code pickled by value keeps its
file name on the way (``serialization.dumps``), so a UDF defined in ``__main__`` or a cell
points at its real file and line.
"""

from __future__ import annotations

import linecache
import os
import sys
import traceback
from typing import Any

Frame = tuple[str, int, str, str, int | None, int | None, int | None]
"""One frame: file name, line number, function name, source line ('' when unread), end line,
start and end column (the last three for the ``^^^`` marks; None when unknown)."""

ENGINE_DIRS = tuple(
    os.path.dirname(os.path.abspath(m)) + os.sep
    for m in (__file__, os.path.join(os.path.dirname(__file__), "..", "dataflow", "x"))
)
"""Frames from files under these folders are the engine's and the API's, never the user's."""


def user_frames(err: BaseException) -> list[Frame]:
    """The frames of ``err``'s traceback outside the engine, with their source lines as this
    process can read them."""
    frames: list[Frame] = []
    for f in traceback.extract_tb(err.__traceback__):  # checks linecache against the files
        if f.filename.startswith(ENGINE_DIRS):
            continue
        line = linecache.getline(f.filename, f.lineno) if f.lineno else ""
        frames.append((f.filename, f.lineno or 0, f.name, line, f.end_lineno, f.colno, f.end_colno))
    return frames


def format_frames(frames: list[Frame]) -> str:
    """``frames`` as ``traceback`` prints them; a line missing from a record is looked up here."""
    summaries = [
        traceback.FrameSummary(
            filename, lineno, name, lookup_line=False, line=line if line.strip() else None,
            end_lineno=end_lineno, colno=colno, end_colno=end_colno,
        )
        for filename, lineno, name, line, end_lineno, colno, end_colno in frames
    ]
    return "".join(_Stack(summaries).format())


class _Stack(traceback.StackSummary):
    def format_frame_summary(self, frame_summary: traceback.FrameSummary) -> str:
        text = super().format_frame_summary(frame_summary)
        cell = notebook_cell(frame_summary.filename)
        if cell is None:
            return text
        return text.replace(f'File "{frame_summary.filename}", line', f"{cell}, line", 1)


def notebook_cell(filename: str) -> str | None:
    """``Cell In[3]`` for the file name IPython gave a cell of the running kernel, else None."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return None
    try:
        shell: Any = ipython.get_ipython()
        named = shell.compile.format_code_name(filename) if shell is not None else None
    except Exception:  # another IPython version, or no shell: the plain file name then
        return None
    if not named:
        return None
    label, name = named
    return f"{label} {name}"

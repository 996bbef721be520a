"""Which datasources a plan reads and which files they list: ``Dataset.input_files()``.

A materialized dataset no longer reads anything; ``Dataset.materialize`` records the sources of
the plan it ran on the blocks' owner (``sources``), so its ``input_files()`` (and that of every
dataset made from it: splits, maps) still names the files its rows came from, as in Ray Data.
"""

from __future__ import annotations

from typing import Any

from dataflow.plan import FusedRead, InputBlocks, LogicalNode, Read, walk


def input_sources(plan: LogicalNode) -> tuple[Any, ...]:
    """The datasources ``plan`` reads, directly or through the materialized datasets it reads."""
    found: list[Any] = []
    for node in walk(plan):
        if isinstance(node, Read):
            found.append(node.datasource)
        elif isinstance(node, FusedRead):
            found.append(node.read.datasource)
        elif isinstance(node, InputBlocks):
            found.extend(getattr(node.owner, "sources", ()))
    unique = {id(source): source for source in found}  # sources need not be hashable
    return tuple(unique.values())


def files_of(datasource: Any) -> list[str]:
    """The files ``datasource`` reads (as the user would write them), or [] if it reads none.

    File sources list their files; others say it in their read tasks' metadata, if at all."""
    file_set = getattr(datasource, "file_set", None)
    if file_set is not None:
        return [file_set.display(entry.path) for entry in file_set.iter_files()]
    files: list[str] = []
    for task in datasource.get_read_tasks(1):
        files.extend(getattr(task.metadata, "input_files", None) or ())
    return files


def input_files(plan: LogicalNode) -> list[str]:
    """Every file ``plan`` reads, once each, in reading order."""
    files: list[str] = []
    for source in input_sources(plan):
        files.extend(files_of(source))
    return list(dict.fromkeys(files))

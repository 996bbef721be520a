"""Resumable writes (``write_*(..., mode="resume")``): the plan side.

A write resumes by input unit: each read task of the plan's datasource is a unit, its rows are
written by one write task into files named after the unit, and the task commits the unit in
the manifest beside the output (``connectors.resumable_write``). Here the plan is checked
(a read followed by row-wise steps only: an all-to-all step, a limit or a union mixes units),
its read tasks are made once, numbered, fingerprinted, and those already committed are left
out; the engine then keeps each unit together (``engine.units``).

The read parallelism of the job's first run is kept in the manifest, so the units are the same
on a machine with another CPU count.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from connectors.resumable_write import fingerprint
from dataflow.plan import FusedRead, LogicalNode, MapStages, Read, walk
from engine.units import UnitReadTask


class _UnitSource:
    """The datasource of a resumed read: the job's read tasks, less the committed units."""

    def __init__(self, datasource: Any, tasks: list[UnitReadTask]) -> None:
        self._datasource = datasource
        self._tasks = tasks

    def get_read_tasks(self, parallelism: int) -> list[UnitReadTask]:
        return list(self._tasks)

    def get_name(self) -> str:
        return str(self._datasource.get_name())

    def estimate_inmemory_data_size(self) -> int | None:
        sizes = [getattr(t.metadata, "size_bytes", None) for t in self._tasks]
        return sum(s for s in sizes if s) or None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._datasource, name)


def plan_units(logical: LogicalNode, optimized: LogicalNode, sink: Any, default_parallelism: int) -> LogicalNode:
    """``optimized`` with its read limited to the units ``sink``'s manifest has not committed.

    ``logical`` (the plan before optimization) names the steps in the fingerprint. Raises
    ``ValueError`` for a plan that cannot be resumed by unit, and ``ResumeMismatchError`` when
    the manifest records another job.
    """
    read = _chain_read(optimized)
    parallelism = sink.resume_parallelism or (read.parallelism if read.parallelism > 0 else default_parallelism)
    tasks = list(read.datasource.get_read_tasks(parallelism))
    steps = [node.name for node in walk(logical) if isinstance(node, (Read, MapStages))]
    fp = fingerprint(tasks, " <- ".join(steps), sink.resume_options())
    committed = sink.begin_resume(fp, parallelism, len(tasks))
    todo = [UnitReadTask(task, unit) for unit, task in enumerate(tasks) if unit not in committed]
    unit_read = replace(read, datasource=_UnitSource(read.datasource, todo), parallelism=max(1, len(todo)))
    return _with_read(optimized, unit_read)


def _chain_read(node: LogicalNode) -> Read:
    """The read at the bottom of a chain of row-wise steps; ValueError for other plans."""
    while True:
        if isinstance(node, FusedRead):
            return node.read
        if isinstance(node, Read):
            return node
        if isinstance(node, MapStages):
            node = node.input
            continue
        raise ValueError(
            f"mode='resume' resumes a write by input unit (read task), so the plan must be a read_* "
            f"followed by row-wise steps (map, map_batches, filter, flat_map, with_column...); "
            f"{node.name} mixes rows of several units (or has no read tasks to resume by). "
            "Write it without mode='resume'"
        )


def _with_read(node: LogicalNode, read: Read) -> LogicalNode:
    if isinstance(node, FusedRead):
        return FusedRead(replace(node.maps, input=read))
    if isinstance(node, Read):
        return read
    assert isinstance(node, MapStages)
    return replace(node, input=_with_read(node.input, read))

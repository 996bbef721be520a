"""Input units: which read task a block's rows came from, for writes that resume.

A resumable write (``mode="resume"``) writes the rows of each read task (its *unit*) in one
write task, so a unit is committed whole or not at all and its files get the same names on
every run. The source's read tasks carry their unit (``UnitReadTask``); a task's unit is the one
its inputs share (``common_unit``), and the execution stamps it on the blocks the task made.
Operators never bundle two units into one task, and the write operator of a resumable write
takes each unit whole (``MapOperator.whole_units``). Its upstream emits in order, so a unit's
blocks arrive together and a block of the next unit says the one before it is complete.

Plans without units (every other plan) carry ``None`` everywhere and bundle as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from engine.object_store import BlockSlice


class UnitReadTask:
    """A read task that knows its unit: called, it reads as the task it wraps."""

    __slots__ = ("task", "unit")

    def __init__(self, task: Any, unit: int) -> None:
        self.task = task
        self.unit = unit

    @property
    def metadata(self) -> Any:
        return getattr(self.task, "metadata", None)

    def __call__(self) -> Iterator[Any]:
        return iter(self.task())

    def __repr__(self) -> str:
        return f"UnitReadTask(unit={self.unit}, {self.task!r})"


def unit_of(item: Any) -> int | None:
    """The unit of a block ref, a slice of one, or a read task (None when it has none)."""
    if isinstance(item, BlockSlice):
        return item.ref.unit
    return getattr(item, "unit", None)


def common_unit(items: Iterable[Any]) -> int | None:
    """The unit all ``items`` share; None when they have none or several."""
    units = {unit_of(item) for item in items}
    return units.pop() if len(units) == 1 else None

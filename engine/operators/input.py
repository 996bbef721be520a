"""InputOperator: blocks that already exist (a materialized dataset) enter a plan here.

It runs no tasks; the blocks are borrowed (``Execution.borrowed``), so the execution never frees them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.object_store import BlockRef
from engine.operators.base import PhysicalOperator


class InputOperator(PhysicalOperator):
    def __init__(self, refs: Sequence[BlockRef], name: str = "Input") -> None:
        super().__init__(name, [])
        self.refs = tuple(refs)
        for ref in refs:
            self.emit(ref)
        self.inputs_done = True

    def borrowed_refs(self) -> tuple[BlockRef, ...]:
        return self.refs

    def add_input(self, item: Any, index: int) -> None:
        msg = "InputOperator has no upstream"
        raise TypeError(msg)

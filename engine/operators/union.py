"""UnionOperator: the blocks of several inputs, in the order they arrive (or input by input).

Blocks it parks (with ``preserve_order``, input 1's blocks wait for the end of input 0) stay
counted against the operator that produced them, so that producer's budget sees them and stops.
"""

from __future__ import annotations

from typing import Any

from engine.operators.base import OperatorContext, PhysicalOperator


class UnionOperator(PhysicalOperator):
    def __init__(self, upstream: list[PhysicalOperator]) -> None:
        super().__init__("Union", upstream)
        self.ordered = False
        """With preserve_order: all of input 0, then all of input 1, ..."""
        self._waiting: dict[int, list[Any]] = {}
        self._current = 0

    def start(self, ctx: OperatorContext) -> None:
        self.ordered = ctx.preserve_order or self.ordered_output

    def add_input(self, item: Any, index: int) -> None:
        if not self.ordered or index == self._current:
            self.emit(item)
        else:
            self._waiting.setdefault(index, []).append(item)

    def upstream_finished(self, index: int) -> None:
        super().upstream_finished(index)
        while self.ordered and self._current in self._upstream_done:
            self._current += 1
            for item in self._waiting.pop(self._current, []):
                self.emit(item)

    def cancel(self) -> list[Any]:
        self.cancelled = True
        items = [item for waiting in self._waiting.values() for item in waiting]
        self._waiting.clear()
        return items

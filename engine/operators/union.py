"""UnionOperator: the blocks of several inputs, in the order they arrive."""

from __future__ import annotations

from typing import Any

from engine.operators.base import PhysicalOperator


class UnionOperator(PhysicalOperator):
    def __init__(self, upstream: list[PhysicalOperator]) -> None:
        super().__init__("Union", upstream)

    def add_input(self, item: Any, index: int) -> None:
        self.emit(item)

"""LimitOperator: pass blocks through until N rows have gone by, then stop upstream."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.object_store import BlockRef
from engine.operators.base import OperatorContext, PhysicalOperator


class LimitOperator(PhysicalOperator):
    """Runs on the driver; the last block is sliced (a new small block) when it overshoots.

    Blocks it does not pass on are handed back to the execution's ``release``, which frees only
    blocks this execution produced: a limit over a materialized dataset leaves it intact.
    """

    def __init__(self, limit: int, upstream: PhysicalOperator) -> None:
        super().__init__(f"Limit[{limit}]", [upstream])
        self.remaining = limit
        self._slice: Callable[[BlockRef, int], BlockRef] | None = None
        self._release: Callable[[BlockRef], None] | None = None
        if limit <= 0:
            self.inputs_done = True

    def start(self, ctx: OperatorContext) -> None:
        self._slice, self._release = ctx.slice_head, ctx.release

    def add_input(self, item: Any, index: int) -> None:
        ref: BlockRef = item
        assert self._slice is not None and self._release is not None
        if self.remaining <= 0:
            self._release(ref)
            return
        if ref.num_rows <= self.remaining:
            self.remaining -= ref.num_rows
            self.emit(ref)
        else:
            piece = self._slice(ref, self.remaining)
            self._release(ref)
            self.remaining = 0
            self.emit(piece)
        if self.remaining <= 0:
            self.inputs_done = True

    def reached(self) -> bool:
        return self.remaining <= 0

    def upstream_unneeded(self) -> bool:
        return self.reached()

"""MixOperator: blocks of several inputs interleaved by weight (Ray Data's ``Dataset.mix``).

Each output block comes whole from one input. The next one comes from the input furthest
behind its share of the rows emitted so far (``weight * total - rows``; ties go to the larger
weight, then the first input); when that input has no block yet, the operator waits for it
rather than take another's, so the order depends only on the blocks each input produces, not
on when they arrive. An input that has ended drops out; with ``stop_on_shortest`` the first
one to end stops everything (the execution then cancels what feeds it), and no block goes out
while an input with none queued may have ended: so where it stops does not depend on timing
either (Ray Data's operator emits on while it does not know yet).

Blocks it parks for later stay counted against the operator that produced them, so an input
far ahead of its share fills its own budget and pauses, not the store.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from engine.object_store import BlockRef
from engine.operators.base import OperatorContext, PhysicalOperator


def pick_input(weights: Sequence[float], rows: Sequence[int], live: Sequence[bool]) -> int | None:
    """The live input furthest behind its share of ``sum(rows)``, or None when none is live."""
    total = sum(rows)
    best: int | None = None
    best_gap = 0.0
    for i, weight in enumerate(weights):
        if not live[i]:
            continue
        gap = weight * total - rows[i]
        if best is None or gap > best_gap or (gap == best_gap and weight > weights[best]):
            best, best_gap = i, gap
    return best


class MixOperator(PhysicalOperator):
    def __init__(self, upstream: list[PhysicalOperator], weights: Sequence[float], stop_on_shortest: bool,
                 name: str = "Mix") -> None:
        super().__init__(name, upstream)
        total = float(sum(weights))
        self.weights = [w / total for w in weights]
        self.stop_on_shortest = stop_on_shortest
        self._queues: list[deque[BlockRef]] = [deque() for _ in upstream]
        self.rows = [0] * len(upstream)
        """Rows emitted from each input so far."""
        self._stopped = False
        self._release: Callable[[BlockRef], None] | None = None

    def start(self, ctx: OperatorContext) -> None:
        self._release = ctx.release

    def add_input(self, item: Any, index: int) -> None:
        if self._stopped:  # already in flight when the shortest input ended
            assert self._release is not None
            self._release(item)
            return
        self._queues[index].append(item)
        self._advance()

    def upstream_finished(self, index: int) -> None:
        super().upstream_finished(index)
        self._advance()

    def upstream_unneeded(self) -> bool:
        return self._stopped

    def cancel(self) -> list[Any]:
        self.cancelled = True
        return self._drain()

    def _ended(self, index: int) -> bool:
        return index in self._upstream_done and not self._queues[index]

    def _advance(self) -> None:
        while not self._stopped:
            if self.stop_on_shortest:
                if any(self._ended(i) for i in range(len(self._queues))):
                    self._stop()
                    return
                if any(not queue and i not in self._upstream_done for i, queue in enumerate(self._queues)):
                    return  # that input may be over (the end is decided) or not: wait to know
            index = pick_input(self.weights, self.rows, [not self._ended(i) for i in range(len(self._queues))])
            if index is None or not self._queues[index]:
                return  # all ended, or waiting for the input furthest behind
            ref = self._queues[index].popleft()
            self.rows[index] += ref.num_rows
            self.emit(ref)

    def _stop(self) -> None:
        self._stopped = True
        self.inputs_done = True
        assert self._release is not None
        for ref in self._drain():
            self._release(ref)

    def _drain(self) -> list[Any]:
        items = [ref for queue in self._queues for ref in queue]
        for queue in self._queues:
            queue.clear()
        return items

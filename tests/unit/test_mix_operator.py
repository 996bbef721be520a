"""The mix operator's choices, without processes: which input goes next, when it waits, where a
shortest-stopping mix ends and what it gives back."""

from __future__ import annotations

from engine.object_store import BlockRef
from engine.operators.base import OperatorContext
from engine.operators.mix import MixOperator, pick_input
from engine.operators.union import UnionOperator


def _ref(name: str, rows: int) -> BlockRef:
    return BlockRef(block_id=name, path=None, num_rows=rows, size_bytes=8 * rows)


def _mix(weights: list[float], stop_on_shortest: bool = False) -> tuple[MixOperator, list[BlockRef]]:
    released: list[BlockRef] = []
    upstream = [UnionOperator([]) for _ in weights]  # stand-ins: only their number matters here
    op = MixOperator(upstream, weights, stop_on_shortest)
    op.start(OperatorContext(released.append, lambda r, n: r, False, lambda r: None, 1 << 30, 2, lambda e: None))
    return op, released


def _out(op: MixOperator) -> list[str]:
    names = [ref.block_id for ref in op.outputs]
    op.outputs.clear()
    return names


def test_pick_input_takes_the_input_furthest_behind_its_share():
    assert pick_input([0.75, 0.25], [0, 0], [True, True]) == 0  # a tie: the larger weight
    assert pick_input([0.5, 0.5], [0, 0], [True, True]) == 0  # then the first
    assert pick_input([0.75, 0.25], [100, 0], [True, True]) == 1
    assert pick_input([0.75, 0.25], [100, 100], [True, True]) == 0
    assert pick_input([0.75, 0.25], [100, 0], [True, False]) == 0  # an ended input drops out
    assert pick_input([0.5, 0.5], [0, 0], [False, False]) is None


def test_it_waits_for_the_input_behind_rather_than_take_another():
    op, _ = _mix([1, 1])
    op.add_input(_ref("a1", 100), 0)
    op.add_input(_ref("a2", 100), 0)
    assert _out(op) == ["a1"]  # a2 waits: b is behind and has nothing yet
    op.add_input(_ref("b1", 100), 1)
    assert _out(op) == ["b1", "a2"]
    op.upstream_finished(1)  # b ends: it drops out, a goes on alone
    op.add_input(_ref("a3", 100), 0)
    assert _out(op) == ["a3"]
    op.upstream_finished(0)
    assert op.completed()


def test_stop_on_shortest_waits_to_know_then_stops_and_gives_back_what_it_parked():
    op, released = _mix([1, 1], stop_on_shortest=True)
    op.add_input(_ref("a1", 100), 0)
    assert _out(op) == []  # b has nothing queued and has not ended: it may be over already
    op.add_input(_ref("b1", 100), 1)
    assert _out(op) == ["a1"]  # b1 waits in turn: a may have ended, and then b1 is not in the mix
    op.add_input(_ref("a2", 100), 0)
    assert _out(op) == ["b1"]
    op.add_input(_ref("a3", 100), 0)
    assert _out(op) == []
    op.upstream_finished(1)  # b ended with nothing queued: the mix ends here
    assert _out(op) == [] and op.upstream_unneeded() and op.completed()
    assert [ref.block_id for ref in released] == ["a2", "a3"]
    op.add_input(_ref("a4", 100), 0)  # one already on its way is given back too
    assert [ref.block_id for ref in released] == ["a2", "a3", "a4"]

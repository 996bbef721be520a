"""How ``streaming_split`` deals blocks to ranks on a cluster: each split is handed what its own
node holds first, and does not take what another split's node holds while something else waits."""

from __future__ import annotations

from engine.object_store import BlockRef
from engine.split import SplitDealer


def _block(i: int, node: str | None) -> BlockRef:
    return BlockRef(block_id=f"b{i}", path=None, num_rows=100, size_bytes=800, node=node)


def _deal(dealer: SplitDealer, order: list[tuple[int, str]]) -> dict[int, list[str | None]]:
    got: dict[int, list[str | None]] = {}
    for split, node in order:
        piece = dealer.next_for(split, near=node)
        assert not isinstance(piece, str), piece
        got.setdefault(split, []).append(piece.ref.node)
    return got


def test_a_split_takes_its_own_nodes_block_first() -> None:
    dealer = SplitDealer(2, equal=False)
    for i, node in enumerate(["a", "a", "b", "a"]):
        dealer.add(_block(i, node))
    assert _deal(dealer, [(1, "b"), (0, "a"), (0, "a"), (0, "a")]) == {1: ["b"], 0: ["a", "a", "a"]}


def test_a_split_with_nothing_local_leaves_the_blocks_of_other_ranks_nodes() -> None:
    # node "b" made one block, the driver's node (no rank) one: the split on "a", whose blocks
    # are not made yet, takes the driver's, and the split on "b" still finds its own
    dealer = SplitDealer(2, equal=False)
    dealer.nodes[1] = "b"
    dealer.add(_block(0, "b"))
    dealer.add(_block(1, "driver"))
    assert _deal(dealer, [(0, "a"), (1, "b")]) == {0: ["driver"], 1: ["b"]}


def test_when_only_other_ranks_blocks_wait_it_takes_from_the_node_with_the_most() -> None:
    dealer = SplitDealer(3, equal=False)
    dealer.nodes.update({1: "b", 2: "c"})
    for i, node in enumerate(["c", "b", "b", "b"]):
        dealer.add(_block(i, node))
    assert _deal(dealer, [(0, "a"), (2, "c")]) == {0: ["b"], 2: ["c"]}


def test_equal_splits_stay_equal_while_dealing_by_node() -> None:
    dealer = SplitDealer(2, equal=True)
    for i in range(8):
        dealer.add(_block(i, "a"))
    dealer.finish()
    rows = [0, 0]
    for _ in range(16):
        for split, node in ((0, "a"), (1, "b")):
            piece = dealer.next_for(split, near=node)
            if not isinstance(piece, str):
                rows[split] += piece.length
    assert rows == [400, 400]


def test_equal_splits_get_their_own_nodes_blocks_of_the_last_rows() -> None:
    # the execution ended with every block still waiting: the final deal goes by node too
    dealer = SplitDealer(2, equal=True)
    dealer.nodes.update({0: "a", 1: "b"})
    for i, node in enumerate(["b", "b", "a", "a", "b"]):
        dealer.add(_block(i, node))
    assert dealer.finish() == []  # 500 rows: 250 each, the last block cut in two
    got: dict[int, list[tuple[str | None, int]]] = {0: [], 1: []}
    for split in (0, 1):
        while not isinstance(piece := dealer.next_for(split), str):
            got[split].append((piece.ref.node, piece.length))
    assert got == {0: [("a", 100), ("a", 100), ("b", 50)], 1: [("b", 100), ("b", 100), ("b", 50)]}
    assert dealer.refcount["b4"] == 2  # the cut block is freed after both halves are read

"""streaming_split: one execution dealt to N consumers (training ranks), equal on request.

``SplitDealer`` is the policy, pure state: blocks come in, pieces go out to the split that asks.
With ``equal=True`` no split may run ahead of the slowest by more than one block, and a reserve
of ``(n - 1)`` blocks' worth of rows is held back until the execution ends; then the reserve is
cut so every split gets exactly ``floor(total / n)`` rows. The remainder (fewer than ``n``
rows) is dropped and reported (``dropped_rows``), never silently.

``OrderedSplitDealer`` is the policy when the execution's order is deterministic
(``preserve_order``): it deals rows by position, not by who asks first, so each split gets the
same rows in the same order on every run, and a split iterator's ``state_dict`` resumes it
exactly. Each block, in arrival order, is cut into ``n`` consecutive equal shares, split 0 first;
rows that do not divide evenly wait for the next block. At the end the last rows (fewer than
``n``) are dropped with ``equal=True`` and dealt one each, from split 0 on, otherwise. A split
abandoned mid-epoch gets nothing more and its share is dropped, so the others' rows stay as
they would have been.

``SplitCoordinator`` runs one execution per epoch and serves pieces to local iterators (direct
calls) and, through the transport its backend hands it (``serve``: for the multi-process backend,
``engine.split_server``'s ROUTER socket in the session's 0700 folder), to iterators in other
processes. This module knows no transport and no store: the backend injects both.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from engine.object_store import BlockRef

log = logging.getLogger("dataflow.split")

WAIT = "wait"
END = "end"
RAY_SPLIT_PREFIX = "ray-actor:"
"""The address of a coordinator the Ray backend hosts in an actor (``engine.ray_split``)."""
LOCALITY_WINDOW = 16
"""How far down the pending blocks a split looks for one held on its own node."""


@dataclass(frozen=True)
class Piece:
    """Rows ``[offset, offset + length)`` of a block."""

    ref: BlockRef
    offset: int
    length: int


class _Dealer:
    """What both dealing policies keep: rows given to each split, who still reads, and how
    many pieces of each block exist (pending, queued or handed out and not released)."""

    def __init__(self, n: int, equal: bool) -> None:
        self.n = n
        self.equal = equal
        self.assigned = [0] * n
        self.pending_rows = 0
        self.done = False
        self.dropped_rows = 0
        self.unequal = False
        self.active = set(range(n))
        self.refcount: dict[str, int] = {}
        self.nodes: dict[int, str] = {}
        """The node each split last asked from (on a cluster)."""

    def unref(self, ref: BlockRef) -> bool:
        """One piece of ``ref`` is done with; True when the block itself can be freed."""
        left = self.refcount.get(ref.block_id, 0) - 1
        if left > 0:
            self.refcount[ref.block_id] = left
            return False
        self.refcount.pop(ref.block_id, None)
        return True

    def add(self, ref: BlockRef) -> list[Piece]:
        """Take a block to deal; returns pieces nobody will get (to free)."""
        raise NotImplementedError

    def next_for(self, split: int, near: str | None = None) -> Piece | str:
        """A piece for ``split``, or WAIT (ask again after the next change), or END."""
        raise NotImplementedError

    def may_pause(self) -> bool:
        """The coordinator may stop pulling blocks (its buffer is full) without starving a split."""
        raise NotImplementedError

    def abandon(self, split: int) -> list[Piece]:
        """``split`` stopped early this epoch: it gets nothing more; returns pieces to free."""
        raise NotImplementedError

    def finish(self) -> list[Piece]:
        """The execution ended; returns pieces nobody will get (to free)."""
        raise NotImplementedError

    def drain(self) -> list[Piece]:
        """Every piece not handed out yet (the epoch stops early: every split left, or the
        execution failed); returns them to free."""
        raise NotImplementedError


class SplitDealer(_Dealer):
    """Who gets which rows, to whichever split asks first; no I/O, no threads."""

    def __init__(self, n: int, equal: bool) -> None:
        super().__init__(n, equal)
        self.pending: deque[Piece] = deque()
        self.max_block_rows = 0
        self._final: list[deque[Piece]] | None = None

    def _min_assigned(self) -> int:
        return min((self.assigned[i] for i in self.active), default=0)

    def add(self, ref: BlockRef) -> list[Piece]:
        """Take a block to deal; returns pieces nobody will get (to free)."""
        if ref.num_rows == 0:
            return []
        self.refcount[ref.block_id] = 1
        if not self.active:  # every split left this epoch
            return [Piece(ref, 0, ref.num_rows)]
        self.pending.append(Piece(ref, 0, ref.num_rows))
        self.pending_rows += ref.num_rows
        self.max_block_rows = max(self.max_block_rows, ref.num_rows)
        return []

    def reserve_rows(self) -> int:
        return (len(self.active) - 1) * self.max_block_rows if self.equal else 0

    def may_pause(self) -> bool:
        """The coordinator may stop pulling blocks (its buffer is full) without starving a split."""
        return self.pending_rows > self.reserve_rows()

    def next_for(self, split: int, near: str | None = None) -> Piece | str:
        """A piece for ``split``, or WAIT (ask again after the next change), or END. ``near``:
        the node of the asking split; a piece of a block held there goes first."""
        if split not in self.active:
            return END
        if self._final is not None:
            queue = self._final[split]
            return queue.popleft() if queue else END
        if not self.pending:
            return END if self.done else WAIT
        if near is not None:
            self.nodes[split] = near
            if self.pending[0].ref.node != near:
                self._bring_forward(split, near)
        head = self.pending[0]
        if self.equal and not self.done:
            ahead = self.assigned[split] + head.length - self._min_assigned()
            if ahead > self.max_block_rows or self.pending_rows - head.length < self.reserve_rows():
                return WAIT
        if self.equal and self.done:
            self._distribute()
            return self.next_for(split)
        self.pending.popleft()
        self.pending_rows -= head.length
        self.assigned[split] += head.length
        return head

    def _bring_forward(self, split: int, node: str) -> None:
        """Move the best of the next ``LOCALITY_WINDOW`` pending pieces for ``split`` (on
        ``node``) to the front; the order of the others is kept. Best is a piece held on
        ``node``; then one held where no other split reads (the driver's node, a node with no
        rank); then one from the node with the most pieces waiting, whose own split has the
        most to spare. Without the middle rule a split on a node that made few blocks lost
        them to splits whose own blocks were not made yet."""
        window = list(itertools.islice(self.pending, LOCALITY_WINDOW))
        readers = {self.nodes[s] for s in self.active if s != split and s in self.nodes}
        waiting = Counter(piece.ref.node for piece in window)

        def rank(i: int) -> tuple[int, int, int]:
            held = window[i].ref.node
            if held == node:
                return (0, 0, i)
            if held not in readers:
                return (1, 0, i)
            return (2, -waiting[held], i)

        best = min(range(len(window)), key=rank)
        if best:
            piece = self.pending[best]
            del self.pending[best]
            self.pending.appendleft(piece)

    def abandon(self, split: int) -> list[Piece]:
        """``split`` stopped early this epoch: it gets nothing more; returns pieces to free."""
        self.active.discard(split)
        if self._final is None:
            return []
        orphaned = list(self._final[split])
        self._final[split].clear()
        return orphaned

    def finish(self) -> list[Piece]:
        """The execution ended; returns pieces nobody will get (to free)."""
        self.done = True
        if self.equal:
            return self._distribute()
        return [] if self.active else self.drain()

    def drain(self) -> list[Piece]:
        pieces = list(self.pending)
        self.pending.clear()
        for queue in self._final or ():
            pieces.extend(queue)
            queue.clear()
        self.pending_rows = 0
        return pieces

    def _distribute(self) -> list[Piece]:
        if self._final is not None:
            return []
        active = sorted(self.active)
        total = sum(self.assigned[i] for i in active) + self.pending_rows
        target = total // max(1, len(active))
        if active and max(self.assigned[i] for i in active) > target:
            self.unequal = True
            log.error("streaming_split(equal=True) could not equalize: %s rows already given", self.assigned)
        self._final = [deque() for _ in range(self.n)]
        need = {split: max(0, target - self.assigned[split]) for split in active}

        def give(split: int, piece: Piece) -> Piece | None:
            """Deal ``split`` what it still needs of ``piece``; returns the rest of it, if any."""
            take = min(need[split], piece.length)
            assert self._final is not None
            self._final[split].append(Piece(piece.ref, piece.offset, take))
            need[split] -= take
            self.assigned[split] += take
            if take == piece.length:
                return None
            self.refcount[piece.ref.block_id] += 1
            return Piece(piece.ref, piece.offset + take, piece.length - take)

        # a split's share comes from its own node's blocks first, then from the others in order
        rest: deque[Piece] = deque()
        for piece in self.pending:
            rest_of: Piece | None = piece
            near = [split for split in active if piece.ref.node is not None and self.nodes.get(split) == piece.ref.node]
            for split in near:
                if rest_of is not None and need[split]:
                    rest_of = give(split, rest_of)
            if rest_of is not None:
                rest.append(rest_of)
        self.pending.clear()
        for split in active:
            while need[split] and rest:
                left = give(split, rest.popleft())
                if left is not None:
                    rest.appendleft(left)
        leftovers: list[Piece] = []
        while rest:
            piece = rest.popleft()
            self.dropped_rows += piece.length
            leftovers.append(piece)
        self.pending_rows = 0
        if self.dropped_rows:
            log.warning(
                "streaming_split(equal=True): dropped the last %d of %d rows so that each of %d splits gets %d",
                self.dropped_rows,
                total,
                len(active),
                target,
            )
        return leftovers


class OrderedSplitDealer(_Dealer):
    """Who gets which rows, by position in the epoch (see the module's docstring)."""

    def __init__(self, n: int, equal: bool) -> None:
        super().__init__(n, equal)
        self.queues: list[deque[Piece]] = [deque() for _ in range(n)]
        self.carry: deque[Piece] = deque()
        """Rows of the blocks so far that did not divide evenly (fewer than ``n``)."""
        self.carry_rows = 0

    def add(self, ref: BlockRef) -> list[Piece]:
        """Deal a block's rows; returns the pieces of abandoned splits (to free)."""
        if ref.num_rows == 0:
            return []
        self.refcount[ref.block_id] = 1
        if not self.active:  # every split left this epoch
            return [Piece(ref, 0, ref.num_rows)]
        self.carry.append(Piece(ref, 0, ref.num_rows))
        self.carry_rows += ref.num_rows
        self.pending_rows += ref.num_rows
        share = self.carry_rows // self.n
        unwanted: list[Piece] = []
        if share:
            for split in range(self.n):
                self._deal(split, share, unwanted)
        return unwanted

    def _deal(self, split: int, rows: int, unwanted: list[Piece]) -> None:
        """Move the first ``rows`` carried rows to ``split`` (to ``unwanted`` if it left)."""
        while rows:
            piece = self.carry.popleft()
            take = min(rows, piece.length)
            if take < piece.length:
                self.carry.appendleft(Piece(piece.ref, piece.offset + take, piece.length - take))
                self.refcount[piece.ref.block_id] += 1
            dealt = Piece(piece.ref, piece.offset, take)
            if split in self.active:
                self.queues[split].append(dealt)
            else:
                unwanted.append(dealt)
                self.pending_rows -= take
            self.carry_rows -= take
            rows -= take

    def reserve_rows(self) -> int:
        return 0

    def may_pause(self) -> bool:
        """Pause pulling only while every split still has rows to read: a split that has read
        all it was dealt can only go on with the next block (no deadlock when splits are read
        one after the other, at the price of buffering, spilled past the store's capacity)."""
        return all(self.queues[split] for split in self.active)

    def next_for(self, split: int, near: str | None = None) -> Piece | str:
        if split not in self.active:  # dealt by position: where the blocks are does not matter
            return END
        queue = self.queues[split]
        if queue:
            piece = queue.popleft()
            self.assigned[split] += piece.length
            self.pending_rows -= piece.length
            return piece
        return END if self.done else WAIT

    def abandon(self, split: int) -> list[Piece]:
        self.active.discard(split)
        orphaned = list(self.queues[split])
        self.queues[split].clear()
        self.pending_rows -= sum(piece.length for piece in orphaned)
        return orphaned

    def finish(self) -> list[Piece]:
        """The execution ended: the last rows (fewer than ``n``) dropped, or one each."""
        self.done = True
        unwanted: list[Piece] = []
        if self.equal:
            self.dropped_rows = self.carry_rows
            if self.dropped_rows:
                total = sum(self.assigned) + self.pending_rows
                log.warning("streaming_split(equal=True): dropped the last %d of %d rows so that each of %d "
                            "splits gets %d", self.dropped_rows, total, self.n, (total - self.dropped_rows) // self.n)
            unwanted = list(self.carry)
            self.pending_rows -= self.carry_rows
            self.carry.clear()
            self.carry_rows = 0
            return unwanted
        split = 0
        while self.carry_rows:
            self._deal(split, 1, unwanted)
            split += 1
        return unwanted

    def drain(self) -> list[Piece]:
        pieces = list(self.carry)
        self.carry.clear()
        self.carry_rows = 0
        for queue in self.queues:
            pieces.extend(queue)
            queue.clear()
        self.pending_rows = 0
        return pieces


class SplitTransport(Protocol):
    """A coordinator's server for iterators in other processes (``engine.split_server``)."""

    address: str

    def wake(self) -> None:
        """The coordinator's state changed: answer the requests that wait."""

    def close(self) -> None: ...


class SplitCoordinator:
    """Serves an execution's blocks to ``n`` split iterators, one execution per epoch.

    ``read`` reads a block of the backend that runs the executions (``private_views``: its
    tables are copy-on-write mappings); ``serve``, when given, builds the server through which
    iterators in other processes reach this coordinator (at ``address``)."""

    _registry: dict[str, SplitCoordinator] = {}
    _ids = itertools.count()

    def __init__(
        self,
        start: Callable[[], Any],
        n: int,
        equal: bool,
        *,
        read: Callable[[BlockRef], pa.Table],
        private_views: bool = False,
        serve: Callable[[SplitCoordinator], SplitTransport] | None = None,
        max_pending_bytes: int = 256 << 20,
        ordered: bool = False,
    ) -> None:
        self.key = f"{os.getpid()}-{next(self._ids)}"
        self._start = start
        self._read = read
        self.private_views = private_views
        self.n = n
        self.equal = equal
        self.max_pending_bytes = max_pending_bytes
        self.ordered = ordered
        """Deal by position (``OrderedSplitDealer``): the execution's order is deterministic."""
        self._cond = threading.Condition()
        self._epoch = -1
        self._dealer: _Dealer | None = None
        self._handle: Any = None
        self._ended: set[int] = set()
        self._owners: dict[str, tuple[_Dealer, Any]] = {}
        """block id -> (the dealer counting its pieces, the handle that can free it, or None for
        a borrowed block: a materialized input's, which is not the split's to free)."""
        self._pending_bytes = 0
        self._error: BaseException | None = None
        self._closed = False
        self.last_stats: dict[str, Any] = {}
        """Of the last finished epoch: rows each split got, rows dropped to make them equal,
        and (on a cluster) rows each split read from blocks held on its own node."""
        self._local_rows = [0] * n
        self._node_rows: dict[str, int] = {}
        self._located = False
        """Splits said which node they read on (only iterators on a cluster do)."""
        self._local_iterators = 0
        self._last_summary = ""
        self._remote_clients = False
        self._departed: set[int] = set()
        """Splits whose reader's process is gone (``depart``): left out of the epochs to come."""
        self.address: str | None = None
        self._server: SplitTransport | None = None
        if serve is not None:
            self._server = serve(self)
            self.address = self._server.address
        SplitCoordinator._registry[self.key] = self

    @classmethod
    def find(cls, key: str) -> SplitCoordinator | None:
        """The open coordinator ``key`` of this process, if any."""
        return cls._registry.get(key)

    # lifetime --------------------------------------------------------------------------------
    def attach(self) -> None:
        """An iterator of this process reads from this coordinator (until it is collected)."""
        with self._cond:
            self._local_iterators += 1

    def detach(self) -> None:
        """An iterator of this process was collected. With the last one gone, and no iterator
        in another process ever heard from, nobody can read on: the coordinator closes (its
        server thread and socket, its buffered blocks, the plan it holds). One that a rank in
        another process reached stays open until the engine shuts down, as nothing says
        whether that rank is done."""
        with self._cond:
            self._local_iterators -= 1
            last = self._local_iterators <= 0 and not self._remote_clients and not self._closed
        if last:  # (may run in a garbage collection, in any thread: closing waits for a thread)
            threading.Thread(target=self.close, name="dataflow-split-close", daemon=True).start()

    def note_remote_client(self) -> None:
        """An iterator may be read in another process: one was pickled (to be sent to a rank),
        or one asked the transport for a piece."""
        with self._cond:
            self._remote_clients = True

    # the API split iterators use -------------------------------------------------------
    def try_next(self, split: int, epoch: int, near: str | None = None) -> Piece | str:
        """A piece of ``epoch`` for ``split``, WAIT, or END; raises the execution's error.
        ``near``: the asking split's node (blocks held there go to it first)."""
        with self._cond:
            if self._error is not None:
                raise self._error
            self._departed.discard(split)  # (a reader again: a rank restarted)
            if epoch > self._epoch:
                if self._epoch >= 0 and len(self._ended) < self.n:
                    return WAIT  # the others are still on the previous epoch
                self._begin_epoch(epoch)
            if epoch < self._epoch:
                return END
            assert self._dealer is not None
            result = self._dealer.next_for(split, near)
            if isinstance(result, Piece):
                self._pending_bytes -= _piece_bytes(result)
                if near is not None:
                    self._located = True
                    self._local_rows[split] += result.length if result.ref.node == near else 0
                    held = result.ref.node or ""
                    self._node_rows[held] = self._node_rows.get(held, 0) + result.length
                self._cond.notify_all()
            elif result == END:
                self._ended.add(split)
                if len(self._ended) == self.n:
                    self.last_stats = {"dropped_rows": self._dealer.dropped_rows, "rows": list(self._dealer.assigned)}
                    self._last_summary = _execution_summary(self._handle)
                    if self._located:
                        self.last_stats["rows_on_own_node"] = list(self._local_rows)
                        self.last_stats["rows_by_node"] = dict(self._node_rows)
            return result

    def summary(self) -> str:
        """The last finished epoch as text (Ray's ``DataIterator.stats()`` of a split): its
        execution's statistics, then the rows each split got and the rows dropped; "" before."""
        with self._cond:
            if not self.last_stats:
                return ""
            stats, text = self.last_stats, self._last_summary
        line = f"streaming_split: rows per split {stats['rows']}, dropped to make them equal {stats['dropped_rows']}"
        return f"{text}\n{line}" if text else line

    def next(self, split: int, epoch: int, timeout: float | None = None) -> Piece | None:
        """Blocking ``try_next`` for iterators in this process; None at the end."""
        with self._cond:
            while True:
                result = self.try_next(split, epoch)
                if isinstance(result, Piece):
                    return result
                if result == END:
                    return None
                self._cond.wait(timeout)

    def next_within(self, split: int, epoch: int, timeout: float, near: str | None = None) -> Piece | str:
        """``try_next``, waiting up to ``timeout`` seconds for a piece or the end (then WAIT)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                result = self.try_next(split, epoch, near)
                left = deadline - time.monotonic()
                if result != WAIT or left <= 0:
                    return result
                self._cond.wait(left)

    def get(self, ref: BlockRef) -> pa.Table:
        """The block of a piece this coordinator dealt (iterators in this process read it here)."""
        return self._read(ref)

    def busy_cpus(self) -> float:
        """CPUs the engine's workers are using now (what a rank's torch loop should leave them)."""
        handle = self._handle
        busy = getattr(handle, "busy_cpus", None)
        return float(busy()) if busy is not None else 0.0

    def release(self, piece: Piece) -> None:
        with self._cond:
            self._release_locked(piece.ref)
            self._cond.notify_all()
        self._notify_server()

    def abandon(self, split: int, epoch: int) -> None:
        """``split`` stopped reading ``epoch`` early: deal its share to the others. The last
        to leave an unfinished epoch ends it: what was buffered for it is freed now, and the
        pump stops the execution (nobody reads it any more)."""
        with self._cond:
            if epoch == self._epoch and self._dealer is not None:
                self._abandon_locked(split)
        self._notify_server()

    def depart(self, split: int) -> None:
        """The process reading ``split`` is gone (it exited or was killed): it reads no more of
        this epoch, nor of the next ones until a reader asks for ``split`` again, so the other
        splits never wait for its share (with ``equal=True`` they would, for ever)."""
        with self._cond:
            self._departed.add(split)
            if self._dealer is not None and split not in self._ended:
                self._abandon_locked(split)
        self._notify_server()

    def _abandon_locked(self, split: int) -> None:
        assert self._dealer is not None
        for piece in self._dealer.abandon(split):
            self._drop_locked(piece)
        self._ended.add(split)
        if self._everyone_left(self._dealer):
            for piece in self._dealer.drain():
                self._drop_locked(piece)
        self._cond.notify_all()

    def _everyone_left(self, dealer: _Dealer) -> bool:
        """Every split stopped reading ``dealer``'s epoch before its execution ended: the
        coordinator closed, or the next epoch began (which only happens once every split left
        this one), or every split abandoned it."""
        if self._closed or dealer is not self._dealer:
            return True
        return not dealer.done and len(self._ended) == self.n

    def _drop_locked(self, piece: Piece) -> None:
        """A piece nobody will get: no longer buffered, and its block freed once unused."""
        self._pending_bytes -= _piece_bytes(piece)
        self._release_locked(piece.ref)

    def _release_locked(self, ref: BlockRef) -> None:
        owner = self._owners.get(ref.block_id)
        if owner is not None and owner[0].unref(ref):
            del self._owners[ref.block_id]
            if owner[1] is not None:
                owner[1].free_detached(ref)

    # epochs --------------------------------------------------------------------------------
    def _begin_epoch(self, epoch: int) -> None:
        self._epoch = epoch
        self._ended = set()
        self._local_rows = [0] * self.n
        self._node_rows = {}
        self._located = False
        previous = self._dealer
        self._dealer = (OrderedSplitDealer if self.ordered else SplitDealer)(self.n, self.equal)
        if previous is not None:  # ranks stay where they are: deal by node from the first piece
            self._dealer.nodes.update(previous.nodes)
        for split in sorted(self._departed):
            self._dealer.abandon(split)
            self._ended.add(split)
        self._handle = None
        threading.Thread(target=self._pump, args=(self._dealer,), name="dataflow-split", daemon=True).start()

    def _pump(self, dealer: _Dealer) -> None:
        try:
            # Started here, not under the lock in ``try_next``: planning and starting an
            # execution can take a while, and the socket server's thread (which calls
            # ``try_next``) must stay free to send keepalives meanwhile.
            handle = self._start()
            with self._cond:
                if self._dealer is dealer:
                    self._handle = handle
            refs = handle.iter_refs()
            try:
                for ref in refs:
                    # a block of a materialized input is borrowed: dealt like any other, never freed
                    owner = handle if handle.detach(ref) else None
                    if ref.num_rows == 0:  # no piece will ever release it
                        if owner is not None:
                            owner.free_detached(ref)
                        continue
                    with self._cond:
                        self._owners[ref.block_id] = (dealer, owner)
                        self._pending_bytes += ref.size_bytes
                        for piece in dealer.add(ref):  # an abandoned split's share
                            self._drop_locked(piece)
                        self._cond.notify_all()
                        self._notify_server()
                        while (self._pending_bytes > self.max_pending_bytes and dealer.may_pause()
                               and not self._everyone_left(dealer)):
                            self._cond.wait()  # dealing, releases, abandons and close notify
                        if self._everyone_left(dealer):
                            break
            finally:
                refs.close()  # stops the execution if it has not ended (every split left)
            with self._cond:
                left = self._everyone_left(dealer)
                for piece in dealer.finish() + (dealer.drain() if left else []):  # nobody reads what is queued
                    self._drop_locked(piece)
                self._cond.notify_all()
                self._notify_server()
        except BaseException as err:  # the consumers raise it
            with self._cond:
                for piece in dealer.drain():  # nobody will read what was buffered
                    self._drop_locked(piece)
                self._error = err
                self._cond.notify_all()
                self._notify_server()

    def _notify_server(self) -> None:
        if self._server is not None:
            self._server.wake()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            if self._dealer is not None:  # nobody reads the epoch now: its pump stops
                for piece in self._dealer.drain():
                    self._drop_locked(piece)
            self._cond.notify_all()
        if self._server is not None:
            self._server.close()
        SplitCoordinator._registry.pop(self.key, None)

    @classmethod
    def close_all(cls) -> None:
        """Stop every coordinator of this process (the engine is shutting down)."""
        for coordinator in list(cls._registry.values()):
            coordinator.close()


def _piece_bytes(piece: Piece) -> int:
    return piece.ref.size_bytes * piece.length // max(1, piece.ref.num_rows)


def _execution_summary(handle: Any) -> str:
    """An execution handle's statistics as text ("" when it has none yet)."""
    stats = getattr(handle, "stats", None)
    if stats is None:
        return ""
    try:
        return str(stats())
    except Exception:  # (statistics are a report: never worth failing the epoch's end)
        return ""

"""Dataset.streaming_split: n iterators over one execution per epoch, for n training ranks.

Each ``SplitIterator`` is a ``DataIterator`` (iter_batches, iter_rows, iter_torch_batches...)
whose blocks come from a shared ``engine.split.SplitCoordinator`` that the backend made
(``engine.runner``). Every call to an ``iter_*`` method starts the split's next epoch; an
epoch's execution starts when the first split asks for it, once every split has finished the
previous one. Iterators pickle: in another process (a ``torch.distributed`` rank started by a
launcher) they reach the coordinator through the backend's transport (``runner.split_client``;
for the multi-process backend, its socket, with blocks mapped from shared memory directly).
Such an iterator never waits unboundedly: if the process that called ``streaming_split`` (it
hosts the coordinator) dies or stops answering, it raises ``SplitCoordinatorLostError`` within
seconds (``engine.split_server.LIVENESS_S``), while a slow pipeline keeps it waiting as long as
needed (the coordinator sends keepalives meanwhile).

``equal=True``: every split gets exactly ``floor(total / n)`` rows; the last ``total % n`` rows
are dropped and reported (``SplitIterator.split_stats()["dropped_rows"]``, and a warning in the log).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from dataflow.iterator import DataIterator
from dataflow.schema import Schema
from engine import runner

if TYPE_CHECKING:
    from dataflow.plan import LogicalNode
    from engine.options import ExecutionOptions
    from engine.runner import SplitSource
    from engine.split import Piece, SplitCoordinator


class EpochInAnotherProcess:
    """Starts an epoch of a plan in the process hosting its split's coordinator (the Ray
    backend's actor), with the driver's execution mode and options and no progress display."""

    def __init__(self, plan: LogicalNode, mode: str, options: ExecutionOptions) -> None:
        self.plan = plan
        self.mode = mode
        self.options = options

    def __call__(self) -> Any:
        from dataflow.context import DataContext
        from dataflow.dataset import Dataset

        ctx = DataContext.get_current()
        ctx.execution_mode, ctx.execution_options, ctx.progress_mode = self.mode, self.options, "off"
        return Dataset(self.plan)._execute()


class _SplitHandle:
    """What DataIterator needs from an execution, served by the coordinator (or a client of its
    transport, in another process): pieces to iterate, and the blocks they are cut from."""

    def __init__(self, source: SplitSource, split: int, epoch: int) -> None:
        self._source = source
        self._split = split
        self._epoch = epoch
        self.private_views = bool(source.private_views)  # may consumers write into the arrays

    def iter_refs(self) -> Iterator[Piece]:
        finished = False
        try:
            while True:
                piece = self._source.next(self._split, self._epoch)
                if piece is None:
                    finished = True
                    return
                yield piece
        finally:
            if not finished:
                self._source.abandon(self._split, self._epoch)

    def get(self, piece: Piece) -> pa.Table:
        ref = piece.ref
        table = self._source.get(ref)
        if piece.offset == 0 and piece.length == ref.num_rows:
            return table
        return table.slice(piece.offset, piece.length)

    def release(self, piece: Piece) -> None:
        self._source.release(piece)

    def busy_cpus(self) -> float:
        """CPUs the engine's workers are using (from the coordinator, in or out of process)."""
        return float(self._source.busy_cpus())


class SplitIterator(DataIterator):
    """One of ``n`` iterators sharing an execution (see ``Dataset.streaming_split``)."""

    def __init__(
        self, coordinator: SplitCoordinator | None, key: str, address: str | None, split: int, n: int,
        schema: Schema | None = None, fetch_schema: Callable[[], Schema | None] | None = None,
    ) -> None:
        super().__init__(self._next_epoch, f"StreamingSplit[{split}/{n}]")
        self._schema = schema
        self._fetch_schema = fetch_schema
        """In the process that split the dataset: its ``schema()``, run when asked (it may run
        the plan for a first block, as Ray's does)."""
        self._coordinator = coordinator
        self._key = key
        self._address = address
        self._split = split
        self._n = n
        self._attach(coordinator)
        self._split_epoch = -1
        """The coordinator's epoch this iterator reads next (``DataIterator._epoch`` is the
        user's, which ``load_state_dict`` sets)."""
        self._client: Any = None

    def _attach(self, coordinator: SplitCoordinator | None) -> None:
        """Keep ``coordinator`` (of this process) open while this iterator lives."""
        if coordinator is not None and hasattr(coordinator, "attach"):
            coordinator.attach()
            weakref.finalize(self, coordinator.detach)

    def _source(self) -> SplitSource:
        if self._coordinator is None:
            self._coordinator = runner.find_split(self._key)
            self._attach(self._coordinator)
        if self._coordinator is not None:
            return self._coordinator
        if self._address is None:
            msg = (
                "this streaming_split iterator was made by the in-process executor; it can only be "
                "used in the process that created it (use the default multi-process executor)"
            )
            raise RuntimeError(msg)
        if self._client is None:
            self._client = runner.split_client(self._address)
        return self._client

    def _next_epoch(self) -> _SplitHandle:
        self._split_epoch += 1
        return _SplitHandle(self._source(), self._split, self._split_epoch)

    def schema(self) -> Schema | None:
        """The split dataset's schema, as ``Dataset.schema()`` gives it (the plan's, else that
        of a first block: a small run of its own). An iterator sent to another process carries
        it; None there only if the dataset has no rows to tell it."""
        if self._schema is None and self._fetch_schema is not None:
            self._schema = self._fetch_schema()
        return self._schema

    def stats(self) -> str:
        """The last finished epoch as text, as Ray's: the execution's statistics, then the rows
        each split got and the rows dropped to make them equal ("" before an epoch has ended,
        and in a process the coordinator does not live in: ``split_stats`` works there)."""
        coordinator = self._coordinator or runner.find_split(self._key)
        return coordinator.summary() if coordinator is not None else ""

    def split_stats(self) -> dict[str, Any]:
        """Rows each split got in the last finished epoch (``rows``), rows dropped to make them
        equal (``dropped_rows``), and on a cluster where each split read (``rows_by_node``,
        ``rows_on_own_node``)."""
        coordinator = self._coordinator or runner.find_split(self._key)
        return dict(coordinator.last_stats) if coordinator is not None else {}

    def __reduce__(self) -> Any:
        # sent to another process (a rank): the coordinator stays open, whatever happens to the
        # iterators here, until the engine shuts down
        coordinator = self._coordinator or runner.find_split(self._key)
        if coordinator is not None and hasattr(coordinator, "note_remote_client"):
            coordinator.note_remote_client()
        return (SplitIterator, (None, self._key, self._address, self._split, self._n, self.schema()))

    def __repr__(self) -> str:
        return f"SplitIterator(split={self._split}, n={self._n}, pid={os.getpid()})"

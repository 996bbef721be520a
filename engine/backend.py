"""The backend interface: what runs operators and holds their blocks, as ``dataflow`` sees it.

A backend runs a list of operators (``execute`` -> ``ExecutionHandle``), holds tables the driver
already has (``put``), reads and frees the blocks it holds (``get``, ``free``), says what it can
offer (``capacity``) and how much of it is in use (``busy_cpus``), makes the coordinator of a
``streaming_split`` (with the transport that lets iterators in other processes reach it), and
stops (``shutdown``). ``dataflow`` reaches a backend only through ``engine.runner``; it never
sees a session, a socket or a store.

Implementations:

* ``engine.session.Session``: the multi-process backend of this machine (the default,
  ``execution_mode="streaming"``): workers, blocks in shared memory, split iterators in other
  processes over a socket;
* ``engine.local.InProcessBackend``: the synchronous in-process mode (``"local"``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from engine.execution import Execution
from engine.object_store import BlockRef, BlockStore
from engine.operators.base import PhysicalOperator
from engine.options import ExecutionOptions
from engine.stats import ExecutionProgress, ExecutionStats

if TYPE_CHECKING:
    from engine.split import Piece, SplitCoordinator, SplitTransport


@dataclass(frozen=True)
class Capacity:
    """What a backend can offer executions, in all."""

    cpus: float
    gpus: int
    store_bytes: int
    """Bytes of blocks it holds before it spills (or refuses)."""
    resources: tuple[tuple[str, float], ...] = ()
    """Custom resources, as ``ExecutionOptions.resources``."""


class ExecutionHandle:
    """A running (or finished) plan: iterate refs, read a block, release it when done, cancel,
    read statistics. What ``dataflow`` sees of an execution, whichever backend runs it."""

    def __init__(self, execution: Execution, store: BlockStore) -> None:
        self.execution = execution
        self.store = store
        self._closed = False

    @property
    def private_views(self) -> bool:
        """True when a consumer may write into the arrays of a block ``get`` returns without
        any other reader seeing it (copy-on-write mappings); False when they are shared objects."""
        return bool(self.store.private_views)

    def iter_refs(self) -> Iterator[BlockRef]:
        raise NotImplementedError

    def get(self, ref: BlockRef) -> pa.Table:
        return self.store.get(ref)

    def release(self, ref: BlockRef) -> None:
        raise NotImplementedError

    def cancel(self) -> None:
        raise NotImplementedError

    def detach(self, ref: BlockRef) -> bool:
        """Keep ``ref`` after the execution (it no longer counts against its budget). False when
        the block was borrowed (a materialized input's): it is not the caller's to free."""
        raise NotImplementedError

    def free_detached(self, ref: BlockRef) -> None:
        """Free a block kept with ``detach``."""
        raise NotImplementedError

    @property
    def blocks_alive(self) -> bool:
        """Whether blocks kept with ``detach`` can still be read (False once the backend that
        holds them shut down)."""
        return True

    def wait_stopped(self, timeout: float | None = None) -> bool:
        """Block until no task of this execution is running anymore."""
        return self.execution.stopped.wait(timeout)

    def stats(self) -> ExecutionStats:
        return ExecutionStats.of(self.execution)

    def progress(self) -> ExecutionProgress:
        """What each operator has done, runs, holds and waits for, now: plain data read
        without locks from any thread (progress bars and metrics poll it)."""
        return ExecutionProgress.of(self.execution, self.actors_of)

    def actors_of(self, op: PhysicalOperator) -> int:
        """Live actors of ``op``'s pool (0 where the backend does not say)."""
        return 0

    def when_ended(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` once the execution has finished, failed or been cancelled (at once if it
        has; otherwise from the thread that ends it: ``fn`` must be quick and never raise)."""
        self.execution.buffer.add_done_callback(fn)

    def results(self) -> list[Any]:
        """Write results (for write plans) once finished."""
        return list(getattr(self.execution.output_op, "results", []))

    def row_count(self) -> int:
        return int(getattr(self.execution.output_op, "rows_counted", 0))

    def busy_cpus(self) -> float:
        """CPUs the engine's worker processes are using right now on this machine."""
        return 0.0


class HeldBlocks:
    """Frees blocks a backend holds for the driver (``Backend.put``): what a materialized
    dataset of in-memory data has where others have the handle of the execution that made
    their blocks (``free_detached``, ``blocks_alive``)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def free_detached(self, ref: BlockRef) -> None:
        if not self.backend.closed:
            self.backend.free(ref)

    @property
    def blocks_alive(self) -> bool:
        return not self.backend.closed


def put_each(tables: Iterable[pa.Table], put: Callable[[pa.Table], BlockRef], free: Callable[[BlockRef], None]) -> list[BlockRef]:
    """``put`` every table; when one fails, ``free`` those put before it, then raise."""
    refs: list[BlockRef] = []
    try:
        for table in tables:
            refs.append(put(table))
    except BaseException:
        for ref in refs:
            free(ref)
        raise
    return refs


class SplitSource(Protocol):
    """What a split iterator reads from: the coordinator itself (in its process) or a client of
    its transport (in another process)."""

    @property
    def private_views(self) -> bool: ...

    def next(self, split: int, epoch: int) -> Piece | None: ...

    def get(self, ref: BlockRef) -> pa.Table: ...

    def release(self, piece: Piece) -> None: ...

    def abandon(self, split: int, epoch: int) -> None: ...

    def busy_cpus(self) -> float: ...


class Backend(ABC):
    """Runs executions and holds their blocks (see the module docstring)."""

    options: ExecutionOptions
    """The settings it runs with (per-execution fields come from each ``execute``)."""

    @property
    @abstractmethod
    def closed(self) -> bool:
        """True once ``shutdown`` ran: a new backend must be started to run anything."""

    @property
    @abstractmethod
    def private_views(self) -> bool:
        """True when the tables ``get`` returns are private copy-on-write mappings."""

    def execution_options(self, wanted: ExecutionOptions) -> ExecutionOptions:
        """The options an execution asking for ``wanted`` runs with: the backend's settings
        (CPUs, store...) with ``wanted``'s per-execution fields."""
        return self.options.for_execution(wanted)

    @abstractmethod
    def execute(self, ops: list[PhysicalOperator], options: ExecutionOptions) -> ExecutionHandle:
        """Start running ``ops`` (topologically ordered; the last one is the output)."""

    @abstractmethod
    def put(self, tables: Sequence[pa.Table]) -> list[BlockRef]:
        """Hold ``tables`` (data the driver already has: ``from_arrow``, ``from_items``...) as
        blocks, one each, outside any execution, as Ray's ``ray.put``: no task runs and the data
        crosses no socket. The caller owns them and frees each with ``free``."""

    @abstractmethod
    def get(self, ref: BlockRef) -> pa.Table:
        """The block ``ref`` points at."""

    @abstractmethod
    def free(self, ref: BlockRef) -> None:
        """Free a block no execution holds anymore (idempotent; a no-op once stopped)."""

    @abstractmethod
    def capacity(self) -> Capacity:
        """CPUs, GPUs and block storage it offers."""

    @abstractmethod
    def busy_cpus(self) -> float:
        """CPUs its running tasks are using now (what a consumer's own threads should leave them)."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop everything it started and free every block it holds (idempotent)."""

    def statistics(self) -> dict[str, Any]:
        """Its processes and block store now (any thread): ``workers``, ``actors``,
        ``store_used``, ``store_peak``, ``store_capacity``, ``spilled_blocks``,
        ``spilled_bytes``, ``executions``; empty where it keeps none."""
        return {}

    def split_transport(self) -> Callable[[SplitCoordinator], SplitTransport] | None:
        """How coordinators of this backend serve iterators in other processes: a factory of
        the server for one coordinator, or None when they can only be used in this process."""
        return None

    def split_coordinator(
        self,
        start: Callable[[], ExecutionHandle],
        n: int,
        equal: bool,
        max_pending_bytes: int,
        ordered: bool = False,
        inputs: Sequence[BlockRef] = (),
    ) -> SplitCoordinator:
        """The coordinator of a ``streaming_split`` into ``n``: ``start`` runs one epoch;
        ``ordered``: its order is the same every epoch, so rows are dealt by position;
        ``inputs``: the blocks of materialized datasets the epochs read (here: this process's)."""
        from engine.split import SplitCoordinator

        return SplitCoordinator(
            start,
            n,
            equal,
            max_pending_bytes=max_pending_bytes,
            read=self.get,
            private_views=self.private_views,
            serve=self.split_transport(),
            ordered=ordered,
        )

    @classmethod
    def split_client(cls, address: str) -> SplitSource:
        """Reach a coordinator of this kind of backend at ``address`` from another process."""
        msg = f"{cls.__name__} has no streaming_split transport (its iterators work in one process only)"
        raise RuntimeError(msg)

"""The physical operator interface, and the bookkeeping every operator shares.

An operator receives items (block refs, or read tasks for a source) with ``add_input(item,
index)`` (``index`` names the upstream it came from), turns them into ``outputs`` either on the
driver (``limit``, ``union``) or by handing out tasks (``map``), and says when it is
``completed``. The execution is the only caller: it moves each operator's outputs to its
downstream operator and decides when tasks may be dispatched.

Operators never free a block. Which blocks exist, who produced them and who may free them is
one table in ``engine.execution`` (``Execution.release``); a block an execution did not produce
(a materialized dataset's) is never in it, so no operator can destroy another dataset's data.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from engine.object_store import BlockRef


@dataclass
class OpStats:
    """Counters one operator accumulates; the executor adds the wait reasons."""

    name: str
    tasks: int = 0
    tasks_failed: int = 0
    tasks_retried: int = 0
    rows_out: int = 0
    bytes_out: int = 0
    task_wall_s: float = 0.0
    task_cpu_s: float = 0.0
    peak_held_bytes: int = 0
    waits: dict[str, float] = field(default_factory=dict)
    worker_deaths: list[str] = field(default_factory=list)
    """How each worker that died running its tasks ended (signal or exit code, memory)."""
    io: dict[str, int] = field(default_factory=dict)
    """Summed I/O counters of its tasks (files and bytes read, row groups skipped, retries...)."""
    merges: int = 0
    """Pushed merges an exchange's reduce ran while its map tasks did (not in ``tasks``)."""
    sampling_tasks: int = 0
    """Tasks of a sort's map side that read the key columns alone to fit the ranges (in ``tasks``)."""
    pages_given_back: int = 0
    """Bytes of spilled map outputs an exchange's reduce gave back as its tasks read them,
    before their files were freed whole (``engine.row_pages``)."""
    rows_skipped: int = 0
    """Rows its ``on_error="skip"`` steps dropped because the UDF raised on them."""
    blocks_errored: int = 0
    """Failed tasks whose output was dropped under ``max_errored_blocks``."""
    errors: dict[str, int] = field(default_factory=dict)
    """Skipped rows and dropped tasks, per exception type."""

    def add_wait(self, reason: str, seconds: float) -> None:
        self.waits[reason] = self.waits.get(reason, 0.0) + seconds


@dataclass(frozen=True)
class OperatorContext:
    """What the execution offers its operators when it starts them (``PhysicalOperator.start``)."""

    release: Callable[[BlockRef], None]
    """Give up a block: freed if this execution produced it, left alone if it is borrowed."""
    slice_head: Callable[[BlockRef, int], BlockRef]
    """A new block holding the first n rows of a block (counted like the block's producer's)."""
    preserve_order: bool
    read: Callable[[BlockRef], pa.Table]
    """A block's table, read in the driver (a sort samples the keys of blocks no task of its
    execution made, a materialized input's, with it)."""
    store_capacity: int
    num_cpus: int
    fail: Callable[[BaseException], None]
    """End the execution with this error (a user mistake found by an operator on the driver)."""


class PhysicalOperator:
    """Base class. Subclasses override ``add_input`` and, if they run tasks, the task hooks."""

    runs_tasks = False

    def __init__(self, name: str, upstream: list[PhysicalOperator]) -> None:
        self.name = name
        self.upstream = upstream
        self.downstream: PhysicalOperator | None = None
        self.outputs: deque[BlockRef] = deque()
        self.stats = OpStats(name)
        self.inputs_done = not upstream
        self._upstream_done: set[int] = set()
        self.cancelled = False
        self.ordered_output = False
        """Emit outputs in input order whatever the execution's ``preserve_order`` (set on
        what feeds an exchange that needs its input in order, and on what follows a sort)."""
        self.held_bytes = 0
        """Bytes of the live blocks this operator produced, wherever they wait (its memory
        footprint). Written only by the execution's ownership table, never by operators."""

    # data flow ---------------------------------------------------------------------------
    def start(self, ctx: OperatorContext) -> None:
        """Called once by the execution before any input arrives."""

    def add_input(self, item: Any, index: int) -> None:
        raise NotImplementedError

    def borrowed_refs(self) -> tuple[BlockRef, ...]:
        """Blocks it hands on that belong to someone else (a materialized dataset's)."""
        return ()

    def upstream_unneeded(self) -> bool:
        """True once nothing more from upstream can change the output (a limit reached): the
        execution then cancels everything upstream."""
        return False

    def release_slice(self, piece: Any) -> bool:
        """This operator is done with ``piece`` (a slice of a block); True when no other slice
        of the block remains queued or running here (the block may then be released)."""
        return True

    def slices_left(self, block_id: str) -> int:
        """Slices of the block still queued or running here (1 for a block it does not cut)."""
        return 1

    def upstream_finished(self, index: int) -> None:
        self._upstream_done.add(index)
        if len(self._upstream_done) == len(self.upstream):
            self.inputs_done = True

    def emit(self, ref: BlockRef) -> None:
        self.outputs.append(ref)
        self.stats.rows_out += ref.num_rows
        self.stats.bytes_out += ref.size_bytes

    def completed(self) -> bool:
        """True when this operator will produce no more outputs."""
        return self.cancelled or (self.inputs_done and not self.has_pending_work())

    def has_pending_work(self) -> bool:
        return False

    def cancel(self) -> list[Any]:
        """Stop: return the items it holds (queued inputs, outputs parked for ordering) so the
        execution can release them."""
        self.cancelled = True
        return []

    # tasks (only for operators with runs_tasks) ---------------------------------------------
    def in_flight(self) -> int:
        return 0

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"

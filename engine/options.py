"""Every engine knob and its default, as frozen dataclasses.

Nothing here reads the environment: ``dataflow.context`` does that, in one place, and passes
the result down. Sizes are bytes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

MiB = 1 << 20
GiB = 1 << 30


def _total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 * GiB


@dataclass(frozen=True)
class ExecutionOptions:
    """How the engine runs plans. Defaults follow Ray Data where it is sound and say so."""

    num_cpus: int | None = None
    """Worker processes for tasks; None means one per CPU (``os.cpu_count()``)."""
    num_gpus: int | None = None
    """GPUs this node offers to ``num_gpus`` tasks and actors; None: the GPUs it has."""
    resources: tuple[tuple[str, float], ...] = ()
    """Custom resources this node offers, e.g. (("TPU", 4),)."""
    object_store_memory: int | None = None
    """Shared-memory capacity; past it, blocks spill to disk. None: 30% of RAM (as Ray)."""
    spill_dir: str | None = None
    """Where spilled blocks go; None: the system temp folder."""
    target_max_block_size: int = 128 * MiB
    """Blocks are split above this size (Ray's default)."""
    min_task_input_bytes: int = 4 * MiB
    """Small inputs are bundled into one task until they reach this size."""
    op_output_budget: int = 192 * MiB
    """Bytes one operator may hold in its output queue plus expected in-flight output."""
    consumer_buffer_bytes: int = 128 * MiB
    """Bytes produced ahead of a consumer (iter_batches) before the engine waits for it."""
    max_task_attempts: int = 3
    """Attempts per task when a worker dies (user exceptions are not retried)."""
    task_timeout_s: float | None = None
    """A task running longer than this fails its job with ``TaskTimeoutError`` and its worker
    is killed (a hung UDF); None: no limit. Tasks running long show in ``stats()`` either way."""
    worker_start_timeout_s: float = 60.0
    actor_idle_timeout_s: float = 5.0
    """An actor pool above its minimum size shrinks after this long with nothing queued."""
    preserve_order: bool = False
    """Deliver blocks in the order of the input (as Ray's ``preserve_order``): deterministic
    output and ``limit``; tasks still run in parallel, finished ones wait for earlier ones."""
    inline_cold_start: bool = True
    """Run tasks in the driver until the first worker process is ready (fast small jobs)."""

    PER_EXECUTION = (
        "target_max_block_size",
        "min_task_input_bytes",
        "op_output_budget",
        "consumer_buffer_bytes",
        "max_task_attempts",
        "task_timeout_s",
        "preserve_order",
    )
    """Fields that may differ between executions of one session (the rest shape the session)."""

    def for_execution(self, wanted: ExecutionOptions) -> ExecutionOptions:
        """This session's options with ``wanted``'s per-execution fields."""
        return replace(self, **{name: getattr(wanted, name) for name in self.PER_EXECUTION})

    def with_(self, **changes: object) -> ExecutionOptions:
        """A copy with ``changes`` applied."""
        return replace(self, **changes)  # type: ignore[arg-type]

    def resolved_num_cpus(self) -> int:
        return self.num_cpus if self.num_cpus is not None else (os.cpu_count() or 1)

    def resolved_num_gpus(self) -> int:
        if self.num_gpus is not None:
            return self.num_gpus
        from engine.resources import detect_gpus

        return detect_gpus()

    def resolved_store_capacity(self) -> int:
        if self.object_store_memory is not None:
            return self.object_store_memory
        return int(_total_memory() * 0.3)

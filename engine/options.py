"""Every engine knob and its default, as dataclasses.

Nothing here reads the environment: ``dataflow.context`` does that, in one place, and passes
the result down. Sizes are bytes.

``ExecutionOptions`` is mutable, as Ray Data's is (``ctx.execution_options.preserve_order =
True``), and refuses names it does not have. The engine never holds the caller's object: a
backend copies the options it starts with (``Session``) and every execution runs with its own
copy (``Backend.execution_options``), so a change made while a job runs applies to the next one.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field, fields, replace
from typing import Any

MiB = 1 << 20
GiB = 1 << 30


@functools.cache
def _host_cpus() -> int:
    """``os.cpu_count()``, read once: glibc reads a /sys file on each call (~8 us), and the
    scheduling loop asks for it on every dispatch."""
    return os.cpu_count() or 1


def _total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 * GiB


@dataclass(frozen=True)
class ExecutionResources:
    """Ray Data's ``ExecutionResources``, as ``ExecutionOptions.resource_limits``: None is no limit.

    ``cpu`` caps the CPUs the tasks of one execution use at once (the sum of the ``num_cpus``
    of its running tasks); ``object_store_memory`` caps the bytes of blocks it holds before
    operators wait (the store budget its backpressure shares out). ``gpu`` and ``memory``
    limits are refused when an execution starts: cap GPUs with ``dataflow.init(num_gpus=...)``.
    """

    cpu: float | None = None
    gpu: float | None = None
    object_store_memory: float | None = None
    memory: float | None = None

    @classmethod
    def for_limits(
        cls,
        cpu: float | None = None,
        gpu: float | None = None,
        object_store_memory: float | None = None,
        memory: float | None = None,
    ) -> ExecutionResources:
        """Limits (Ray's spelling); an unset field is no limit."""
        return cls(cpu, gpu, object_store_memory, memory)

    def copy(
        self,
        cpu: float | None = None,
        gpu: float | None = None,
        memory: float | None = None,
        object_store_memory: float | None = None,
    ) -> ExecutionResources:
        """A copy with the given fields changed (None keeps this one's), as Ray's
        ``resource_limits = resource_limits.copy(cpu=2)``."""
        changed = {"cpu": cpu, "gpu": gpu, "memory": memory, "object_store_memory": object_store_memory}
        return replace(self, **{k: v for k, v in changed.items() if v is not None})


@dataclass
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
    small_exchange_bytes: int = 8 * MiB
    """An all-to-all step (shuffle, sort, groupby aggregation) whose whole input is at most this
    size runs as one task with no map tasks (the same result, without a task round trip per
    block and partition); 0: always partition over the workers."""
    op_output_budget: int = 192 * MiB
    """Bytes one operator may hold in its output queue plus expected in-flight output."""
    consumer_buffer_bytes: int = 128 * MiB
    """Bytes produced ahead of a consumer (iter_batches) before the engine waits for it."""
    max_task_attempts: int = 3
    """Attempts per task when a worker dies (user exceptions are not retried)."""
    max_errored_blocks: int = 0
    """Ray's setting: how many failed tasks (a UDF's or a reader's exception) an execution lets
    go, their output dropped, before an error fails it; -1: no limit. Not for writes."""
    task_timeout_s: float | None = None
    """A task running longer than this fails its job with ``TaskTimeoutError`` and its worker
    is killed (a hung UDF); None: no limit. Tasks running long show in ``stats()`` either way."""
    worker_memory_limit: int | None = None
    """Resident memory the worker processes may reach together before admission slows to one
    running task per operator (a UDF whose heap grows is seen before the kernel kills workers);
    None: 80% of the machine's memory less the object store."""
    worker_start_timeout_s: float = 60.0
    actor_idle_timeout_s: float = 5.0
    """An actor pool above its minimum size shrinks after this long with nothing queued."""
    preserve_order: bool = False
    """Deliver blocks in the order of the input (as Ray's ``preserve_order``): deterministic
    output and ``limit``; tasks still run in parallel, finished ones wait for earlier ones."""
    inline_cold_start: bool = True
    """Run tasks in the driver until the first worker process is ready (fast small jobs)."""
    resource_limits: ExecutionResources = field(default_factory=ExecutionResources)
    """Ray's ``resource_limits``: what one execution may use at once (see ``ExecutionResources``)."""
    locality_with_output: bool | list[str] = False
    """Ray's setting: on the Ray runner, tasks prefer the driver's node (True) or the listed node
    ids in turn (soft: a full node lets a task run elsewhere); on one machine every block is
    local to the consumer already."""
    actor_locality_enabled: bool = True
    """Ray's setting: on the Ray runner, a task goes to an idle actor on the node holding most of
    its input (False: any idle actor); on one machine every actor is local already."""
    verbose_progress: bool | None = None
    """Ray's setting: True shows a progress line per operator under each execution's, False only
    the execution's; None leaves it to ``DataContext.enable_operator_progress_bars``."""

    PER_EXECUTION = (
        "target_max_block_size",
        "min_task_input_bytes",
        "small_exchange_bytes",
        "op_output_budget",
        "consumer_buffer_bytes",
        "max_task_attempts",
        "max_errored_blocks",
        "task_timeout_s",
        "preserve_order",
        "resource_limits",
        "locality_with_output",
        "actor_locality_enabled",
        "verbose_progress",
    )
    """Fields that may differ between executions of one session (the rest shape the session)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _FIELD_NAMES:
            hint = _RAY_HINTS.get(name, "")
            msg = f"ExecutionOptions has no setting {name!r}{hint}; its settings are {sorted(_FIELD_NAMES)}"
            raise AttributeError(msg, name=name, obj=self)
        object.__setattr__(self, name, value)

    def check(self) -> None:
        """Raise ``ValueError`` for a setting that cannot be honoured (before anything runs)."""
        limits = self.resource_limits
        if not isinstance(limits, ExecutionResources):
            msg = f"resource_limits must be an ExecutionResources, got {type(limits).__name__}"
            raise TypeError(msg)
        if limits.gpu is not None or limits.memory is not None:
            msg = (
                "resource_limits.gpu and resource_limits.memory are not supported: GPUs are given to "
                "actor pools for their lifetime, so cap them with dataflow.init(num_gpus=...); "
                "cpu and object_store_memory limits are"
            )
            raise ValueError(msg)
        for name in ("cpu", "object_store_memory"):
            value = getattr(limits, name)
            if value is not None and not value > 0:
                msg = f"resource_limits.{name} must be > 0 or None, got {value!r}"
                raise ValueError(msg)
        blocks = self.max_errored_blocks
        if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < -1:
            msg = f"max_errored_blocks must be an int >= -1 (-1: no limit), got {blocks!r}"
            raise ValueError(msg)
        if not isinstance(self.target_max_block_size, int) or self.target_max_block_size <= 0:
            msg = f"target_max_block_size must be a positive number of bytes, got {self.target_max_block_size!r}"
            raise ValueError(msg)
        locality = self.locality_with_output
        if not isinstance(locality, bool) and not (
            isinstance(locality, (list, tuple)) and locality and all(isinstance(n, str) for n in locality)
        ):
            msg = f"locality_with_output must be a bool or a non-empty list of Ray node ids, got {locality!r}"
            raise ValueError(msg)
        small = self.small_exchange_bytes
        if isinstance(small, bool) or not isinstance(small, int) or small < 0:
            msg = f"small_exchange_bytes must be a number of bytes >= 0 (0: never one task), got {small!r}"
            raise ValueError(msg)

    def cpu_limit(self) -> float | None:
        """The CPUs one execution's running tasks may use at once (``resource_limits.cpu``), or None."""
        return None if self.resource_limits.cpu is None else float(self.resource_limits.cpu)

    def for_execution(self, wanted: ExecutionOptions) -> ExecutionOptions:
        """This session's options with ``wanted``'s per-execution fields."""
        return replace(self, **{name: getattr(wanted, name) for name in self.PER_EXECUTION})

    def with_(self, **changes: object) -> ExecutionOptions:
        """A copy with ``changes`` applied."""
        return replace(self, **changes)  # type: ignore[arg-type]

    def resolved_num_cpus(self) -> int:
        return self.num_cpus if self.num_cpus is not None else _host_cpus()

    def resolved_num_gpus(self) -> int:
        if self.num_gpus is not None:
            return self.num_gpus
        from engine.resources import detect_gpus

        return detect_gpus()

    def resolved_worker_memory_limit(self) -> int:
        if self.worker_memory_limit is not None:
            return self.worker_memory_limit
        return max(1 << 30, int(_total_memory() * 0.8) - self.resolved_store_capacity())

    def resolved_store_capacity(self) -> int:
        if self.object_store_memory is not None:
            return self.object_store_memory
        return int(_total_memory() * 0.3)


_FIELD_NAMES = frozenset(f.name for f in fields(ExecutionOptions))
_RAY_HINTS = {
    "exclude_resources": " (Ray's deprecated exclude_resources: lower resource_limits instead)",
    "label_selector": " (Ray's label_selector: dataflow runs on one machine, which has no node labels)",
}

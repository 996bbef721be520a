"""Per-operator statistics of an execution, and how they print.

``ExecutionStats.of`` takes a snapshot (it only reads state). The text shows, for each
operator: tasks, rows and bytes out, task wall and CPU time, peak bytes held, and how long it
was held back and why (no free worker, output budget full, concurrency cap...).

``ExecutionProgress.of`` is the live view progress bars and metrics read while the plan runs:
plain data, taken from any thread without a lock (it reads ints, floats and the lengths of
containers the executor's loop writes; a dict is copied in one step under the GIL).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.operators.base import OpStats


def format_bytes(n: float) -> str:
    """``n`` bytes for people: ``512 B``, ``1.5 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


def _fmt_io(name: str, amount: int) -> str:
    value = format_bytes(amount) if name.startswith("bytes") else str(amount)
    return f"{name.replace('_', ' ')} {value}"


LONG_TASK_S = 10.0
"""A task running this long (and five times its operator's mean) is named in ``stats()``."""


def _errors_line(s: OpStats) -> str:
    """``skipped 3 rows (on_error="skip"), dropped 1 block (max_errored_blocks): ValueError 4``."""
    parts = []
    if s.rows_skipped:
        parts.append(f'skipped {s.rows_skipped} row{"s" if s.rows_skipped != 1 else ""} (on_error="skip")')
    if s.blocks_errored:
        parts.append(f'dropped {s.blocks_errored} block{"s" if s.blocks_errored != 1 else ""} (max_errored_blocks)')
    kinds = ", ".join(f"{name} {n}" for name, n in sorted(s.errors.items(), key=lambda kv: -kv[1]))
    return f"    errors: {', '.join(parts)}: {kinds}"


@dataclass
class ExecutionStats:
    wall_s: float
    operators: list[OpStats] = field(default_factory=list)
    long_running: list[str] = field(default_factory=list)
    """Tasks running unusually long right now: which operator, which task, for how long."""

    @staticmethod
    def of(execution: Any) -> ExecutionStats:
        end = execution.finished_at or time.perf_counter()
        now = time.monotonic()
        long_running = []
        for op in execution.ops:
            mean = op.stats.task_wall_s / op.stats.tasks if op.stats.tasks else 0.0
            for pending in list(getattr(op, "pending", {}).values()):
                age = now - pending.started_at
                if age >= max(LONG_TASK_S, 5 * mean):
                    long_running.append(
                        f"task {pending.spec.task_index} of {op.name} running for {age:.0f} s "
                        f"(attempt {pending.spec.attempt + 1}; finished tasks took {mean:.2f} s on average)"
                    )
        return ExecutionStats(end - execution.started, [op.stats for op in execution.ops], long_running)

    def to_dict(self) -> dict[str, Any]:
        return {
            "wall_s": self.wall_s,
            "operators": [
                {
                    "name": s.name,
                    "tasks": s.tasks,
                    "rows_out": s.rows_out,
                    "bytes_out": s.bytes_out,
                    "task_wall_s": s.task_wall_s,
                    "task_cpu_s": s.task_cpu_s,
                    "peak_held_bytes": s.peak_held_bytes,
                    "retried": s.tasks_retried,
                    "merges": s.merges,
                    "sampling_tasks": s.sampling_tasks,
                    "pages_given_back": s.pages_given_back,
                    "failed": s.tasks_failed,
                    "worker_deaths": list(s.worker_deaths),
                    "waits": dict(s.waits),
                    "io": dict(s.io),
                    "rows_skipped": s.rows_skipped,
                    "blocks_errored": s.blocks_errored,
                    "errors": dict(s.errors),
                }
                for s in self.operators
            ],
            "long_running": list(self.long_running),
        }

    def __str__(self) -> str:
        lines = [f"Execution: {self.wall_s:.3f} s wall"]
        for i, s in enumerate(self.operators):
            lines.append(
                f"  Operator {i} {s.name}: {s.tasks} tasks, {s.rows_out} rows, {format_bytes(s.bytes_out)} out; "
                f"task wall {s.task_wall_s:.3f} s, cpu {s.task_cpu_s:.3f} s; peak held {format_bytes(s.peak_held_bytes)}"
            )
            if s.merges:
                lines.append(f"    merged its map outputs in {s.merges} tasks while the map tasks ran")
            if s.sampling_tasks:
                lines.append(f"    {s.sampling_tasks} of its tasks read the sort key columns alone first, to fit the ranges")
            if s.pages_given_back:
                lines.append(f"    gave back {format_bytes(s.pages_given_back)} of spilled map outputs as its tasks read them")
            if s.tasks_retried:
                lines.append(f"    retried {s.tasks_retried} tasks after worker deaths")
            for death in s.worker_deaths[:5]:
                lines.append(f"    {death}")
            if s.io:
                lines.append("    I/O: " + ", ".join(_fmt_io(name, n) for name, n in s.io.items()))
            if s.errors:
                lines.append(_errors_line(s))
            for reason, seconds in sorted(s.waits.items(), key=lambda kv: -kv[1]):
                if seconds >= 0.0005:
                    lines.append(f"    held back {seconds:.3f} s: {reason}")
        for line in self.long_running:
            lines.append(f"  Long-running: {line}")
        return "\n".join(lines)


@dataclass(frozen=True)
class OpProgress:
    """One operator of a running plan, now: what it has done, runs, holds and waits for."""

    index: int
    name: str
    upstream: tuple[int, ...]
    """Indices of the operators feeding it."""
    runs_tasks: bool
    rows_out: int
    bytes_out: int
    tasks_done: int
    tasks_running: int
    tasks_queued: int
    """Inputs waiting for a task (blocks, a source's read tasks, planned reduce tasks) and retries."""
    actors: int
    held_bytes: int
    """Bytes of the live blocks it produced (its share of the store)."""
    waiting: str | None
    """Why it may not start a task now (no free worker, output budget full...), or None."""
    inputs_done: bool
    completed: bool
    tasks_retried: int = 0
    tasks_failed: int = 0
    worker_deaths: int = 0
    waits: dict[str, float] = field(default_factory=dict)
    """Seconds held back so far, by reason."""

    def own_fraction(self) -> float:
        """Share of the work it knows of that is done (1.0 once completed)."""
        if self.completed or not self.runs_tasks:  # a limit or a union passes on what comes
            return 1.0
        known = self.tasks_done + self.tasks_running + self.tasks_queued
        return self.tasks_done / known if known else (1.0 if self.inputs_done else 0.0)


@dataclass(frozen=True)
class ExecutionProgress:
    """A running (or ended) plan, now: plain data for progress bars, logs and metrics."""

    execution_id: int
    elapsed_s: float
    state: str
    """"running", "finished", "failed" or "cancelled"."""
    operators: tuple[OpProgress, ...]
    error: str | None = None

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def rows_out(self) -> int:
        """Rows the plan's last operator produced (written rows for a write, counted for a count)."""
        return self.operators[-1].rows_out if self.operators else 0

    @property
    def bytes_out(self) -> int:
        return self.operators[-1].bytes_out if self.operators else 0

    def fractions(self) -> list[float]:
        """Each operator's estimated share done: its own share of the work it knows of, times
        the least done of its inputs while more may still come from them."""
        done: list[float] = []
        for op in self.operators:
            share = op.own_fraction()
            if not op.inputs_done and not op.completed and op.upstream:
                share *= min(done[i] for i in op.upstream)  # operators come in topological order
            done.append(share)
        return done

    def fraction(self) -> float:
        """The plan's estimated share done (1.0 once it finished)."""
        if self.state == "finished":
            return 1.0
        shares = self.fractions()
        return shares[-1] if shares else 0.0

    @staticmethod
    def of(execution: Any, actors: Callable[[Any], int] | None = None) -> ExecutionProgress:
        """A snapshot of ``execution`` (any thread); ``actors(op)`` counts an actor pool's workers."""
        ops = list(execution.ops)
        index = {id(op): i for i, op in enumerate(ops)}
        outcome = execution.outcome
        end = execution.finished_at if outcome is not None and execution.finished_at else time.perf_counter()
        operators = []
        for i, op in enumerate(ops):
            s = op.stats
            runs = bool(op.runs_tasks)
            operators.append(
                OpProgress(
                    index=i,
                    name=op.name,
                    upstream=tuple(index[id(u)] for u in op.upstream if id(u) in index),
                    runs_tasks=runs,
                    rows_out=s.rows_out,
                    bytes_out=s.bytes_out,
                    tasks_done=s.tasks,
                    tasks_running=op.in_flight(),
                    tasks_queued=op.queued() if runs else 0,
                    actors=actors(op) if actors is not None and runs and op.actor_pool is not None else 0,
                    held_bytes=op.held_bytes,
                    waiting=execution.waiting_reason(op) if outcome is None else None,
                    inputs_done=bool(op.inputs_done),
                    completed=bool(op.completed()),
                    tasks_retried=s.tasks_retried,
                    tasks_failed=s.tasks_failed,
                    worker_deaths=len(s.worker_deaths),
                    waits=dict(s.waits),
                )
            )
        error = execution.buffer.error
        message = None
        if error is not None:
            lines = str(error).strip().splitlines()
            kind = type(error).__name__
            message = kind if not lines else lines[0] if kind in lines[0] else f"{kind}: {lines[0]}"
        return ExecutionProgress(execution.id, end - execution.started, outcome or "running", tuple(operators), message)

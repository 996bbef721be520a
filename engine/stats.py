"""Per-operator statistics of an execution, and how they print.

``ExecutionStats.of`` takes a snapshot (it only reads state). The text shows, for each
operator: tasks, rows and bytes out, task wall and CPU time, peak bytes held, and how long it
was held back and why (no free worker, output budget full, concurrency cap...).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from engine.operators.base import OpStats


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


def _fmt_io(name: str, amount: int) -> str:
    value = _fmt_bytes(amount) if name.startswith("bytes") else str(amount)
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
                f"  Operator {i} {s.name}: {s.tasks} tasks, {s.rows_out} rows, {_fmt_bytes(s.bytes_out)} out; "
                f"task wall {s.task_wall_s:.3f} s, cpu {s.task_cpu_s:.3f} s; peak held {_fmt_bytes(s.peak_held_bytes)}"
            )
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

"""DataContext: the options in force, composed from the engine's; environment read here only.

``dataflow.init(...)`` sets the engine options for the session it starts. ``DataContext.
get_current()`` is the process-wide context (as in Ray Data); ``with dataflow.options(...)``
overrides fields for a block of code.

Environment variables: ``DATAFLOW_EXECUTION_MODE`` ("streaming" | "local"), ``DATAFLOW_NUM_CPUS``,
``DATAFLOW_OBJECT_STORE_MEMORY`` (bytes).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace
from typing import Any

from engine.options import ExecutionOptions

EXECUTION_MODES = ("streaming", "local")


def _env_options() -> ExecutionOptions:
    changes: dict[str, Any] = {}
    if os.environ.get("DATAFLOW_NUM_CPUS"):
        changes["num_cpus"] = int(os.environ["DATAFLOW_NUM_CPUS"])
    if os.environ.get("DATAFLOW_OBJECT_STORE_MEMORY"):
        changes["object_store_memory"] = int(os.environ["DATAFLOW_OBJECT_STORE_MEMORY"])
    return ExecutionOptions(**changes)


@dataclass
class DataContext:
    """What the next execution will use."""

    execution_mode: str = field(default_factory=lambda: os.environ.get("DATAFLOW_EXECUTION_MODE", "streaming"))
    execution_options: ExecutionOptions = field(default_factory=_env_options)
    cap_torch_threads: bool = True
    """While worker processes feed ``iter_torch_batches``, give torch's intra-op threads only the
    cores the running tasks leave free (at least 1), batch by batch, and restore them when the
    iteration ends (``dataflow.torch_batches``): torch's OpenMP threads spin against busy
    workers otherwise (a ``x.sum()`` loop ran 1.6x slower on 2 cores). False leaves torch's
    thread count alone."""

    _current: Any = None

    def __post_init__(self) -> None:
        if self.execution_mode not in EXECUTION_MODES:
            msg = f"execution_mode must be one of {EXECUTION_MODES}, got {self.execution_mode!r}"
            raise ValueError(msg)

    @staticmethod
    def get_current() -> DataContext:
        """The process-wide context (created on first use)."""
        if DataContext._current is None:
            DataContext._current = DataContext()
        return DataContext._current  # type: ignore[no-any-return]


@contextlib.contextmanager
def options(**changes: Any) -> Iterator[DataContext]:
    """Override context fields or execution options within a ``with`` block."""
    ctx = DataContext.get_current()
    saved = (ctx.execution_mode, ctx.execution_options)
    option_names = {f.name for f in fields(ExecutionOptions)}
    engine_changes = {k: v for k, v in changes.items() if k in option_names}
    for key in changes:
        if key not in option_names and key != "execution_mode":
            msg = f"unknown option {key!r}"
            raise TypeError(msg)
    try:
        if "execution_mode" in changes:
            ctx.execution_mode = changes["execution_mode"]
        if engine_changes:
            ctx.execution_options = replace(ctx.execution_options, **engine_changes)
        yield ctx
    finally:
        ctx.execution_mode, ctx.execution_options = saved

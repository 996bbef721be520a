"""DataContext: the options in force, composed from the engine's; environment read here only.

``dataflow.init(...)`` sets the engine options for the session it starts. ``DataContext.
get_current()`` is the process-wide context (as in Ray Data); ``with dataflow.options(...)``
overrides fields for a block of code.

Environment variables: ``DATAFLOW_EXECUTION_MODE`` ("streaming" | "local"), ``DATAFLOW_NUM_CPUS``,
``DATAFLOW_OBJECT_STORE_MEMORY`` (bytes), ``DATAFLOW_PROGRESS`` ("auto" | "rich" | "log" | "off",
``dataflow.progress``), ``DATAFLOW_LOG_DIR`` (``dataflow.logs``), ``DATAFLOW_METRICS_PORT`` and
``DATAFLOW_METRICS_HOST`` (``dataflow.metrics``).

Ray Data's settings that mean something here are honoured (``target_max_block_size``,
``execution_options.preserve_order``, ``execution_options.resource_limits``...). Those that
only tune Ray's own machinery are kept and do nothing, with a warning that says why; the rest
raise ``AttributeError`` saying why and what to use (``dataflow.ray_settings``), as does any
other name, instead of being silently kept and ignored.
"""

from __future__ import annotations

import contextlib
import copy
import enum
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace
from typing import Any

from connectors import retry
from dataflow import ray_settings
from engine import serialization
from engine.options import ExecutionOptions
from engine.task import ErrorRetries, task_configs

EXECUTION_MODES = ("streaming", "local", "ray")
PROGRESS_MODES = ("auto", "rich", "log", "off")


def _env_options() -> ExecutionOptions:
    changes: dict[str, Any] = {}
    if os.environ.get("DATAFLOW_NUM_CPUS"):
        changes["num_cpus"] = int(os.environ["DATAFLOW_NUM_CPUS"])
    if os.environ.get("DATAFLOW_OBJECT_STORE_MEMORY"):
        changes["object_store_memory"] = int(os.environ["DATAFLOW_OBJECT_STORE_MEMORY"])
    return ExecutionOptions(**changes)


def env_log_dir() -> str | None:
    """``DATAFLOW_LOG_DIR``: the folder of the session log files (None: the default)."""
    return os.environ.get("DATAFLOW_LOG_DIR") or None


def env_shared_paths() -> tuple[str, ...]:
    """``DATAFLOW_SHARED_PATHS``: folders all nodes of a cluster mount (``:``-separated)."""
    return tuple(p for p in os.environ.get("DATAFLOW_SHARED_PATHS", "").split(os.pathsep) if p)


def env_metrics_address() -> tuple[str, int] | None:
    """``DATAFLOW_METRICS_HOST`` (127.0.0.1 by default) and ``DATAFLOW_METRICS_PORT``, when set."""
    port = os.environ.get("DATAFLOW_METRICS_PORT")
    if not port:
        return None
    return os.environ.get("DATAFLOW_METRICS_HOST") or "127.0.0.1", int(port)


DEFAULT_RETRIED_IO_ERRORS = (
    "AWS Error INTERNAL_FAILURE",
    "AWS Error NETWORK_CONNECTION",
    "AWS Error SLOW_DOWN",
    "AWS Error UNKNOWN (HTTP status 503)",
    "AWS Error SERVICE_UNAVAILABLE",
)
"""Ray 2.60's defaults (dataflow's own classifier retries these already; listed so that code
reading or extending the list sees Ray's)."""
DEFAULT_WRITE_FILE_RETRY_ON_ERRORS = DEFAULT_RETRIED_IO_ERRORS[:4]


class ShuffleStrategy(enum.StrEnum):
    """Ray's choices for ``DataContext.shuffle_strategy``, which selects among Ray's shuffle
    implementations: accepted and kept, without effect here (``dataflow.ray_settings``)."""

    SORT_SHUFFLE_PULL_BASED = "sort_shuffle_pull_based"
    SORT_SHUFFLE_PUSH_BASED = "sort_shuffle_push_based"
    HASH_SHUFFLE = "hash_shuffle"
    SHUFFLE_V2 = "shuffle_v2"
    GPU_SHUFFLE = "gpu_shuffle"


_RAY_DEBUG_KEYS = {
    "debug_limit_shuffle_execution_to_num_blocks": "Ray shuffles only that many input blocks",
}
"""``set_config`` keys Ray Data reads itself, which change nothing here."""


@dataclass
class DataContext:
    """What the next execution will use."""

    execution_mode: str = field(
        default_factory=lambda: os.environ.get("DATAFLOW_RUNNER") or os.environ.get("DATAFLOW_EXECUTION_MODE", "streaming")
    )
    execution_options: ExecutionOptions = field(default_factory=_env_options)
    cap_torch_threads: bool = True
    """While worker processes feed ``iter_torch_batches``, give torch's intra-op threads only the
    cores the running tasks leave free (at least 1), batch by batch, and restore them when the
    iteration ends (``dataflow.torch_batches``): torch's OpenMP threads spin against busy
    workers otherwise (a ``x.sum()`` loop ran 1.6x slower on 2 cores). False leaves torch's
    thread count alone."""
    progress_mode: str = field(default_factory=lambda: os.environ.get("DATAFLOW_PROGRESS") or "auto")
    """How running executions are shown (``dataflow.progress``): "auto" (bars on a terminal,
    text updated in place in Jupyter, a log line per operator every ``progress_log_interval_s``
    otherwise), "rich", "log" or "off". ``enable_progress_bars = False`` sets "off"."""
    enable_operator_progress_bars: bool = True
    """Ray's setting: a line per operator under each execution's bar (False: the bar only)."""
    print_on_execution_start: bool = True
    """Ray's setting: each execution logs a line naming its operators when it starts (logger
    ``dataflow.execution``); False leaves it out (the line at its end stays)."""
    progress_log_interval_s: float = 10.0
    """In "log" mode, how often the lines of a running execution are logged."""
    shared_filesystem_paths: tuple[str, ...] = field(default_factory=env_shared_paths)
    """Folders every node of a multi-node cluster mounts at the same place (an NFS or Lustre
    mount): the Ray runner writes there as to s3://. A write to any other local path on a
    multi-node cluster is refused, since each node would write its part to its own disk. From
    ``DATAFLOW_SHARED_PATHS`` (separated by ``:``) by default."""
    enable_arrow_backed_pandas_conversion: bool = True
    """Ray's setting (True by default since Ray 2.56): ``Dataset.to_pandas`` gives
    ``pd.ArrowDtype`` columns; False gives numpy dtypes."""
    enable_fallback_to_arrow_object_ext_type: bool | None = None
    """Ray's setting: values a UDF returns (or ``from_items``, ``from_torch`` hold) that Arrow
    cannot hold natively (a tuple of mixed types, an instance of your class) are kept as pickled
    Python objects (``engine.python_objects``): None (the default) with a warning once per
    process, True without one; False raises the conversion error instead. Read when a step
    is added to a dataset."""

    retried_io_errors: list[str] = field(default_factory=lambda: list(DEFAULT_RETRIED_IO_ERRORS))
    """Ray's setting: an I/O error whose message contains one of these is retried (with backoff,
    ``connectors.retry``) by the reads and writes of datasets made after it is set, on top of
    the errors dataflow retries anyway (timeouts, resets, throttling, 5xx)."""
    write_file_retry_on_errors: list[str] = field(default_factory=lambda: list(DEFAULT_WRITE_FILE_RETRY_ON_ERRORS))
    """Ray's setting: the same for the writing of files."""
    retried_map_errors: bool | list[str] = False
    """Ray's setting: a task whose UDF (map, read, exchange; not a write) raised runs again from
    its first input, in the same worker after Ray's random backoff, when this is True (any
    error) or a list of patterns one of which the error's ``"Type: message"`` holds (as a
    substring, or a regular expression). At most ``max_map_retries`` more times; the error that
    is finally raised says how many attempts were made."""
    max_map_retries: int = 0
    """Ray's setting: how many more runs ``retried_map_errors`` allows a task (0: none)."""
    actor_init_retry_on_errors: bool = False
    """Ray's setting: True calls a callable class's constructor (an actor's, or a task's) that
    raised again, in the same worker, up to ``actor_init_max_retries`` more times before its
    error fails the task. Read when an execution starts."""
    actor_init_max_retries: int = 3
    """Ray's setting: how many more constructor calls ``actor_init_retry_on_errors`` allows
    (-1: until one succeeds)."""
    _kv_configs: dict[str, Any] = field(default_factory=dict)
    _ray_only: dict[str, Any] = field(default_factory=dict)
    """Ray settings that do nothing here (``dataflow.ray_settings.WITHOUT_EFFECT``), as set."""
    _current: Any = None

    def __post_init__(self) -> None:
        if self.execution_mode not in EXECUTION_MODES:
            msg = f"execution_mode must be one of {EXECUTION_MODES}, got {self.execution_mode!r}"
            raise ValueError(msg)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ray_settings.WITHOUT_EFFECT:
            self._ray_only[name] = value
            ray_settings.note_without_effect(name, value)
            return
        if name not in _FIELD_NAMES and not isinstance(getattr(type(self), name, None), property):
            settings = sorted(n for n in (*_FIELD_NAMES, *_PROPERTIES) if not n.startswith("_"))
            why = ray_settings.REFUSED.get(name, "a Ray Data setting dataflow does not have, or a typo")
            msg = f"DataContext has no setting {name!r} ({why}); its settings are {settings}, and execution_options' fields"
            raise AttributeError(msg, name=name, obj=self)
        if name == "progress_mode" and value not in PROGRESS_MODES:
            msg = f"progress_mode (DATAFLOW_PROGRESS) must be one of {PROGRESS_MODES}, got {value!r}"
            raise ValueError(msg)
        object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        # only names not found otherwise: Ray's settings that do nothing here read back as set
        if name in ray_settings.WITHOUT_EFFECT:
            return self.__dict__.get("_ray_only", {}).get(name, ray_settings.WITHOUT_EFFECT[name][0])
        raise AttributeError(f"'DataContext' object has no attribute {name!r}", name=name, obj=self)

    @property
    def target_max_block_size(self) -> int:
        """Ray's setting: blocks that reads and maps output are split above this many bytes
        (``execution_options.target_max_block_size``; 128 MiB by default, as Ray)."""
        return self.execution_options.target_max_block_size

    @target_max_block_size.setter
    def target_max_block_size(self, value: int) -> None:
        if value is None or isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            msg = (
                f"target_max_block_size must be a positive number of bytes, got {value!r} (Ray's None, "
                "unbounded blocks, is not supported: the engine sizes its memory budgets by it)"
            )
            raise ValueError(msg)
        self.execution_options.target_max_block_size = value

    @property
    def max_errored_blocks(self) -> int:
        """Ray's setting: how many failed tasks (a UDF's or a reader's exception) a job lets go,
        dropping their output, before an error fails it; -1: no limit; 0 (the default): none
        (``execution_options.max_errored_blocks``). Writes always fail on an error. To drop
        single rows instead of whole blocks, pass ``on_error="skip"`` to the map."""
        return self.execution_options.max_errored_blocks

    @max_errored_blocks.setter
    def max_errored_blocks(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < -1:
            msg = f"max_errored_blocks must be an int >= -1 (-1: no limit), got {value!r}"
            raise ValueError(msg)
        self.execution_options.max_errored_blocks = value

    @property
    def enable_progress_bars(self) -> bool:
        """Ray's setting (True by default, as in Ray): progress is shown as ``progress_mode``
        says. False turns it off (``progress_mode = "off"``); True turns an "off" back to "auto"."""
        return self.progress_mode != "off"

    @enable_progress_bars.setter
    def enable_progress_bars(self, value: bool) -> None:
        if not value:
            self.progress_mode = "off"
        elif self.progress_mode == "off":
            self.progress_mode = "auto"

    @property
    def enable_rich_progress_bars(self) -> bool:
        """Ray's setting: True draws progress with rich (``progress_mode = "rich"``); False
        turns a "rich" back to "auto"."""
        return self.progress_mode == "rich"

    @enable_rich_progress_bars.setter
    def enable_rich_progress_bars(self, value: bool) -> None:
        if value:
            self.progress_mode = "rich"
        elif self.progress_mode == "rich":
            self.progress_mode = "auto"

    def actor_init_retries(self) -> int:
        """How many more times a constructor that raised is called (``actor_init_retry_on_errors``
        and ``actor_init_max_retries``; -1: no limit), checked."""
        count = self.actor_init_max_retries
        if isinstance(count, bool) or not isinstance(count, int) or count < -1:
            raise ValueError(f"actor_init_max_retries must be an int >= -1 (-1: no limit), got {count!r}")
        return count if self.actor_init_retry_on_errors else 0

    def get_config(self, key: str, default: Any = None) -> Any:
        """Ray's key-value settings (``set_config``). Inside a task (a UDF, a reader, a writer,
        in any process) the process's context answers with the values the driver's context
        held when the execution started; elsewhere, with its own."""
        configs = task_configs() if self is DataContext._current else None
        return (configs if configs is not None else self._kv_configs).get(key, default)

    def set_config(self, key: str, value: Any) -> None:
        """Set a key-value setting: the tasks of executions that start after it see it
        (``get_config``); ``value`` travels to worker processes pickled. Ray's own debugging
        keys (``debug_limit_shuffle_execution_to_num_blocks``) are kept but do nothing here:
        a warning says so."""
        if key in _RAY_DEBUG_KEYS:
            warnings.warn(f"set_config({key!r}): a Ray Data debugging setting ({_RAY_DEBUG_KEYS[key]}); "
                          "it has no effect here", stacklevel=2)
        self._kv_configs[key] = value

    def remove_config(self, key: str) -> None:
        """Remove a key-value setting (nothing happens when it is not set)."""
        self._kv_configs.pop(key, None)

    def kv_configs(self) -> dict[str, Any]:
        """A copy of the key-value settings, as an execution hands them to its tasks (pickled,
        for worker processes: a value that cannot be is a ``TypeError`` naming its key, in
        every execution mode alike)."""
        configs = dict(self._kv_configs)
        for key, value in configs.items():
            try:
                serialization.dumps(value)
            except Exception as err:
                msg = (f"DataContext config {key!r} (set_config) cannot be pickled, and every task of the "
                       f"dataset gets the context's configs: {type(err).__name__}: {err}")
                raise TypeError(msg) from err
        return configs

    def map_error_retries(self) -> ErrorRetries | None:
        """``retried_map_errors`` and ``max_map_retries`` as the engine takes them (None: no
        retries), checked."""
        errors, count = self.retried_map_errors, self.max_map_retries
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"max_map_retries must be an int >= 0, got {count!r}")
        if not isinstance(errors, bool) and (
                not isinstance(errors, (list, tuple)) or not all(isinstance(p, str) for p in errors)):
            raise ValueError(f"retried_map_errors must be True, False or a list of patterns (str), got {errors!r}")
        if count == 0 or errors is False or (not isinstance(errors, bool) and not errors):
            return None
        return ErrorRetries(None if errors is True else tuple(errors), count)

    def copy(self) -> DataContext:
        """A deep copy (Ray's ``DataContext.copy``): changing it leaves this context alone."""
        return copy.deepcopy(self)

    @staticmethod
    def get_current() -> DataContext:
        """The process-wide context (created on first use)."""
        if DataContext._current is None:
            DataContext._current = DataContext()
        return DataContext._current  # type: ignore[no-any-return]


_FIELD_NAMES = frozenset(f.name for f in fields(DataContext))
_PROPERTIES = frozenset(n for n, v in vars(DataContext).items() if isinstance(v, property))


def _retried_messages() -> tuple[str, ...]:
    """The messages the current context asks reads and writes to retry (``retried_io_errors``
    and ``write_file_retry_on_errors``), each once."""
    ctx = DataContext.get_current()
    return tuple(dict.fromkeys([*ctx.retried_io_errors, *ctx.write_file_retry_on_errors]))


retry.set_retried_messages_source(_retried_messages)


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
        # a copy even without changes: settings changed in place inside the block end with it
        ctx.execution_options = replace(ctx.execution_options, **engine_changes)
        yield ctx
    finally:
        ctx.execution_mode, ctx.execution_options = saved

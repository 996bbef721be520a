"""Turning the arguments of ``map`` / ``map_batches`` / ``filter`` / ``flat_map`` into a plan node.

Validation happens here, when the user calls the method, so a wrong argument fails on the line
that has it, not when the job runs.

Ray's remote arguments (``memory=``, ``accelerator_type=``, ``**ray_remote_args``...) mean what
they mean in Ray where one machine gives them a meaning, and are refused with the reason where
it does not (``remote_args``); a keyword that is not one of Ray's is a ``TypeError`` naming it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from typing import Any

from dataflow.context import DataContext
from dataflow.plan import ActorPool, LogicalNode, MapStages, Resources
from engine.block_format import BATCH_FORMATS
from engine.row_errors import ON_ERROR, ErrorSink
from engine.transform import Stage, udf_name

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ActorPoolStrategy:
    """Ray Data's ``compute=ActorPoolStrategy(...)``: the same as ``concurrency=(min, max)``.

    ``size`` fixes the pool; ``min_size``/``max_size`` bound an autoscaling one (no
    ``max_size``: one actor per CPU at most). ``initial_size`` is checked as Ray checks it; the
    pool starts at the size its resources allow within ``[min_size, max_size]`` (all its GPUs,
    or one actor per CPU), since starting smaller only delays a model-loading pool.
    ``max_tasks_in_flight_per_actor`` and the other Ray tuning knobs are accepted: each actor
    here runs one task at a time and the next waits in the driver.
    """

    size: int | None = None
    min_size: int | None = None
    max_size: int | None = None
    initial_size: int | None = None
    max_tasks_in_flight_per_actor: int | None = None
    max_concurrent_calls_per_actor: int | None = None
    enable_true_multi_threading: bool | None = None

    def __post_init__(self) -> None:
        if self.size is not None:
            if self.size < 1:
                msg = f"size must be >= 1, got {self.size}"
                raise ValueError(msg)
            if self.min_size is not None or self.max_size is not None or self.initial_size is not None:
                msg = "min_size, max_size, and initial_size cannot be set at the same time as `size`"
                raise ValueError(msg)
        if self.min_size is not None and self.min_size < 1:
            msg = f"min_size must be >= 1, got {self.min_size}"
            raise ValueError(msg)
        low = self.min_size or 1
        if self.max_size is not None and low > self.max_size:
            msg = f"min_size must be <= max_size, got {low} and {self.max_size}"
            raise ValueError(msg)
        if self.initial_size is not None and (
            self.initial_size < low or (self.max_size is not None and self.initial_size > self.max_size)
        ):
            msg = f"initial_size ({self.initial_size}) must be between min_size ({low}) and max_size ({self.max_size})"
            raise ValueError(msg)
        for name in ("max_tasks_in_flight_per_actor", "max_concurrent_calls_per_actor"):
            value = getattr(self, name)
            if value is not None and value < 1:
                msg = f"{name} must be >= 1, got {value}"
                raise ValueError(msg)

    def concurrency(self) -> int | tuple[int, int]:
        if self.size is not None:
            return self.size
        low = self.min_size or 1
        return (low, self.max_size or max(low, os.cpu_count() or 1))


@dataclass(frozen=True)
class TaskPoolStrategy:
    """Ray Data's ``compute=TaskPoolStrategy(size)``: the same as ``concurrency=size``."""

    size: int | None = None

    def __post_init__(self) -> None:
        if self.size is not None and self.size < 1:
            msg = f"size must be >= 1, got {self.size}"
            raise ValueError(msg)


def concurrency_from_compute(compute: Any, concurrency: Any, fn: Any = None) -> Any:
    """``concurrency`` implied by Ray's ``compute=`` argument: ``"tasks"``, ``"actors"``, a
    ``TaskPoolStrategy`` or an ``ActorPoolStrategy``. As in Ray, a callable class cannot run
    as tasks and a function cannot run on an actor pool."""
    if compute is None:
        return concurrency
    tasks = isinstance(compute, TaskPoolStrategy) or (isinstance(compute, str) and compute == "tasks")
    actors = isinstance(compute, ActorPoolStrategy) or (isinstance(compute, str) and compute == "actors")
    if not tasks and not actors:
        msg = f'compute must be "tasks", "actors", an ActorPoolStrategy or a TaskPoolStrategy, got {compute!r}'
        raise TypeError(msg)
    if fn is not None and isinstance(fn, type) and tasks:
        msg = (
            f"the callable class {fn.__name__} cannot run with compute={compute!r}: a class runs on an "
            "actor pool; pass an ActorPoolStrategy, or None for the default"
        )
        raise ValueError(msg)
    if fn is not None and not isinstance(fn, type) and actors:
        msg = (
            f"the function {getattr(fn, '__name__', fn)!r} cannot run with compute={compute!r}: only a "
            "callable class runs on an actor pool; pass a TaskPoolStrategy, or None for the default"
        )
        raise ValueError(msg)
    if compute == "tasks":
        return concurrency
    if concurrency is not None:
        msg = "pass either compute= or concurrency=, not both"
        raise ValueError(msg)
    if compute == "actors":
        return ActorPoolStrategy().concurrency()
    if isinstance(compute, ActorPoolStrategy):
        return compute.concurrency()
    return compute.size


# Ray 2.60's ``ray.remote`` options (``ray._common.ray_option_utils``), and what each means here.
_REMOTE_HONOURED = frozenset({
    "num_cpus", "num_gpus", "memory", "resources", "accelerator_type", "scheduling_strategy",
    "max_retries", "retry_exceptions", "runtime_env", "label_selector", "fallback_strategy", "max_calls",
    "max_task_retries", "max_restarts", "name", "enable_task_events", "_labels",
})
_REMOTE_REFUSED = {
    "placement_group": "placement groups reserve resources across a Ray cluster",
    "placement_group_bundle_index": "placement groups reserve resources across a Ray cluster",
    "placement_group_capture_child_tasks": "placement groups reserve resources across a Ray cluster",
    "num_returns": "a map task returns its blocks as a stream",
    "object_store_memory": "Ray refuses it for tasks too; cap the store with dataflow.init(object_store_memory=...)",
    "lifetime": "actors live as long as the map that uses them",
    "namespace": "actors are not named or shared between jobs",
    "get_if_exists": "actors are not named or shared between jobs",
    "concurrency_groups": "each actor runs one task at a time",
    "max_concurrency": "each actor runs one task at a time",
    "max_pending_calls": "tasks wait in the driver, not in the actor",
    "allow_out_of_order_execution": "each actor runs one task at a time",
    "enable_tensor_transport": "blocks move through shared memory",
    "_generator_backpressure_num_objects": "backpressure is by bytes, per operator",
    "_num_objects_per_yield": "backpressure is by bytes, per operator",
    "_actor_generator_backpressure_num_objects": "backpressure is by bytes, per operator",
}
RAY_REMOTE_ARGS = _REMOTE_HONOURED | frozenset(_REMOTE_REFUSED)
"""Every keyword ``map``/``map_batches``/``flat_map``/``filter`` take as ``**ray_remote_args``."""
ACCELERATOR_PREFIX = "accelerator_type:"
"""``accelerator_type="A100"`` asks for 0.001 of resource ``accelerator_type:A100``, as in Ray."""
_RUNTIME_ENV_KEYS = frozenset({"env_vars", "config"})
MEMORY_SHARE = 0.7
"""Share of RAM the ``memory=`` of running tasks may add up to (Ray's heap share: the object
store takes the other 30% by default)."""


@dataclass(frozen=True)
class RemoteArgs:
    """What Ray's remote arguments of one map ask for, in dataflow's terms."""

    resources: Resources
    memory: float | None = None
    max_retries: int | None = None
    retry_exceptions: bool | tuple[type[BaseException], ...] = False
    env_vars: tuple[tuple[str, str], ...] = ()


def remote_args(
    method: str,
    num_cpus: float | None,
    num_gpus: float | None,
    memory: float | None,
    resources: dict[str, float] | None,
    ray_remote_args: dict[str, Any] | None,
) -> RemoteArgs:
    """Ray's remote arguments, merged as Ray merges them (named arguments over
    ``**ray_remote_args``; what ``ray_remote_args_fn()`` returns over both), checked and turned
    into resources, retries and environment. ``ray_remote_args_fn`` is called once, here: Ray
    calls it before starting each worker, but the plan is fixed when the map is made."""
    args = dict(ray_remote_args or {})
    args_fn = args.pop("ray_remote_args_fn", None)
    _check_names(method, args, "")
    for name, value in (("num_cpus", num_cpus), ("num_gpus", num_gpus), ("memory", memory), ("resources", resources)):
        if value is not None:
            args[name] = value
    if args_fn is not None:
        if not callable(args_fn):
            msg = f"ray_remote_args_fn must be a function returning a dict, got {type(args_fn).__name__}"
            raise TypeError(msg)
        produced = args_fn()
        if not isinstance(produced, dict):
            msg = f"ray_remote_args_fn must return a dict of remote arguments, got {type(produced).__name__}"
            raise TypeError(msg)
        _check_names(method, produced, " (returned by ray_remote_args_fn)")
        args.update(produced)
    for name in sorted(args):
        if name in _REMOTE_REFUSED and args[name] is not None:
            msg = f"{method}({name}=...) is a Ray option with no meaning in dataflow: {_REMOTE_REFUSED[name]}"
            raise ValueError(msg)
    custom = dict(_resource_dict(args.get("resources")))
    accelerator = args.get("accelerator_type")
    if accelerator is not None:
        if not isinstance(accelerator, str) or not accelerator:
            msg = f"accelerator_type must be a string such as 'A100', got {accelerator!r}"
            raise TypeError(msg)
        custom[ACCELERATOR_PREFIX + accelerator] = 0.001
    _check_scheduling(args)
    max_retries = args.get("max_retries", args.get("max_task_retries"))
    if max_retries is not None and (not isinstance(max_retries, int) or max_retries < -1):
        msg = f"max_retries must be an int >= -1 (-1: no limit), got {max_retries!r}"
        raise ValueError(msg)
    mem = args.get("memory")
    if mem is not None and (not isinstance(mem, (int, float)) or mem < 0):
        msg = f"memory must be a number of bytes >= 0, got {mem!r}"
        raise ValueError(msg)
    max_calls = args.get("max_calls")
    if max_calls:
        logger.warning(
            "%s(max_calls=%s): dataflow reuses worker processes across tasks; a worker is not "
            "restarted after %s calls", method, max_calls, max_calls,
        )
    return RemoteArgs(
        resources=resources_of(args.get("num_cpus"), args.get("num_gpus"), custom),
        memory=float(mem) if mem else None,
        max_retries=max_retries,
        retry_exceptions=_retry_exceptions(args.get("retry_exceptions", False)),
        env_vars=_env_vars(args.get("runtime_env")),
    )


RESOURCE_ARGS = frozenset({"num_cpus", "num_gpus", "resources", "accelerator_type"})
"""The remote arguments an all-to-all step's tasks can hold (its other arguments mean nothing there)."""


def task_resources(method: str, ray_remote_args: dict[str, Any] | None, what: str) -> Resources | None:
    """What each task of an all-to-all step (``random_shuffle``'s, ``join``'s) holds while it
    runs, from the Ray remote arguments it was given: checked as a map's, and any argument but
    ``RESOURCE_ARGS`` refused, as it would have no effect. None when none were given."""
    if not ray_remote_args:
        return None
    if not isinstance(ray_remote_args, dict):
        msg = f"{what} must be a dict, got {type(ray_remote_args).__name__}"
        raise TypeError(msg)
    args = remote_args(method, None, None, None, None, ray_remote_args)
    unused = sorted(set(ray_remote_args) - RESOURCE_ARGS)
    if unused:  # named as the caller wrote it: random_shuffle(memory=...) or join(...={'memory': ...})
        given = f"{unused[0]}=..." if what == "ray_remote_args" else f"{what}={{{unused[0]!r}: ...}}"
        msg = f"{method}({given}): only num_cpus, num_gpus, resources and accelerator_type apply to its tasks"
        raise ValueError(msg)
    return args.resources


def _check_names(method: str, args: dict[str, Any], where: str) -> None:
    unknown = sorted(name for name in args if name not in RAY_REMOTE_ARGS)
    if unknown:
        msg = f"{method}() got an unexpected keyword argument {unknown[0]!r}{where}"
        raise TypeError(msg)


def _resource_dict(resources: Any) -> dict[str, float]:
    if resources is None:
        return {}
    if not isinstance(resources, dict):
        msg = f"resources must be a dict of resource name to amount, got {type(resources).__name__}"
        raise TypeError(msg)
    if "CPU" in resources or "GPU" in resources:
        msg = "use the 'num_cpus' and 'num_gpus' keywords instead of 'CPU' and 'GPU' in 'resources'"
        raise ValueError(msg)
    for name, amount in resources.items():
        if not isinstance(amount, (int, float)) or amount < 0:
            msg = f"resources[{name!r}] must be a number >= 0, got {amount!r}"
            raise ValueError(msg)
    return {str(k): float(v) for k, v in resources.items()}


def _check_scheduling(args: dict[str, Any]) -> None:
    strategy = args.get("scheduling_strategy")
    if strategy is not None and strategy not in ("DEFAULT", "SPREAD"):
        msg = (
            f"scheduling_strategy={strategy!r} is not supported: dataflow runs on one machine, where "
            "'DEFAULT' and 'SPREAD' are accepted (and the same); placement groups and node affinity have no meaning"
        )
        raise ValueError(msg)
    for name in ("label_selector", "fallback_strategy"):
        if args.get(name):
            msg = f"{name}={args[name]!r} is not supported: dataflow runs on one machine, which has no node labels"
            raise ValueError(msg)


def _retry_exceptions(value: Any) -> bool | tuple[type[BaseException], ...]:
    if isinstance(value, bool):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(t, type) and issubclass(t, Exception) for t in value):
        return tuple(value)
    msg = f"retry_exceptions must be either a boolean or a list of exceptions, got {value!r}"
    raise ValueError(msg)


def _env_vars(runtime_env: Any) -> tuple[tuple[str, str], ...]:
    if not runtime_env:
        return ()
    if not isinstance(runtime_env, dict):
        msg = f"runtime_env must be a dict, got {type(runtime_env).__name__}"
        raise TypeError(msg)
    other = sorted(set(runtime_env) - _RUNTIME_ENV_KEYS)
    if other:
        msg = (
            f"runtime_env {other} is not supported: dataflow runs UDFs in this machine's Python "
            "environment (install packages there, and put code on its path); only 'env_vars' is honoured"
        )
        raise ValueError(msg)
    env = runtime_env.get("env_vars") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        msg = f"runtime_env['env_vars'] must be a dict of str to str, got {env!r}"
        raise TypeError(msg)
    return tuple(sorted(env.items()))


def memory_cap(memory: float | None, method: str) -> int | None:
    """How many tasks (or actors) asking for ``memory`` bytes each may run at once, or None."""
    if not memory:
        return None
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None
    share = int(total * MEMORY_SHARE)
    if memory > share:
        msg = (
            f"{method}(memory={int(memory)}) asks for more than this machine's memory for tasks "
            f"({share} bytes, {int(MEMORY_SHARE * 100)}% of RAM); it could never run"
        )
        raise ValueError(msg)
    return max(1, int(share // memory))


def resources_of(num_cpus: float | None, num_gpus: float | None, resources: dict[str, float] | None) -> Resources:
    """A task's resources: one CPU unless told, no GPU, and the custom ones asked for."""
    cpus = 1.0 if num_cpus is None else float(num_cpus)
    gpus = 0.0 if num_gpus is None else float(num_gpus)
    if cpus < 0 or gpus < 0:
        msg = f"num_cpus and num_gpus must be >= 0, got num_cpus={num_cpus}, num_gpus={num_gpus}"
        raise ValueError(msg)
    return Resources(cpus, gpus, tuple(sorted((resources or {}).items())))


def compute_of(
    fn: Any, concurrency: int | tuple[int, ...] | None, num_gpus: float = 0.0
) -> tuple[ActorPool | None, int | None]:
    """(actor pool, task concurrency cap) for a UDF and its ``concurrency`` argument.

    A function that needs GPUs also runs on a pool of dedicated workers (each with its
    ``CUDA_VISIBLE_DEVICES``), as many as the GPUs allow unless ``concurrency`` caps it.
    """
    is_class = isinstance(fn, type)
    if isinstance(concurrency, tuple) and len(concurrency) == 3:  # Ray's (min, max, initial)
        if not concurrency[0] <= concurrency[2] <= concurrency[1]:
            msg = f"concurrency=(min, max, initial) needs min <= initial <= max, got {concurrency}"
            raise ValueError(msg)
        concurrency = concurrency[:2]
    if concurrency is not None:
        if isinstance(concurrency, tuple):
            if len(concurrency) != 2 or not 1 <= concurrency[0] <= concurrency[1]:
                msg = f"concurrency must be n or (min, max) with 1 <= min <= max, got {concurrency}"
                raise ValueError(msg)
        elif not isinstance(concurrency, int) or concurrency < 1:
            msg = f"concurrency must be a positive int or a (min, max) tuple, got {concurrency!r}"
            raise ValueError(msg)
    if not is_class and num_gpus > 0:
        if isinstance(concurrency, tuple):
            return ActorPool(concurrency[0], concurrency[1]), None
        return ActorPool(1, concurrency or 1 << 16), None
    if not is_class:
        if isinstance(concurrency, tuple):
            msg = "concurrency=(min, max) is for callable classes (actor pools); pass an int for functions"
            raise ValueError(msg)
        return None, concurrency
    if concurrency is None:
        return ActorPool(1, 1), None
    if isinstance(concurrency, tuple):
        return ActorPool(concurrency[0], concurrency[1]), None
    return ActorPool(concurrency, concurrency), None


class NotAFunctionError(TypeError, ValueError):
    """A UDF argument that is not callable: a ``TypeError``, and a ``ValueError`` as Ray raises
    (``filter(fn="a > 1")``: "fn must be a UserDefinedFunction"), so either ``except`` catches it."""


def check_callable(fn: Any, method: str) -> None:
    if not callable(fn):
        msg = f"{method} expects a function or a callable class, got {type(fn).__name__}"
        if isinstance(fn, str) and method.startswith("filter"):
            msg += " (a string expression is filter(expr=...))"
        raise NotAFunctionError(msg)
    if isinstance(fn, type) and "__call__" not in dir(fn):
        msg = f"{method} got class {fn.__name__}, which has no __call__ method"
        raise TypeError(msg)


def map_node(
    input_node: LogicalNode,
    method: str,
    fn: Any,
    *,
    kind: str,
    row_mode: str = "map",
    batch_size: int | str | None = None,
    batch_format: str = "default",
    fn_args: Any = None,
    fn_kwargs: Any = None,
    fn_constructor_args: Any = None,
    fn_constructor_kwargs: Any = None,
    num_cpus: float | None = None,
    num_gpus: float | None = None,
    concurrency: int | tuple[int, ...] | None = None,
    resources: dict[str, float] | None = None,
    preserves_rows: bool = False,
    compute: Any = None,
    task_timeout_s: float | None = None,
    memory: float | None = None,
    zero_copy_batch: bool = True,
    ray_remote_args: dict[str, Any] | None = None,
    on_error: str = "raise",
    error_sink: str | os.PathLike[str] | None = None,
) -> MapStages:
    """The plan node of one ``map``/``map_batches``/``flat_map``/``filter`` call, its arguments
    checked (``ray_remote_args``: Ray's remote arguments, see ``remote_args``; ``on_error``
    and ``error_sink``: see ``error_handling``)."""
    check_callable(fn, method)
    sink = error_handling(method, on_error, error_sink)
    concurrency = concurrency_from_compute(compute, concurrency, fn)
    if batch_format is not None and batch_format not in BATCH_FORMATS:
        msg = f"batch_format must be one of {BATCH_FORMATS}, got {batch_format!r}"
        raise ValueError(msg)
    if batch_size == "auto" or batch_size == "default":
        batch_size = None
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size <= 0):
        msg = f"batch_size must be a positive int or None, got {batch_size!r}"
        raise ValueError(msg)
    if not isinstance(fn, type) and (fn_constructor_args or fn_constructor_kwargs):
        msg = "fn_constructor_args/fn_constructor_kwargs are only for callable classes"
        raise ValueError(msg)
    if task_timeout_s is not None and not task_timeout_s > 0:
        msg = f"task_timeout_s must be a positive number of seconds or None, got {task_timeout_s!r}"
        raise ValueError(msg)
    remote = remote_args(method, num_cpus, num_gpus, memory, resources, ray_remote_args)
    resources_needed = remote.resources
    actor_pool, max_concurrency = compute_of(fn, concurrency, resources_needed.num_gpus)
    cap = memory_cap(remote.memory, method)
    if cap is not None:  # Ray's memory=: as many at once as the machine's memory holds
        if actor_pool is not None:
            top = min(actor_pool.max_size, cap)
            actor_pool = replace(actor_pool, min_size=min(actor_pool.min_size, top), max_size=top)
        else:
            max_concurrency = min(max_concurrency or cap, cap)
    stage = Stage(
        name=f"{method.title().replace('_', '')}({udf_name(fn)})",
        kind=kind,
        fn=fn,
        fn_args=tuple(fn_args or ()),
        fn_kwargs=dict(fn_kwargs or {}),
        fn_constructor_args=tuple(fn_constructor_args or ()),
        fn_constructor_kwargs=dict(fn_constructor_kwargs or {}),
        row_mode=row_mode,
        batch_size=batch_size,
        batch_format=batch_format,
        arrow_backed_pandas=DataContext.get_current().enable_arrow_backed_pandas_conversion,
        python_objects=DataContext.get_current().enable_fallback_to_arrow_object_ext_type,
        zero_copy_batch=zero_copy_batch,
        max_retries=remote.max_retries,
        retry_exceptions=remote.retry_exceptions,
        env_vars=remote.env_vars,
        on_error=on_error,
        error_sink=sink,
    )
    return MapStages(
        input=input_node,
        stages=(stage,),
        resources=resources_needed,
        actor_pool=actor_pool,
        max_concurrency=max_concurrency,
        preserves_rows=preserves_rows and on_error == "raise",  # skipping drops rows
        task_timeout_s=task_timeout_s,
    )


def error_handling(method: str, on_error: str, error_sink: str | os.PathLike[str] | None) -> ErrorSink | None:
    """Check ``on_error`` ("raise" or "skip") and return the sink for ``error_sink`` (a folder
    path or URL where the skipped rows are written as Parquet, with their errors), or None."""
    if on_error not in ON_ERROR:
        msg = f'{method}(on_error=...) must be "raise" (the first error fails the job) or "skip" (drop the rows it raises on), got {on_error!r}'
        raise ValueError(msg)
    if error_sink is None:
        return None
    if on_error != "skip":
        msg = f'{method}(error_sink=...) is where the rows on_error="skip" drops are written; pass on_error="skip" too'
        raise ValueError(msg)
    from connectors.error_sink import ParquetErrorSink

    return ParquetErrorSink(error_sink)


def builtin_node(
    input_node: LogicalNode,
    name: str,
    fn: Any,
    *,
    preserves_rows: bool = True,
    projection: tuple[str, ...] | None = None,
    filter_expr: Any = None,
) -> MapStages:
    """A step provided by dataflow itself (select_columns...), run like a UDF named ``name``."""
    stage = Stage(name=name, kind="batches", fn=fn, batch_format="pyarrow")
    return MapStages(
        input=input_node,
        stages=(stage,),
        preserves_rows=preserves_rows,
        projection=projection,
        filter_expr=filter_expr,
    )


def task_limits(
    method: str,
    concurrency: Any,
    num_cpus: float | None,
    num_gpus: float | None,
    memory: float | None,
    resources: dict[str, float] | None,
    ray_remote_args: dict[str, Any] | None,
) -> tuple[RemoteArgs, int | None]:
    """What the tasks of a step of dataflow's own (a read, a column step, a write) hold, and
    how many may run at once: ``concurrency`` checked, lowered to what ``memory`` allows."""
    if concurrency is not None and (isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1):
        msg = f"{method}(concurrency=...) must be a positive int here, got {concurrency!r}"
        raise ValueError(msg)
    remote = remote_args(method, num_cpus, num_gpus, memory, resources, ray_remote_args)
    cap = memory_cap(remote.memory, method)
    if cap is not None:
        concurrency = min(concurrency or cap, cap)
    return remote, concurrency


def with_remote_args(
    node: MapStages,
    method: str,
    *,
    compute: Any = None,
    concurrency: int | None = None,
    num_cpus: float | None = None,
    num_gpus: float | None = None,
    memory: float | None = None,
    resources: dict[str, float] | None = None,
    task_timeout_s: float | None = None,
    ray_remote_args: dict[str, Any] | None = None,
) -> MapStages:
    """A step provided by dataflow (``filter(expr=...)``) with the compute, resources and
    limits its call asked for, checked as a UDF's are."""
    if isinstance(compute, ActorPoolStrategy) or compute == "actors":
        msg = f"{method}() runs as tasks; compute={compute!r} is for callable classes"
        raise ValueError(msg)
    if task_timeout_s is not None and not task_timeout_s > 0:
        msg = f"task_timeout_s must be a positive number of seconds or None, got {task_timeout_s!r}"
        raise ValueError(msg)
    remote, concurrency = task_limits(method, concurrency_from_compute(compute, concurrency), num_cpus, num_gpus,
                                      memory, resources, ray_remote_args)
    stages = tuple(
        replace(stage, max_retries=remote.max_retries, env_vars=remote.env_vars) for stage in node.stages
    )
    return replace(node, stages=stages, resources=remote.resources, max_concurrency=concurrency,
                   task_timeout_s=task_timeout_s)

"""Turning the arguments of ``map`` / ``map_batches`` / ``filter`` / ``flat_map`` into a plan node.

Validation happens here, when the user calls the method, so a wrong argument fails on the line
that has it, not when the job runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from dataflow.plan import ActorPool, LogicalNode, MapStages, Resources
from engine.block_format import BATCH_FORMATS
from engine.transform import Stage, udf_name


@dataclass(frozen=True)
class ActorPoolStrategy:
    """Ray Data's ``compute=ActorPoolStrategy(...)``: the same as ``concurrency=(min, max)``."""

    size: int | None = None
    min_size: int | None = None
    max_size: int | None = None

    def concurrency(self) -> int | tuple[int, int]:
        if self.size is not None:
            return self.size
        low = self.min_size or 1
        return (low, self.max_size or max(low, os.cpu_count() or 1))


@dataclass(frozen=True)
class TaskPoolStrategy:
    """Ray Data's ``compute=TaskPoolStrategy(size)``: the same as ``concurrency=size``."""

    size: int | None = None


def concurrency_from_compute(compute: Any, concurrency: Any) -> Any:
    """``concurrency`` implied by Ray's ``compute=`` argument (which Ray itself deprecates)."""
    if compute is None or compute == "tasks":
        return concurrency
    if concurrency is not None:
        msg = "pass either compute= or concurrency=, not both"
        raise ValueError(msg)
    if isinstance(compute, ActorPoolStrategy):
        return compute.concurrency()
    if isinstance(compute, TaskPoolStrategy):
        return compute.size
    msg = f"compute must be an ActorPoolStrategy or a TaskPoolStrategy, got {compute!r}"
    raise TypeError(msg)


def resources_of(num_cpus: float | None, num_gpus: float | None, resources: dict[str, float] | None) -> Resources:
    cpus = 1.0 if num_cpus is None else float(num_cpus)
    gpus = 0.0 if num_gpus is None else float(num_gpus)
    if cpus < 0 or gpus < 0:
        msg = f"num_cpus and num_gpus must be >= 0, got num_cpus={num_cpus}, num_gpus={num_gpus}"
        raise ValueError(msg)
    return Resources(cpus, gpus, tuple(sorted((resources or {}).items())))


def compute_of(
    fn: Any, concurrency: int | tuple[int, int] | None, num_gpus: float = 0.0
) -> tuple[ActorPool | None, int | None]:
    """(actor pool, task concurrency cap) for a UDF and its ``concurrency`` argument.

    A function that needs GPUs also runs on a pool of dedicated workers (each with its
    ``CUDA_VISIBLE_DEVICES``), as many as the GPUs allow unless ``concurrency`` caps it.
    """
    is_class = isinstance(fn, type)
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


def check_callable(fn: Any, method: str) -> None:
    if not callable(fn):
        msg = f"{method} expects a function or a callable class, got {type(fn).__name__}"
        raise TypeError(msg)
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
    concurrency: int | tuple[int, int] | None = None,
    resources: dict[str, float] | None = None,
    preserves_rows: bool = False,
    compute: Any = None,
    task_timeout_s: float | None = None,
) -> MapStages:
    check_callable(fn, method)
    concurrency = concurrency_from_compute(compute, concurrency)
    if batch_format not in BATCH_FORMATS:
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
    resources_needed = resources_of(num_cpus, num_gpus, resources)
    actor_pool, max_concurrency = compute_of(fn, concurrency, resources_needed.num_gpus)
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
    )
    return MapStages(
        input=input_node,
        stages=(stage,),
        resources=resources_needed,
        actor_pool=actor_pool,
        max_concurrency=max_concurrency,
        preserves_rows=preserves_rows,
        task_timeout_s=task_timeout_s,
    )


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

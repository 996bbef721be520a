"""The Ray backend: the same plans, operators and backpressure, on a Ray cluster.

Past one machine dataflow runs on a Ray cluster its users already operate; it never manages a
cluster itself. This is the only module that imports ``ray``. What stays dataflow's: the plan,
fusion, the operators (maps, exchanges, limits), byte budgets and the choice of what runs next
(``engine.execution``, ``engine.scheduler``), error types and stats. What Ray does: placing
processes on nodes, moving objects between them, spilling, restarting crashed workers and
rebuilding lost blocks from lineage.

* A task is a Ray task with streaming returns: it runs ``engine.task.run_task`` (the code every
  backend runs), yields its output blocks one by one, then its result record. The blocks are
  task return values, so the driver owns them and Ray can spill them and rebuild them from
  lineage when a node dies (``max_retries`` is the engine's attempt count). Inputs are passed as
  object refs, so Ray fetches them to the task's node.
* An actor pool is a set of Ray actors (``max_restarts``, ``max_task_retries``) that construct the
  UDF once; a task goes to an idle actor.
* A block ref's id is its object's id; the driver keeps the object refs (``RayStore``) and frees a
  block by dropping its ref.
* Completion is an event: a thread per running task waits on its generator and hands the result
  to the loop thread, which alone touches executions.

Budgets scale with the cluster's object store; a request no node can ever fit fails at once.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import queue
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import ray

from engine import serialization
from engine.autoscale import PoolState, target_size, to_retire
from engine.backend import Backend, Capacity, ExecutionHandle, put_each
from engine.errors import EngineError, ResourceError, WorkerDiedError
from engine.execution import Execution
from engine.object_store import BlockRef, BlockSlice, BlockStore
from engine.operators.base import PhysicalOperator
from engine.operators.map import MapOperator, Pending
from engine.options import ExecutionOptions
from engine.resources import ResourceLedger
from engine.scheduler import Candidate, pick
from engine.task import TaskResult, TaskSpec, configs_of, describe_error, run_task
from engine.transform import UDFFailure

log = logging.getLogger("dataflow.ray")

CONNECT_TIMEOUT_S = 15.0
"""A cluster that has not answered ``ray.init`` by then is reported unreachable (a healthy one
answers in a few seconds)."""
TICK_S = 1.0
"""The loop runs a scheduling round at least this often while executions run (idle actors
retire on time even when no task finishes)."""

STORE_SHARE = 0.5
"""The part of the cluster's object store the engine budgets for its blocks."""
WAIT_PLACEMENT = "pending placement (the cluster has no free slot that fits)"
AUTOSCALER_PERIOD_S = 5.0


# what runs on the cluster -------------------------------------------------------------------
class NoColumns:
    """A block without columns as it crosses Ray. A pickled ``pyarrow.Table`` keeps only its
    columns, so a table with none (``select_columns([])``) arrived with no rows."""

    def __init__(self, num_rows: int) -> None:
        self.num_rows = num_rows


def to_ray(table: pa.Table) -> pa.Table | NoColumns:
    return NoColumns(table.num_rows) if table.num_columns == 0 and table.num_rows else table


def from_ray(value: pa.Table | NoColumns) -> pa.Table:
    if isinstance(value, NoColumns):
        return pa.table({"_": pa.nulls(value.num_rows)}).drop_columns(["_"])
    return value


_transforms: dict[str, Any] = {}
"""Transforms unpickled in this Ray worker process, by operator digest."""


class _TaskStore(BlockStore):
    """A task's view of the store on a Ray worker: its inputs (resolved by Ray) and its outputs
    (yielded back as task returns)."""

    private_views = False

    def __init__(self, inputs: dict[str, pa.Table]) -> None:
        self.inputs = inputs
        self.outputs: dict[str, pa.Table] = {}
        self._ids = itertools.count()

    def put(self, table: pa.Table, spill: bool = False, sliced: bool = False) -> BlockRef:
        block_id = f"out{next(self._ids)}"
        self.outputs[block_id] = table
        return BlockRef(block_id, None, table.num_rows, table.nbytes)

    def get(self, ref: BlockRef) -> pa.Table:
        return self.inputs[ref.block_id] if ref.block_id in self.inputs else self.outputs[ref.block_id]

    def free(self, ref: BlockRef) -> None:
        self.outputs.pop(ref.block_id, None)


def _load(digest: str, transform: bytes) -> Any:
    if digest not in _transforms:
        from engine.worker import load_transform

        _transforms[digest] = load_transform(transform)
    return _transforms[digest]


def _use_path(sys_path: list[str]) -> None:
    """The driver's import path, where it exists here: UDFs defined in the driver's modules
    (a test file, a script's folder) unpickle as they do in the local engine's workers."""
    for entry in sys_path:
        if entry not in sys.path and os.path.isdir(entry or "."):
            sys.path.append(entry)


def _failed(task_id: int, what: str, err: BaseException) -> TaskResult:
    return TaskResult(task_id, error=describe_error(UDFFailure(what, err)))


def _execute(spec_bytes: bytes, transform: Callable[[], Any], block_ids: list[str], tables: tuple[pa.Table, ...]) -> Iterator[Any]:
    """Run one task where Ray placed it: yield its blocks, then its result record."""
    try:
        spec: TaskSpec = serialization.loads(spec_bytes)
    except Exception as err:  # a read task or input from a module this worker cannot import
        yield _failed(-1, "deserializing the task's inputs", err)
        return
    try:
        loaded = transform()
    except UDFFailure as err:  # the UDF's own error (an actor's constructor): its type kept
        yield TaskResult(spec.task_id, error=describe_error(err))
        return
    except Exception as err:
        yield _failed(spec.task_id, "deserializing the UDF", err)
        return
    store = _TaskStore({block_id: from_ray(table) for block_id, table in zip(block_ids, tables, strict=True)})
    result = run_task(spec, loaded, store)
    for ref in result.refs:
        yield to_ray(store.outputs.pop(ref.block_id))
    result.value = (result.value, ray.get_runtime_context().get_node_id(), _attempt())
    yield result


def _attempt() -> int:
    """How many times Ray ran this task before (its worker or node died): 0 the first time."""
    try:
        return int(ray._private.worker.global_worker.core_worker.get_current_task_attempt_number())
    except Exception:  # a private API: without it, Ray's retries go uncounted
        return 0


def _remote_task(spec: bytes, digest: str, transform: bytes, sys_path: list[str], block_ids: list[str],
                 *tables: pa.Table) -> Iterator[Any]:
    _use_path(sys_path)
    yield from _execute(spec, lambda: _load(digest, transform), block_ids, tables)


class _PoolActor:
    """One member of an actor pool: the operator's transform, constructed once."""

    def __init__(self, digest: str, transform: bytes, sys_path: list[str]) -> None:
        _use_path(sys_path)
        self.error: BaseException | None = None
        try:
            self.transform = _load(digest, transform)
            with configs_of(self.transform):  # (a UDF's constructor may read them)
                self.transform.prepare()
        except Exception as err:  # reported with the first task, as the UDF's own error
            self.error = err

    def ready(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def _transform(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.transform

    def run(self, spec: bytes, block_ids: list[str], *tables: pa.Table) -> Iterator[Any]:
        yield from _execute(spec, self._transform, block_ids, tables)


# the driver side -----------------------------------------------------------------------------
class RayStore(BlockStore):
    """Block ids to the object refs the driver owns; freeing a block drops its ref."""

    private_views = False

    def __init__(self) -> None:
        self._refs: dict[str, ray.ObjectRef] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def register(self, object_ref: ray.ObjectRef, meta: BlockRef, node: str | None = None) -> BlockRef:
        ref = BlockRef(object_ref.hex(), None, meta.num_rows, meta.size_bytes, partitions=meta.partitions, node=node,
                       sample=meta.sample)
        with self._lock:
            self._refs[ref.block_id] = object_ref
        return ref

    def adopt(self, block_id: str, object_ref: ray.ObjectRef) -> None:
        """Read block ``block_id`` (another process's, which owns it) through ``object_ref``."""
        with self._lock:
            self._refs[block_id] = object_ref

    def object_ref(self, block_id: str) -> ray.ObjectRef:
        with self._lock:
            return self._refs[block_id]

    def put(self, table: pa.Table, spill: bool = False, sliced: bool = False) -> BlockRef:
        return self.register(ray.put(to_ray(table)), BlockRef("", None, table.num_rows, table.nbytes))

    def get(self, ref: BlockRef) -> pa.Table:
        if os.getpid() != self._pid:
            msg = ("the Ray runner's blocks can only be read by the driver and its cluster, not by a process "
                   "it forked (a torch DataLoader worker): use DataLoader(num_workers=0) with iter_torch_batches "
                   "or to_torch, whose reads already run on the cluster")
            raise RuntimeError(msg)
        return from_ray(ray.get(self.object_ref(ref.block_id)))

    def free(self, ref: BlockRef) -> None:
        with self._lock:
            self._refs.pop(ref.block_id, None)

    def __len__(self) -> int:
        return len(self._refs)


@dataclass
class _Running:
    execution: Execution
    op: MapOperator
    pending: Pending
    actor: Any = None


@dataclass
class _Pool:
    """The actors of one operator's pool (by slot), which are busy, since when the others are
    idle, and their nodes. A Ray actor holds its CPUs, GPUs and custom resources while it lives."""

    resources: Any
    make: Callable[[], Any]
    """Starts one more actor."""
    actors: dict[int, Any] = field(default_factory=dict)
    busy: set[int] = field(default_factory=set)
    ready: dict[int, Any] = field(default_factory=dict)
    """Each actor's ``ready()`` call: its node id once it has started."""
    nodes: dict[int, str] = field(default_factory=dict)
    idle_since: dict[int, float] = field(default_factory=dict)
    _slots: Any = field(default_factory=itertools.count)

    def add(self) -> None:
        slot = next(self._slots)
        self.actors[slot] = actor = self.make()
        self.ready[slot] = actor.ready.remote()
        self.idle_since[slot] = time.monotonic()

    def remove(self, slot: int) -> None:
        actor = self.actors.pop(slot)
        for table in (self.ready, self.nodes, self.idle_since):
            table.pop(slot, None)
        self.busy.discard(slot)
        with contextlib.suppress(Exception):  # already dead
            ray.kill(actor)

    def starting(self) -> int:
        self._learn_nodes()
        return len(self.actors) - len(self.nodes)

    def idle(self, near: str | None = None) -> int | None:
        """An idle actor, one on node ``near`` if there is one."""
        idle = [i for i in self.actors if i not in self.busy]
        if near is not None and idle:
            self._learn_nodes()
            local = [i for i in idle if self.nodes.get(i) == near]
            if local:
                return local[0]
        return idle[0] if idle else None

    def _learn_nodes(self) -> None:
        waiting = {slot: ref for slot, ref in self.ready.items() if slot not in self.nodes}
        if not waiting:
            return
        done, _ = ray.wait(list(waiting.values()), num_returns=len(waiting), timeout=0)
        for slot, ref in waiting.items():
            if ref in done:
                try:
                    self.nodes[slot] = ray.get(ref)
                except Exception:  # a failed start shows when it runs a task
                    self.nodes[slot] = ""


class RayExecutor:
    """The loop thread: runs executions' operators as Ray tasks, one event at a time."""

    def __init__(self, options: ExecutionOptions, store: RayStore, cluster: dict[str, float], store_capacity: int) -> None:
        self.options = options
        self.store = store
        self.store_capacity = store_capacity
        custom = {k: v for k, v in cluster.items() if k not in ("CPU", "GPU", "memory", "object_store_memory")}
        self._ledger = ResourceLedger(cluster.get("CPU", 0.0), custom)
        self._gpus_total = cluster.get("GPU", 0.0)
        self._gpus_used = 0.0
        self._events: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._executions: list[Execution] = []
        self._running: dict[int, _Running] = {}
        self._pools: dict[str, _Pool] = {}
        self._actor_cpus = 0.0
        self._actor_gpus = 0.0
        self._actor_custom: dict[str, float] = {}
        """What live pool actors hold (Ray keeps an actor's resources for its lifetime)."""
        self._transforms: dict[str, ray.ObjectRef] = {}
        self._locality_turn = itertools.count()
        """Which node of a ``locality_with_output`` list the next task prefers."""
        self._waiters = ThreadPoolExecutor(max_workers=256, thread_name_prefix="dataflow-ray-wait")
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="dataflow-ray-executor", daemon=True)
        self._asked_at = 0.0

    def start(self) -> None:
        self._thread.start()

    @property
    def stopped(self) -> bool:
        return self._stopping or not self._thread.is_alive()

    def call_soon(self, fn: Callable[[], None]) -> None:
        self._events.put(fn)

    def submit(self, execution: Execution) -> None:
        self.call_soon(lambda: self._add(execution))

    def stop(self, timeout: float = 10.0) -> None:
        def begin() -> None:
            self._stopping = True
            for execution in list(self._executions):
                execution.cancel()
            for pool in list(self._pools.values()):
                self._end_pool(pool)
            self._pools.clear()

        self.call_soon(begin)
        self._events.put(None)
        self._thread.join(timeout)
        self._waiters.shutdown(wait=False, cancel_futures=True)

    def busy_cpus(self) -> float:
        return self._ledger.used_cpus

    # the loop ------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            try:
                fn = self._events.get(timeout=TICK_S)
            except queue.Empty:  # nothing happened: time still retires idle actors
                if self._executions and not self._stopping:
                    self._guarded(self._schedule)
                continue
            if fn is None:
                return
            self._guarded(fn)
            while True:  # everything that arrived meanwhile, then one scheduling round
                try:
                    more = self._events.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    return
                self._guarded(more)
            if not self._stopping:
                self._guarded(self._schedule)
            # nothing of the last event may outlive it while the loop waits (a finished task's
            # closure holds its execution, whose error holds the caller's frames)
            fn = more = None

    def _guarded(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as err:  # the loop outlives any one failure; the jobs it hits fail
            log.exception("dataflow ray executor: a step failed")
            for execution in list(self._executions):
                execution.fail(EngineError(f"the ray executor failed (this is a bug in dataflow): {err!r}"))

    def _add(self, execution: Execution) -> None:
        if self._stopping:
            execution.fail(EngineError("the ray backend was shut down"))
            return
        self._executions.append(execution)
        execution.route()

    def _reap(self, execution: Execution) -> None:
        if execution.done and execution in self._executions:
            self._executions.remove(execution)
            execution.stopped.set()
            for op in execution.map_ops():
                pool = self._pools.pop(f"actor:{op.key}", None)
                if pool is not None:
                    self._end_pool(pool)

    # scheduling ------------------------------------------------------------------------------
    def _ask_autoscaler(self, waiting: list[MapOperator]) -> None:
        """Tell Ray's autoscaler about tasks no node has room for now (it cannot see work not
        submitted yet); at most every few seconds."""
        now = time.monotonic()
        if not waiting or now - self._asked_at < AUTOSCALER_PERIOD_S:
            return
        self._asked_at = now
        bundles = []
        for op in waiting:
            res = op.resources
            bundle = {"CPU": res.num_cpus, **dict(res.custom)}
            if res.num_gpus:
                bundle["GPU"] = res.num_gpus
            bundles += [bundle] * max(1, min(op.slots(self.options.resolved_num_cpus()), 64))
        try:
            from ray.autoscaler.sdk import request_resources

            request_resources(bundles=bundles)
        except Exception:  # no autoscaler (a fixed cluster): nothing to ask
            log.debug("no autoscaler to ask for %d bundles", len(bundles), exc_info=True)

    def _schedule(self) -> None:
        for execution in list(self._executions):
            waits: dict[int, str] = {}
            try:
                while self._dispatch_one(execution, waits):
                    pass
            except Exception as err:
                log.exception("dataflow ray executor: scheduling failed")
                execution.fail(EngineError(f"scheduling failed (this is a bug in dataflow): {err!r}"))
            execution.note_waits(waits)
            self._grow_or_shrink(execution)
            self._ask_autoscaler([op for op in execution.map_ops() if waits.get(id(op)) == WAIT_PLACEMENT])
            self._reap(execution)

    def _fits(self, op: MapOperator) -> bool:
        res = op.resources
        if res.num_gpus and self._gpus_used + res.num_gpus > self._gpus_total + 1e-9:
            return False
        return self._ledger.fits(res.num_cpus, res.custom)

    def _dispatch_one(self, execution: Execution, waits: dict[int, str]) -> bool:
        candidates: list[Candidate] = []
        ops: list[MapOperator] = []
        for op in execution.map_ops():
            ready, reason = execution.dispatchable(op)
            if not ready:
                waits.pop(id(op), None)
                continue
            if reason is not None:
                waits[id(op)] = reason
                continue
            if op.actor_pool is not None:
                pool = self._pool(execution, op)
                if pool is None:
                    return False
                if pool.idle() is None:
                    waits[id(op)] = "every actor busy"
                    continue
            if op.actor_pool is None and not self._fits(op):
                waits[id(op)] = WAIT_PLACEMENT
                continue
            waits.pop(id(op), None)
            candidates.append(Candidate(op.key, execution.depth[id(op)], op.held_bytes, op.in_flight()))
            ops.append(op)
        index = pick(candidates)
        if index is None:
            return False
        self._dispatch(execution, ops[index])
        return True

    def _pool(self, execution: Execution, op: MapOperator) -> _Pool | None:
        """``op``'s actor pool, started at the size the cluster leaves it (see ``_pool_room``);
        None when even its minimum cannot fit (the execution then fails, naming the step)."""
        key = f"actor:{op.key}"
        pool = self._pools.get(key)
        if pool is None:
            assert op.actor_pool is not None
            res = op.resources
            room = self._pool_room(execution, op)
            if room < op.actor_pool.min_size:
                execution.fail(ResourceError(
                    f"{op.name} asks for {op.actor_pool.min_size} actors of {res.num_cpus:g} CPU each, but the "
                    f"cluster's {self._ledger.cpus:g} CPUs leave room for {room} once the tasks that feed it "
                    "have a CPU and other actor pools hold theirs (Ray actors keep their CPUs while they "
                    "live): lower its concurrency or num_cpus, or add nodes"
                ))
                return None
            cls = ray.remote(_PoolActor).options(
                num_cpus=res.num_cpus, num_gpus=res.num_gpus or None, resources=dict(res.custom) or None,
                max_restarts=-1, max_task_retries=max(0, self.options.max_task_attempts - 1),
            )
            pool = _Pool(res, lambda: cls.remote(op.digest, op.transform_bytes, sys.path))
            self._pools[key] = pool
            size = target_size(PoolState(op.actor_pool.min_size, op.actor_pool.max_size, 0, 0, 0, False, room), new=True)
            for _ in range(size):
                self._add_actor(pool)
        return pool

    def _pool_room(self, execution: Execution, op: MapOperator) -> int:
        """How many actors of ``op`` the cluster can hold besides the other pools' actors and
        one task of each task step of the execution still running (the steps that feed it)."""
        res = op.resources
        feeding = max((o.resources.num_cpus for o in execution.map_ops() if o.actor_pool is None and not o.completed()),
                      default=0.0)
        fits = [(self._ledger.cpus - self._actor_cpus - feeding) / res.num_cpus] if res.num_cpus > 0 else []
        if res.num_gpus > 0:
            fits.append((self._gpus_total - self._actor_gpus) / res.num_gpus)
        fits += [(self._ledger.custom.get(name, 0.0) - self._actor_custom.get(name, 0.0)) / amount
                 for name, amount in res.custom if amount > 0]
        return max(0, int(min(fits) + 1e-9)) if fits else op.actor_pool.max_size  # type: ignore[union-attr]

    def _add_actor(self, pool: _Pool) -> None:
        res = pool.resources
        pool.add()
        self._hold_for_actor(res, +1)

    def _remove_actor(self, pool: _Pool, slot: int) -> None:
        pool.remove(slot)
        self._hold_for_actor(pool.resources, -1)

    def _end_pool(self, pool: _Pool) -> None:
        for slot in list(pool.actors):
            self._remove_actor(pool, slot)

    def _hold_for_actor(self, res: Any, sign: int) -> None:
        """A live actor keeps its resources: the ledger counts them as used (``sign`` +1 when
        it starts, -1 when it ends)."""
        if sign > 0:
            self._ledger.take(res.num_cpus, res.custom)
        else:
            self._ledger.give(res.num_cpus, res.custom)
        self._actor_cpus += sign * res.num_cpus
        self._actor_gpus += sign * res.num_gpus
        self._gpus_used = max(0.0, self._gpus_used + sign * res.num_gpus)
        for name, amount in res.custom:
            self._actor_custom[name] = self._actor_custom.get(name, 0.0) + sign * amount

    def _grow_or_shrink(self, execution: Execution) -> None:
        """The local engine's policy (``engine.autoscale``): one more actor when work waits,
        every actor is busy and none is starting (and the cluster has room); idle actors past
        ``actor_idle_timeout_s`` retire down to the pool's minimum."""
        now = time.monotonic()
        for op in execution.map_ops():
            pool = self._pools.get(f"actor:{op.key}")
            if pool is None or op.actor_pool is None or op.completed():
                continue
            live, busy = len(pool.actors), len(pool.busy)
            waiting = busy == live and execution.dispatchable(op)[0]
            room = self._pool_room(execution, op) if waiting else 0
            state = PoolState(op.actor_pool.min_size, op.actor_pool.max_size, live, pool.starting(), busy, waiting,
                              live + room)
            if waiting and room > 0 and target_size(state, new=False) > live:
                self._add_actor(pool)
                log.info("%s: actor pool grown to %d", op.name, live + 1)
                continue
            slots = list(pool.actors)
            idle = [None if slot in pool.busy else pool.idle_since.get(slot) for slot in slots]
            for i in to_retire(idle, op.actor_pool.min_size, self.options.actor_idle_timeout_s, now):
                self._remove_actor(pool, slots[i])
                log.info("%s: an idle actor retired (pool of %d)", op.name, len(pool.actors))

    def _transform(self, op: MapOperator) -> ray.ObjectRef:
        if op.digest not in self._transforms:
            self._transforms[op.digest] = ray.put(op.transform_bytes)
        return self._transforms[op.digest]

    def _dispatch(self, execution: Execution, op: MapOperator) -> None:
        try:
            transform = self._transform(op)
        except Exception as err:
            from engine.executor import unpicklable_error

            execution.fail(unpicklable_error(op.name, "its function", err))
            return
        pending = op.next_task()
        spec = pending.spec
        try:
            spec_bytes = serialization.dumps(spec)
        except Exception as err:
            from engine.executor import unpicklable_error

            op.pending.pop(spec.task_id, None)
            execution.fail(unpicklable_error(op.name, "a task's inputs (its read task or arguments)", err))
            return
        block_ids = list(dict.fromkeys(_block_id(item) for item in spec.inputs if _block_id(item)))
        try:
            args = [self.store.object_ref(b) for b in block_ids]
        except KeyError as err:
            op.pending.pop(spec.task_id, None)
            execution.fail(EngineError(f"a block of {op.name}'s input is gone: {err}"))
            return
        res = op.resources
        running = _Running(execution, op, pending)
        if op.actor_pool is not None:
            pool = self._pools[f"actor:{op.key}"]
            slot = pool.idle(near=_busiest_node(spec.inputs) if execution.options.actor_locality_enabled else None)
            assert slot is not None
            pool.busy.add(slot)
            running.actor = slot
            generator = pool.actors[slot].run.options(num_returns="streaming").remote(spec_bytes, block_ids, *args)
        else:
            self._ledger.take(res.num_cpus, res.custom)
            self._gpus_used += res.num_gpus
            generator = (
                ray.remote(_remote_task)
                .options(
                    num_cpus=res.num_cpus,
                    num_gpus=res.num_gpus or None,
                    resources=dict(res.custom) or None,
                    num_returns="streaming",
                    max_retries=max(0, self.options.max_task_attempts - 1),
                    retry_exceptions=False,
                    **self._output_locality(execution),
                )
                .remote(spec_bytes, op.digest, transform, sys.path, block_ids, *args)
            )
        self._running[spec.task_id] = running
        self._waiters.submit(self._wait, spec.task_id, generator)

    def _output_locality(self, execution: Execution) -> dict[str, Any]:
        """Ray's ``locality_with_output``: True prefers the driver's node for every task, a list
        of node ids takes them in turn; soft, so a busy or full node does not stop a task."""
        want = execution.options.locality_with_output
        if not want:
            return {}
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if want is True:
            node = ray.get_runtime_context().get_node_id()
        else:
            nodes = list(want)
            node = nodes[next(self._locality_turn) % len(nodes)]
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node, soft=True)}

    def _wait(self, task_id: int, generator: Any) -> None:
        """On a waiter thread: collect the task's returns, then hand them to the loop."""
        refs: list[ray.ObjectRef] = []
        try:
            for ref in generator:
                refs.append(ref)
            result: TaskResult = ray.get(refs[-1])
            outcome: Any = (refs[:-1], result)
        except Exception as err:  # the task's worker or node died beyond Ray's retries
            outcome = err
        self.call_soon(lambda: self._finished(task_id, outcome))

    def _finished(self, task_id: int, outcome: Any) -> None:
        running = self._running.pop(task_id, None)
        if running is None:
            return
        execution, op = running.execution, running.op
        res = op.resources
        if running.actor is not None:
            pool = self._pools.get(f"actor:{op.key}")
            if pool is not None:
                pool.busy.discard(running.actor)
                pool.idle_since[running.actor] = time.monotonic()
        else:
            self._ledger.give(res.num_cpus, res.custom)
            self._gpus_used = max(0.0, self._gpus_used - res.num_gpus)
        if isinstance(outcome, BaseException):
            if execution.cancelled:
                execution.task_discarded(op, task_id, [])
            else:
                op.pending.pop(task_id, None)
                op.stats.tasks_failed += 1
                for value in running.pending.bundle:
                    execution.release_input(value, op)
                execution.fail(_cluster_failure(op.name, outcome))
            self._reap(execution)
            return
        object_refs, result = outcome
        result.task_id = task_id
        value, node, attempt = result.value if isinstance(result.value, tuple) else (None, None, 0)
        result.value = value if result.error is None else None
        if attempt:  # Ray ran it again after its worker or node died: counted as the engine's retries are
            op.stats.tasks_retried += attempt
            log.info("%s: a task was retried by Ray (attempt %d) after its worker or node died", op.name, attempt + 1)
        result.refs = [self.store.register(o, meta, node) for o, meta in zip(object_refs, result.refs, strict=True)]
        if execution.cancelled:
            execution.task_discarded(op, task_id, result.refs)
        else:
            execution.task_finished(op, result)
        self._reap(execution)


def _busiest_node(inputs: list[Any]) -> str | None:
    """The node holding most of these input bytes (None when unknown)."""
    size: dict[str, int] = {}
    for item in inputs:
        ref = item.ref if isinstance(item, BlockSlice) else item
        if isinstance(ref, BlockRef) and ref.node is not None:
            size[ref.node] = size.get(ref.node, 0) + item.size_bytes
    return max(size, key=size.__getitem__) if size else None


def _block_id(item: Any) -> str | None:
    if isinstance(item, BlockRef):
        return item.block_id
    if isinstance(item, BlockSlice):
        return item.ref.block_id
    return None


class RayHandle(ExecutionHandle):
    """An execution running on the Ray executor; state changes go through its loop."""

    def __init__(self, execution: Execution, backend: RayBackend) -> None:
        super().__init__(execution, backend.store)
        self.executor = backend.executor

    def busy_cpus(self) -> float:
        return 0.0  # the consumer's machine is not the cluster's

    def iter_refs(self) -> Iterator[BlockRef]:
        try:
            while True:
                ref = self.execution.buffer.get()
                if ref is None:
                    return
                self.executor.call_soon(lambda ref=ref: self.execution.handed_to_consumer(ref))  # type: ignore[misc]
                yield ref
        finally:
            if not self.execution.buffer.done or self.execution.buffer.error is None:
                self.cancel()

    def release(self, ref: BlockRef) -> None:
        self.executor.call_soon(lambda: self.execution.release_consumed(ref))

    def detach(self, ref: BlockRef) -> bool:
        self.executor.call_soon(lambda: self.execution.detach(ref))
        return ref.block_id not in self.execution.borrowed

    def free_detached(self, ref: BlockRef) -> None:
        self.store.free(ref)

    def cancel(self) -> None:
        if not self._closed:
            self._closed = True
            execution = self.execution

            def stop() -> None:
                execution.cancel()
                execution.release_undelivered()
                execution.buffer.finish()  # nothing more for the consumer: reaped once no task runs

            self.executor.call_soon(stop)


class RayBackend(Backend):
    """Runs executions on a Ray cluster (``dataflow.init(runner="ray", address=...)``)."""

    def __init__(self, options: ExecutionOptions, address: str | None = None, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        self._started_ray = False
        if not ray.is_initialized():
            _connect(address, connect_timeout_s, options)
            self._started_ray = True
        cluster = ray.cluster_resources()
        self.nodes = [n for n in ray.nodes() if n.get("Alive")]
        store_bytes = int(cluster.get("object_store_memory", 0)) or options.resolved_store_capacity()
        capacity = int(store_bytes * STORE_SHARE)
        if options.object_store_memory is not None:
            capacity = min(capacity, options.object_store_memory)
        self.options = options.with_(
            num_cpus=max(1, int(cluster.get("CPU", 1))),
            num_gpus=int(cluster.get("GPU", 0)),
            object_store_memory=capacity,
            resources=tuple(sorted((k, v) for k, v in cluster.items()
                                   if k not in ("CPU", "GPU", "memory", "object_store_memory") and not k.startswith("node:"))),
        )
        self.store = RayStore()
        self.executor = RayExecutor(self.options, self.store, cluster, capacity)
        self.executor.start()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def private_views(self) -> bool:
        return False

    def execute(self, ops: list[PhysicalOperator], options: ExecutionOptions) -> ExecutionHandle:
        execution = Execution(ops, self.options.for_execution(options), self.store.free, self.store,
                              store_capacity=self.executor.store_capacity, shares_finished_budgets=False)
        self._check_fits(execution)
        self.executor.submit(execution)
        return RayHandle(execution, self)

    def _check_fits(self, execution: Execution) -> None:
        """A task no single node could ever run fails now, not after waiting forever."""
        for op in execution.map_ops():
            res = op.resources
            if not any(_node_fits(node, res.num_cpus, res.num_gpus, res.custom) for node in self.nodes):
                msg = (f"{op.name} asks for num_cpus={res.num_cpus}, num_gpus={res.num_gpus}"
                       f"{', ' + str(dict(res.custom)) if res.custom else ''}; no node of this Ray cluster has that")
                raise ResourceError(msg)

    def put(self, tables: Sequence[pa.Table]) -> list[BlockRef]:
        return put_each(tables, self.store.put, self.store.free)

    def get(self, ref: BlockRef) -> pa.Table:
        return self.store.get(ref)

    def free(self, ref: BlockRef) -> None:
        self.store.free(ref)

    def capacity(self) -> Capacity:
        return Capacity(float(self.options.resolved_num_cpus()), self.options.resolved_num_gpus(),
                        self.executor.store_capacity, tuple(self.options.resources))

    def busy_cpus(self) -> float:
        return 0.0

    def split_coordinator(  # type: ignore[override]
        self,
        start: Callable[[], ExecutionHandle],
        n: int,
        equal: bool,
        max_pending_bytes: int,
        ordered: bool = False,
        inputs: Sequence[BlockRef] = (),
    ) -> Any:
        """A coordinator actor on this node, which ranks anywhere on the cluster reach
        (``engine.ray_split``); ``start`` runs an epoch in the actor's process, which is handed
        the object refs of ``inputs`` (a materialized dataset's blocks) to read them."""
        from engine.ray_split import start_coordinator

        refs = {ref.block_id: self.store.object_ref(ref.block_id) for ref in inputs}
        return start_coordinator(start, n, equal, max_pending_bytes, ordered, key=f"{os.getpid()}-{next(_split_ids)}",
                                 inputs=refs)

    def multi_node(self) -> bool:
        return len(self.nodes) > 1

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.executor.stop()
        if self._started_ray:
            ray.shutdown()


_split_ids = itertools.count()


def _node_fits(node: dict[str, Any], cpus: float, gpus: float, custom: tuple[tuple[str, float], ...]) -> bool:
    have = node.get("Resources", {})
    if cpus > have.get("CPU", 0) + 1e-9 or gpus > have.get("GPU", 0) + 1e-9:
        return False
    return all(have.get(name, 0) + 1e-9 >= amount for name, amount in custom)


def _cluster_failure(step: str, err: BaseException) -> Exception:
    """The error a task's Ray-level failure is to the caller. A ``RayTaskError`` was raised in
    the task's process outside the part that catches the UDF's errors (shipping its output,
    say): a bug here, not a death; a worker, node or object lost past Ray's retries is
    ``WorkerDiedError``. Both keep Ray's error as their cause."""
    if isinstance(err, ray.exceptions.RayTaskError):
        failure: Exception = EngineError(f"a task of {step} failed on the cluster outside its UDF (this is a bug in dataflow): {err}")
    else:
        failure = WorkerDiedError(f"a task of {step} failed on the cluster: {err}")
    failure.__cause__ = err
    return failure


PROBE_TIMEOUT_S = 5.0
"""How long a TCP connection to an explicit ``host:port`` may take before ``ray.init`` is tried."""


def _probe(address: str | None, timeout_s: float) -> None:
    """Fail at once when nothing listens at an explicit ``host:port`` (``ray://host:port`` too):
    ``ray.init`` would retry a refused connection until the timeout. "auto", None and other
    forms are left to ``ray.init``."""
    if not address or address == "auto" or address.startswith("local"):
        return
    target = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=timeout_s):
            pass
    except OSError as err:
        msg = f"cannot reach the Ray cluster at {address!r}: nothing answers at {target} ({err})"
        raise ConnectionError(msg) from err


def _in_a_thread_that_stays(start: Callable[[], object]) -> None:
    """Run ``start`` in this thread if it is the main one (which lives as long as the process,
    and where Ray can install its SIGTERM handler), else in a daemon thread that then waits
    until the process exits, so what ``start`` spawned outlives the calling thread."""
    if threading.current_thread() is threading.main_thread():
        start()
        return
    done = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            start()
        except BaseException as err:  # reported to the caller below
            failure.append(err)
        done.set()
        if not failure:
            threading.Event().wait()  # parked: Ray's processes die with the thread that started them

    threading.Thread(target=run, name="dataflow-ray-local", daemon=True).start()
    done.wait()
    if failure:
        raise failure[0]


def _starts_local(address: str | None) -> bool:
    """Whether ``ray.init(address=address)`` starts a new Ray instance on this machine rather
    than connecting to one (``RAY_ADDRESS`` in the environment names one to connect to)."""
    return address == "local" or (address is None and not os.environ.get("RAY_ADDRESS"))


def _connect(address: str | None, timeout_s: float, options: ExecutionOptions | None = None) -> None:
    """``ray.init`` that fails within ``timeout_s`` with a clear error on a wrong address.

    A new local instance is started with the CPUs and GPUs ``options`` names, in the main thread
    or in one that stays: Ray has the processes it starts killed when the thread that started
    them exits (``PR_SET_PDEATHSIG``), so starting it in the bounded thread below took the new
    cluster down a moment after ``init`` returned ("Failed to connect to GCS within 60 seconds",
    then the driver exits). Starting one waits on no network."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    if _starts_local(address):
        sizes = {} if options is None else {"num_cpus": options.num_cpus, "num_gpus": options.num_gpus}
        try:
            _in_a_thread_that_stays(lambda: ray.init(
                address=address, logging_level=logging.WARNING, log_to_driver=False, ignore_reinit_error=True,
                **{k: v for k, v in sizes.items() if v is not None}))
        except Exception as err:
            msg = f"cannot start a local Ray instance: {err}"
            raise ConnectionError(msg) from err
        return
    _probe(address, min(timeout_s, PROBE_TIMEOUT_S))
    failure: list[BaseException] = []

    def connect() -> None:
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False, ignore_reinit_error=True)
        except BaseException as err:  # reported to the caller below
            failure.append(err)

    started = time.monotonic()
    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive() or failure:
        why = f"{failure[0]}" if failure else f"no answer within {timeout_s:.0f} s"
        msg = f"cannot reach the Ray cluster at {address or 'a new local instance'!r}: {why}"
        raise ConnectionError(msg) from (failure[0] if failure else None)
    log.info("connected to Ray at %s in %.1f s", address, time.monotonic() - started)

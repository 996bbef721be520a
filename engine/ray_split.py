"""streaming_split on a Ray cluster: the coordinator runs in an actor on the driver's node.

The ranks of a training job run on other nodes (Ray Train workers, or the user's actors). They
reach the split's ``SplitCoordinator`` hosted by ``_SplitActor``: a threaded actor pinned to the
driver's node and owned by the driver (it dies with it), which runs each epoch's execution with
the Ray backend of its own process. A rank asks it for a piece; the piece's block travels as an
object ref in the answer, so the rank reads it with ``ray.get`` (mapped from its node's object
store when the block is there, moved there by Ray otherwise) and never through the actor. The
coordinator prefers to hand a rank the blocks its node holds.

Every wait is bounded: the actor answers ``WAIT`` after ``POLL_S`` and the rank asks again (a
slow pipeline keeps ranks waiting as long as needed); a coordinator that died or stopped
answering raises ``SplitCoordinatorLostError`` within ``LIVENESS_S``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from engine import serialization
from engine.errors import SplitCoordinatorLostError
from engine.object_store import BlockRef
from engine.ray_backend import from_ray
from engine.split import END, RAY_SPLIT_PREFIX, WAIT, Piece, SplitCoordinator

POLL_S = 2.0
"""How long the actor holds a rank's request before answering WAIT."""
LIVENESS_S = 30.0
"""A request unanswered this long past ``POLL_S`` means the coordinator is lost."""
NAMESPACE = "dataflow"
INLINE_ANSWER_BYTES = 64 << 10
"""A block of at most this many bytes travels in the answer to a rank's poll, read by the actor
from its own memory (Ray keeps an object under 100 KiB that a task returns in its owner's
process, here the actor's). A rank reading it by its ref asks the actor for it in a second
request, through Ray's borrowing of an object one of its own actors owns, and once waited
there over a minute for a 20-row block; bigger blocks are in Ray's object store, and ranks
read them by ref as before."""

log = logging.getLogger("dataflow.split")


@ray.remote(num_cpus=0, max_concurrency=64)
class _SplitActor:
    """Hosts one ``SplitCoordinator``; its epochs run on the cluster from this process."""

    def __init__(self, start: bytes, n: int, equal: bool, max_pending_bytes: int, ordered: bool,
                 inputs: dict[str, Any] | None = None) -> None:
        from engine import runner

        self._runner = runner
        if inputs:  # a materialized dataset's blocks: the driver's refs, readable here too
            store = runner.backend(None, "ray").store  # type: ignore[attr-defined]
            for block_id, object_ref in inputs.items():
                store.adopt(block_id, object_ref)
        self.coordinator = SplitCoordinator(
            serialization.loads(start), n, equal, read=_read_here, max_pending_bytes=max_pending_bytes, ordered=ordered
        )

    def poll(self, split: int, epoch: int, node: str | None) -> tuple[Any, ...]:
        """``("piece", piece, [object ref])``, ``("piece", piece, [None], rows)`` for a block of
        at most ``INLINE_ANSWER_BYTES``, ``("wait",)`` or ``("end",)``."""
        result = self.coordinator.next_within(split, epoch, POLL_S, near=node)
        if isinstance(result, Piece):
            store = self._runner.backend(None, "ray").store  # type: ignore[attr-defined]
            object_ref = store.object_ref(result.ref.block_id)
            if result.ref.size_bytes <= INLINE_ANSWER_BYTES:
                with contextlib.suppress(ray.exceptions.GetTimeoutError):  # (then by ref, as a big one)
                    return ("piece", result, [None], ray.get(object_ref, timeout=POLL_S))
            return ("piece", result, [object_ref])
        return (result,)

    def release(self, piece: Piece) -> None:
        self.coordinator.release(piece)

    def abandon(self, split: int, epoch: int) -> None:
        self.coordinator.abandon(split, epoch)

    def busy_cpus(self) -> float:
        return self.coordinator.busy_cpus()

    def last_stats(self) -> dict[str, Any]:
        return dict(self.coordinator.last_stats)

    def summary(self) -> str:
        return self.coordinator.summary()

    def close(self) -> None:
        self.coordinator.close()


def _whereabouts(object_ref: ray.ObjectRef) -> str:
    """What Ray says of where an object is, for a log line (never raises, waits at most 5 s)."""
    try:
        found = ray.experimental.get_object_locations([object_ref], timeout_ms=5000).get(object_ref)
    except Exception as err:
        return f"its locations could not be looked up: {err!r}"
    if not found:
        return "its owner knows of no copy"
    nodes = found.get("node_ids") or []
    return f"copies on {len(nodes)} node(s) {', '.join(n[:8] for n in nodes)}, {found.get('object_size')} bytes"


def _read_here(ref: BlockRef) -> pa.Table:
    raise RuntimeError("ranks read a split's blocks from the object refs they are handed")


class RaySplitClient:
    """A ``SplitSource`` for split iterators anywhere on the cluster (the driver included)."""

    private_views = False

    def __init__(self, actor: Any, key: str) -> None:
        self._actor = actor
        self.key = key
        self.address = RAY_SPLIT_PREFIX + key
        self._lock = threading.Lock()
        self._held: dict[str, tuple[Any, int]] = {}
        """block id -> its object ref (or its rows, for a block that came in the answer) and the
        pieces of it this process holds."""
        self._node: str | None = None

    @classmethod
    def connect(cls, address: str) -> RaySplitClient:
        """The client of the coordinator at ``address`` (a process already connected to Ray)."""
        key = address.removeprefix(RAY_SPLIT_PREFIX)
        if not ray.is_initialized():
            msg = f"this streaming_split iterator reads from a Ray cluster: call ray.init(address=...) first ({address})"
            raise RuntimeError(msg)
        try:
            actor = ray.get_actor(_actor_name(key), namespace=NAMESPACE)
        except ValueError as err:
            raise SplitCoordinatorLostError(f"the streaming_split coordinator {key} is gone: {err}") from err
        return cls(actor, key)

    def _call(self, method: Callable[..., Any], *args: Any) -> Any:
        try:
            return ray.get(method.remote(*args), timeout=POLL_S + LIVENESS_S)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as err:
            msg = f"the streaming_split coordinator {self.key} is gone or not answering: {err}"
            raise SplitCoordinatorLostError(msg) from err

    def next(self, split: int, epoch: int) -> Piece | None:
        if self._node is None:
            self._node = ray.get_runtime_context().get_node_id()
        while True:
            answer = self._call(self._actor.poll, split, epoch, self._node)
            if answer[0] == END:
                return None
            if answer[0] == WAIT:
                continue
            _, piece, (object_ref,), *rows = answer
            with self._lock:
                held = self._held.get(piece.ref.block_id)
                value = held[0] if held else rows[0] if rows else object_ref
                self._held[piece.ref.block_id] = (value, held[1] + 1 if held else 1)
            return piece

    def get(self, ref: BlockRef) -> pa.Table:
        """The block's rows. Ray may take long to bring them (a busy or spilling object store):
        every ``LIVENESS_S`` the coordinator is asked whether it still lives (a lost one raises
        ``SplitCoordinatorLostError``) and the wait is logged, naming the block."""
        with self._lock:
            object_ref = self._held[ref.block_id][0]
        if not isinstance(object_ref, ray.ObjectRef):  # the rows came in the answer
            return from_ray(object_ref)
        waited = 0.0
        while True:
            try:
                return from_ray(ray.get(object_ref, timeout=LIVENESS_S))
            except ray.exceptions.GetTimeoutError:
                waited += LIVENESS_S
            self.busy_cpus()  # (raises SplitCoordinatorLostError when the coordinator is gone)
            log.warning("streaming_split %s: a rank has waited %.0f s for block %s (%d rows) from Ray's object "
                        "store (%s)", self.key, waited, ref.block_id, ref.num_rows, _whereabouts(object_ref))

    def release(self, piece: Piece) -> None:
        with self._lock:
            object_ref, count = self._held[piece.ref.block_id]
            if count > 1:
                self._held[piece.ref.block_id] = (object_ref, count - 1)
            else:
                del self._held[piece.ref.block_id]
        if ray.is_initialized():  # (after ray.shutdown() a call would connect this process again)
            self._actor.release.remote(piece)

    def abandon(self, split: int, epoch: int) -> None:
        if ray.is_initialized():
            self._actor.abandon.remote(split, epoch)

    def busy_cpus(self) -> float:
        return float(self._call(self._actor.busy_cpus))

    @property
    def last_stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = self._call(self._actor.last_stats)
        return stats

    def summary(self) -> str:
        text: str = self._call(self._actor.summary)
        return text


def start_coordinator(start: Callable[[], Any], n: int, equal: bool, max_pending_bytes: int, ordered: bool,
                      key: str, inputs: dict[str, Any] | None = None) -> RaySplitClient:
    """Start the coordinator actor of a ``streaming_split`` on this (the driver's) node."""
    here = ray.get_runtime_context().get_node_id()
    actor = _SplitActor.options(  # type: ignore[attr-defined]
        name=_actor_name(key),
        namespace=NAMESPACE,
        scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
    ).remote(serialization.dumps(start), n, equal, max_pending_bytes, ordered, inputs or {})
    client = RaySplitClient(actor, key)
    # a named actor outlives its handles: end it with the driver's iterators (or the driver)
    # (at the driver's exit Ray ends it with the job: no call then, which could start a new Ray)
    weakref.finalize(client, _kill, actor).atexit = False
    return client


def _kill(actor: Any) -> None:
    if ray.is_initialized():
        with contextlib.suppress(Exception):  # the cluster may be going away
            ray.kill(actor)


def _actor_name(key: str) -> str:
    return f"split-{key}"

"""Torch ingest: ``iter_torch_batches`` and a torch ``IterableDataset``; the one module importing torch.

It is imported only when one of them is first used, so ``import dataflow`` never imports torch.
The stages continue ``DataIterator``'s chain:

    fetch -> rebatch -> shuffle (``dataflow.iterator``) -> format (numpy, zero-copy)
    -> collate (tensors) -> pin -> to device (own CUDA stream) -> prefetch (background thread)

Everything up to "to device" runs on one background thread, ``prefetch_batches`` ahead of the
training loop, so the loop does not wait when the engine keeps up.

**Zero copy.** Numeric and fixed-shape (fixed-size-list, tensor) columns arrive as numpy views of
the block, and become tensors over the same memory through DLPack. Numpy marks those views
read-only (Arrow memory is immutable); ``torch.from_numpy`` would warn that torch cannot honour
that. The warning does not apply here: in the multi-process engine a block is a copy-on-write
mapping of its shared-memory file (``engine.object_store``), so an in-place write
(``batch["x"] += 1``) lands on pages private to this process and changes nothing anyone else
reads. In the in-process mode (``execution_mode="local"``) blocks are ordinary memory that may
be the dataset's own (a materialized dataset, ``from_numpy`` input), so there each tensor is
copied once instead, to keep the same semantics.

**Devices.** ``device="auto"`` is CUDA when available, else the CPU. A CUDA device with no CUDA
is an error when ``iter_torch_batches`` is called. With a CUDA target, batches are pinned (or
``pin_memory=True``) and copied with ``non_blocking=True`` on a dedicated stream; the training
loop's stream waits on an event, so the copy of batch n+1 overlaps the compute of batch n.
"""

from __future__ import annotations

import math
import os
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa
import torch
import torch.distributed
import torch.utils.data

from connectors.base import Datasource, push_filter
from dataflow.collate_fn import collate_input, stack_cells
from dataflow.iterator import DataIterator, check_batch_size, prefetch
from engine.block_format import to_batch

# ----- devices ------------------------------------------------------------------------------


def resolve_device(device: Any) -> torch.device:
    """``"auto"`` -> CUDA if available else CPU; a CUDA device without CUDA is a ValueError now."""
    if device is None or device == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    try:
        target = torch.device(device)
    except (RuntimeError, TypeError) as err:
        msg = f"device must be 'auto', 'cpu', 'cuda', 'cuda:N' or a torch.device, got {device!r}"
        raise ValueError(msg) from err
    if target.type == "cuda":
        if not torch.cuda.is_available():
            msg = (
                f"device={device!r} was requested but CUDA is not available (torch {torch.__version__}, "
                f"built with CUDA {torch.version.cuda}); use device='auto' to fall back to the CPU"
            )
            raise ValueError(msg)
        index = torch.cuda.current_device() if target.index is None else target.index
        if index >= torch.cuda.device_count():
            msg = f"device={device!r}: only {torch.cuda.device_count()} CUDA device(s) are visible"
            raise ValueError(msg)
        # pinned now: the copies run on another thread, whose current device may differ
        target = torch.device("cuda", index)
    return target


# ----- collate: numpy views -> tensors ------------------------------------------------------


def tensor_view(array: np.ndarray) -> torch.Tensor:
    """A tensor over ``array``'s memory, even when numpy flags it read-only (see the module doc)."""
    try:
        return torch.from_dlpack(array)  # DLPack >= 1.0 carries the read-only flag: no warning
    except (BufferError, RuntimeError, TypeError):
        pass
    if array.flags.writeable:
        return torch.from_numpy(array)
    with warnings.catch_warnings():  # older numpy/torch without DLPack 1.0: same view, silenced
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)
        return torch.from_numpy(array)


def to_tensors(
    batch: Mapping[str, np.ndarray], dtypes: Any = None, *, private: bool = True
) -> dict[str, torch.Tensor]:
    """The default collate: each column as a tensor, zero-copy unless a dtype cast needs one.

    ``dtypes`` is one ``torch.dtype`` for every column or a dict per column. ``private=False``
    (blocks that are not copy-on-write) copies tensors that would share the block's memory.
    """
    out = {}
    for name, array in batch.items():
        dtype = dtypes.get(name) if isinstance(dtypes, Mapping) else dtypes
        out[name] = column_tensor(name, array, dtype, private)
    return out


def column_tensor(name: str, array: Any, dtype: torch.dtype | None, private: bool) -> torch.Tensor:
    if not isinstance(array, np.ndarray):
        array = np.asarray(array)
    if array.dtype == object:
        array = stack_cells(
            array, f"column {name!r}", "one tensor",
            "resize or pad them in a map or map_batches (read_images(size=...) for images), or build the "
            "batch with collate_fn",
            "which do not make one tensor; drop it (select_columns / drop_columns) or build the batch "
            "yourself with collate_fn",
        )
    try:
        tensor = tensor_view(array)
    except TypeError as err:
        msg = (
            f"column {name!r} has dtype {array.dtype}, which torch cannot hold; drop it "
            "(select_columns / drop_columns) or convert it with collate_fn"
        )
        raise TypeError(msg) from err
    if dtype is not None and tensor.dtype != dtype:
        return tensor.to(dtype)  # a cast makes new memory: nothing to protect
    return tensor if private else tensor.clone()


def map_tensors(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``fn`` applied to every tensor in a tensor, dict, list or tuple; other values as they are."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, Mapping):
        return {k: map_tensors(v, fn) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(map_tensors(v, fn) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(map_tensors(v, fn) for v in value)
    return value


# ----- pin and move to the device -----------------------------------------------------------


class DeviceMover:
    """Pins host tensors and copies them to ``device`` on a side CUDA stream (CPU: nothing to do).

    ``send`` runs on the prefetch thread and returns the batch with an event recorded after its
    copies; ``receive`` runs on the training thread and makes its current stream wait for that
    event (the GPU waits, not Python), then tells the caching allocator the tensors are used there.
    """

    def __init__(self, device: torch.device, pin_memory: bool) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        # pinned memory exists only with CUDA; on a CPU-only machine pin_memory=True is a no-op,
        # so a script written for a GPU box still runs on a laptop with device="auto"
        self.pin = torch.cuda.is_available() and (pin_memory or self.cuda)
        self.stream = torch.cuda.Stream(device) if self.cuda else None

    def send(self, batch: Any) -> tuple[Any, Any]:
        if self.pin:
            batch = map_tensors(batch, lambda t: t if t.is_pinned() or t.device.type != "cpu" else t.pin_memory())
        if not self.cuda:
            if self.device.type != "cpu":
                batch = map_tensors(batch, lambda t: t.to(self.device))
            return batch, None
        with torch.cuda.stream(self.stream):
            batch = map_tensors(batch, lambda t: t.to(self.device, non_blocking=True))
            event = torch.cuda.Event()
            event.record(self.stream)
        return batch, event

    def receive(self, batch: Any, event: Any) -> Any:
        if event is None:
            return batch
        current = torch.cuda.current_stream(self.device)
        current.wait_event(event)
        map_tensors(batch, lambda t: t.record_stream(current))
        return batch


# ----- iter_torch_batches --------------------------------------------------------------------


def iter_torch_batches(iterator: DataIterator, **options: Any) -> Iterator[Any]:
    """``sized_torch_batches`` without the row counts: what the loop gets."""
    return (batch for batch, _ in sized_torch_batches(iterator, **options))


def sized_torch_batches(
    iterator: DataIterator,
    *,
    prefetch_batches: int = 1,
    batch_size: int | None = 256,
    dtypes: Any = None,
    device: Any = "auto",
    collate_fn: Callable[[dict[str, np.ndarray]], Any] | None = None,
    drop_last: bool = False,
    local_shuffle_buffer_size: int | None = None,
    local_shuffle_seed: int | None = None,
    pin_memory: bool = False,
) -> Iterator[tuple[Any, int]]:
    """Batches of ``batch_size`` rows as ``{column: tensor}`` on ``device``, as Ray Data's.

    * ``dtypes``: one ``torch.dtype`` for all columns or ``{column: dtype}``; others keep theirs.
    * ``collate_fn(batch)`` receives the numpy dict (a ``pyarrow.Table`` or a ``DataFrame`` for an
      ``ArrowBatchCollateFn`` or ``PandasBatchCollateFn`` of ``dataflow.collate_fn``) and returns
      what the loop gets; tensors in its result (alone, or in a dict/list/tuple) are moved to ``device``. It cannot be combined
      with ``dtypes`` (cast inside it), as in Ray Data.
    * ``drop_last``, ``local_shuffle_buffer_size``, ``local_shuffle_seed``: as ``iter_batches``.
    * ``device``: "auto" (CUDA if available, else CPU), "cpu", "cuda", "cuda:N", a torch.device.
    * ``pin_memory``: pin host memory before the copy (implied for a CUDA target; ignored without CUDA).
    * ``prefetch_batches``: batches prepared ahead on a background thread (0: inline).

    Each comes with the rows it holds, ``(batch, rows)``: what a ``collate_fn`` returns need
    not have a length (a dataclass, a scalar), and a tuple ``(x, y)`` is not 2 rows.
    Arguments are checked here, when called, not at the first batch.
    """
    check_batch_size(batch_size)
    if collate_fn is not None and dtypes is not None:
        msg = "collate_fn cannot be combined with dtypes: cast to the dtypes you want inside collate_fn"
        raise ValueError(msg)
    if collate_fn is not None and not callable(collate_fn):
        msg = f"collate_fn must be callable, got {type(collate_fn).__name__}"
        raise TypeError(msg)
    check_dtypes(dtypes)
    target = resolve_device(device)
    mover = DeviceMover(target, pin_memory)
    return _batches(iterator, target, mover, batch_size, dtypes, collate_fn, drop_last,
                    local_shuffle_buffer_size, local_shuffle_seed, prefetch_batches)


def check_dtypes(dtypes: Any) -> None:
    values = dtypes.values() if isinstance(dtypes, Mapping) else [dtypes]
    for value in values:
        if value is not None and not isinstance(value, torch.dtype):
            msg = f"dtypes must be a torch.dtype or a dict of column -> torch.dtype, got {value!r}"
            raise TypeError(msg)


def _batches(
    iterator: DataIterator,
    target: torch.device,
    mover: DeviceMover,
    batch_size: int | None,
    dtypes: Any,
    collate_fn: Callable[[dict[str, np.ndarray]], Any] | None,
    drop_last: bool,
    shuffle_buffer: int | None,
    shuffle_seed: int | None,
    depth: int,
) -> Iterator[tuple[Any, int]]:
    private = {"blocks": True}
    engine: dict[str, Callable[[], float]] = {"busy_cpus": lambda: 0.0}

    def on_execute(handle: Any) -> None:
        # copy-on-write mappings make zero-copy tensors private; in-process blocks are not
        private["blocks"] = handle.private_views
        busy_cpus = getattr(handle, "busy_cpus", None)
        if busy_cpus is not None:  # split iterators ask the coordinator, wherever it runs
            engine["busy_cpus"] = busy_cpus

    tables = iterator.iter_tables(batch_size, drop_last, shuffle_buffer, shuffle_seed, on_execute=on_execute)

    def collate(table: pa.Table) -> Any:
        if collate_fn is not None:  # a table, a numpy dict or a DataFrame, as its class says
            return collate_fn(collate_input(collate_fn, table))
        batch = to_batch(table, "numpy")
        # a copy to pinned or device memory is coming anyway: no need to protect the block
        keep_private = private["blocks"] or mover.pin or target.type != "cpu"
        return to_tensors(batch, dtypes, private=keep_private)

    prepared = ((*mover.send(collate(table)), table.num_rows) for table in tables)
    ahead = prefetch(prepared, depth)
    cap = _THREAD_CAP  # (held here: a loop left open until the interpreter exits is closed after
    capped = False     # the module's globals are gone)
    try:
        for batch, event, rows in ahead:
            if not capped:  # the plan runs by now, so ``on_execute`` has been called
                capped = True
                cap.enter()
            cap.adjust(engine["busy_cpus"]())
            yield mover.receive(batch, event), rows
    finally:
        ahead.close()  # stops the prefetch thread before the thread count is restored
        if capped:
            cap.exit()


def _cores() -> int:
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)


class _CapState(threading.local):
    users = 0
    saved: int | None = None
    set_to: int | None = None
    cores = 1


class _TorchThreadCap:
    """Gives torch the cores the engine's workers leave free, batch by batch, while they feed a loop.

    torch's OpenMP threads spin-wait after each parallel op; when the workers hold every core, a
    spinning thread and a descheduled one waste each other's time slices. Before each batch the
    loop gets ``cores - busy worker CPUs`` intra-op threads (at least 1, at most what it had), so
    a loop the workers keep up with gets every core back. Measured on 2 cores: a ``x.sum()`` step
    per batch (workers always busy) took 3.9 s per epoch at torch's 2 threads, 2.3 s capped; a
    conv step (workers mostly idle, waiting for the loop) keeps its 2 threads.

    torch's thread count belongs to the thread that sets it, so the state is per thread: loops
    in several threads (split ranks) each get their own. Within a thread iterators nest: the
    first to start saves the setting, the last to end restores it. A loop that sets its own
    thread count takes over: from then on nothing is changed or restored. An iterator that is
    abandoned and collected on another thread cannot restore its loop's thread (torch offers no
    way); ``DataContext.cap_torch_threads = False`` turns all of this off.
    """

    def __init__(self) -> None:
        self._state = _CapState()

    def enter(self) -> None:
        from dataflow.context import DataContext

        state = self._state
        state.users += 1
        if state.users == 1 and DataContext.get_current().cap_torch_threads:
            state.saved = state.set_to = torch.get_num_threads()
            state.cores = _cores()

    def adjust(self, busy_cpus: float) -> None:
        state = self._state
        if state.saved is None:
            return
        if torch.get_num_threads() != state.set_to:  # the loop chose its own
            state.saved = state.set_to = None
            return
        target = min(state.saved, max(1, state.cores - math.ceil(busy_cpus)))
        if target != state.set_to:
            torch.set_num_threads(target)
            state.set_to = target

    def exit(self) -> None:
        state = self._state
        if state.users == 0:  # finalized on a thread that never entered
            return
        state.users -= 1
        if state.users == 0 and state.saved is not None:
            # a loop left open until the interpreter exits is closed after modules are torn
            # down: torch's functions are None by then, and there is no thread left to restore
            get_num_threads = getattr(torch, "get_num_threads", None)
            if get_num_threads is not None and get_num_threads() == state.set_to:
                torch.set_num_threads(state.saved)
            state.saved = state.set_to = None


_THREAD_CAP = _TorchThreadCap()


# ----- torch.utils.data.IterableDataset ------------------------------------------------------


class TorchIterableDataset(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """A dataset as a torch ``IterableDataset`` of batches, sharded across DataLoader workers and ranks.

        loader = DataLoader(ds.to_torch_iterable(batch_size=256), batch_size=None, num_workers=2)

    Each process reading it gets shard ``rank * num_workers + worker_id`` of
    ``world_size * num_workers`` (``torch.distributed`` when initialized, and
    ``torch.utils.data.get_worker_info()``), so every row is read exactly once across all
    workers and ranks. A shard is a set of the dataset's read tasks (taken round-robin from a
    fixed number of them, so every process computes the same split) or of a materialized
    dataset's blocks; a plan with ``limit()`` cannot be split this way and is refused (call
    ``materialize()`` first). ``drop_last`` and shuffling apply within each shard.

    **DataLoader workers run the plan in-process.** Workers are forked from the training
    process, whose engine (an executor thread, sockets, a zygote process) does not survive a
    fork; starting an engine in each worker would multiply the worker processes by
    ``num_workers`` and fight over the same CPUs. So a worker runs its shard with the
    synchronous in-process executor (``execution_mode="local"``): no threads or sockets are
    inherited, parallelism comes from the DataLoader's workers, and the tensors go back to the
    training process through torch's own shared memory. Batches made in workers are on the CPU:
    use ``DataLoader(pin_memory=True)`` and move them in the loop. With ``num_workers=0`` the
    plan runs on the normal engine (sharded by rank only) and ``device`` is honoured.
    """

    def __init__(
        self,
        dataset: Any,
        *,
        batch_size: int | None = 256,
        dtypes: Any = None,
        device: Any = "cpu",
        collate_fn: Callable[[dict[str, np.ndarray]], Any] | None = None,
        drop_last: bool = False,
        local_shuffle_buffer_size: int | None = None,
        local_shuffle_seed: int | None = None,
        prefetch_batches: int = 1,
        pin_memory: bool = False,
        num_read_tasks: int = 200,
    ) -> None:
        super().__init__()
        check_batch_size(batch_size)
        if collate_fn is not None and dtypes is not None:
            msg = "collate_fn cannot be combined with dtypes: cast to the dtypes you want inside collate_fn"
            raise ValueError(msg)
        check_dtypes(dtypes)
        resolve_device(device)  # a bad device fails here, not in a worker
        self.dataset = dataset
        self.num_read_tasks = num_read_tasks
        self.options = {
            "batch_size": batch_size, "dtypes": dtypes, "device": device, "collate_fn": collate_fn,
            "drop_last": drop_last, "local_shuffle_buffer_size": local_shuffle_buffer_size,
            "local_shuffle_seed": local_shuffle_seed, "prefetch_batches": prefetch_batches,
            "pin_memory": pin_memory,
        }

    def shard(self) -> tuple[int, int]:
        """(shard index, number of shards) for the calling process."""
        rank, world = 0, 1
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        info = torch.utils.data.get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        return rank * workers + worker, world * workers

    def __iter__(self) -> Iterator[Any]:
        from dataflow.context import DataContext
        from dataflow.dataset import Dataset

        index, count = self.shard()
        in_worker = torch.utils.data.get_worker_info() is not None
        options = dict(self.options)
        if in_worker:
            DataContext.get_current().execution_mode = "local"  # this forked process only; see above
            if resolve_device(options["device"]).type != "cpu":
                msg = "DataLoader workers make CPU tensors; use device='cpu' and move batches in the training loop"
                raise ValueError(msg)
        dataset = self.dataset
        if count > 1:
            dataset = Dataset(shard_plan(dataset._plan, index, count, self.num_read_tasks, in_worker))
        yield from dataset.iter_torch_batches(**options)


def shard_plan(node: Any, index: int, count: int, num_read_tasks: int, in_process: bool) -> Any:
    """The plan reading only shard ``index`` of ``count``: its reads and input blocks, round-robin."""
    from dataflow.plan import InputBlocks, Limit, MapStages, Mix, Read, Union

    if isinstance(node, Read):
        tasks = node.parallelism if node.parallelism > 0 else num_read_tasks
        return replace(node, datasource=ShardedDatasource(node.datasource, index, count, tasks))
    if isinstance(node, InputBlocks):
        refs = node.refs[index::count]
        if in_process and any(getattr(r, "path", None) or getattr(r, "data", None) for r in refs):
            # blocks of the parent's shared-memory store (files, or bytes in their refs): read directly
            return Read(BlockFilesDatasource(tuple(refs), node.owner), max(1, len(refs)))
        return InputBlocks(tuple(refs), node.owner)
    if isinstance(node, MapStages):
        return replace(node, input=shard_plan(node.input, index, count, num_read_tasks, in_process))
    if isinstance(node, Mix) and node.stop_on_shortest:
        msg = (
            "a mix with STOP_ON_SHORTEST cannot be sharded across DataLoader workers or ranks (each shard "
            "would stop at the end of its own share of the shortest input); call materialize() on it first"
        )
        raise ValueError(msg)
    if isinstance(node, (Union, Mix)):  # a mix: each shard mixes its share of every input
        return replace(node, children=tuple(shard_plan(c, index, count, num_read_tasks, in_process)
                                            for c in node.children))
    if isinstance(node, Limit):
        msg = (
            "a dataset with limit() cannot be sharded across DataLoader workers or ranks (each shard "
            "would take its own first rows); call materialize() on it first"
        )
        raise ValueError(msg)
    msg = f"cannot shard a plan containing {type(node).__name__}"
    raise ValueError(msg)


class ShardedDatasource(Datasource):
    """Every ``count``-th read task of ``inner``, from a fixed number of tasks so all shards agree."""

    def __init__(self, inner: Any, index: int, count: int, num_tasks: int) -> None:
        self.inner, self.index, self.count, self.num_tasks = inner, index, count, num_tasks
        self.sizes_own_tasks = getattr(inner, "sizes_own_tasks", False)

    def get_name(self) -> str:
        return f"{self.inner.get_name()}[shard {self.index}/{self.count}]"

    def get_read_tasks(self, parallelism: int) -> list[Any]:
        return list(self.inner.get_read_tasks(self.num_tasks))[self.index :: self.count]

    def estimate_inmemory_data_size(self) -> int | None:
        size = self.inner.estimate_inmemory_data_size()
        return None if size is None else size // self.count

    def schema(self) -> pa.Schema | None:
        return self.inner.schema()  # type: ignore[no-any-return]

    def count_rows(self) -> int | None:
        return None

    def _wrap(self, inner: Any) -> ShardedDatasource | None:
        return None if inner is None else ShardedDatasource(inner, self.index, self.count, self.num_tasks)

    def apply_projection(self, columns: list[str]) -> ShardedDatasource | None:
        return self._wrap(self.inner.apply_projection(columns))

    def apply_filter(self, expr: Any, statistics: Any = None) -> ShardedDatasource | None:
        return self._wrap(push_filter(self.inner, expr, statistics))


class BlockFilesDatasource:
    """Blocks of a materialized dataset, read from their Arrow IPC files (mapped, zero-copy)
    or, for small ones, from the bytes their refs carry.

    Used in DataLoader workers, which cannot ask the parent's engine for blocks; ``owner``
    (the parent's materialized dataset, inherited through fork) keeps the files in place.
    """

    def __init__(self, refs: tuple[Any, ...], owner: Any) -> None:
        self.refs, self.owner = refs, owner

    def get_name(self) -> str:
        return f"BlockFiles[{len(self.refs)}]"

    def get_read_tasks(self, parallelism: int) -> list[Any]:
        from connectors.base import BlockMetadata, ReadTask

        return [ReadTask(_BlockFileReader(r), BlockMetadata(r.num_rows, r.size_bytes)) for r in self.refs]

    def estimate_inmemory_data_size(self) -> int:
        return sum(r.size_bytes for r in self.refs)

    def schema(self) -> None:
        return None

    def count_rows(self) -> int:
        return sum(r.num_rows for r in self.refs)

    def apply_projection(self, columns: list[str]) -> None:
        return None

    def apply_filter(self, expr: Any) -> None:
        return None


class _BlockFileReader:
    def __init__(self, ref: Any) -> None:
        self.ref = ref

    def __call__(self) -> list[pa.Table]:
        from engine import runner

        # the in-process backend reads a shared-memory store's blocks (files, or a ref's bytes);
        # a mapping stays open as long as the table's buffers reference it
        return [runner.backend(mode="local").get(self.ref)]


# ----- DataIterator.to_torch (deprecated in Ray Data, kept for code ported from it) -----------


class _EpochDataset(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """An IterableDataset whose every iteration calls ``make()`` (one epoch of the iterator)."""

    def __init__(self, make: Callable[[], Iterator[Any]]) -> None:
        self._make = make

    def __iter__(self) -> Iterator[Any]:
        return self._make()


def to_torch(
    iterator: DataIterator,
    *,
    label_column: str | None = None,
    feature_columns: Any = None,
    label_column_dtype: torch.dtype | None = None,
    feature_column_dtypes: Any = None,
    batch_size: int = 1,
    prefetch_batches: int = 1,
    drop_last: bool = False,
    local_shuffle_buffer_size: int | None = None,
    local_shuffle_seed: int | None = None,
    unsqueeze_label_tensor: bool = True,
    unsqueeze_feature_tensors: bool = True,
) -> torch.utils.data.IterableDataset:  # type: ignore[type-arg]
    """Ray Data's ``DataIterator.to_torch``: an IterableDataset of ``(features, label)`` batches.

    ``features`` is one ``(N, columns)`` tensor (``feature_columns`` a list, or None: every
    column but the label), a list of them (a list of lists) or a dict of them (a dict of
    lists); ``label`` is ``(N, 1)`` (``(N,)`` without ``unsqueeze_label_tensor``), or None
    without ``label_column``. Each column is ``(N, 1)`` before concatenation unless
    ``unsqueeze_feature_tensors=False``. Deprecated in Ray Data, and here: use
    ``iter_torch_batches``, which keeps columns apart and copies nothing.
    """
    warnings.warn(
        "DataIterator.to_torch is deprecated (as in Ray Data); use iter_torch_batches instead",
        DeprecationWarning,
        stacklevel=3,
    )
    check_batch_size(batch_size)
    feature_columns = feature_columns or None
    _check_feature_dtypes(feature_columns, feature_column_dtypes)

    def features_of(table: pa.Table) -> Any:
        if isinstance(feature_columns, Mapping):
            dtypes = feature_column_dtypes if isinstance(feature_column_dtypes, Mapping) else None
            return {
                key: _columns_tensor(table, list(cols), dtypes[key] if dtypes else feature_column_dtypes,
                                     unsqueeze_feature_tensors)
                for key, cols in feature_columns.items()
            }
        if feature_columns and isinstance(feature_columns[0], (list, tuple)):
            dtypes = feature_column_dtypes
            if not isinstance(dtypes, (list, tuple)):
                dtypes = [dtypes] * len(feature_columns)
            return [_columns_tensor(table, list(cols), dt, unsqueeze_feature_tensors)
                    for cols, dt in zip(feature_columns, dtypes, strict=True)]
        if feature_column_dtypes is not None and not isinstance(feature_column_dtypes, torch.dtype):
            msg = f"with feature_columns a list of names, feature_column_dtypes must be None or one torch.dtype, got {type(feature_column_dtypes)}"
            raise TypeError(msg)
        return _columns_tensor(table, list(feature_columns or table.column_names), feature_column_dtypes,
                               unsqueeze_feature_tensors)

    def epoch() -> Iterator[Any]:
        for table in iterator.iter_batches(
            batch_size=batch_size, batch_format="pyarrow", prefetch_batches=prefetch_batches, drop_last=drop_last,
            local_shuffle_buffer_size=local_shuffle_buffer_size, local_shuffle_seed=local_shuffle_seed,
        ):
            label = None
            if label_column:
                label = _columns_tensor(table, [label_column], label_column_dtype, unsqueeze_label_tensor)
                table = table.drop_columns([label_column])
            yield features_of(table), label

    return _EpochDataset(epoch)


def _check_feature_dtypes(columns: Any, dtypes: Any) -> None:
    """Ray Data's checks of ``feature_column_dtypes`` against the shape of ``feature_columns``."""
    if not dtypes or isinstance(dtypes, torch.dtype) or columns is None:
        return
    if isinstance(columns, Mapping):
        if not isinstance(dtypes, Mapping):
            msg = f"If `feature_columns` is a dict, `feature_column_dtypes` must be None, `torch.dtype`, or dict, got {type(dtypes)}."
            raise TypeError(msg)
        if set(columns) != set(dtypes):
            msg = "`feature_columns` and `feature_column_dtypes` must have the same keys."
            raise ValueError(msg)
        if any(not cols for cols in columns.values()):
            msg = "column list may not be empty"
            raise ValueError(msg)
    elif isinstance(columns[0], (list, tuple)):
        if not isinstance(dtypes, (list, tuple)):
            msg = f"If `feature_columns` is a list of lists, `feature_column_dtypes` must be None, `torch.dtype`, or a sequence, got {type(dtypes)}."
            raise TypeError(msg)
        if len(columns) != len(dtypes):
            msg = "`feature_columns` and `feature_column_dtypes` must have the same length."
            raise ValueError(msg)
        if any(not cols for cols in columns):
            msg = "column list may not be empty"
            raise ValueError(msg)


def _columns_tensor(table: pa.Table, columns: list[str], dtype: torch.dtype | None, unsqueeze: bool) -> torch.Tensor:
    """``columns`` of ``table`` as one tensor: each ``(N, 1)`` (or ``(N, ...)``) side by side."""
    batch = to_batch(table.select(columns), "numpy")
    tensors = []
    for name in columns:
        try:
            tensor = column_tensor(name, batch[name], dtype, private=True)
        except (TypeError, ValueError, RuntimeError) as err:
            msg = f"Failed to convert column {name} to a Torch Tensor of dtype {dtype}. See above exception chain for the exact failure."
            raise ValueError(msg) from err
        tensors.append(tensor.unsqueeze(1) if unsqueeze else tensor)
    if len(tensors) > 1:
        return torch.cat(tensors, dim=1)  # new memory
    return tensors[0].clone()  # not a view of the block: the caller may write into it


__all__ = ["DeviceMover", "TorchIterableDataset", "iter_torch_batches", "resolve_device", "to_tensors", "to_torch"]

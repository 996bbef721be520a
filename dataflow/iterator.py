"""DataIterator: how a consumer reads a dataset, as a chain of named stages.

    execute -> fetch (map blocks zero-copy) -> rebatch (exact batch_size) -> shuffle (optional,
    local buffer) -> format (numpy / pandas / pyarrow / polars) -> prefetch (background thread)

``iter_torch_batches`` continues after format with collate (tensors) -> pin -> to device; those
stages live in ``dataflow.torch_batches``, the one module that imports torch (on first use).
``iter_jax_batches`` continues with check and pad -> synchronize hosts -> shard over the devices,
in ``dataflow.jax_batches``, the one module that imports jax (on first use).

Each stage is a generator. Blocks are released back to the engine as soon as every row of
them has been handed on, so a slow consumer holds at most its prefetch window.

``iter_tf_batches`` and ``to_tf`` turn the numpy batches into TensorFlow tensors in
``dataflow.tf_batches``, the one module that imports tensorflow (on first use).
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from dataflow import progress
from dataflow.context import DataContext
from dataflow.schema import Schema
from engine.block_format import concat_blocks, iter_rows, slice_rows, to_batch

_END = object()


class Epochs:
    """What ``iter_batches``, ``iter_rows`` and the other ``iter_*`` return. As Ray's, an
    iterable: each loop over it (each ``iter``) is a pass of its own, from the first row, so
    ``batches = it.iter_torch_batches()`` looped over once per epoch trains every epoch (a
    generator gave one pass and then nothing). It is an iterator too, for code that calls
    ``next`` on it: ``next`` continues the pass it started, and so does a loop begun after it.
    The first pass is made at the call (arguments are checked there, as before)."""

    def __init__(self, first: Iterator[Any], again: Callable[[], Iterator[Any]]) -> None:
        self._current: Iterator[Any] | None = first
        self._again = again

    def __iter__(self) -> Iterator[Any]:
        current, self._current = self._current, None
        return current if current is not None else self._again()

    def __next__(self) -> Any:
        if self._current is None:
            self._current = self._again()
        return next(self._current)

    def close(self) -> None:
        """Stop the pass ``next`` is reading (its blocks are released at once)."""
        close = getattr(self._current, "close", None)
        if close is not None:
            close()


def _epochs(method: Callable[..., Iterator[Any]]) -> Callable[..., Epochs]:
    """``method``'s passes as ``Epochs``: each new loop calls it again with the same arguments."""

    @functools.wraps(method)
    def passes(self: Any, *args: Any, **kwargs: Any) -> Epochs:
        return Epochs(method(self, *args, **kwargs), lambda: method(self, *args, **kwargs))

    return passes


class DataIterator:
    """Iterates one dataset; every ``iter_*`` call runs the plan again (one epoch)."""

    def __init__(self, execute: Callable[[], Any], name: str = "Dataset", dataset: Any = None) -> None:
        """``execute()`` starts one epoch; ``dataset`` is the Dataset iterated, when there is one
        (``schema`` and ``materialize`` ask it)."""
        self._execute = execute
        self._name = name
        self._dataset = dataset
        self._last_handle: Any = None
        self._epoch = -1
        self._rows_consumed = 0
        self._skip_rows = 0

    def __repr__(self) -> str:
        return f"DataIterator({self._dataset!r})" if self._dataset is not None else f"DataIterator({self._name})"

    def __getattr__(self, name: str) -> Any:
        # only reached for a name the iterator lacks: say so when it is one of Ray Data's
        from dataflow import ray_api

        raise ray_api.attribute_error(self, name, ray_api.RAY_DATA_ITERATOR_API)

    def get_context(self) -> DataContext:
        """The ``DataContext`` the epochs run with (``Dataset.context``: the current one)."""
        return DataContext.get_current()

    def stats(self) -> str:
        """Per-operator statistics of the last epoch this iterator ran (see ``Dataset.stats``)."""
        stats = getattr(self._last_handle, "stats", None)
        if stats is None:
            return ""  # as Ray's: no epoch has run yet
        return str(stats())

    def schema(self) -> Schema | None:
        """The schema of the dataset iterated (``Dataset.schema``); for an iterator of
        ``streaming_split``, the schema its plan tells without running, else None."""
        return self._dataset.schema() if self._dataset is not None else None

    def materialize(self) -> Any:
        """Run an epoch and keep its blocks: a ``MaterializedDataset``, as Ray Data's."""
        if self._dataset is not None:
            return self._dataset.materialize()
        from dataflow.context import options
        from dataflow.read_api import from_arrow

        tables = list(self.iter_blocks())  # an epoch of a split: its blocks are not ours to keep
        with options(preserve_order=True):
            return from_arrow(tables).materialize()

    def to_torch(
        self,
        *,
        label_column: str | None = None,
        feature_columns: list[str] | list[list[str]] | dict[str, list[str]] | None = None,
        label_column_dtype: Any = None,
        feature_column_dtypes: Any = None,
        batch_size: int = 1,
        prefetch_batches: int = 1,
        drop_last: bool = False,
        local_shuffle_buffer_size: int | None = None,
        local_shuffle_seed: int | None = None,
        unsqueeze_label_tensor: bool = True,
        unsqueeze_feature_tensors: bool = True,
    ) -> Any:
        """A torch ``IterableDataset`` of ``(features, label)`` tensors (deprecated in Ray Data,
        as here: use ``iter_torch_batches``). See ``dataflow.torch_batches.to_torch``."""
        from dataflow.torch_batches import to_torch

        return to_torch(
            self, label_column=label_column, feature_columns=feature_columns, label_column_dtype=label_column_dtype,
            feature_column_dtypes=feature_column_dtypes, batch_size=batch_size, prefetch_batches=prefetch_batches,
            drop_last=drop_last, local_shuffle_buffer_size=local_shuffle_buffer_size,
            local_shuffle_seed=local_shuffle_seed, unsqueeze_label_tensor=unsqueeze_label_tensor,
            unsqueeze_feature_tensors=unsqueeze_feature_tensors,
        )

    @_epochs
    def iter_tf_batches(
        self,
        *,
        prefetch_batches: int = 1,
        batch_size: int | None = 256,
        dtypes: Any = None,
        drop_last: bool = False,
        local_shuffle_buffer_size: int | None = None,
        local_shuffle_seed: int | None = None,
    ) -> Iterator[Any]:
        """Batches as dicts of TensorFlow tensors (see ``dataflow.tf_batches.iter_tf_batches``)."""
        from dataflow.tf_batches import iter_tf_batches

        return iter_tf_batches(
            self, prefetch_batches=prefetch_batches, batch_size=batch_size, dtypes=dtypes, drop_last=drop_last,
            local_shuffle_buffer_size=local_shuffle_buffer_size, local_shuffle_seed=local_shuffle_seed,
        )

    def to_tf(
        self,
        feature_columns: str | list[str],
        label_columns: str | list[str],
        *,
        additional_columns: str | list[str] | None = None,
        prefetch_batches: int = 1,
        batch_size: int = 1,
        drop_last: bool = False,
        local_shuffle_buffer_size: int | None = None,
        local_shuffle_seed: int | None = None,
        feature_type_spec: Any = None,
        label_type_spec: Any = None,
        additional_type_spec: Any = None,
    ) -> Any:
        """A ``tf.data.Dataset`` of ``(features, labels)`` batches, type specs from the schema
        unless given (see ``dataflow.tf_batches.to_tf``)."""
        from dataflow.tf_batches import to_tf

        return to_tf(
            self, feature_columns, label_columns, additional_columns=additional_columns,
            prefetch_batches=prefetch_batches, batch_size=batch_size, drop_last=drop_last,
            local_shuffle_buffer_size=local_shuffle_buffer_size, local_shuffle_seed=local_shuffle_seed,
            feature_type_spec=feature_type_spec, label_type_spec=label_type_spec,
            additional_type_spec=additional_type_spec,
        )

    # resuming an epoch -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where the current epoch stands: how many rows this iterator has handed out. Plain
        data (save it with a training checkpoint); ``load_state_dict`` resumes from it."""
        return {"epoch": max(self._epoch, 0), "rows_consumed": self._rows_consumed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next epoch starts after ``state["rows_consumed"]`` rows.

        Exact (no row seen twice or skipped, batches as before) when the dataset's order is the
        same on every run: ``preserve_order=True``, or what a seeded ``random_shuffle`` or a
        ``sort`` outputs. The rows before that point are computed again and dropped; a local
        shuffle buffer is applied after the skip.
        """
        rows = int(state.get("rows_consumed", 0))
        if rows < 0:
            msg = f"rows_consumed must be >= 0, got {rows}"
            raise ValueError(msg)
        self._skip_rows = rows
        self._epoch = int(state.get("epoch", 0)) - 1

    def _counted(self, items: Iterator[Any], *, sized: bool = False) -> Iterator[Any]:
        """``items`` handed to the caller, counted for ``state_dict`` as the caller takes them.
        ``sized``: ``items`` are ``(item, rows)`` pairs (a padded batch holds more rows than it read).

        Closing this generator closes ``items`` at once, on the caller's thread: the stages below
        restore per-thread state (torch's thread count) and release blocks in their ``finally``,
        which must not wait for a garbage collection that may run on another thread. (A prefetch
        thread closes the stages it runs when it stops, which the close waits for, up to
        ``PREFETCH_JOIN_S``.)
        """
        try:
            for item in items:
                if sized:
                    item, rows = item
                else:
                    rows = _rows_of(item)
                self._rows_consumed += rows
                yield item
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    def _skipping(self, blocks: Iterator[pa.Table]) -> Iterator[pa.Table]:
        """A new epoch: the blocks after the rows a loaded state says were consumed."""
        self._epoch += 1
        skip, self._skip_rows = self._skip_rows, 0
        self._rows_consumed = skip
        for block in blocks:
            if skip >= block.num_rows:
                skip -= block.num_rows
                continue
            yield block.slice(skip) if skip else block
            skip = 0

    def iter_blocks(self, *, on_execute: Callable[[Any], None] | None = None) -> Iterator[pa.Table]:
        """Blocks as Arrow tables, each released once the caller moves to the next.

        ``on_execute(handle)`` is called once the plan runs (stages that need to know the block
        store, such as the torch stage deciding whether zero-copy tensors are private, use it).
        """
        handle = self._execute()
        self._last_handle = handle
        if on_execute is not None:
            on_execute(handle)
        refs = handle.iter_refs()
        closed_early = False
        rows = 0
        try:
            for ref in refs:
                table = handle.get(ref)
                rows += table.num_rows
                if self._dataset is not None and getattr(self._dataset, "_cached_schema", 0) is None:
                    self._dataset._cached_schema = table.schema  # known now: schema() need not run it again
                try:
                    yield table
                finally:
                    handle.release(ref)
            if self._dataset is not None:  # a whole run: its row count is known (repr shows it, as Ray's)
                self._dataset._cached_num_rows = rows
        except GeneratorExit:  # perhaps by the garbage collector, on any thread: the summary is the thread's
            closed_early = True
            raise
        finally:
            refs.close()  # type: ignore[attr-defined]
            if not closed_early:  # run to its end or failed: the summary is out before the caller goes on
                progress.settle(handle)

    @_epochs
    def iter_batches(
        self,
        *,
        prefetch_batches: int = 1,
        batch_size: int | None = 256,
        batch_format: str | None = "default",
        drop_last: bool = False,
        local_shuffle_buffer_size: int | None = None,
        local_shuffle_seed: int | None = None,
    ) -> Iterator[Any]:
        """Batches of exactly ``batch_size`` rows (the last may be short unless ``drop_last``);
        ``batch_format=None``: ``pyarrow.Table``s, as Ray's native format."""
        check_batch_size(batch_size)
        tables = self.iter_tables(batch_size, drop_last, local_shuffle_buffer_size, local_shuffle_seed)
        arrow_backed = DataContext.get_current().enable_arrow_backed_pandas_conversion
        batches = (to_batch(t, batch_format, arrow_backed) for t in tables)
        return self._counted(prefetch(batches, prefetch_batches, adaptive=True))

    def iter_tables(
        self,
        batch_size: int | None,
        drop_last: bool = False,
        local_shuffle_buffer_size: int | None = None,
        local_shuffle_seed: int | None = None,
        *,
        on_execute: Callable[[Any], None] | None = None,
    ) -> Iterator[pa.Table]:
        """The stages every ``iter_*`` shares: fetch -> rebatch -> shuffle, as Arrow tables."""
        tables = rebatch(self._skipping(self.iter_blocks(on_execute=on_execute)), batch_size, drop_last)
        if local_shuffle_buffer_size:
            tables = local_shuffle(tables, batch_size or 256, local_shuffle_buffer_size, local_shuffle_seed)
        return tables

    @_epochs
    def iter_torch_batches(
        self,
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
    ) -> Iterator[Any]:
        """Batches as dicts of torch tensors (see ``dataflow.torch_batches.sized_torch_batches``)."""
        from dataflow.torch_batches import sized_torch_batches

        return self._counted(sized_torch_batches(
            self, prefetch_batches=prefetch_batches, batch_size=batch_size, dtypes=dtypes, device=device,
            collate_fn=collate_fn, drop_last=drop_last, local_shuffle_buffer_size=local_shuffle_buffer_size,
            local_shuffle_seed=local_shuffle_seed, pin_memory=pin_memory,
        ), sized=True)

    @_epochs
    def iter_jax_batches(
        self,
        *,
        prefetch_batches: int = 1,
        batch_size: int = 256,
        dtypes: Any = None,
        collate_fn: Any = None,
        drop_last: bool = False,
        local_shuffle_buffer_size: int | None = None,
        local_shuffle_seed: int | None = None,
        synchronize_batches: bool = False,
        paddings: Any = None,
    ) -> Iterator[Any]:
        """Batches as dicts of ``jax.Array``s sharded over every JAX device along the rows (one
        array when ``collate_fn`` returns one); see ``dataflow.jax_batches.iter_jax_batches``."""
        from dataflow.jax_batches import iter_jax_batches

        return self._counted(iter_jax_batches(
            self, prefetch_batches=prefetch_batches, batch_size=batch_size, dtypes=dtypes, collate_fn=collate_fn,
            drop_last=drop_last, local_shuffle_buffer_size=local_shuffle_buffer_size,
            local_shuffle_seed=local_shuffle_seed, synchronize_batches=synchronize_batches, paddings=paddings,
        ), sized=True)

    @_epochs
    def iter_rows(self) -> Iterator[dict[str, Any]]:
        """Rows as dicts."""
        for table in self._skipping(self.iter_blocks()):
            for row in iter_rows(table):
                self._rows_consumed += 1
                yield row


def _rows_of(batch: Any) -> int:
    """Rows in a batch of any format (a dict of arrays or tensors, a table, a data frame)."""
    if isinstance(batch, dict):
        first = next(iter(batch.values()), None)
        return len(first) if first is not None else 0
    num_rows = getattr(batch, "num_rows", None)
    if num_rows is not None:
        return int(num_rows)
    height = getattr(batch, "height", None)  # polars
    return int(height) if isinstance(height, int) else len(batch)


def check_batch_size(batch_size: int | None) -> None:
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0):
        msg = f"batch_size must be a positive integer or None, got {batch_size!r}"
        raise ValueError(msg)


def rebatch(blocks: Iterator[pa.Table], batch_size: int | None, drop_last: bool = False) -> Iterator[pa.Table]:
    """Tables of exactly ``batch_size`` rows across block boundaries; None: one per block."""
    if batch_size is None:
        for block in blocks:
            if block.num_rows:
                yield block
        return
    pending: list[pa.Table] = []
    have = 0
    for block in blocks:
        offset = 0
        n = block.num_rows
        while offset < n:
            if not pending and n - offset >= batch_size:
                yield block.slice(offset, batch_size)  # zero-copy: the common case
                offset += batch_size
                continue
            take = min(batch_size - have, n - offset)
            pending.append(block.slice(offset, take))
            have += take
            offset += take
            if have == batch_size:
                yield _concat(pending)
                pending, have = [], 0
    if have and not drop_last:
        yield _concat(pending)


def _concat(tables: list[pa.Table]) -> pa.Table:
    if len(tables) == 1:
        return tables[0]
    return concat_blocks(tables).combine_chunks()


def local_shuffle(
    tables: Iterator[pa.Table], batch_size: int, buffer_size: int, seed: int | None
) -> Iterator[pa.Table]:
    """Rows shuffled within a buffer of at least ``buffer_size`` rows, re-cut to ``batch_size``."""
    rng = np.random.default_rng(seed)
    buffer: list[pa.Table] = []
    rows = 0
    for table in tables:
        buffer.append(table)
        rows += table.num_rows
        if rows < buffer_size + batch_size:
            continue
        mixed = _shuffled(buffer, rng)
        emit = (rows - buffer_size) // batch_size * batch_size
        for start in range(0, emit, batch_size):
            yield slice_rows(mixed, start, batch_size)
        buffer, rows = [mixed.slice(emit)], rows - emit
    if rows:
        mixed = _shuffled(buffer, rng)
        for start in range(0, rows, batch_size):
            yield slice_rows(mixed, start, batch_size)


def _shuffled(tables: list[pa.Table], rng: np.random.Generator) -> pa.Table:
    table = concat_blocks(tables)
    return table.take(pa.array(rng.permutation(table.num_rows)))


class _Window:
    """The bounded hand-off between a prefetch thread and its consumer. Both sides wait on one
    condition and wake each other; nothing polls on a timer."""

    def __init__(self, depth: int) -> None:
        self._items: deque[Any] = deque()
        self._depth = depth
        self._cond = threading.Condition()
        self._closed = False

    def put(self, item: Any, final: bool = False) -> bool:
        """Hand ``item`` over, waiting while ``depth`` items wait (not for the ``final`` one);
        False once the consumer has gone."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed or final or len(self._items) < self._depth)
            if self._closed:
                return False
            self._items.append(item)
            self._cond.notify_all()
            return True

    def get(self) -> Any:
        with self._cond:
            self._cond.wait_for(lambda: bool(self._items))
            item = self._items.popleft()
            self._cond.notify_all()
            return item

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._items.clear()
            self._cond.notify_all()


PREFETCH_JOIN_S = 10.0
"""How long a consumer that stops early waits for the prefetch thread to let go of the plan
(it is inside its current item); past that the thread finishes on its own."""


INLINE_BELOW_S = 100e-6
"""A consumer whose own step between two batches averages less than this gains at most that
much from a batch made ahead of it, and pays a hand-off between threads for every one: an
adaptive ``prefetch`` then lets it make its batches itself."""


def prefetch(items: Iterator[Any], depth: int, adaptive: bool = False) -> Iterator[Any]:
    """Run ``items`` on a background thread, ``depth`` ahead of the consumer (0: inline).

    ``adaptive``: only while the consumer is slow (see ``_SharedSource``); for items any thread
    may make (batches in a plain format, not ones a device copy was started for).
    """
    if depth <= 0:
        yield from items
        return
    if adaptive:
        yield from _adaptive_prefetch(items, depth)
        return
    window = _Window(depth)

    def produce() -> None:
        try:
            for item in items:
                if not window.put(item):
                    break
            window.put(_END, final=True)
        except BaseException as err:  # handed to the consumer, raised there
            window.put(err, final=True)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name="dataflow-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = window.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        window.close()
        thread.join(PREFETCH_JOIN_S)


def _adaptive_prefetch(items: Iterator[Any], depth: int) -> Iterator[Any]:
    source = _SharedSource(items, depth)
    thread = threading.Thread(target=source.run_ahead, name="dataflow-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = source.get()
            if item is _END:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        source.close()
        thread.join(PREFETCH_JOIN_S)


class _Failed:
    """The error ``items`` raised, as the last item."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class _SharedSource:
    """``items``, advanced by one thread at a time: the consumer, or a thread that makes up to
    ``depth`` items ahead while the consumer is away.

    Whoever holds ``_pull_lock`` advances ``items`` and, when it is the prefetch thread, puts
    the item in ``_buffer`` before letting go, so items come out in order. The consumer takes
    the buffered item if there is one and otherwise makes the next itself, never waiting for a
    hand-off it could do without. While the consumer comes back within ``INLINE_BELOW_S`` (a
    moving average of its own time between items), the prefetch thread stands aside (it waits,
    woken when that changes or at the end): two threads taking turns on every item would cost
    more than the overlap saves. Nothing waits on a timer.
    """

    def __init__(self, items: Iterator[Any], depth: int) -> None:
        self._items = items
        self._depth = depth
        self._pull_lock = threading.Lock()
        self._cond = threading.Condition()
        self._buffer: deque[Any] = deque()
        self._done = False
        """The last item (the end or an error) was made."""
        self._closed = False
        self._inline = False
        self._away_s = 0.0
        """Moving average of the consumer's time between taking an item and asking again."""
        self._returned_at: float | None = None

    def _pull(self) -> Any:
        """The next item (holding ``_pull_lock``); the end and errors are final items."""
        try:
            return next(self._items)
        except StopIteration:
            return _END
        except BaseException as err:  # raised on the consumer's thread, where it belongs
            return _Failed(err)

    def get(self) -> Any:
        now = time.perf_counter()
        if self._returned_at is not None:
            self._away_s = 0.75 * self._away_s + 0.25 * (now - self._returned_at)
            inline = self._away_s < INLINE_BELOW_S
            if inline != self._inline:
                with self._cond:
                    self._inline = inline
                    self._cond.notify_all()
        with self._pull_lock:
            with self._cond:
                buffered = bool(self._buffer)
                item = None
                if buffered:  # room for the prefetch thread's next item
                    item = self._buffer.popleft()
                    self._cond.notify_all()
            if not buffered:
                item = self._pull()
                if item is _END or isinstance(item, _Failed):
                    with self._cond:
                        self._done = True
                        self._cond.notify_all()
        self._returned_at = time.perf_counter()
        return item

    def run_ahead(self) -> None:
        """The prefetch thread: make items while there is room and the consumer is slow."""
        try:
            self._run_ahead()
        except BaseException as err:  # (not the source's: the thread's own) ends the items with it
            with self._cond:
                if not self._done:
                    self._buffer.append(_Failed(err))
                    self._done = True
                self._cond.notify_all()
        finally:
            with self._pull_lock:
                close = getattr(self._items, "close", None)
                if close is not None:
                    close()

    def _run_ahead(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(
                    lambda: self._closed or self._done or (not self._inline and len(self._buffer) < self._depth)
                )
                if self._closed or self._done:
                    return
            with self._pull_lock:
                with self._cond:
                    if self._closed or self._done or self._inline or len(self._buffer) >= self._depth:
                        continue
                item = self._pull()
                with self._cond:
                    self._buffer.append(item)
                    self._done = item is _END or isinstance(item, _Failed)
                    self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._buffer.clear()
            self._cond.notify_all()

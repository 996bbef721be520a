"""RandomAccessDataset: rows looked up by key (Ray Data's ``Dataset.to_random_access_dataset``).

    sort by key -> materialize (blocks in the object store) -> map each block once, zero-copy
    -> per block its first and last key -> a lookup: bisect over the blocks' last keys, then
    ``np.searchsorted`` in that block's key column, on a pool of ``num_workers`` threads

Ray serves lookups from actors that each hold some of the blocks. Here the blocks are mapped
into the driver once (zero-copy from the shared-memory store) and a pool of threads shares them
all, so ``get_async`` returns a ``concurrent.futures.Future`` where Ray's returns an ObjectRef:
call ``.result()`` where Ray's code calls ``ray.get``.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from dataflow.context import options
from engine.block_format import rows_of
from engine.errors import ColumnNotFoundError

if TYPE_CHECKING:
    import pyarrow.compute as pc

    from dataflow.dataset import Dataset, MaterializedDataset
else:
    from dataflow.lazy_compute import pc

DEFAULT_NUM_WORKERS = 4
"""Ray's default is four workers per node of the cluster; this is one node."""


class RandomAccessDataset:
    """Random access to the rows of a dataset by the value of one column (see
    ``Dataset.to_random_access_dataset``).

    ``get_async(key)`` and ``multiget(keys)`` return rows as dicts, as ``Dataset.take()`` does,
    and None for a key no row has; of rows with equal keys, the first in the dataset's order (the
    sort is stable), as Ray's binary search finds. The sorted blocks are held until ``close()``
    (or ``with``'s end), or until this object is collected.
    """

    def __init__(self, ds: Dataset, key: str, num_workers: int | None = None) -> None:
        """Sort ``ds`` by ``key`` and index its blocks (use ``ds.to_random_access_dataset``)."""
        start = time.perf_counter()
        _check_key(ds, key)
        self._num_workers = _check_num_workers(num_workers)
        self._key = key
        self._sorted: MaterializedDataset | None = ds.sort(key).materialize()
        """Owns the blocks ``_blocks`` map: they live as long as it does."""
        blocks = [_Block(table, key) for table in _read_blocks(self._sorted)]
        self._blocks = [block for block in blocks if block.num_keys]  # Ray's "non-empty blocks"
        self._upper_bounds = [block.last for block in self._blocks]
        self._lower_bound = self._blocks[0].first if self._blocks else None
        self._num_rows = sum(block.table.num_rows for block in blocks)
        self._pool = ThreadPoolExecutor(self._num_workers, thread_name_prefix="dataflow-random-access")
        self._stats = _AccessStats()
        self._build_time = time.perf_counter() - start

    def __repr__(self) -> str:
        return f"RandomAccessDataset(key={self._key!r}, num_blocks={len(self._blocks)}, num_rows={self._num_rows})"

    def __enter__(self) -> RandomAccessDataset:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # lookups ----------------------------------------------------------------------------------
    def get_async(self, key: Any) -> Future[dict[str, Any] | None]:
        """The row whose key column equals ``key`` (a dict), or None: a ``Future`` whose
        ``result()`` is what Ray's ``ray.get`` of its ObjectRef gives.

        Raises ``TypeError`` at once when ``key`` cannot be compared with the column's values
        (a string for an integer column).
        """
        self._check_open()
        index = self._find_block(key)
        if index is None:
            done: Future[dict[str, Any] | None] = Future()
            done.set_result(None)
            return done
        return self._pool.submit(self._lookup_one, index, key)

    def multiget(self, keys: list[Any]) -> list[dict[str, Any] | None]:
        """The rows for ``keys``, in their order (None for a key no row has). One lookup per
        block the keys fall in, run on the worker threads at once."""
        self._check_open()
        keys = list(keys)
        positions: dict[int, list[int]] = defaultdict(list)  # block -> where its keys are in ``keys``
        for position, key in enumerate(keys):
            index = self._find_block(key)
            if index is not None:
                positions[index].append(position)
        futures = {index: self._pool.submit(self._lookup, index, [keys[p] for p in at]) for index, at in positions.items()}
        results: list[dict[str, Any] | None] = [None] * len(keys)
        for index, future in futures.items():
            for position, row in zip(positions[index], future.result(), strict=True):
                results[position] = row
        return results

    def stats(self) -> str:
        """Build time, workers and access timing, in Ray's format. Every worker reads every block
        here, so "Blocks per worker" is the number of blocks."""
        accesses = self._stats.per_worker(self._num_workers)
        blocks = len(self._blocks)
        msg = "RandomAccessDataset:\n"
        msg += f"- Build time: {round(self._build_time, 2)}s\n"
        msg += f"- Num workers: {self._num_workers}\n"
        msg += f"- Blocks per worker: {blocks} min, {blocks} max, {blocks} mean\n"
        msg += (f"- Accesses per worker: {min(accesses)} min, {max(accesses)} max, "
                f"{int(sum(accesses) / len(accesses))} mean\n")
        msg += f"- Mean access time: {int(self._stats.total_time / (1 + sum(accesses)) * 1e6)}us\n"
        return msg

    def close(self) -> None:
        """Finish the lookups under way, stop the worker threads and let go of the blocks (the
        sorted dataset frees them once nothing else holds it). Lookups after this raise."""
        self._pool.shutdown(wait=True)
        self._blocks, self._upper_bounds, self._lower_bound = [], [], None
        self._sorted = None

    # inside -------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._sorted is None:
            msg = "this RandomAccessDataset is closed; make another with Dataset.to_random_access_dataset"
            raise RuntimeError(msg)

    def _find_block(self, key: Any) -> int | None:
        """The block holding the first row with ``key`` if any does: the first whose last key is
        at least ``key`` (Ray's ``_find_le``)."""
        try:
            index = bisect.bisect_left(self._upper_bounds, key)
            if index == len(self._upper_bounds) or key < self._lower_bound:
                return None
        except TypeError:
            kind = type(self._lower_bound).__name__
            msg = (f"cannot look up {key!r} ({type(key).__name__}) in the key column {self._key!r}, whose "
                   f"values are of type {kind}: pass a key of that type")
            raise TypeError(msg) from None
        return index

    def _lookup_one(self, index: int, key: Any) -> dict[str, Any] | None:
        return self._lookup(index, [key])[0]

    def _lookup(self, index: int, keys: list[Any]) -> list[dict[str, Any] | None]:
        start = time.perf_counter()
        rows = self._blocks[index].find(keys)
        self._stats.record(time.perf_counter() - start)
        return rows


class _Block:
    """One block of the sorted dataset: its rows and its key column, ready to search.

    Rows with a null or NaN key sort last and are not indexed (no key finds them): ``num_keys``
    counts the others, which come first.
    """

    def __init__(self, table: pa.Table, key: str) -> None:
        self.table = table
        self._column = table[key]
        self.num_keys = _num_sortable(self._column)
        self.first = self._column[0].as_py() if self.num_keys else None
        self.last = self._column[self.num_keys - 1].as_py() if self.num_keys else None

    @cached_property
    def keys(self) -> np.ndarray:
        """The indexed keys as numpy: a view of the block for numbers (no copy when the block is
        one chunk), Python objects otherwise (made on first use; two threads racing to make it
        make the same array)."""
        column = self._column.slice(0, self.num_keys)
        if pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
            return column.to_numpy()
        return _object_array(column.to_pylist())

    def find(self, keys: list[Any]) -> list[dict[str, Any] | None]:
        """The first row with each key, or None (``keys`` all at most ``last``)."""
        indexed = self.keys
        wanted = _object_array(keys) if indexed.dtype == object else np.asarray(keys)
        at = np.searchsorted(indexed, wanted)  # side="left": the first of equal keys
        hits = np.flatnonzero(at < len(indexed))
        hits = hits[indexed[at[hits]] == wanted[hits]]
        results: list[dict[str, Any] | None] = [None] * len(keys)
        for position, row in zip(hits.tolist(), rows_of(self.table.take(at[hits])), strict=True):
            results[position] = row
        return results


class _AccessStats:
    """Lookups each worker thread ran and the time they took (``RandomAccessDataset.stats``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._accesses: dict[str, int] = {}
        self.total_time = 0.0

    def record(self, seconds: float) -> None:
        name = threading.current_thread().name
        with self._lock:
            self._accesses[name] = self._accesses.get(name, 0) + 1
            self.total_time += seconds

    def per_worker(self, num_workers: int) -> list[int]:
        """Accesses of each of ``num_workers`` threads (0 for one that has run none)."""
        with self._lock:
            counts = list(self._accesses.values())
        return counts + [0] * (num_workers - len(counts))


def _check_key(ds: Dataset, key: str) -> None:
    if not isinstance(key, str):
        msg = f"key must be the name of one column, got {key!r}"
        raise TypeError(msg)
    columns = ds.columns()  # as Ray's: the schema, running the plan for a block if need be
    if columns and key not in columns:
        msg = (f"to_random_access_dataset: you specified the key column {key!r}, but there's no such "
               f"column in the dataset. The dataset has columns: {columns}")
        raise ColumnNotFoundError(msg)


def _check_num_workers(num_workers: int | None) -> int:
    if num_workers is None:
        return DEFAULT_NUM_WORKERS
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        msg = f"num_workers must be a positive integer or None, got {num_workers!r}"
        raise ValueError(msg)
    return num_workers


def _read_blocks(ds: MaterializedDataset) -> list[pa.Table]:
    """The blocks of ``ds`` in its order, each mapped once. They stay valid after the read:
    the blocks are ``ds``'s, and only its collection frees them."""
    with options(preserve_order=True):
        return list(ds.iterator().iter_blocks())


def _object_array(values: list[Any]) -> np.ndarray:
    """``values`` as a 1-d array of Python objects (``np.array`` would make tuples a 2nd axis)."""
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


def _num_sortable(column: pa.ChunkedArray) -> int:
    """Values that are neither null nor NaN (the sort puts those last)."""
    unsortable = column.null_count
    if pa.types.is_floating(column.type):
        unsortable += pc.sum(pc.is_nan(column)).as_py() or 0
    return len(column) - unsortable


__all__ = ["RandomAccessDataset"]

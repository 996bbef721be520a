"""Cutting a dataset into materialized parts: ``split``, ``split_at_indices``,
``split_proportionately``, ``train_test_split``; and ``streaming_train_test_split``, which
stays lazy. Arguments, checks and rounding are Ray Data's.

The dataset is materialized once (in row order: with ``preserve_order``, so a row number means
the same on every run); the cuts are computed from its blocks' row counts. A part is
made of the parent's blocks, not copies of them: whole blocks are shared (the part keeps the
parent's blocks alive, as any dataset read from a materialized one does), and only a block a cut
runs through is sliced, by a task that writes the slice as a new block the part owns. A part is
itself made by ``materialize()`` over a plan of those blocks (``InputBlocks``, and a slicing
step for a cut block), so its blocks are freed when it is garbage collected, as for any
materialized dataset.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from dataflow.context import DataContext, options
from dataflow.plan import InputBlocks, LogicalNode, Union
from dataflow.udf import builtin_node
from engine import runner

if TYPE_CHECKING:
    from dataflow.dataset import Dataset, MaterializedDataset

BlockRef = Any
"""A block of a materialized dataset (the engine's reference to it; dataflow only reads
``num_rows`` and passes it back)."""


# ----- the steps that cut a block ---------------------------------------------------------------


class SliceRows:
    """Rows ``[offset, offset + length)`` of a block."""

    def __init__(self, offset: int, length: int) -> None:
        self.offset, self.length = offset, length

    def __call__(self, table: pa.Table) -> pa.Table:
        return table.slice(self.offset, self.length)


class TakeRows:
    """The rows of a block where ``mask`` is true."""

    def __init__(self, mask: np.ndarray) -> None:
        self.mask = mask

    def __call__(self, table: pa.Table) -> pa.Table:
        return table.filter(pa.array(self.mask, pa.bool_()))


Part = tuple[BlockRef, "SliceRows | TakeRows | None"]
"""A block of the parent and which of its rows a part takes (None: all of them)."""


def _build(parent: MaterializedDataset, parts: list[Part]) -> MaterializedDataset:
    """A materialized dataset of ``parts``, in order: whole blocks shared, cut ones sliced."""
    from dataflow.dataset import Dataset

    owner = parent._blocks
    nodes: list[LogicalNode] = []
    whole: list[BlockRef] = []
    for ref, rows in parts:
        if rows is None:
            whole.append(ref)
            continue
        if whole:
            nodes.append(InputBlocks(tuple(whole), owner))
            whole = []
        nodes.append(builtin_node(InputBlocks((ref,), owner), "Split", rows, preserves_rows=False))
    if whole or not nodes:
        nodes.append(InputBlocks(tuple(whole), owner))
    if len(nodes) == 1:
        return Dataset(nodes[0]).materialize()
    with options(preserve_order=True):  # the pieces in the order of the rows
        return Dataset(Union(tuple(nodes))).materialize()


def _parts_between(refs: Sequence[BlockRef], start: int, end: int) -> list[Part]:
    """The parts holding rows ``[start, end)`` of the blocks ``refs``."""
    parts: list[Part] = []
    offset = 0
    for ref in refs:
        lo, hi = offset, offset + ref.num_rows
        offset = hi
        if hi <= start or lo >= end or ref.num_rows == 0:
            continue
        first, last = max(start, lo) - lo, min(end, hi) - lo
        whole = first == 0 and last == ref.num_rows
        parts.append((ref, None if whole else SliceRows(first, last - first)))
    return parts


def _materialized(ds: Dataset) -> MaterializedDataset:
    """``ds`` itself when materialized, else materialized in the order of its rows, so that row
    numbers (``split_at_indices``, a ``train_test_split`` without shuffle) mean the same on
    every run, as they do on a materialized dataset."""
    from dataflow.dataset import MaterializedDataset

    if isinstance(ds, MaterializedDataset):
        return ds
    with options(preserve_order=True):
        return ds.materialize()


def _num_rows(ds: MaterializedDataset) -> int:
    return sum(ref.num_rows for ref in ds._blocks.refs)


def _split_rows(ds: MaterializedDataset, bounds: Sequence[int]) -> list[MaterializedDataset]:
    """One part per pair of consecutive ``bounds`` (row numbers, ascending)."""
    refs = ds._blocks.refs
    return [_build(ds, _parts_between(refs, lo, hi)) for lo, hi in itertools.pairwise(bounds)]


# ----- the API ------------------------------------------------------------------------------------


def split(ds: Dataset, n: int, *, equal: bool = False, locality_hints: list[Any] | None = None) -> list[MaterializedDataset]:
    """See ``Dataset.split``."""
    if isinstance(n, bool) or not isinstance(n, int):
        msg = f"the number of splits must be an int, got {n!r}"
        raise TypeError(msg)
    if n <= 0:
        msg = f"The number of splits {n} is not positive."
        raise ValueError(msg)
    if locality_hints and len(locality_hints) != n:
        msg = f"The length of locality_hints {len(locality_hints)} doesn't equal the number of splits {n}."
        raise ValueError(msg)
    # locality_hints place blocks near actors on a cluster; on one machine every block is local
    materialized = _materialized(ds)
    if equal:
        each = _num_rows(materialized) // n
        return _split_rows(materialized, [each * i for i in range(n + 1)])
    # as Ray: whole blocks, dealt in n runs of consecutive blocks whose counts differ by at most one
    refs = materialized._blocks.refs
    if len(refs) < n:  # fewer blocks than splits (a small dataset is one block here, several in
        # Ray): whole blocks would leave splits empty, so cut rows, split sizes differing by one
        total = _num_rows(materialized)
        return _split_rows(materialized, [total * i // n for i in range(n + 1)])
    runs = np.array_split(np.arange(len(refs)), n)
    return [_build(materialized, [(refs[i], None) for i in run]) for run in runs]


def split_at_indices(ds: Dataset, indices: Sequence[int]) -> list[MaterializedDataset]:
    """See ``Dataset.split_at_indices``."""
    indices = list(indices)
    if len(indices) < 1:
        msg = "indices must be at least of length 1"
        raise ValueError(msg)
    if sorted(indices) != indices:
        msg = "indices must be sorted"
        raise ValueError(msg)
    if indices[0] < 0:
        msg = "indices must be positive"
        raise ValueError(msg)
    materialized = _materialized(ds)
    total = _num_rows(materialized)
    return _split_rows(materialized, [0, *(min(i, total) for i in indices), total])


def split_proportionately(ds: Dataset, proportions: Sequence[float]) -> list[MaterializedDataset]:
    """See ``Dataset.split_proportionately``."""
    if len(proportions) < 1:
        msg = "proportions must be at least of length 1"
        raise ValueError(msg)
    if sum(proportions) >= 1:
        msg = "proportions must sum to less than 1"
        raise ValueError(msg)
    if any(p <= 0 for p in proportions):
        msg = "proportions must be bigger than 0"
        raise ValueError(msg)
    materialized = _materialized(ds)
    total = _num_rows(materialized)
    indices = [int(total * p) for p in np.cumsum(proportions)]
    # as Ray: move cuts down so that every part but the last has at least one row
    subtract = 0
    for i in range(len(indices) - 2, -1, -1):
        indices[i] -= subtract
        if indices[i] == indices[i + 1]:
            subtract += 1
            indices[i] -= 1
    if any(i <= 0 for i in indices):
        msg = "Couldn't create non-empty splits with the given proportions."
        raise ValueError(msg)
    return split_at_indices(materialized, indices)


def _check_test_fraction(test_size: float) -> None:
    if test_size <= 0 or test_size >= 1:
        msg = f"If `test_size` is a float, it must be bigger than 0 and smaller than 1. Got {test_size}."
        raise ValueError(msg)


def _check_test_count(test_size: int, total: int) -> None:
    if test_size <= 0 or test_size >= total:
        msg = (
            "If `test_size` is an int, it must be bigger than 0 and smaller than the size of the "
            f"dataset ({total}). Got {test_size}."
        )
        raise ValueError(msg)


def train_test_split(
    ds: Dataset, test_size: float, *, shuffle: bool = False, seed: int | None = None, stratify: str | None = None
) -> tuple[MaterializedDataset, MaterializedDataset]:
    """See ``Dataset.train_test_split``."""
    if not isinstance(test_size, int | float):
        msg = f"`test_size` must be int or float got {type(test_size)}."
        raise TypeError(msg)
    if shuffle and stratify is not None:
        msg = (
            "Cannot specify both 'shuffle=True' and 'stratify' parameters. Stratified splitting "
            "maintains class proportions and is incompatible with shuffling."
        )
        raise ValueError(msg)
    if shuffle:
        ds = ds.random_shuffle(seed=seed)
    if stratify is not None:
        return _stratified(_materialized(ds), test_size, stratify)
    if isinstance(test_size, float):
        _check_test_fraction(test_size)
        train, test = split_proportionately(ds, [1 - test_size])
        return train, test
    materialized = _materialized(ds)
    total = _num_rows(materialized)
    _check_test_count(test_size, total)
    train, test = split_at_indices(materialized, [total - test_size])
    return train, test


def _stratified(ds: MaterializedDataset, test_size: float, column: str) -> tuple[MaterializedDataset, MaterializedDataset]:
    """Per class of ``column``: its first ``n - int(n * fraction)`` rows train, the rest test.

    As Ray, an int ``test_size`` becomes the fraction ``test_size / rows``. Rows keep the
    dataset's order (Ray's come grouped by class)."""
    import pandas as pd

    total = _num_rows(ds)
    if isinstance(test_size, int):
        _check_test_count(test_size, total)
        fraction = test_size / total
    else:
        _check_test_fraction(test_size)
        fraction = test_size
    refs = ds._blocks.refs
    ctx = DataContext.get_current()
    backend = runner.backend(ctx.execution_options, ctx.execution_mode)
    chunks = []
    for ref in refs:
        table = backend.get(ref)
        if column not in table.column_names:
            msg = f"stratify: there is no column {column!r}; the dataset has columns {table.column_names}"
            raise ValueError(msg)
        chunks.append(table.column(column))
    if not chunks:
        return _build(ds, []), _build(ds, [])
    values = pa.chunked_array([c for chunk in chunks for c in chunk.chunks], type=chunks[0].type)
    codes, _ = pd.factorize(values.to_pandas(), use_na_sentinel=False)
    ranks = pd.Series(codes).groupby(codes).cumcount().to_numpy()
    sizes = np.bincount(codes)
    train_per_class = sizes - (sizes * fraction).astype(np.int64)
    is_train = ranks < train_per_class[codes]
    train: list[Part] = []
    test: list[Part] = []
    offset = 0
    for ref in refs:
        mask = is_train[offset : offset + ref.num_rows]
        offset += ref.num_rows
        kept = int(mask.sum())
        if kept == ref.num_rows:
            train.append((ref, None))
        elif kept == 0:
            test.append((ref, None))
        else:
            train.append((ref, TakeRows(mask)))
            test.append((ref, TakeRows(~mask)))
    return _build(ds, train), _build(ds, test)


# ----- streaming_train_test_split -----------------------------------------------------------------


class TrainTestSide:
    """Keeps the rows of one side of a streaming train/test split (``Dataset.streaming_train_test_split``).

    "hash": a row is train when the 64-bit blake2b of ``str(value)`` of ``hash_column`` is below
    ``(1 - test_size) * 2**64``, exactly as Ray Data (the same rows go to test). "random": each
    row is train with probability ``1 - test_size``; the draws of a block are seeded from
    ``seed`` and the block's first, middle and last rows, so both sides (two executions) make
    the same choice for every row whatever order tasks run and finish in (Ray seeds with the task
    index and needs ``preserve_order`` for that).
    """

    def __init__(self, train: bool, test_size: float, split_type: str, hash_column: str | None, seed: int | None) -> None:
        self.train = train
        self.test_size = test_size
        self.split_type = split_type
        self.hash_column = hash_column
        self.seed = seed

    def __call__(self, table: pa.Table) -> pa.Table:
        is_train = self._is_train(table)
        return table.filter(pa.array(is_train if self.train else ~is_train, pa.bool_()))

    def _is_train(self, table: pa.Table) -> np.ndarray:
        if self.split_type == "hash":
            if self.hash_column not in table.column_names:
                msg = f"Key column {self.hash_column} not found in batch"
                raise ValueError(msg)
            limit = (1 - self.test_size) * (1 << 64)
            keys = table.column(self.hash_column).to_numpy(zero_copy_only=False)
            return np.array([_hash64(key) < limit for key in keys], dtype=bool)
        rng = np.random.default_rng([_block_key(table), 0 if self.seed is None else self.seed])
        return rng.random(table.num_rows) < (1 - self.test_size)


def _hash64(key: Any) -> int:
    return int.from_bytes(hashlib.blake2b(str(key).encode(), digest_size=8).digest(), "big")


def _block_key(table: pa.Table) -> int:
    """A number that tells blocks apart: the row count and the first, middle and last rows."""
    n = table.num_rows
    if n == 0:
        return 0
    sample = table.take(pa.array(sorted({0, n // 2, n - 1}), pa.int64()))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, sample.schema) as writer:
        writer.write_table(sample)
    digest = hashlib.blake2b(n.to_bytes(8, "little"), digest_size=8)
    digest.update(sink.getvalue().to_pybytes())
    return int.from_bytes(digest.digest(), "big")


def streaming_train_test_split(
    ds: Dataset,
    test_size: float,
    *,
    split_type: str = "random",
    hash_column: str | None = None,
    seed: int | None = None,
    **map_kwargs: Any,
) -> tuple[Dataset, Dataset]:
    """See ``Dataset.streaming_train_test_split``."""
    if test_size <= 0 or test_size >= 1:
        msg = "test_size must be between 0 and 1."
        raise ValueError(msg)
    if seed is not None and split_type == "hash":
        msg = "seed is not supported for hash split"
        raise ValueError(msg)
    if hash_column is not None and split_type == "random":
        msg = "hash_column is not supported for random split"
        raise ValueError(msg)
    if split_type == "hash" and hash_column is None:
        msg = "hash_column is required for hash split"
        raise ValueError(msg)
    if split_type not in ("random", "hash"):
        msg = f"Invalid split type: {split_type}"
        raise ValueError(msg)
    sides = []
    for train in (True, False):
        keep = TrainTestSide(train, test_size, split_type, hash_column, seed)
        sides.append(ds.map_batches(keep, batch_format="pyarrow", **map_kwargs))
    return sides[0], sides[1]

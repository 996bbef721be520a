"""Random and hash exchanges: ``random_shuffle``, ``repartition`` and what a hash join or a
groupby partitions by.

A random shuffle gives each row a 64-bit key from a counter-based hash of (seed, the row's
global position): the key picks the row's partition, and each reducer orders its rows by key.
The output is therefore one uniform permutation, and with a seed the same permutation on every
run, with any number of workers or partitions, whatever the block sizes (the exchange feeds
rows in order, so positions are stable). Without a seed a new one is drawn for each execution.
Straight over a Parquet read the read tasks partition, each told the position of its first row
from the footers' row counts (``PositionedReadPartitionOperator``): the same positions, so the
same permutation.
"""

from __future__ import annotations

import copy
import os
import zlib
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa

from dataflow.random_seed import StepSeed
from dataflow.sort import sort_words
from engine.errors import ColumnNotFoundError
from engine.exchange import FINE_PARTITIONS, concat

SHUFFLE_KEY = "__dataflow_shuffle_key"

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def splitmix64(x: np.ndarray, inplace: bool = False) -> np.ndarray:
    """The splitmix64 finalizer, element-wise on uint64 (a bijection with good avalanche);
    ``inplace`` overwrites ``x`` (one temporary instead of six: half the time)."""
    z = x if inplace else x.copy()
    shifted = np.empty_like(z)
    with np.errstate(over="ignore"):
        z += _GOLDEN
        for shift, factor in ((30, _M1), (27, _M2), (31, None)):
            np.right_shift(z, np.uint64(shift), out=shifted)
            z ^= shifted
            if factor is not None:
                z *= factor
    return z


def spread(hashes: np.ndarray, num_partitions: int) -> np.ndarray:
    """Partition indices from 64-bit hashes (the high bits, scaled: no modulo bias)."""
    return ((hashes >> np.uint64(32)) * np.uint64(num_partitions) >> np.uint64(32)).astype(np.intp)


def resolve_seed(seed: int | None) -> int:
    return int.from_bytes(os.urandom(8)) >> 1 if seed is None else int(seed) & ((1 << 64) - 1)


class RandomPartitioner:
    def __init__(self, seed: StepSeed | int | None, num_partitions: int = FINE_PARTITIONS) -> None:
        self.seed: StepSeed | int | None = seed
        self.num_partitions = num_partitions

    def for_execution(self) -> RandomPartitioner:
        """A copy with a concrete seed: fixed for every task and retry of one execution."""
        bound = copy.copy(self)
        seed = self.seed.for_execution() if isinstance(self.seed, StepSeed) else self.seed
        bound.seed = resolve_seed(seed)
        return bound

    def assign(self, table: pa.Table, row_offset: int) -> tuple[pa.Table, np.ndarray]:
        keys = self._keys(table, row_offset)
        return table.append_column(SHUFFLE_KEY, pa.array(keys)), spread(keys, self.num_partitions)

    def keyed(self, table: pa.Table, row_offset: int) -> pa.Table:
        """``assign``'s table alone: all rows go to one reducer, which needs no partitions."""
        return table.append_column(SHUFFLE_KEY, pa.array(self._keys(table, row_offset)))

    def _keys(self, table: pa.Table, row_offset: int) -> np.ndarray:
        assert isinstance(self.seed, int)
        keys = np.arange(row_offset, row_offset + table.num_rows, dtype=np.uint64)
        keys ^= splitmix64(np.array([self.seed], dtype=np.uint64))
        return splitmix64(keys, inplace=True)


class RoundRobinPartitioner:
    """``repartition(n, shuffle=True)``: row ``k`` of the input, in order, goes to partition
    ``k % n`` (the exchange gets its input in order, so ``row_offset`` is global)."""

    def __init__(self, num_partitions: int) -> None:
        self.num_partitions = num_partitions

    def for_execution(self) -> RoundRobinPartitioner:
        return self

    def assign(self, table: pa.Table, row_offset: int) -> tuple[pa.Table, np.ndarray]:
        rows = np.arange(row_offset, row_offset + table.num_rows, dtype=np.int64)
        return table, (rows % self.num_partitions).astype(np.intp)


def key_hashes(table: pa.Table, keys: Sequence[str]) -> np.ndarray:
    """A 64-bit hash of each row's ``keys``, the same in every process for equal values
    (int32 and int64, string and large_string alike; dictionaries are decoded first)."""
    import polars as pl

    columns = {}
    for name in keys:
        if name not in table.column_names:
            msg = f"column {name!r} not found; the dataset has {table.column_names}"
            raise ColumnNotFoundError(msg)
        column = table.column(name)
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        columns[name] = column
    frame = pl.from_arrow(pa.table(columns), rechunk=False)
    assert isinstance(frame, pl.DataFrame)
    return frame.hash_rows(seed=0x5EED).to_numpy().astype(np.uint64, copy=False)


class HashPartitioner:
    position_free = True
    """A row's partition depends on its keys alone, not on its position in the input: the map
    side may run in the read tasks (``dataflow.compile._partitioned_read``)."""

    def __init__(self, keys: Sequence[str], num_partitions: int = FINE_PARTITIONS) -> None:
        self.keys = tuple(keys)
        self.num_partitions = num_partitions

    def for_execution(self) -> HashPartitioner:
        return self

    def assign(self, table: pa.Table, row_offset: int) -> tuple[pa.Table, np.ndarray]:
        return table, spread(key_hashes(table, self.keys), self.num_partitions)


def key_order(keys: np.ndarray) -> np.ndarray:
    """The positions of ``keys`` (uint64) in ascending order, equal keys in their input order:
    ``np.argsort(keys, kind="stable")``, computed faster.

    Each key's top bits are packed above its position in one word and the words sorted (by
    numpy or polars, whichever sorts faster here: ``dataflow.sort.sort_words``). 200k keys on
    this machine: 1.5-2.5 ms packed and sorted by numpy where its sort is vectorized and fast,
    5-7 ms by a radix sort of the top 32 bits (before), 21-23 ms for the argsort itself. Keys
    whose top bits are equal (rare for random keys) come out by position; each such run is then
    ordered by its full keys, so the answer is exactly the stable argsort's. Keys that tie that
    way often (not random ones) are argsorted instead."""
    n = len(keys)
    if n < 2:
        return np.arange(n, dtype=np.int64)
    bits = max(1, (n - 1).bit_length())
    words = keys >> np.uint64(bits)
    words <<= np.uint64(bits)
    words |= np.arange(n, dtype=np.uint64)
    words = sort_words(words)
    order = (words & np.uint64((1 << bits) - 1)).view(np.int64)
    ranked = words >> np.uint64(bits)
    tied = np.flatnonzero(ranked[1:] == ranked[:-1])
    if len(tied) > n // 64 + 16:  # many keys alike in their top bits: not random keys
        return np.argsort(keys, kind="stable")
    if len(tied):
        starts = tied[np.r_[True, tied[1:] != tied[:-1] + 1]]
        ends = tied[np.r_[tied[1:] != tied[:-1] + 1, True]] + 2
        for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
            run = order[start:end]
            order[start:end] = run[np.argsort(keys[run], kind="stable")]
    return order


class ShuffleReducer:
    """Rows of one range of partitions, ordered by their random key."""

    def __init__(self, exact_blocks: bool = False) -> None:
        self.exact_blocks = exact_blocks

    def for_execution(self) -> ShuffleReducer:
        return self

    def __call__(self, sides: list[list[pa.Table]], index: int) -> Iterator[pa.Table]:
        if not sides[0]:
            return
        table = concat(sides[0])
        keys = table.column(SHUFFLE_KEY).to_numpy()
        table = table.drop_columns([SHUFFLE_KEY])
        yield table.take(key_order(keys))


class ConcatReducer:
    """One output block per task, its inputs as they are (``repartition``).

    ``pieces``: the task's inputs one by one instead, in the same order (``as_pieces``), for a
    task that writes them to its file itself: nothing is copied into one block first."""

    exact_blocks = True

    def __init__(self, pieces: bool = False) -> None:
        self.pieces = pieces

    def for_execution(self) -> ConcatReducer:
        return self

    def as_pieces(self) -> ConcatReducer:
        return ConcatReducer(pieces=True)

    def __call__(self, sides: list[list[pa.Table]], index: int) -> Iterator[pa.Table]:
        if self.pieces:
            yield from sides[0]
        elif sides[0]:
            yield concat(sides[0]).combine_chunks()


class RandomSample:
    """``random_sample``'s step: its seed is drawn for each execution (``for_execution``)."""

    def __init__(self, fraction: float, seed: StepSeed | int | None) -> None:
        self.fraction = fraction
        self.seed = seed

    def for_execution(self) -> RandomSample:
        seed = self.seed.for_execution() if isinstance(self.seed, StepSeed) else self.seed
        return RandomSample(self.fraction, seed)

    def __call__(self, batch: pa.Table) -> pa.Table:
        assert not isinstance(self.seed, StepSeed), "bound to an execution first"
        return random_sample_batch(batch, self.fraction, self.seed)


def random_sample_batch(batch: pa.Table, fraction: float, seed: int | None) -> pa.Table:
    """Keep each row with probability ``fraction``. With a seed the choice depends only on the
    seed and the batch (its size and first row), so a rerun samples the same rows."""
    if seed is None:
        rng = np.random.default_rng()
    else:
        first = zlib.crc32(repr(batch.slice(0, 1).to_pylist()).encode())
        rng = np.random.default_rng([int(seed) & ((1 << 63) - 1), batch.num_rows, first])
    return batch.filter(pa.array(rng.random(batch.num_rows) < fraction))

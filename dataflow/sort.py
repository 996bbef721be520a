"""Sort as a range exchange: sampled boundaries, partitions by the primary key, stable merges.

The map side samples the primary key of every block as it arrives (a few rows per block, taken
by the task that made the block and sent with its ref, so the driver reads no block; a
materialized input's blocks are sampled in the driver), cuts the sorted sample into
``FINE_PARTITIONS`` quantile ranges once the last block is in, and sends each row to the range
its primary key falls in; nulls and NaNs go to the last
range, as they sort last. Equal primary keys share a range, so ranges sorted on all the keys
and emitted in range order are the sorted dataset. Reducers concatenate their slices in input
order and sort stably: the sort is stable overall.
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from engine.errors import ColumnNotFoundError
from engine.exchange import FINE_PARTITIONS, concat

if TYPE_CHECKING:
    import pyarrow.compute as pc
else:
    from dataflow.lazy_compute import pc

SAMPLES_PER_BLOCK = 64

BUCKETS = 1 << 14
"""Buckets ``count_at_most`` cuts the span of a sort's boundaries into (a 16k-entry table fits
the L2 cache; with 255 boundaries about 1.6% of the rows still need a binary search)."""

RADIX_MAX_ROWS = 1 << 19
"""Up to this many keys spanning at most 32 bits, two counting passes beat a packed sort by
polars (not one by numpy's vectorized sort, ``vectorized_sort``)."""

COUNTING_SORT_RANGE = 4096
"""Arrow sorts integers whose values span at most about this many by counting (faster than
anything else); wider integer keys are sorted by polars (``sort_indices``), 2.5-6x faster than
Arrow's (250k int64 keys: 8 against 21 ms; 2M: 60-85 against 240 ms, on one thread)."""


@dataclass(frozen=True)
class SortKey:
    """Columns and a direction for each (Ray's ``key`` and ``descending`` arguments)."""

    columns: tuple[str, ...]
    descending: tuple[bool, ...]

    @classmethod
    def of(cls, key: str | Sequence[str], descending: bool | Sequence[bool] = False) -> SortKey:
        columns = (key,) if isinstance(key, str) else tuple(key) if isinstance(key, (list, tuple)) else ()
        if not columns or not all(isinstance(c, str) for c in columns):
            msg = f"sort key must be a column name or a list of them, got {key!r}"
            raise ValueError(msg)
        if isinstance(descending, bool):
            flags = (descending,) * len(columns)
        else:
            flags = tuple(bool(d) for d in descending)
            if len(flags) != len(columns):
                msg = f"descending must be a bool or one per key column: {len(flags)} for {len(columns)} columns"
                raise ValueError(msg)
        return cls(columns, flags)

    def arrow(self) -> list[tuple[str, str, str]]:
        return [(c, "descending" if d else "ascending", "at_end") for c, d in zip(self.columns, self.descending, strict=True)]

    def check(self, table: pa.Table) -> None:
        missing = [c for c in self.columns if c not in table.column_names]
        if missing:
            msg = f"sort key column {missing[0]!r} not found; the dataset has {table.column_names}"
            raise ColumnNotFoundError(msg)


def _valid(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """The non-null, non-NaN values."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_floating(column.type):
        return column.filter(pc.invert(pc.fill_null(pc.is_nan(column), True)))
    return column.drop_null()


class RangePartitioner:
    def __init__(self, key: SortKey) -> None:
        self.key = key
        self.boundaries: pa.Array | None = None
        self.num_partitions = FINE_PARTITIONS

    def for_execution(self) -> RangePartitioner:
        return copy.copy(self)

    def with_boundaries(self, boundaries: list[object]) -> RangePartitioner:
        """Ranges the user chose (``sort(boundaries=...)``): one output per range, no sampling."""
        fixed = copy.copy(self)
        fixed.boundaries = pa.array(sorted(boundaries))
        fixed.num_partitions = len(boundaries) + 1
        return fixed

    @property
    def position_free(self) -> bool:
        """Ranges fixed up front (``sort(boundaries=...)``): a row's partition comes from its key
        alone, so the map side may run in the read tasks (``dataflow.compile._partitioned_read``;
        their outputs reach the reducers in input order, which keeps ties in it). Sampled ranges
        are fitted first (``dataflow.compile._sampled_read``)."""
        return self.boundaries is not None

    @property
    def sample_columns(self) -> tuple[str, ...] | None:
        """The columns ``sample`` reads (a source may read them alone to fit the ranges); None
        once the ranges are fixed."""
        return self.key.columns if self.boundaries is None else None

    def sample(self, table: pa.Table) -> pa.Array:
        """Evenly spaced primary-key values of one block (in the task that made it)."""
        self.key.check(table)
        column = table.column(self.key.columns[0])
        n = len(column)
        positions = np.unique(np.linspace(0, n - 1, num=min(n, SAMPLES_PER_BLOCK)).astype(np.int64))
        return _valid(column.take(pa.array(positions)))

    def fit(self, samples: list[pa.Array]) -> None:
        values = [s for s in samples if len(s)]
        if not values:
            self.boundaries, self.num_partitions = None, 1
            return
        merged = pa.concat_arrays([v.cast(values[0].type) for v in values])
        ordered = merged.take(pc.sort_indices(merged))
        count = min(FINE_PARTITIONS, len(ordered))
        cuts = [len(ordered) * i // count for i in range(1, count)]
        self.boundaries = ordered.take(pa.array(cuts, type=pa.int64()))
        self.num_partitions = len(self.boundaries) + 1

    def assign(self, table: pa.Table, row_offset: int) -> tuple[pa.Table, np.ndarray]:
        self.key.check(table)
        last = self.num_partitions - 1
        if self.boundaries is None or table.num_rows == 0:
            return table, np.full(table.num_rows, last, dtype=np.intp)
        column = table.column(self.key.columns[0]).combine_chunks()
        if column.type != self.boundaries.type:
            column = column.cast(self.boundaries.type)
        missing = pc.is_null(column)
        if pa.types.is_floating(column.type):
            missing = pc.or_(missing, pc.fill_null(pc.is_nan(column), False))
        if pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
            values = pc.fill_null(column, pa.scalar(0, column.type)).to_numpy(zero_copy_only=False)
            parts = count_at_most(self.boundaries.to_numpy(zero_copy_only=False), values).astype(np.intp)
        else:
            found = pc.search_sorted(self.boundaries, column, side="right")
            parts = pc.fill_null(found, last).to_numpy(zero_copy_only=False).astype(np.intp)
        if self.key.descending[0]:
            parts = last - parts
        parts[missing.to_numpy(zero_copy_only=False)] = last
        return table, parts

    def row_order(self, table: pa.Table) -> np.ndarray | None:
        """The order of a map output's rows: by the sort key, stably, when that costs about
        what grouping them by range does (one integer key without nulls spanning at most 32
        bits: two counting passes, ``radix_order``); None otherwise (grouped by range). Sorted
        by key they are grouped by range too (a range holds every row of its keys), and each
        reduce task then gathers its rows from sorted runs, a sequential read of each map
        output's slice rather than a random one: the 46 reduce tasks of the 4M-row sort took
        0.35-0.40 CPU-s to concatenate and take against 0.50-0.62, the map side's order and take
        0.43 against 0.42."""
        if len(self.key.columns) != 1 or self.boundaries is None or table.num_rows <= COUNTING_SORT_RANGE:
            return None
        column = table.column(self.key.columns[0])
        if not pa.types.is_integer(column.type) or column.null_count:
            return None
        low, high = (v.as_py() for v in pc.min_max(column).values())
        if (high - low).bit_length() > 32:
            return None
        return radix_order(column.to_numpy(), low, high, self.key.descending[0])


def count_at_most(bounds: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For each value, how many of the sorted ``bounds`` are at most it: ``np.searchsorted(bounds,
    values, side="right")``, 3-6x faster for 255 bounds (a binary search mispredicts a branch at
    every step; 200k values: 2.4 against 7.4 ms for int64, 1.7 against 10.3 for float64).

    The span of the bounds is cut into ``BUCKETS`` equal buckets. A value alone in its bucket,
    with no bound there, is past exactly the bounds of the buckets below it, which a table gives;
    only values sharing a bucket with a bound are searched. Exact for any values: a value's
    bucket never decreases as the value grows (rounding is monotone), so a value below a bound
    never lands in a later bucket than the bound's. NaN values count as the lowest (the caller
    sends them last itself)."""
    lo, hi = (float(bounds[0]), float(bounds[-1])) if len(bounds) else (0.0, 0.0)
    if len(bounds) <= 8 or len(values) < 4096 or not (np.isfinite(lo) and np.isfinite(hi) and hi > lo):
        return np.searchsorted(bounds, values, side="right")
    scale = (BUCKETS - 2) / (hi - lo)

    def bucket(x: np.ndarray) -> np.ndarray:  # 0 below the first bound, BUCKETS - 1 past the last
        f = x.astype(np.float64)
        f -= lo
        f *= scale
        f += 1.0
        if np.issubdtype(x.dtype, np.floating):
            np.nan_to_num(f, copy=False, nan=0.0)
        np.clip(f, 0.0, BUCKETS - 1, out=f)
        return f.astype(np.intp)  # (truncation is floor here: nothing is negative)

    edges = bucket(bounds)
    below = np.searchsorted(edges, np.arange(BUCKETS), side="left")  # bounds in earlier buckets
    shared = np.zeros(BUCKETS, dtype=bool)
    shared[edges] = True
    buckets = bucket(values)
    out = below[buckets]
    rows = np.flatnonzero(shared[buckets])
    out[rows] = np.searchsorted(bounds, values[rows], side="right")
    return out


def sort_indices(table: pa.Table, key: SortKey) -> pa.Array | np.ndarray:
    """The stable sort order of ``table`` on ``key`` (nulls last, as ``pc.sort_indices`` with
    ``at_end``). A single integer key with no nulls whose span is past counting range is sorted
    as one unsigned 64-bit word per row, its offset in the span above its row number, when the
    two fit (``packed_order``), except that a span of at most 16 bits goes to one 16-bit
    counting pass, and without numpy's vectorized sort (``vectorized_sort``) a span of at most
    32 bits over at most ``RADIX_MAX_ROWS`` rows to two (``radix_order``); any other integer key
    by polars' stable arg_sort, every other key by Arrow. All run on one thread: a task is one
    CPU's work.

    Measured on this machine (one thread, AVX-512, median of 21; the packed words sorted by
    numpy, or by polars as where numpy's sort is not vectorized):

    ====================  ==========  ===========  ============  ==============
    keys (span)           counting    packed: np   packed: pl    polars argsort
    ====================  ==========  ===========  ============  ==============
    200k (24, 32 bits)    2.4-5.3 ms  0.9-4.5 ms   2.3-5.4 ms    -
    200k (40 bits)        -           0.9-3.1 ms   2.3-4.3 ms    8.3-8.8 ms
    1M (24, 32 bits)      38-48 ms    8.8-15 ms    18-22 ms      -
    1M (40 bits)          -           5.6-12 ms    16-19 ms      41-43 ms
    ====================  ==========  ===========  ============  ==============
    """
    if len(key.columns) == 1 and table.num_rows > COUNTING_SORT_RANGE:
        column = table.column(key.columns[0])
        if pa.types.is_integer(column.type):
            low, high = pc.min_max(column).values()
            if low.is_valid and high.as_py() - low.as_py() > COUNTING_SORT_RANGE:
                span = high.as_py() - low.as_py()
                if column.null_count == 0 and (span.bit_length() <= 16 or (
                        span.bit_length() <= 32 and len(column) <= RADIX_MAX_ROWS and not vectorized_sort())):
                    return radix_order(column.to_numpy(), low.as_py(), high.as_py(), key.descending[0])
                if column.null_count == 0 and span.bit_length() + _row_bits(len(column)) <= 64:
                    return packed_order(column.to_numpy(), low.as_py(), high.as_py(), key.descending[0])
                import polars as pl

                frame = pl.from_arrow(pa.table({"k": column}), rechunk=False)
                assert isinstance(frame, pl.DataFrame)
                order = frame.select(pl.arg_sort_by("k", descending=key.descending[0], nulls_last=True,
                                                    multithreaded=False, maintain_order=True))
                return order.to_series().to_numpy()
    return pc.sort_indices(table, sort_keys=key.arrow())


def _row_bits(n: int) -> int:
    """Bits that hold every row number below ``n``."""
    return max(1, (n - 1).bit_length())


def packed_order(values: np.ndarray, low: int, high: int, descending: bool) -> np.ndarray:
    """The stable order of integer ``values`` (in ``[low, high]``, no nulls, a span that fits
    beside the row numbers in 64 bits): each value's offset from ``low`` (from ``high`` when
    descending) shifted above its row number, the words sorted (numpy's vectorized sort, or
    polars' radix sort where numpy's is not vectorized; one thread), the row numbers read back.
    Equal values keep their input order: their row numbers decide, and every word is distinct,
    so an unstable sort of the words is a stable sort of the values."""
    n = len(values)
    bits = _row_bits(n)
    assert (high - low).bit_length() + bits <= 64
    words = values.astype(np.uint64)  # arithmetic modulo 2**64: each true offset fits its bits
    if descending:
        np.subtract(np.uint64(high % (1 << 64)), words, out=words)
    else:
        words -= np.uint64(low % (1 << 64))
    words <<= np.uint64(bits)
    words |= np.arange(n, dtype=np.uint64)
    words = sort_words(words)
    return (words & np.uint64((1 << bits) - 1)).view(np.int64)  # row numbers: below 2**63


def sort_words(words: np.ndarray) -> np.ndarray:
    """``words`` (uint64) in ascending order, sorted in place by numpy where it is the faster
    here (``vectorized_sort``), else a sorted copy by polars' radix sort (one thread)."""
    if vectorized_sort():
        words.sort()
        return words
    import polars as pl

    return pl.Series(words).sort(multithreaded=False).to_numpy()


CALIBRATION_WORDS = 1 << 15
"""Words ``vectorized_sort`` has numpy sort to see how fast its sort is here."""
FAST_NS_PER_WORD = 12.0
"""numpy's sort of 64-bit words counts as fast below this many nanoseconds a word: polars' radix
sort takes 10-18 (200k words: 2.1-2.7 ms on the machines measured), numpy's vectorized sort 3.5
where it works as meant (0.7 ms) and 41-47 where it does not (8.3 ms)."""


@functools.cache
def vectorized_sort() -> bool:
    """Whether numpy sorts 64-bit words faster than polars would in this process: numpy's SIMD
    sort (x86-simd-sort: from numpy 2.0 on a CPU with AVX2, from 1.26 with AVX-512, as numpy
    dispatches; ``NPY_DISABLE_CPU_FEATURES`` counts), measured once (the best of three sorts of
    ``CALIBRATION_WORDS`` random words, 0.3-4.5 ms) under ``FAST_NS_PER_WORD``. Without those
    CPU features numpy is 5x slower than polars (10 ms for 200k words), so it is not measured.
    With them it was 2.9x faster than polars here one day (200k words: 0.7 against 2.1 ms) and
    3.1x slower another, on a virtual machine of the same name (8.3 against 2.7 ms: another
    host): so it is measured, not assumed. Either way the words come out the same."""
    return _numpy_sort_is_vectorized() and _numpy_sort_ns_per_word() < FAST_NS_PER_WORD


def _numpy_sort_is_vectorized() -> bool:
    try:
        try:
            from numpy._core._multiarray_umath import __cpu_features__ as features
        except ImportError:
            from numpy.core._multiarray_umath import __cpu_features__ as features
    except ImportError:
        return False
    if "X86_V3" in features:  # numpy 2.4's names for its dispatch targets
        return bool(features.get("X86_V3") or features.get("X86_V4"))
    if int(np.__version__.split(".")[0]) >= 2:
        return bool(features.get("AVX2") or features.get("AVX512_SKX"))
    return bool(features.get("AVX512_SKX"))


def _numpy_sort_ns_per_word() -> float:
    words = np.random.default_rng(7).integers(0, 1 << 63, CALIBRATION_WORDS, dtype=np.uint64)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        np.sort(words)
        best = min(best, time.perf_counter() - start)
    return best * 1e9 / CALIBRATION_WORDS


def radix_order(values: np.ndarray, low: int, high: int, descending: bool) -> np.ndarray:
    """The stable order of integer ``values`` (in ``[low, high]``, a span of at most 32 bits,
    no nulls): a least-significant-digit radix sort of their offsets from ``low`` (from ``high``
    when descending) in two 16-bit digits, one when the span fits 16 bits; numpy's stable
    argsort of uint16 is a counting sort, linear in n. One digit beats every other sort: 87k
    keys spanning 21.7k values (a reduce task of the 4M-row sort) 0.9 ms, packed 4.0 ms."""
    assert (high - low).bit_length() <= 32
    wrapped = values.astype(np.uint64)  # arithmetic modulo 2**64: each true offset is below 2**32
    if descending:
        offsets = (np.uint64(high % (1 << 64)) - wrapped).astype(np.uint32)
    else:
        offsets = (wrapped - np.uint64(low % (1 << 64))).astype(np.uint32)
    order = np.argsort(offsets.astype(np.uint16), kind="stable")
    if (high - low).bit_length() <= 16:  # one digit: done
        return order
    return order[np.argsort((offsets >> np.uint32(16)).astype(np.uint16)[order], kind="stable")]


class SortReducer:
    """One range of partitions, sorted stably on every key."""

    exact_blocks = False

    def __init__(self, key: SortKey) -> None:
        self.key = key

    def for_execution(self) -> SortReducer:
        return self

    def __call__(self, sides: list[list[pa.Table]], index: int) -> Iterator[pa.Table]:
        if not sides[0]:
            return
        table = concat(sides[0])
        yield table.take(sort_indices(table, self.key))


class TopKPartitioner:
    """``sort(...).limit(k)``: each map task keeps only its block's first ``k`` rows in the
    sort order (a stable sort, so ties keep their input order), all for one reducer."""

    num_partitions = 1
    position_free = True
    """A block's candidates depend on its rows alone: the map side may run in the read tasks
    (their outputs reach the reducer in input order, which keeps ties in it)."""

    def __init__(self, key: SortKey, k: int) -> None:
        self.key, self.k = key, k

    def for_execution(self) -> TopKPartitioner:
        return self

    def assign(self, table: pa.Table, row_offset: int) -> tuple[pa.Table, np.ndarray]:
        self.key.check(table)
        if table.num_rows > self.k:
            table = table.take(sort_indices(table, self.key)[: self.k])
        return table, np.zeros(table.num_rows, dtype=np.intp)


class TopKReducer(SortReducer):
    """The first ``k`` rows of every map task's candidates, sorted stably."""

    def __init__(self, key: SortKey, k: int) -> None:
        super().__init__(key)
        self.k = k

    def __call__(self, sides: list[list[pa.Table]], index: int) -> Iterator[pa.Table]:
        for table in super().__call__(sides, index):
            yield table.slice(0, self.k)

"""The sort kernels of the exchange's reducers against Arrow's own, on the shapes that choose
between them (narrow and wide integer keys, nulls, both directions, chunked columns)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from dataflow.shuffle import key_order, splitmix64
from dataflow.sort import (
    COUNTING_SORT_RANGE,
    RangePartitioner,
    SortKey,
    count_at_most,
    packed_order,
    radix_order,
    sort_indices,
)


@pytest.fixture(params=[False, True], ids=["polars", "numpy"])
def key_order_path(request, monkeypatch):
    """key_order's two ways: packed words sorted by numpy (where its sort is vectorized and the
    faster), or by polars."""
    from dataflow import sort

    monkeypatch.setattr(sort, "vectorized_sort", lambda: request.param)


@pytest.mark.parametrize("speed", ["as it is", "slowed"])
def test_numpy_sorts_the_words_only_where_its_sort_is_measured_fast(speed, monkeypatch):
    """Whether numpy or polars sorts 64-bit words is measured once per process, not assumed from
    the CPU's features: numpy's vectorized sort was 3x faster than polars' on this machine one
    day and 3x slower another. A numpy sort slowed on purpose loses; either way the words come
    out sorted."""
    import time

    from dataflow import sort

    if speed == "slowed":
        real = np.sort

        def slow(words, *args, **kwargs):
            time.sleep(len(words) * sort.FAST_NS_PER_WORD * 1e-9)
            return real(words, *args, **kwargs)

        monkeypatch.setattr(sort.np, "sort", slow)
    sort.vectorized_sort.cache_clear()
    try:
        chosen = sort.vectorized_sort()
    finally:
        sort.vectorized_sort.cache_clear()
    if speed == "slowed" or not sort._numpy_sort_is_vectorized():
        assert chosen is False
    words = np.random.default_rng(1).integers(0, 1 << 63, 5000, dtype=np.uint64)
    assert np.array_equal(sort.sort_words(words.copy()), np.sort(words))


@pytest.mark.parametrize("n", [0, 1, 5, 1000, 200_000])
def test_key_order_is_argsort_of_distinct_keys(n, key_order_path):
    keys = splitmix64(np.arange(n, dtype=np.uint64) ^ np.uint64(12345))
    assert np.array_equal(key_order(keys), np.argsort(keys, kind="stable"))


@pytest.mark.parametrize("distinct_tops", [1, 3, 1000])
def test_key_order_puts_keys_that_share_their_top_bits_in_order(distinct_tops, key_order_path):
    """Keys whose top bits repeat (rare in random keys; all of them here) come out ordered by
    their whole value, equal keys in their input order."""
    rng = np.random.default_rng(distinct_tops)
    tops = rng.integers(0, 1 << 32, distinct_tops, dtype=np.uint64)
    keys = (tops[rng.integers(0, distinct_tops, 50_000)] << np.uint64(32)) | rng.integers(0, 1 << 32, 50_000, dtype=np.uint64)
    keys[::7] = keys[0]  # and exact duplicates
    assert np.array_equal(key_order(keys), np.argsort(keys, kind="stable"))


def test_key_order_mends_a_few_keys_that_tie_in_their_top_bits(key_order_path):
    """Random keys, a few of them sharing their top bits with another but not their low bits,
    a few exact duplicates: too few for the argsort fallback, each tied run is put in order of
    the whole keys, duplicates in their input order."""
    rng = np.random.default_rng(11)
    n = 100_000
    keys = splitmix64(np.arange(n, dtype=np.uint64))
    partners = rng.choice(n, 120, replace=False)
    for a, b in zip(partners[:60], partners[60:], strict=True):  # same top 56 bits, other low bits
        keys[b] = (keys[a] & ~np.uint64(0xFF)) | rng.integers(0, 256, dtype=np.uint64)
    keys[rng.choice(n, 30, replace=False)] = keys[7]  # duplicates
    assert np.array_equal(key_order(keys), np.argsort(keys, kind="stable"))


@pytest.mark.parametrize("dtype", ["int64", "int32", "uint64", "int8"])
@pytest.mark.parametrize("span", [50, COUNTING_SORT_RANGE * 4, 1 << 40])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_indices_is_arrows_stable_order(dtype, span, descending):
    rng = np.random.default_rng([span, descending])
    n = 3 * COUNTING_SORT_RANGE
    info = np.iinfo(dtype)
    low = max(int(info.min), 0 if dtype.startswith("u") else -span // 2)
    high = min(int(info.max), low + span)
    values = rng.integers(low, high, n, dtype=dtype, endpoint=True)
    if dtype == "uint64":
        values = values + np.uint64(1 << 63) if span > 1 << 32 else values  # values past int64
    column = pa.chunked_array([pa.array(values[: n // 3]), pa.array(values[n // 3 :], mask=rng.random(n - n // 3) < 0.05)])
    table = pa.table({"k": column, "i": np.arange(n)})
    key = SortKey.of("k", descending)
    order = sort_indices(table, key)
    assert isinstance(order, np.ndarray) == (high - low > COUNTING_SORT_RANGE)  # polars' radix sort, else Arrow's
    got = np.asarray(order)
    want = pc.sort_indices(table, sort_keys=key.arrow()).to_numpy()
    assert np.array_equal(got, want)  # ties (many with a narrow span) keep their input order


@pytest.mark.parametrize("dtype", ["int64", "int32", "int16", "uint64", "uint32"])
@pytest.mark.parametrize("span", [COUNTING_SORT_RANGE * 4, 1 << 30, 1 << 44])
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("vectorized", [False, True])
def test_a_wide_integer_key_without_nulls_sorts_as_arrow(dtype, span, descending, vectorized, monkeypatch):
    """Two counting passes (a span of 32 bits or less), packed words (a span that fits beside the
    row numbers; sorted by numpy or by polars, as where numpy's sort is not vectorized) or
    polars: Arrow's stable order, for negative values, values past int64 (uint64) and ties
    alike, across chunks."""
    from dataflow import sort

    monkeypatch.setattr(sort, "vectorized_sort", lambda: vectorized)
    rng = np.random.default_rng([span, descending, len(dtype)])
    info = np.iinfo(dtype)
    n = 5 * COUNTING_SORT_RANGE
    low = max(int(info.min), 0 if dtype.startswith("u") else -span // 2)
    if dtype == "uint64":
        low = (1 << 63) + 12345  # every value past int64's range
    high = min(int(info.max), low + span)
    values = rng.integers(low, high, n, dtype=dtype, endpoint=True)
    values[::9] = values[4]  # ties
    values[1], values[2] = low, high  # both ends of the span
    table = pa.table({"k": pa.chunked_array([values[:1000], values[1000:]])})
    key = SortKey.of("k", descending)
    want = pc.sort_indices(table, sort_keys=key.arrow()).to_numpy()
    if (high - low).bit_length() <= 32:
        assert np.array_equal(radix_order(values, low, high, descending), want)
    if (high - low).bit_length() + (n - 1).bit_length() <= 64:
        assert np.array_equal(packed_order(values, low, high, descending), want)
    order = sort_indices(table, key)
    assert isinstance(order, np.ndarray) and np.array_equal(order, want)


def test_keys_spanning_61_bits_sort_as_arrow():
    big = np.arange(COUNTING_SORT_RANGE * 2, dtype=np.int64) * (1 << 48)  # 61 bits of span, 13 of rows
    table = pa.table({"k": big[::-1].copy()})
    assert np.array_equal(np.asarray(sort_indices(table, SortKey.of("k"))), np.arange(len(big))[::-1])


def _values(dtype: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if dtype.startswith("float"):
        values = (rng.standard_normal(n) * 1e3).astype(dtype)
        values[rng.random(n) < 0.01] = np.inf
        values[rng.random(n) < 0.01] = -np.inf
        return values
    info = np.iinfo(dtype)
    values = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    values[: n // 4] = rng.integers(-50 if info.min < 0 else 0, 50, n // 4).astype(dtype)  # a narrow, crowded span too
    values[rng.random(n) < 0.01] = info.max
    values[rng.random(n) < 0.01] = info.min
    return values


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint64", "float32", "float64"])
@pytest.mark.parametrize("num_bounds", [3, 9, 255])
def test_count_at_most_is_a_binary_search(dtype, num_bounds):
    """Every value, including ones equal to a bound, the type's extremes, infinities and values
    in a crowded span, lands where ``np.searchsorted`` puts it."""
    rng = np.random.default_rng([num_bounds, len(dtype)])
    values = _values(dtype, 50_000, rng)
    for bounds in (np.sort(rng.choice(values, num_bounds)), np.sort(rng.choice(values[: 50_000 // 4], num_bounds))):
        bounds = bounds[np.isfinite(bounds)] if dtype.startswith("float") else bounds
        assert np.array_equal(count_at_most(bounds, values), np.searchsorted(bounds, values, side="right"))


@pytest.mark.parametrize("dtype", ["int64", "float64", "string"])
@pytest.mark.parametrize("descending", [False, True])
def test_range_assignment_is_arrows_search(dtype, descending):
    """A row's range from ``assign`` is Arrow's ``search_sorted`` on the boundaries, with nulls
    and NaNs in the last range (descending: the ranges reversed)."""
    rng = np.random.default_rng(len(dtype) + descending)
    n = 20_000
    raw = rng.integers(-10**6, 10**6, n)
    if dtype == "string":
        column = pa.array([f"k{v:08d}" for v in raw], mask=rng.random(n) < 0.02)
    else:
        values = raw.astype(dtype)
        if dtype == "float64":
            values[rng.random(n) < 0.02] = np.nan
        column = pa.array(values, mask=rng.random(n) < 0.02)
    key = SortKey.of("k", descending)
    partitioner = RangePartitioner(key)
    table = pa.table({"k": column})
    partitioner.fit([partitioner.sample(table)])
    _, parts = partitioner.assign(table, 0)
    last = partitioner.num_partitions - 1
    want = pc.fill_null(pc.search_sorted(partitioner.boundaries, column, side="right"), last).to_numpy(zero_copy_only=False).copy()
    if descending:
        want = last - want
    missing = pc.is_null(column, nan_is_null=True).to_numpy(zero_copy_only=False)
    want[missing] = last
    assert partitioner.num_partitions > 9
    assert np.array_equal(parts, want)


@pytest.mark.parametrize("n", [2, 3, 1000, 70_000])
def test_key_order_fixes_keys_that_tie_in_their_packed_top_bits(n):
    """A few random keys forced to share their top bits with a neighbour (rare in real data),
    and some exact duplicates: the order is still exactly the stable argsort's."""
    rng = np.random.default_rng(n)
    keys = rng.integers(0, np.iinfo(np.uint64).max, n, dtype=np.uint64, endpoint=True)
    pick = rng.choice(n, size=min(n, 40), replace=False)
    low = np.uint64((1 << 20) - 1)
    keys[pick[1::2]] = (keys[pick[: len(pick) // 2 * 2 : 2]] & ~low) | (keys[pick[1::2]] & low)  # same top bits
    keys[pick[:2]] = keys[pick[2]] if n > 2 else keys[pick[:2]]  # exact duplicates
    assert np.array_equal(key_order(keys), np.argsort(keys, kind="stable"))


@pytest.mark.parametrize("dtype", ["int64", "uint64", "int32"])
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("base", [0, -(1 << 40), 1 << 40])
@pytest.mark.parametrize("bits", [16, 32])
def test_keys_spanning_32_bits_or_less_sort_by_radix_as_argsort(dtype, descending, base, bits):
    """Keys whose span fits 32 bits (at the edge, wherever they start) are ordered by two
    16-bit counting passes, or one when it fits 16 bits: the result is the stable argsort's,
    ties in row order."""
    rng = np.random.default_rng(7)
    if dtype == "uint64":
        base = abs(base) + (1 << 63) if base else (1 << 64) - (1 << 32) - 1  # near the top of uint64
    elif dtype == "int32":
        base = -(1 << 31)
    span = (1 << bits) - 1
    offsets = rng.integers(0, span, 30_000, dtype=np.uint64, endpoint=True)
    offsets[:3] = (0, span, span)  # both ends, and a tie
    offsets[100:200] = offsets[5]
    values = (offsets + np.uint64(base % (1 << 64))).astype(np.uint64).view(np.int64).astype(dtype)
    low, high = int(values.min()), int(values.max())
    order = radix_order(values, low, high, descending)
    want = np.argsort(-values.astype(object) if descending else values.astype(object), kind="stable")
    assert np.array_equal(order, want)


@pytest.mark.parametrize("dtype", ["int64", "uint64", "int32"])
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("base", [0, -(1 << 40), 1 << 40])
def test_keys_whose_span_fits_beside_the_row_numbers_sort_packed_as_argsort(dtype, descending, base):
    """Keys whose span leaves just room for the row numbers in 64 bits (at the edge, wherever
    they start) are ordered as packed words: the result is the stable argsort's, ties in row
    order."""
    rng = np.random.default_rng(7)
    n = 30_000
    if dtype == "uint64":
        base = abs(base) + (1 << 62) if base else (1 << 64) - (1 << 49)  # near the top of uint64
    elif dtype == "int32":
        base = -(1 << 31)
    span = (1 << 32) - 1 if dtype == "int32" else (1 << (64 - (n - 1).bit_length())) - 1
    offsets = rng.integers(0, span, n, dtype=np.uint64, endpoint=True)
    offsets[:3] = (0, span, span)  # both ends, and a tie
    offsets[100:200] = offsets[5]
    values = (offsets + np.uint64(base % (1 << 64))).astype(np.uint64).view(np.int64).astype(dtype)
    low, high = int(values.min()), int(values.max())
    assert high - low == span
    order = packed_order(values, low, high, descending)
    want = np.argsort(-values.astype(object) if descending else values.astype(object), kind="stable")
    assert np.array_equal(order, want)


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("shape", ["narrow", "32 bits", "wide", "nulls", "already sorted"])
def test_a_sorts_map_output_is_grouped_by_range_and_sorted_where_that_is_cheap(descending, shape):
    """A sort's map task stores its rows grouped by range; for one integer key without nulls
    spanning at most 32 bits, sorted by key (stably) as well, so each reduce task gathers from
    sorted runs. Either way the counts describe the stored rows, and rows of a range keep their
    input order among equal keys."""
    from engine.exchange import PartitionTransform

    rng = np.random.default_rng([descending, len(shape)])
    n = 20_000
    span = {"narrow": 30_000, "32 bits": (1 << 32) - 1, "wide": 1 << 50}.get(shape, 1 << 20)
    keys = rng.integers(-(span // 2), span - span // 2, n, endpoint=True)
    keys[::7] = keys[3]  # ties
    if shape == "already sorted":
        keys = np.sort(keys)[::-1].copy() if descending else np.sort(keys)
    mask = rng.random(n) < 0.05 if shape == "nulls" else None
    table = pa.table({"k": pa.array(keys, mask=mask), "row": np.arange(n)})
    sort_key = SortKey.of("k", descending)
    partitioner = RangePartitioner(sort_key)
    partitioner.fit([partitioner.sample(table.slice(i, 2_000)) for i in range(0, n, 2_000)])
    (out, counts), = PartitionTransform("SortMap", partitioner).partition([table], 0)
    assert sorted(out.column("row").to_pylist()) == list(range(n))
    _, parts = partitioner.assign(out, 0)
    assert np.all(parts[1:] >= parts[:-1])  # grouped by range
    assert np.array_equal(np.bincount(parts, minlength=partitioner.num_partitions), np.frombuffer(counts, "<u4"))
    rows = out.column("row").to_numpy()
    for p in np.unique(parts):  # equal keys of a range in input order
        ks, rs = out.column("k").to_numpy(zero_copy_only=False)[parts == p], rows[parts == p]
        for k in np.unique(ks[:50]):
            assert np.all(np.diff(rs[ks == k]) > 0)
    cheap = shape in ("narrow", "32 bits", "already sorted")
    want = pc.sort_indices(table, sort_keys=sort_key.arrow()).to_numpy()
    assert np.array_equal(rows, want) == cheap  # (grouped only: far from the full order)
    if shape == "already sorted":
        assert np.array_equal(rows, np.arange(n))

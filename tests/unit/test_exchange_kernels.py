"""The sort kernels of the exchange's reducers against Arrow's own, on the shapes that choose
between them (narrow and wide integer keys, nulls, both directions, chunked columns)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from dataflow.shuffle import key_order, splitmix64
from dataflow.sort import COUNTING_SORT_RANGE, SortKey, sort_indices


@pytest.mark.parametrize("n", [0, 1, 5, 1000, 200_000])
def test_key_order_is_argsort_of_distinct_keys(n):
    keys = splitmix64(np.arange(n, dtype=np.uint64) ^ np.uint64(12345))
    assert np.array_equal(key_order(keys), np.argsort(keys, kind="stable"))


@pytest.mark.parametrize("distinct_tops", [1, 3, 1000])
def test_key_order_puts_keys_that_share_their_top_bits_in_order(distinct_tops):
    """Keys whose top bits repeat (rare in random keys; all of them here) come out ordered by
    their whole value, equal keys in their input order."""
    rng = np.random.default_rng(distinct_tops)
    tops = rng.integers(0, 1 << 32, distinct_tops, dtype=np.uint64)
    keys = (tops[rng.integers(0, distinct_tops, 50_000)] << np.uint64(32)) | rng.integers(0, 1 << 32, 50_000, dtype=np.uint64)
    keys[::7] = keys[0]  # and exact duplicates
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

"""The pages of a block file that a slice's rows alone occupy (``engine.row_pages``): punched
out once a reduce task has read its slice. Punching them must never change another slice's
rows, and must give back most of the file where the rows are big."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pyarrow as pa
import pytest

from engine import row_pages
from engine.object_store import BlockRef, BlockSlice, read_block, read_slice_pages, write_ipc_file
from engine.row_pages import MIN_RANGE_BYTES, PAGE

pytestmark = pytest.mark.skipif(not row_pages.can_punch(), reason="no fallocate(PUNCH_HOLE) here")


def _strings(rng, n: int, lo: int, hi: int, nulls: bool = False) -> pa.Array:
    lengths = rng.integers(lo, hi, n)
    data = rng.integers(97, 123, int(lengths.sum()), dtype=np.uint8).tobytes()
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
    values = [data[offsets[i]:offsets[i + 1]].decode() for i in range(n)]
    mask = rng.random(n) < 0.1 if nulls else None
    return pa.array(values, type=pa.string(), mask=mask)


def _table(rng, n: int) -> pa.Table:
    """Every column kind the page finder looks into, and some it leaves alone."""
    list_lengths = rng.integers(0, 40, n)
    list_offsets = np.concatenate(([0], np.cumsum(list_lengths))).astype(np.int32)
    lists = pa.ListArray.from_arrays(pa.array(list_offsets), pa.array(rng.integers(0, 1 << 40, int(list_offsets[-1]))))
    tensors = pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(n * 64).astype(np.float32)), 64)
    shape = pa.fixed_shape_tensor(pa.float32(), (4, 16))
    return pa.table({
        "i8": pa.array(rng.integers(-100, 100, n), type=pa.int8()),
        "i64": pa.array(rng.integers(0, 1 << 50, n), mask=rng.random(n) < 0.05),
        "f32": pa.array(rng.standard_normal(n).astype(np.float32)),
        "ts": pa.array(rng.integers(0, 1 << 40, n).astype("datetime64[us]")),
        "dec": pa.array([int(x) for x in rng.integers(0, 10**9, n)], type=pa.decimal128(20, 2)),
        "fsb": pa.array([bytes([i % 256]) * 12 for i in range(n)], type=pa.binary(12)),
        "s": _strings(rng, n, 100, 600, nulls=True),
        "ls": pa.array(_strings(rng, n, 0, 50).to_pylist(), type=pa.large_string()),
        "b": pa.array([x.encode() for x in _strings(rng, n, 10, 30).to_pylist()], type=pa.binary()),
        "lst": lists,
        "llst": pa.LargeListArray.from_arrays(pa.array(list_offsets.astype(np.int64)),
                                              pa.array(rng.standard_normal(int(list_offsets[-1])).astype(np.float32))),
        "fsl": tensors,
        "tensor": pa.ExtensionArray.from_storage(shape, tensors),
        "flag": pa.array(rng.random(n) < 0.5),  # (booleans: left for the unlink)
        "dict": pa.array(rng.choice(["x", "y", "z"], n)).dictionary_encode(),
        "st": pa.StructArray.from_arrays([pa.array(rng.integers(0, 9, n))], names=["a"]),
    })


def _write(path, table: pa.Table) -> BlockRef:
    write_ipc_file(str(path), table, piecewise=True)
    return BlockRef("b", str(path), table.num_rows, table.nbytes, spilled=True)


def _cuts(rng, n: int, pieces: int) -> list[tuple[int, int]]:
    edges = np.unique(np.concatenate(([0, n], rng.integers(0, n, pieces - 1))))
    return [(int(a), int(b)) for a, b in itertools.pairwise(edges)]


@pytest.mark.parametrize("seed", range(6))
def test_punching_a_slices_pages_leaves_every_other_row_as_it_was(tmp_path, seed):
    rng = np.random.default_rng(seed)
    table = _table(rng, int(rng.integers(3_000, 9_000)))
    if seed % 2:  # several record batches in one file, as a map task that yields more than one
        table = pa.concat_tables([table.slice(0, table.num_rows // 3), table.slice(table.num_rows // 3)])
    ref = _write(tmp_path / "block.arrow", table)
    size = os.path.getsize(ref.path)
    cuts = _cuts(rng, table.num_rows, int(rng.integers(2, 12)))
    pages = {}
    for lo, hi in cuts:
        rows, ranges = read_slice_pages(BlockSlice(ref, lo, hi - lo))
        assert rows.equals(table.slice(lo, hi - lo))
        for offset, length in ranges:
            assert offset % PAGE == 0 and length % PAGE == 0 and length >= MIN_RANGE_BYTES
            assert 0 <= offset and offset + length <= size
        pages[(lo, hi)] = ranges
        del rows
    spans = sorted(r for ranges in pages.values() for r in ranges)
    for (a, la), (b, _) in itertools.pairwise(spans):
        assert a + la <= b, "two slices claim the same page"
    punched = [c for c in cuts if rng.random() < 0.5] or cuts[:1]
    blocks_before = os.stat(ref.path).st_blocks
    given = sum(row_pages.punch(ref.path, pages[c]) for c in punched)
    assert given == sum(length for c in punched for _, length in pages[c])
    assert os.stat(ref.path).st_blocks * 512 <= blocks_before * 512 - given + PAGE * 16
    after = read_block(ref)
    for lo, hi in cuts:
        if (lo, hi) not in punched:
            assert after.slice(lo, hi - lo).equals(table.slice(lo, hi - lo)), (lo, hi)


def test_big_rows_give_back_most_of_the_file(tmp_path):
    """Long strings and tensors (the shape of a sort's spilled map output): nearly all of a slice's
    bytes are whole pages it alone holds."""
    rng = np.random.default_rng(3)
    n = 40_000
    table = pa.table({"key": rng.integers(0, 1 << 40, n), "payload": _strings(rng, n, 300, 360),
                      "emb": pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(n * 32).astype(np.float32)), 32)})
    ref = _write(tmp_path / "big.arrow", table)
    size = os.path.getsize(ref.path)
    total = 0
    for lo, hi in _cuts(rng, n, 8):
        _, ranges = read_slice_pages(BlockSlice(ref, lo, hi - lo))
        total += sum(length for _, length in ranges)
    assert total > 0.9 * size


def test_small_and_inline_blocks_have_no_pages(tmp_path):
    small = pa.table({"x": np.arange(100)})
    ref = _write(tmp_path / "small.arrow", small)
    assert read_slice_pages(BlockSlice(ref, 10, 50))[1] == ()
    assert read_slice_pages(BlockSlice(ref, 10, 50))[0].equals(small.slice(10, 50))


def test_punching_a_file_that_is_gone_is_nothing(tmp_path):
    assert row_pages.punch(str(tmp_path / "gone.arrow"), ((0, 1 << 20),)) == 0

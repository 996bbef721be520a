"""Ray's ``read_parquet(include_row_hash=True)``: a deterministic ``uint64`` per row.

A row's hash depends only on its file's path, the piece of the file its read task covers (the
``index``-th of ``count`` byte ranges) and its position among the rows that piece outputs, so
repeated reads of the same data with the same pipeline configuration give every row the same
hash (Ray's contract), whichever worker reads it and in whatever order tasks finish. The mix is
SplitMix64's finalizer over a BLAKE2b digest of the path and piece plus the row's position.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa

COLUMN = "row_hash"


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer, elementwise on uint64 (arithmetic wraps modulo 2**64)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def piece_seed(path: str, index: int, count: int) -> int:
    """The 64-bit seed of one piece of one file."""
    digest = hashlib.blake2b(f"{path}\0{index}/{count}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def hashes(seed: int, start: int, num_rows: int) -> pa.Array:
    """The hashes of rows ``start`` .. ``start + num_rows - 1`` of the piece with ``seed``."""
    with np.errstate(over="ignore"):
        positions = np.arange(start, start + num_rows, dtype=np.uint64) + np.uint64(seed)
    return pa.array(_mix(positions), pa.uint64())


def with_row_hash(table: pa.Table, seed: int, start: int) -> pa.Table:
    """``table`` with its ``row_hash`` column set (replacing one the file had)."""
    column = hashes(seed, start, table.num_rows)
    index = table.schema.get_field_index(COLUMN)
    if index >= 0:
        return table.set_column(index, pa.field(COLUMN, pa.uint64()), column)
    return table.append_column(pa.field(COLUMN, pa.uint64()), column)

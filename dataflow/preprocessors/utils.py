"""Ray's ``ray.data.preprocessors.utils`` helpers the text preprocessors share: the default
tokenizer, the hash that picks a token's bucket, and tokenizing a column around its nulls.

``simple_hash`` is Ray's exactly (SHA-256 of ``str(value)``, modulo the number of features), so
a token lands in the same bucket here as in Ray and a model trained on Ray's features keeps working.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

Tokenizer = Callable[[str], list[str]]


def simple_split_tokenizer(value: str) -> list[str]:
    """Tokenize a string by splitting on single spaces (Ray's default tokenizer)."""
    return value.split(" ")


def simple_hash(value: object, num_features: int) -> int:
    """Deterministically hash ``value`` into ``[0, num_features)``, as Ray's ``simple_hash``."""
    hashed = hashlib.sha256(str(value).encode())
    return int(hashed.hexdigest(), 16) % num_features


def tokenize_ignoring_nulls(values: list[Any], tokenization_fn: Tokenizer) -> list[list[str] | None]:
    """Each present value tokenized; a missing one (None, NaN or ``pd.NA``) stays None, as Ray leaves it
    missing rather than handing it to ``tokenization_fn``."""
    return [None if _is_missing(v) else tokenization_fn(v) for v in values]


def _is_missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value))


def function_name(fn: Callable[..., Any]) -> str:
    """How Ray's ``__repr__`` shows a tokenization function: its ``__name__``, else itself."""
    return str(getattr(fn, "__name__", fn))


def count_rows(rows: list[list[int] | None], width: int) -> pa.Array:
    """A ``list<int64>`` column of count vectors: ``rows`` holds each row's bucket indices (one
    per occurrence), None for a missing document, whose row is null."""
    counts = np.zeros((len(rows), width), dtype=np.int64)
    for i, indices in enumerate(rows):
        if indices:
            np.add.at(counts[i], indices, 1)
    offsets = pa.array(np.arange(0, (len(rows) + 1) * width, width, dtype=np.int32))
    nulls = pa.array([r is None for r in rows], pa.bool_())
    return pa.ListArray.from_arrays(offsets, pa.array(counts.ravel()), mask=nulls)

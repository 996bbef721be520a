"""Ray's document-term vectorizers: each string column becomes a ``list<int64>`` column of
token counts. ``HashingVectorizer`` puts a token in bucket ``simple_hash(token, num_features)``
(no fitting); ``CountVectorizer`` learns its vocabulary (token counts, in one aggregation pass)
and gives each token of it a position, most frequent first, ties in order of first appearance."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from itertools import chain
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from dataflow.preprocessor import check_columns
from dataflow.preprocessors._columnwise import put_column
from dataflow.preprocessors._stats import ValueCounts, value_counts
from dataflow.preprocessors.tokenizer import TokenizingPreprocessor
from dataflow.preprocessors.utils import Tokenizer as TokenizationFn
from dataflow.preprocessors.utils import count_rows, simple_hash, tokenize_ignoring_nulls

if TYPE_CHECKING:
    from dataflow.dataset import Dataset


class _CountingVectorizer(TokenizingPreprocessor):
    """Tokenize each column and count each row's tokens into a fixed-width vector;
        subclasses say how wide (``_width``) and which positions a row's tokens take (``_positioner``,
    made once per column and batch)."""

    _batch_format = "pyarrow"

    def _width(self, column: str) -> int:
        raise NotImplementedError

    def _positioner(self, column: str) -> Callable[[list[str]], list[int]]:
        raise NotImplementedError

    def _transform_arrow(self, table: pa.Table) -> pa.Table:
        check_columns(table.column_names, self._columns, type(self).__name__)
        vectors = []
        for column in self._columns:
            tokenized = self._tokenize(table.column(column).to_pylist())
            positions = self._positioner(column)
            rows = [None if tokens is None else positions(tokens) for tokens in tokenized]
            vectors.append(count_rows(rows, self._width(column)))
        for name, values in zip(self._output_columns, vectors, strict=True):
            table = put_column(table, name, values)
        return table


class HashingVectorizer(_CountingVectorizer):
    """Count each string's tokens into ``num_features`` buckets by hashing them (the hashing
    trick): bucket ``i`` counts the tokens with ``simple_hash(token, num_features) == i``.
    Not fittable; a missing string gives a null row."""

    _is_fittable = False
    _repr_fields = ("num_features", "tokenization_fn")

    def __init__(
        self,
        columns: list[str],
        num_features: int,
        tokenization_fn: TokenizationFn | None = None,
        *,
        output_columns: list[str] | None = None,
    ) -> None:
        super().__init__(columns, tokenization_fn, output_columns)
        self._num_features = num_features

    @property
    def num_features(self) -> int:
        """The number of buckets (the vectors' length)."""
        return self._num_features

    def _width(self, column: str) -> int:
        return self._num_features

    def _positioner(self, column: str) -> Callable[[list[str]], list[int]]:
        buckets: dict[str, int] = {}  # a batch hashes each distinct token once

        def positions(tokens: list[str]) -> list[int]:
            for token in tokens:
                if token not in buckets:
                    buckets[token] = simple_hash(token, self._num_features)
            return [buckets[token] for token in tokens]

        return positions


class TokenCounts(ValueCounts):
    """How many times each token of a string column appears (missing strings add none)."""

    def __init__(self, on: str, tokenization_fn: TokenizationFn) -> None:
        super().__init__(on, explode_lists=True, alias_name=f"token_counts({on})")
        self.tokenization_fn = tokenization_fn

    def aggregate_block(self, block: pa.Table) -> dict[Any, int]:
        tokenized = tokenize_ignoring_nulls(block.column(self.on).to_pylist(), self.tokenization_fn)
        return dict(Counter(chain.from_iterable(t for t in tokenized if t is not None)))


class CountVectorizer(_CountingVectorizer):
    """Count each string's tokens against a vocabulary learnt by ``fit``: the
    (``max_features`` most frequent) tokens, most frequent first, ties in order of first
    appearance. Stats: ``token_counts(A)``, a ``Counter`` in that order."""

    _repr_fields = ("tokenization_fn", "max_features")

    def __init__(
        self,
        columns: list[str],
        tokenization_fn: TokenizationFn | None = None,
        max_features: int | None = None,
        *,
        output_columns: list[str] | None = None,
    ) -> None:
        super().__init__(columns, tokenization_fn, output_columns)
        self._max_features = max_features

    @property
    def max_features(self) -> int | None:
        """How many of the most frequent tokens the vocabulary keeps (None: all)."""
        return self._max_features

    def _fit(self, ds: Dataset) -> dict[str, Any]:
        aggs = [TokenCounts(c, self._tokenization_fn) for c in self._columns]
        result = ds.aggregate(*aggs) or {}
        return {agg.name: Counter(dict(value_counts(result, agg.name).most_common(self._max_features))) for agg in aggs}

    def _width(self, column: str) -> int:
        return len(self.stats_[f"token_counts({column})"])

    def _positioner(self, column: str) -> Callable[[list[str]], list[int]]:
        counts: Counter = self.stats_[f"token_counts({column})"]
        vocabulary = {token: i for i, (token, _) in enumerate(counts.most_common())}
        return lambda tokens: [vocabulary[t] for t in tokens if t in vocabulary]

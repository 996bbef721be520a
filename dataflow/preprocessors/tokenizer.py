"""Ray's ``Tokenizer``: each string becomes its list of tokens (``tokenization_fn``, by
default a split on single spaces); a missing string stays missing. Also the shared base of the
preprocessors that tokenize (the vectorizers)."""

from __future__ import annotations

import pandas as pd

from dataflow.preprocessors._columnwise import ColumnwisePreprocessor
from dataflow.preprocessors.utils import Tokenizer as TokenizationFn
from dataflow.preprocessors.utils import function_name, simple_split_tokenizer, tokenize_ignoring_nulls


class TokenizingPreprocessor(ColumnwisePreprocessor):
    """Columns of strings in, one output column each; holds ``tokenization_fn`` and shows it
    in ``__repr__`` by name, as Ray's."""

    def __init__(
        self,
        columns: list[str],
        tokenization_fn: TokenizationFn | None = None,
        output_columns: list[str] | None = None,
    ) -> None:
        super().__init__(columns, output_columns)
        self._tokenization_fn = tokenization_fn or simple_split_tokenizer

    @property
    def tokenization_fn(self) -> TokenizationFn:
        """The function splitting a string into tokens."""
        return self._tokenization_fn

    def _repr_value(self, name: str) -> str:
        if name == "tokenization_fn":
            return function_name(self._tokenization_fn)
        return super()._repr_value(name)

    def _tokenize(self, values: list) -> list[list[str] | None]:
        return tokenize_ignoring_nulls(values, self._tokenization_fn)


class Tokenizer(TokenizingPreprocessor):
    """Replace each string with its list of tokens (a ``list<string>`` column). Not fittable."""

    _is_fittable = False
    _repr_fields = ("tokenization_fn",)

    def _transform_pandas(self, df: pd.DataFrame) -> pd.DataFrame:
        return self._map_columns(df, lambda s, _: pd.Series(self._tokenize(s.tolist()), index=s.index, dtype=object))

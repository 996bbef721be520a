"""Ray's ``FeatureHasher``: columns that each count one token become one vector column of
``num_features`` buckets, column ``c`` added into bucket ``simple_hash(c, num_features)``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from dataflow.preprocessor import Preprocessor, check_columns
from dataflow.preprocessors._columnwise import put_column
from dataflow.preprocessors.utils import simple_hash
from engine.block_format import tensor_array


class FeatureHasher(Preprocessor):
    """The hashing trick on a table of token frequencies: bucket ``i`` of ``output_column`` is
    the sum of the columns whose name hashes to ``i`` (a missing count makes its bucket NaN).
    The input columns are kept. Not fittable."""

    _is_fittable = False
    _batch_format = "pyarrow"

    def __init__(self, columns: list[str], num_features: int, output_column: str) -> None:
        super().__init__()
        self._columns = columns
        self._num_features = num_features
        self._output_column = output_column

    @property
    def columns(self) -> list[str]:
        """The token-count columns read."""
        return self._columns

    @property
    def num_features(self) -> int:
        """The number of buckets (the vectors' length)."""
        return self._num_features

    @property
    def output_column(self) -> str:
        """The column of vectors written."""
        return self._output_column

    def _transform_arrow(self, table: pa.Table) -> pa.Table:
        check_columns(table.column_names, self._columns, type(self).__name__)
        counts = table.select(self._columns).to_pandas()
        if counts.isna().to_numpy().any():
            counts = counts.astype(np.float64)  # as Ray: a missing count is NaN, the bucket stays a float
        values = counts.to_numpy()
        dtype = values.dtype if values.dtype != object else np.float64
        hashed = np.zeros((table.num_rows, self._num_features), dtype=dtype)
        for j, column in enumerate(self._columns):
            hashed[:, simple_hash(column, self._num_features)] += values[:, j].astype(dtype)
        vectors = tensor_array(hashed)  # Ray's tensor type
        return put_column(table, self._output_column, vectors)

    def get_input_columns(self) -> list[str]:
        return list(self._columns)

    def get_output_columns(self) -> list[str]:
        return [self._output_column]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(columns={self._columns!r}, num_features={self._num_features!r}, "
            f"output_column={self._output_column!r})"
        )

"""``Concatenator`` (Ray's ``ray.data.preprocessors.concatenator``): several numeric columns
into one column of fixed-length vectors."""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa

from dataflow.preprocessor import Preprocessor
from engine.block_format import tensor_array

logger = logging.getLogger(__name__)


class Concatenator(Preprocessor):
    """Stack ``columns`` (in that order) into ``output_column_name``, one vector per row, and
    drop them. ``dtype``: the vectors' numpy dtype; ``flatten``: vector-valued columns are
    spliced in; ``raise_if_missing``: a missing column is an error, else a logged warning."""

    _is_fittable = False
    _batch_format = "pyarrow"

    def __init__(
        self,
        columns: list[str],
        output_column_name: str = "concat_out",
        dtype: np.dtype | None = None,
        raise_if_missing: bool = False,
        flatten: bool = False,
    ) -> None:
        super().__init__()
        self._columns = list(columns)
        self._output_column_name = output_column_name
        self._dtype = dtype
        self._raise_if_missing = raise_if_missing
        self._flatten = flatten

    @property
    def columns(self) -> list[str]:
        """The columns stacked, in order."""
        return self._columns

    @property
    def output_column_name(self) -> str:
        """The column of vectors."""
        return self._output_column_name

    def _transform_arrow(self, table: pa.Table) -> pa.Table:
        missing = set(self._columns) - set(table.column_names)
        if missing:
            message = f"Missing columns specified in '{self._columns}': {missing}"
            if self._raise_if_missing:
                raise ValueError(message)
            logger.warning(message)
        present = [c for c in self._columns if c in table.column_names]
        frame = table.select(present).to_pandas()
        if self._flatten:
            stacked = np.stack([self._flatten_row(row) for row in frame.itertuples(index=False)]) if len(frame) else None
        else:
            stacked = np.column_stack([frame[c].to_numpy(dtype=self._dtype) for c in present]) if present else None
        if stacked is None:
            vectors = pa.array([[]] * table.num_rows, pa.list_(pa.float64()))
        else:
            vectors = tensor_array(stacked)  # Ray's tensor type (numbers; other values a fixed-size list)
        return table.drop_columns(present).append_column(self._output_column_name, vectors)

    def _flatten_row(self, row: tuple) -> np.ndarray:
        parts = [np.atleast_1d(np.asarray(v)) for v in row]
        if self._dtype is not None:
            parts = [p.astype(self._dtype) for p in parts]
        return np.concatenate(parts)

    def get_input_columns(self) -> list[str]:
        """The columns stacked."""
        return self._columns

    def get_output_columns(self) -> list[str]:
        """The column of vectors."""
        return [self._output_column_name]

    def __repr__(self) -> str:
        defaults = {"output_column_name": "concat_out", "columns": None, "dtype": None, "raise_if_missing": False, "flatten": False}
        shown = [f"{name}={getattr(self, '_' + name)}" for name, default in defaults.items() if getattr(self, "_" + name) != default]
        return f"{type(self).__name__}({', '.join(shown)})"



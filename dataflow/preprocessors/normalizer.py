"""``Normalizer`` (Ray's ``ray.data.preprocessors.normalizer``): scale each row to unit norm."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dataflow.preprocessor import check_columns
from dataflow.preprocessors._columnwise import ColumnwisePreprocessor


def _norm(values: np.ndarray, norm: str) -> np.ndarray:
    if norm == "l1":
        return np.abs(values).sum(axis=1)
    if norm == "l2":
        return np.sqrt(np.power(values, 2).sum(axis=1))
    return np.max(np.abs(values), axis=1)


class Normalizer(ColumnwisePreprocessor):
    """Divide each row of ``columns`` by its ``"l1"``, ``"l2"`` or ``"max"`` norm (needs no fit)."""

    _is_fittable = False
    _norms = ("l1", "l2", "max")
    _repr_fields = ("norm",)

    def __init__(self, columns: list[str], norm: str = "l2", *, output_columns: list[str] | None = None) -> None:
        if norm not in self._norms:
            msg = f"Norm {norm} is not supported.Supported values are: {list(self._norms)}"
            raise ValueError(msg)
        super().__init__(columns, output_columns)
        self._norm = norm

    @property
    def norm(self) -> str:
        """Which norm each row is divided by."""
        return self._norm

    def _transform_pandas(self, df: pd.DataFrame) -> pd.DataFrame:
        check_columns(list(df.columns), self._columns, type(self).__name__)
        columns = df.loc[:, self._columns]
        norms = _norm(columns.to_numpy(dtype="float64"), self._norm)
        df[self._output_columns] = columns.div(norms, axis=0)
        return df

"""Ray's ``PowerTransformer``: a fixed power transform per column (Yeo-Johnson, or Box-Cox for
positive data) that makes data more Gaussian-like. The power is given, not fitted."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dataflow.preprocessors._columnwise import ColumnwisePreprocessor


class PowerTransformer(ColumnwisePreprocessor):
    """Yeo-Johnson (``method="yeo-johnson"``, any real data) or Box-Cox (``"box-cox"``, positive
    data) with the given ``power``, each column on its own, as float64. Not fittable."""

    _valid_methods = ("yeo-johnson", "box-cox")
    _is_fittable = False
    _repr_fields = ("power", "method")

    def __init__(
        self,
        columns: list[str],
        power: float,
        method: str = "yeo-johnson",
        *,
        output_columns: list[str] | None = None,
    ) -> None:
        super().__init__(columns, output_columns)
        self._power = power
        self._method = method
        if method not in self._valid_methods:
            msg = f"Method {method} is not supported.Supported values are: {list(self._valid_methods)}"
            raise ValueError(msg)

    @property
    def power(self) -> float:
        """The power parameter (lambda)."""
        return self._power

    @property
    def method(self) -> str:
        """``"yeo-johnson"`` or ``"box-cox"``."""
        return self._method

    def _transform_pandas(self, df: pd.DataFrame) -> pd.DataFrame:
        transform = self._yeo_johnson if self._method == "yeo-johnson" else self._box_cox
        return self._map_columns(df, lambda s, _: transform(s))

    def _yeo_johnson(self, s: pd.Series) -> np.ndarray:
        power = self._power
        result = np.zeros_like(s, dtype=np.float64)
        positive = (s >= 0).fillna(False).to_numpy(dtype=bool)  # a missing value takes the negative branch: NaN
        values = s.to_numpy(dtype=np.float64, na_value=np.nan)
        if power != 0:
            result[positive] = (np.power(values[positive] + 1, power) - 1) / power
        else:
            result[positive] = np.log(values[positive] + 1)
        if power != 2:
            result[~positive] = -(np.power(-values[~positive] + 1, 2 - power) - 1) / (2 - power)
        else:
            result[~positive] = -np.log(-values[~positive] + 1)
        return result

    def _box_cox(self, s: pd.Series) -> pd.Series:
        if self._power != 0:
            return (np.power(s, self._power) - 1) / self._power
        return np.log(s)

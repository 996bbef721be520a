"""The shared shape of the preprocessors that rewrite each of ``columns`` into the matching
name of ``output_columns`` (the same columns unless given): settings, repr, column checks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd
import pyarrow as pa

from dataflow.preprocessor import Preprocessor, check_columns


class ColumnwisePreprocessor(Preprocessor):
    """``columns`` in, ``output_columns`` out, one for one; ``_repr_fields`` lists the
    settings ``__repr__`` shows between ``columns`` and ``output_columns``, as Ray's."""

    _repr_fields: tuple[str, ...] = ()

    def __init__(self, columns: list[str], output_columns: list[str] | None = None) -> None:
        super().__init__()
        if isinstance(columns, str):
            msg = f"columns must be a list of column names, got the string {columns!r}"
            raise TypeError(msg)
        self._columns = list(columns)
        self._output_columns = Preprocessor._derive_and_validate_output_columns(self._columns, output_columns)

    @property
    def columns(self) -> list[str]:
        """The columns read."""
        return self._columns

    @property
    def output_columns(self) -> list[str]:
        """The columns written (the input columns unless given)."""
        return self._output_columns

    def _map_columns(self, df: pd.DataFrame, fn: Callable[[pd.Series, str], Any]) -> pd.DataFrame:
        """``df`` with each output column set to ``fn(input series, input name)``; all inputs
        are read before any output is written, so outputs may overwrite later inputs."""
        check_columns(list(df.columns), self._columns, type(self).__name__)
        results = [fn(df[c], c) for c in self._columns]
        for name, values in zip(self._output_columns, results, strict=True):
            df[name] = values
        return df

    def _repr_value(self, name: str) -> str:
        """How ``__repr__`` shows the setting ``name`` (its repr; a subclass may differ)."""
        return repr(getattr(self, "_" + name))

    def __repr__(self) -> str:
        fields = [f"columns={self._columns!r}"]
        fields += [f"{name}={self._repr_value(name)}" for name in self._repr_fields]
        fields.append(f"output_columns={self._output_columns!r}")
        return f"{type(self).__name__}({', '.join(fields)})"


def put_column(table: pa.Table, name: str, values: pa.Array) -> pa.Table:
    """``table`` with column ``name`` replaced by ``values``, or appended where it is new."""
    if name in table.column_names:
        return table.set_column(table.column_names.index(name), name, values)
    return table.append_column(name, values)

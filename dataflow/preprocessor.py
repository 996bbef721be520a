"""The base of every preprocessor (Ray's ``ray.data.preprocessor``): fit, transform, state.

A preprocessor learns statistics from a dataset (``fit``) and then rewrites batches with them
(``transform`` on a dataset, ``transform_batch`` on one batch). Subclasses say what to compute
(``_fit``, returning the ``stats_`` dict under Ray's key names) and how to rewrite one batch
(``_transform_pandas``, ``_transform_numpy`` or ``_transform_arrow``: the one implemented, or
``preferred_batch_format()``; dataflow's own name theirs in ``_batch_format``). The rewrite runs
in worker processes, so a preprocessor must pickle: keep plain data in its attributes.
"""

from __future__ import annotations

import base64
import collections.abc
import pickle
import warnings
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pandas as pd
import pyarrow as pa

from engine.block_format import to_batch, to_block

if TYPE_CHECKING:
    from dataflow.dataset import Dataset

Batch = pd.DataFrame | pa.Table | dict[str, np.ndarray]


class BatchFormat(str, Enum):  # noqa: UP042 - str + Enum as Ray's
    """The batch formats a preprocessor transforms in (Ray's ``BatchFormat``)."""

    PANDAS = "pandas"
    ARROW = "arrow"
    NUMPY = "numpy"


class PreprocessorNotFittedException(RuntimeError):
    """Raised when a preprocessor that needs fitting is used before ``fit``."""


class Preprocessor:
    """A fittable batch transformation, as Ray's ``Preprocessor``.

    Subclasses set ``_is_fittable = False`` when they learn nothing, otherwise implement
    ``_fit(ds) -> stats`` computing everything in one ``ds.aggregate`` call where they can.
    """

    class FitStatus(str, Enum):  # noqa: UP042 - str + Enum as Ray's, whose str() differs
        """Whether a preprocessor has been fitted (Ray's values)."""

        NOT_FITTABLE = "NOT_FITTABLE"
        NOT_FITTED = "NOT_FITTED"
        PARTIALLY_FITTED = "PARTIALLY_FITTED"
        FITTED = "FITTED"

    _is_fittable: bool = True
    _batch_format: ClassVar[str] = "pandas"  # which of _transform_pandas/_transform_arrow runs
    _columns: list[str]

    def __init__(self) -> None:
        self.stats_: dict[str, Any] = {}

    # state --------------------------------------------------------------------------------
    def fit_status(self) -> Preprocessor.FitStatus:
        """NOT_FITTABLE, FITTED (after ``fit``, or with stats) or NOT_FITTED."""
        if not self._is_fittable:
            return Preprocessor.FitStatus.NOT_FITTABLE
        if getattr(self, "_fitted", False) or self.stats_:
            return Preprocessor.FitStatus.FITTED
        return Preprocessor.FitStatus.NOT_FITTED

    def has_stats(self) -> bool:
        """Whether ``fit`` left any statistics."""
        return bool(self.stats_)

    def _check_fitted(self, what: str) -> None:
        if self.fit_status() in (Preprocessor.FitStatus.NOT_FITTED, Preprocessor.FitStatus.PARTIALLY_FITTED):
            raise PreprocessorNotFittedException(what)

    # fitting ------------------------------------------------------------------------------
    def fit(self, ds: Dataset) -> Preprocessor:
        """Learn the statistics from ``ds``; fitting again replaces them (with a warning)."""
        status = self.fit_status()
        if status == Preprocessor.FitStatus.NOT_FITTABLE:
            return self
        if status in (Preprocessor.FitStatus.FITTED, Preprocessor.FitStatus.PARTIALLY_FITTED):
            warnings.warn(
                "`fit` has already been called on the preprocessor (or at least one "
                "contained preprocessors if this is a chain). "
                "All previously fitted state will be overwritten!",
                stacklevel=2,
            )
        self.stats_ = {}
        learned = self._fit(ds)
        if learned is not self:  # (Ray's contract: _fit sets self.stats_ and returns self)
            self.stats_ = learned
        self._fitted = True
        return self

    def _fit(self, ds: Dataset) -> Any:
        """The statistics of ``ds`` this preprocessor needs, under Ray's key names; or, as a
        subclass written for Ray does, ``self`` after setting ``self.stats_``."""
        raise NotImplementedError

    def fit_transform(
        self,
        ds: Dataset,
        *,
        transform_num_cpus: float | None = None,
        transform_memory: float | None = None,
        transform_batch_size: int | None = None,
        transform_concurrency: int | None = None,
    ) -> Dataset:
        """``fit(ds)`` then ``transform(ds)``."""
        self.fit(ds)
        return self.transform(
            ds,
            batch_size=transform_batch_size,
            num_cpus=transform_num_cpus,
            memory=transform_memory,
            concurrency=transform_concurrency,
        )

    # transforming -------------------------------------------------------------------------
    def transform(
        self,
        ds: Dataset,
        *,
        batch_size: int | None = None,
        num_cpus: float | None = None,
        memory: float | None = None,
        concurrency: int | None = None,
    ) -> Dataset:
        """``ds`` with each batch rewritten (lazily, by ``map_batches``)."""
        self._check_fitted("`fit` must be called before `transform`, or simply use fit_transform() to run both steps")
        return self._transform(ds, batch_size=batch_size, num_cpus=num_cpus, memory=memory, concurrency=concurrency)

    def _transform(self, ds: Dataset, **options: Any) -> Dataset:
        kwargs = {name: value for name, value in options.items() if value is not None}
        return ds.map_batches(self._transform_format, batch_format=self._kind(), **kwargs)

    @classmethod
    def preferred_batch_format(cls) -> BatchFormat:
        """The batch format to transform in when a subclass implements more than one of
        ``_transform_pandas``, ``_transform_numpy`` and ``_transform_arrow`` (Ray's; pandas)."""
        return BatchFormat.PANDAS

    def _kind(self) -> str:
        """Which ``_transform_*`` runs, as Ray picks it: the one a subclass implements, or its
        ``preferred_batch_format()`` among several; dataflow's own preprocessors name theirs
        (``_batch_format``)."""
        cls = type(self)
        if any("_batch_format" in vars(c) for c in cls.__mro__ if c is not Preprocessor):
            return cls._batch_format
        implemented = [kind for kind, method in (("pandas", "_transform_pandas"), ("numpy", "_transform_numpy"),
                                                   ("pyarrow", "_transform_arrow"))
                       if getattr(cls, method) is not getattr(Preprocessor, method)]
        if len(implemented) > 1:
            preferred = str(BatchFormat(self.preferred_batch_format()).value)
            return "pyarrow" if preferred == "arrow" else preferred
        if not implemented:
            msg = ("None of `_transform_numpy`, `_transform_pandas` or `_transform_arrow` are implemented. At least "
                   "one of these transform functions must be implemented for Preprocessor transforms.")
            raise NotImplementedError(msg)
        return implemented[0]

    def transform_batch(self, data: Batch) -> Batch:
        """One batch rewritten: a pandas DataFrame, a pyarrow Table or a dict of numpy arrays
        in, the same kind out."""
        self._check_fitted("`fit` must be called before `transform_batch`.")
        return self._transform_batch(data)

    def _transform_batch(self, data: Batch) -> Batch:
        if isinstance(data, pd.DataFrame):
            kind = "pandas"
        elif isinstance(data, pa.Table):
            kind = "pyarrow"
        elif isinstance(data, collections.abc.Mapping):
            kind = "numpy"
        else:
            msg = (
                "`transform_batch` is only implemented for pandas DataFrames, pyarrow Tables and "
                f"dicts of numpy arrays. Got {type(data)}."
            )
            raise ValueError(msg)
        result = self._transform_format(_convert(data, self._kind()))
        return _convert(result, kind)

    def _transform_format(self, batch: Any) -> Any:
        """The batch in ``_kind()``'s format rewritten; the function ``map_batches`` runs."""
        kind = self._kind()
        if kind == "pyarrow":
            # pandas metadata would turn a rewritten column back to its old dtype in to_pandas
            return self._transform_arrow(batch).replace_schema_metadata(None)
        if kind == "numpy":
            return self._transform_numpy(batch)
        return self._transform_pandas(batch.copy(deep=False))

    def _transform_pandas(self, df: pd.DataFrame) -> pd.DataFrame:
        raise NotImplementedError

    def _transform_numpy(self, data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def _transform_arrow(self, table: pa.Table) -> pa.Table:
        raise NotImplementedError

    # columns ------------------------------------------------------------------------------
    def get_input_columns(self) -> list[str]:
        """The columns this preprocessor reads."""
        return list(getattr(self, "_columns", []))

    def get_output_columns(self) -> list[str]:
        """The columns this preprocessor writes."""
        return list(getattr(self, "_output_columns", []))

    @staticmethod
    def _derive_and_validate_output_columns(columns: list[str], output_columns: list[str] | None) -> list[str]:
        """``output_columns``, or ``columns`` when not given; their lengths must match."""
        if output_columns and len(columns) != len(output_columns):
            msg = (
                "Invalid output_columns: Got len(columns) != len(output_columns). "
                "The length of columns and output_columns must match."
            )
            raise ValueError(msg)
        return list(output_columns or columns)

    # serialization ------------------------------------------------------------------------
    def serialize(self) -> str:
        """This preprocessor (settings and fitted state) as a string: pickle, base64-encoded,
        as Ray's legacy format. Not a stable format: read it back with the same version."""
        return base64.b64encode(pickle.dumps(self)).decode("ascii")

    @staticmethod
    def deserialize(serialized: str) -> Preprocessor:
        """The preprocessor ``serialize()`` wrote."""
        return pickle.loads(base64.b64decode(serialized))


def check_columns(names: list[str], columns: list[str], what: str) -> None:
    """Raise ``ValueError`` naming the ``columns`` missing from ``names``."""
    missing = [c for c in columns if c not in names]
    if missing:
        msg = f"{what}: column(s) {missing} not found; the batch has {list(names)}"
        raise ValueError(msg)


def _convert(batch: Any, kind: str) -> Any:
    """``batch`` (pandas, pyarrow or a dict of numpy arrays) as ``kind``, through the engine's
    own batch conversions (``to_block`` / ``to_batch``, what ``map_batches`` uses); a batch
    already of that kind as it is."""
    if (kind == "pandas" and isinstance(batch, pd.DataFrame)) or (kind == "pyarrow" and isinstance(batch, pa.Table)):
        return batch
    table = to_block(batch).replace_schema_metadata(None)
    return to_batch(table, kind, arrow_backed_pandas=False)

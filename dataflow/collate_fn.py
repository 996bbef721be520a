"""Ray Data's collate function classes (``ray.data.collate_fn``) for ``iter_torch_batches(
collate_fn=...)``: subclass one and implement ``__call__``; which one you subclass says what
each batch arrives as. A plain function gets the numpy dict, as ``NumpyBatchCollateFn`` does.

* ``ArrowBatchCollateFn``: a ``pyarrow.Table`` (no conversion at all; build tensors as you like).
* ``NumpyBatchCollateFn``: ``{column: np.ndarray}``.
* ``PandasBatchCollateFn``: a ``pandas.DataFrame``.
"""

from __future__ import annotations

import abc
from typing import Any

import pyarrow as pa

from engine.block_format import to_batch


class CollateFn(abc.ABC):
    """A batch in, what the training loop gets out."""

    batch_format = "numpy"

    @abc.abstractmethod
    def __call__(self, batch: Any) -> Any:
        """The collated data for one batch."""


class ArrowBatchCollateFn(CollateFn):
    """Gets each batch as a ``pyarrow.Table``."""

    batch_format = "pyarrow"


class NumpyBatchCollateFn(CollateFn):
    """Gets each batch as ``{column: np.ndarray}``."""

    batch_format = "numpy"


class PandasBatchCollateFn(CollateFn):
    """Gets each batch as a ``pandas.DataFrame``."""

    batch_format = "pandas"


def collate_input(collate_fn: Any, table: pa.Table) -> Any:
    """``table`` in the format ``collate_fn`` takes: its class's, or the numpy dict for a function."""
    return to_batch(table, getattr(collate_fn, "batch_format", "numpy") if isinstance(collate_fn, CollateFn) else "numpy")

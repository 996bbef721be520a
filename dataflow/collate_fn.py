"""Ray Data's collate function classes (``ray.data.collate_fn``) for ``iter_torch_batches(
collate_fn=...)``: subclass one and implement ``__call__``; which one you subclass says what
each batch arrives as. A plain function gets the numpy dict, as ``NumpyBatchCollateFn`` does.

* ``ArrowBatchCollateFn``: a ``pyarrow.Table`` (no conversion at all; build tensors as you like).
* ``NumpyBatchCollateFn``: ``{column: np.ndarray}``.
* ``PandasBatchCollateFn``: a ``pandas.DataFrame``.
* ``DefaultCollateFn(dtypes=None, combine_chunks=False, num_workers=4)``: the collate
  ``iter_torch_batches`` runs without one, as a class to pass or subclass: a table in,
  ``{column: torch.Tensor}`` out, each tensor its own memory (``dtypes``: one ``torch.dtype``
  or one per column). Ray's returns a list of tensors per column (one per Arrow chunk) when
  ``combine_chunks=False`` and joins them when it moves the batch to a device; this one
  returns one tensor per column either way, which is what a training loop sees in both.
  ``num_workers`` is accepted: the columns are converted without threads (views of the
  batch's memory, copied once).
"""

from __future__ import annotations

import abc
from typing import Any

import numpy as np
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


class DefaultCollateFn(ArrowBatchCollateFn):
    """Ray's ``DefaultCollateFn``: an Arrow batch as ``{column: torch.Tensor}``."""

    def __init__(self, dtypes: Any = None, combine_chunks: bool = False, num_workers: int = 4) -> None:
        from dataflow.torch_batches import check_dtypes

        check_dtypes(dtypes)
        self.dtypes = dtypes
        self.combine_chunks = combine_chunks
        self.num_workers = num_workers

    def __call__(self, batch: pa.Table) -> dict[str, Any]:
        from dataflow.torch_batches import to_tensors

        # private=False: tensors get memory of their own (a batch's may be the block's, shared)
        return to_tensors(to_batch(batch, "numpy"), self.dtypes, private=False)


def collate_input(collate_fn: Any, table: pa.Table) -> Any:
    """``table`` in the format ``collate_fn`` takes: its class's, or the numpy dict for a function."""
    return to_batch(table, getattr(collate_fn, "batch_format", "numpy") if isinstance(collate_fn, CollateFn) else "numpy")


def stack_cells(array: np.ndarray, what: str, makes: str, shapes_hint: str, values_hint: str) -> np.ndarray:
    """An object column (``what``: how errors name it) whose cells are equal-shape numeric
    arrays, stacked into one array; anything else is a ``TypeError`` saying it does not make
    ``makes`` (``one tensor``, ``one jax.Array``), with ``shapes_hint`` for cells of different
    shapes and ``values_hint`` for other values. For the frameworks' batch conversions."""
    cells = list(array)
    if cells and all(c is None for c in cells):  # a column of Arrow's null type: NaNs, as Ray's
        return np.full(len(cells), np.nan, dtype=np.float32)
    if cells and all(isinstance(c, np.ndarray) and c.dtype != object for c in cells):
        try:
            return np.stack(cells)
        except ValueError:
            shapes = sorted({c.shape for c in cells})
            msg = (
                f"{what} holds arrays of different shapes ({', '.join(map(str, shapes[:4]))}"
                f"{'...' if len(shapes) > 4 else ''}), which do not make {makes}; {shapes_hint}"
            )
            raise TypeError(msg) from None
    kind = type(cells[0]).__name__ if cells else "nothing"
    raise TypeError(f"{what} holds {kind} values (strings, ragged lists or nulls), {values_hint}")

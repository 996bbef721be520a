"""Ray's ``ray.data.block`` names a custom connector uses: ``Block`` (a ``pyarrow.Table`` here),
``BlockMetadata``, ``BlockAccessor`` for the conversions Ray's sink examples call, and
``DataBatch``, the type of what ``map_batches`` gives a UDF."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Union

import numpy as np
import pyarrow as pa

from connectors.base import Block, BlockMetadata

if TYPE_CHECKING:
    import pandas

__all__ = ["Block", "BlockAccessor", "BlockMetadata", "DataBatch"]

DataBatch = Union[pa.Table, "pandas.DataFrame", dict[str, np.ndarray]]
"""A batch as a UDF gets it: an Arrow table, a pandas DataFrame or a dict of numpy arrays."""


class BlockAccessor:
    """A block's contents in other forms: ``BlockAccessor.for_block(block).to_pandas()``."""

    def __init__(self, table: pa.Table) -> None:
        self._table = table

    @staticmethod
    def for_block(block: Any) -> BlockAccessor:
        if isinstance(block, pa.RecordBatch):
            block = pa.Table.from_batches([block])
        elif type(block).__module__.split(".")[0] == "pandas":
            from engine.block_format import frame_to_table

            block = frame_to_table(block)
        if not isinstance(block, pa.Table):
            msg = f"a block is a pyarrow Table (or a pandas DataFrame), got {type(block).__name__}"
            raise TypeError(msg)
        return BlockAccessor(block)

    def num_rows(self) -> int:
        return self._table.num_rows

    def size_bytes(self) -> int:
        return self._table.nbytes

    def schema(self) -> pa.Schema:
        return self._table.schema

    def to_arrow(self) -> pa.Table:
        return self._table

    def to_pandas(self) -> Any:
        from dataflow.context import DataContext
        from engine.block_format import table_to_pandas

        return table_to_pandas(self._table, DataContext.get_current().enable_arrow_backed_pandas_conversion)

    def to_numpy(self, columns: str | list[str] | None = None) -> Any:
        from engine.block_format import to_batch

        batch = to_batch(self._table, "numpy")
        if isinstance(columns, str):
            return batch[columns]
        return batch if columns is None else {c: batch[c] for c in columns}

    def to_batch_format(self, batch_format: str | None) -> Any:
        from engine.block_format import to_batch

        return to_batch(self._table, batch_format)

    def iter_rows(self, public_row_format: bool = True) -> Iterator[dict[str, Any]]:
        from engine.block_format import iter_rows

        return iter(iter_rows(self._table))

    def slice(self, start: int, end: int, copy: bool = False) -> pa.Table:
        from engine.block_format import slice_rows

        return slice_rows(self._table, start, end - start)

    def get_metadata(self, input_files: list[str] | None = None, exec_stats: Any = None) -> BlockMetadata:
        return BlockMetadata(self._table.num_rows, self._table.nbytes, tuple(input_files or ()), self._table.schema)

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

    # what Ray's custom aggregations (``AggregateFnV2.aggregate_block``) and sinks call ---------
    def column_names(self) -> list[str]:
        return self._table.column_names

    def to_block(self) -> pa.Table:
        return self._table

    def to_default(self) -> pa.Table:
        return self._table

    def _column(self, on: str) -> pa.ChunkedArray:
        if on is None:
            msg = f"Provided `on` value has to be non-null (got '{on}')"
            raise ValueError(msg)
        if on not in self._table.column_names:
            msg = f"Referencing column '{on}' not present in the schema: {self._table.schema}"
            raise ValueError(msg)
        return self._table[on]

    def count(self, on: str, ignore_nulls: bool = False) -> int:
        """Values of column ``on`` (non-null ones only with ``ignore_nulls``), as Ray's."""
        import pyarrow.compute as pc

        return int(pc.count(self._column(on), mode="only_valid" if ignore_nulls else "all").as_py())

    def sum(self, on: str, ignore_nulls: bool) -> Any:
        """Ray's: pyarrow's sum (None over a null unless ``ignore_nulls``; a NaN makes it NaN)."""
        import pyarrow.compute as pc

        return pc.sum(self._column(on), skip_nulls=ignore_nulls).as_py()

    def min(self, on: str, ignore_nulls: bool) -> Any:
        import pyarrow.compute as pc

        return pc.min(self._column(on), skip_nulls=ignore_nulls).as_py()

    def max(self, on: str, ignore_nulls: bool) -> Any:
        import pyarrow.compute as pc

        return pc.max(self._column(on), skip_nulls=ignore_nulls).as_py()

    def mean(self, on: str, ignore_nulls: bool) -> Any:
        import pyarrow.compute as pc

        return pc.mean(self._column(on), skip_nulls=ignore_nulls).as_py()

    def sum_of_squared_diffs_from_mean(self, on: str, ignore_nulls: bool, mean: Any = None) -> Any:
        """Σ (x - mean)² over column ``on`` (the column's own mean unless given), as Ray's."""
        import pyarrow.compute as pc

        column = self._column(on)
        if mean is None:
            mean = pc.mean(column, skip_nulls=ignore_nulls).as_py()
        if mean is None:
            return None
        return pc.sum(pc.power(pc.subtract(column, mean), 2), skip_nulls=ignore_nulls).as_py()

    def select(self, columns: list[str]) -> pa.Table:
        return self._table.select(list(columns))

    def take(self, indices: Any) -> pa.Table:
        return self._table.take(indices)

    def rename_columns(self, columns_rename: dict[str, str]) -> pa.Table:
        return self._table.rename_columns([columns_rename.get(name, name) for name in self._table.column_names])

    def fill_column(self, name: str, value: Any) -> pa.Table:
        """The block with column ``name`` (replaced or added) holding ``value`` in every row."""
        column = pa.array([value] * self._table.num_rows)
        if name in self._table.column_names:
            return self._table.set_column(self._table.column_names.index(name), name, column)
        return self._table.append_column(name, column)

    def hstack(self, other_block: Any) -> pa.Table:
        """This block's columns, then ``other_block``'s (the same rows)."""
        other = BlockAccessor.for_block(other_block).to_arrow()
        table = self._table
        for name in other.column_names:
            table = table.append_column(name, other[name])
        return table

    def random_shuffle(self, random_seed: int | None) -> pa.Table:
        return self._table.take(np.random.default_rng(random_seed).permutation(self._table.num_rows))

    def _get_row(self, index: int) -> dict[str, Any]:
        return self._table.slice(index, 1).to_pylist()[0]

    @staticmethod
    def builder() -> Any:
        """A builder of a block from rows and blocks (Ray's ``BlockAccessor.builder()``)."""
        from dataflow._internal.delegating_block_builder import DelegatingBlockBuilder

        return DelegatingBlockBuilder()

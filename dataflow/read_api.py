"""Where datasets come from: ``range``, ``from_*`` for data in memory, ``read_*`` for files.

Each validates its arguments and returns ``Dataset(Read(datasource))``; nothing is read until a
consuming call. File readers fail at once with FileNotFoundError when a path does not exist.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from connectors.base import Datasource
from connectors.memory import ArrowDatasource, RangeDatasource
from dataflow.dataset import Dataset
from dataflow.plan import Read


def read_datasource(datasource: Datasource, *, override_num_blocks: int | None = None) -> Dataset:
    """A dataset reading from a custom ``Datasource``."""
    return Dataset(Read(datasource, override_num_blocks or -1))


def range(n: int, *, override_num_blocks: int | None = None) -> Dataset:
    """Rows ``{"id": 0}`` ... ``{"id": n - 1}``."""
    return read_datasource(RangeDatasource(n, override_num_blocks))


def from_arrow(tables: pa.Table | Sequence[pa.Table], *, override_num_blocks: int | None = None) -> Dataset:
    if isinstance(tables, (pa.Table, pa.RecordBatch)):
        tables = [tables]
    tables = [pa.Table.from_batches([t]) if isinstance(t, pa.RecordBatch) else t for t in tables]
    return read_datasource(ArrowDatasource(tables, override_num_blocks, "FromArrow"))


def items_to_table(items: Sequence[Any]) -> pa.Table:
    """Dicts become columns; any other value becomes column ``item`` (as ``ray.data.from_items``)."""
    from engine.block_format import rows_to_block, to_block

    if items and all(isinstance(i, dict) for i in items):
        return rows_to_block(list(items))
    return to_block({"item": list(items)})


def from_items(items: Sequence[Any], *, override_num_blocks: int | None = None) -> Dataset:
    """A dataset of Python values: dicts become rows, other values a column ``item``."""
    items = list(items)
    return read_datasource(ArrowDatasource([items_to_table(items)], override_num_blocks, "FromItems"))


def from_pandas(dfs: Any, *, override_num_blocks: int | None = None) -> Dataset:
    frames = dfs if isinstance(dfs, (list, tuple)) else [dfs]
    tables = [pa.Table.from_pandas(df, preserve_index=False) for df in frames]
    return read_datasource(ArrowDatasource(tables, override_num_blocks, "FromPandas"))


def from_polars(dfs: Any, *, override_num_blocks: int | None = None) -> Dataset:
    frames = dfs if isinstance(dfs, (list, tuple)) else [dfs]
    return read_datasource(ArrowDatasource([df.to_arrow() for df in frames], override_num_blocks, "FromPolars"))


def from_numpy(ndarrays: np.ndarray | Sequence[np.ndarray], *, override_num_blocks: int | None = None) -> Dataset:
    """Column ``data``; an n-d array becomes one tensor column (one row per first-axis entry)."""
    from engine.block_format import tensor_array

    arrays = [ndarrays] if isinstance(ndarrays, np.ndarray) else list(ndarrays)
    tables = [pa.Table.from_arrays([tensor_array(np.asarray(a))], names=["data"]) for a in arrays]
    return read_datasource(ArrowDatasource(tables, override_num_blocks, "FromNumpy"))


def read_parquet(
    paths: str | list[str],
    *,
    columns: list[str] | None = None,
    filter: Any = None,
    filesystem: Any = None,
    partitioning: Any = "hive",
    include_paths: bool = False,
    override_num_blocks: int | None = None,
    **kwargs: Any,
) -> Dataset:
    """Parquet files: a file, a folder (recursive), a glob or a list; local or ``s3://``.

    ``columns`` and ``filter`` (a ``pyarrow.compute`` expression) are pushed into the reader;
    row groups whose statistics rule the filter out are never read.
    """
    from connectors.parquet_format import ParquetDatasource

    source = ParquetDatasource(paths, columns=columns, filter=filter, filesystem=filesystem,
                               partitioning=partitioning, include_paths=include_paths, **kwargs)
    return read_datasource(source, override_num_blocks=override_num_blocks)

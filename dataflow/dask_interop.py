"""Dask DataFrames in and out: Ray's ``Dataset.to_dask`` and ``from_dask``.

``to_dask`` runs the dataset once and makes one Dask partition of each of its blocks, in the
order ``to_pandas`` would give them (the dataset's order under ``preserve_order``), converted
to pandas as ``to_pandas`` converts (Ray 2.60's dtypes) when Dask computes that partition. The
blocks are held in this process, in the graph, so the DataFrame works with any Dask scheduler:
the default threads, processes, or a ``distributed`` cluster (which ships each partition's
block with its task). Ray instead keeps the blocks in its object store and requires Dask's
scheduler to be Dask-on-Ray, which it sets globally; dataflow changes no Dask setting.

``from_dask`` computes the DataFrame's partitions with the scheduler Dask is configured with and
makes one block of each, as Ray's does (the index is dropped, as ``from_pandas`` drops it).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from dataflow.context import DataContext

if TYPE_CHECKING:
    from dataflow.dataset import Dataset, MaterializedDataset


def _import_dask() -> tuple[Any, Any]:
    try:
        import dask
        import dask.dataframe as dd
    except ImportError as err:
        msg = "to_dask/from_dask need Dask's DataFrame: pip install 'dask[dataframe]' (or dataflow's 'dask' extra)"
        raise ImportError(msg) from err
    return dask, dd


def block_to_pandas(table: pa.Table, arrow_backed: bool) -> Any:
    """One block as the pandas DataFrame ``to_pandas`` would give for it."""
    from engine.block_format import table_to_pandas

    return table_to_pandas(table, arrow_backed)


def to_dask(ds: Dataset, meta: Any = None, verify_meta: bool = True) -> Any:
    """``ds`` as a Dask DataFrame with one partition per block (see the module docstring).

    ``meta``: Dask's ``meta`` (an empty DataFrame, a ``{name: dtype}`` dict, ``(name, dtype)``
    pairs...); by default, the empty frame of the dataset's schema. ``verify_meta``: Dask checks
    every partition against it.
    """
    dask, dd = _import_dask()
    arrow_backed = DataContext.get_current().enable_arrow_backed_pandas_conversion
    tables = [t for t in ds.iterator().iter_blocks() if t.num_rows]
    if meta is None:
        schema = tables[0].schema if tables else ds.schema(fetch_if_missing=True)
        if schema is None:
            raise ValueError("to_dask: the dataset has no rows and no schema; pass meta= to say its columns")
        arrow_schema = schema if isinstance(schema, pa.Schema) else schema.base_schema
        meta = block_to_pandas(arrow_schema.empty_table(), arrow_backed)
    if not tables:
        import pandas as pd

        empty = meta if isinstance(meta, pd.DataFrame) else dd.utils.make_meta(meta)
        return dd.from_pandas(empty, npartitions=1)
    convert = dask.delayed(block_to_pandas, pure=True)
    # each block enters the graph under a name of its own, unique to this call (two frames in
    # one graph must never share a key), so Dask does not hash the data to make one
    call = uuid.uuid4().hex
    parts = [convert(dask.delayed(table, name=f"dataflow-block-{call}-{i}"), arrow_backed)
             for i, table in enumerate(tables)]
    return dd.from_delayed(parts, meta=meta, verify_meta=verify_meta)


def from_dask(df: Any) -> MaterializedDataset:
    """A materialized dataset of ``df``'s partitions, one block each."""
    dask, dd = _import_dask()
    if not isinstance(df, dd.DataFrame):
        raise TypeError(f"from_dask takes a dask.dataframe.DataFrame, got {type(df).__name__}")
    from dataflow.read_api import from_pandas

    frames = dask.compute(*df.to_delayed())
    return from_pandas(list(frames))

"""``ray.data._internal.delegating_block_builder.DelegatingBlockBuilder``, as Ray's custom
datasource example builds its blocks with it: rows (dicts) and blocks in, one Arrow table out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

__all__ = ["DelegatingBlockBuilder"]


class DelegatingBlockBuilder:
    """Collects rows (``add``) and blocks (``add_block``, Arrow tables or pandas DataFrames) in
    order; ``build`` gives them as one Arrow table (rows' missing keys are nulls, as Ray's)."""

    def __init__(self) -> None:
        self._parts: list[pa.Table] = []
        self._rows: list[Mapping[str, Any]] = []

    def add(self, item: Mapping[str, Any]) -> None:
        if hasattr(item, "as_pydict"):
            item = item.as_pydict()
        if not isinstance(item, Mapping):
            msg = f"Returned elements of a block must be of type `dict`, got {item!r} (type {type(item).__name__})"
            raise ValueError(msg)
        self._rows.append(item)

    def add_block(self, block: Any) -> None:
        from dataflow.block import BlockAccessor

        self._flush_rows()
        self._parts.append(BlockAccessor.for_block(block).to_arrow())

    def _flush_rows(self) -> None:
        if self._rows:
            from engine.block_format import rows_to_block

            self._parts.append(rows_to_block(self._rows))
            self._rows = []

    def num_rows(self) -> int:
        return sum(p.num_rows for p in self._parts) + len(self._rows)

    def get_estimated_memory_usage(self) -> int:
        return sum(p.nbytes for p in self._parts)

    def build(self) -> pa.Table:
        from engine.block_format import concat_blocks

        self._flush_rows()
        if not self._parts:
            return pa.table({})
        return concat_blocks(self._parts)

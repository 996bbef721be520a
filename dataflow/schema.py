"""``Schema``: what ``Dataset.schema()`` returns, shaped as Ray Data 2.60's.

It wraps the Arrow schema (``base_schema``) and prints as Ray's two-column table::

    Column  Type
    ------  ----
    id      int64

Ray's ``Schema`` has ``names``, ``types``, ``base_schema`` and equality; code written for
dataflow before this class existed used the ``pyarrow.Schema`` itself, so the Arrow schema's
own attributes (``field``, ``empty_table``, ``metadata``, ``len()``, iteration) are reached
through the wrapper too. Pass ``schema.base_schema`` where pyarrow wants a real schema.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from engine.ragged_tensors import is_ragged


def type_name(type_: pa.DataType) -> str:
    """How Ray 2.60 prints a column type: its own names for tensor columns
    (``ArrowTensorTypeV2(shape=(2, 3), dtype=double)``,
    ``ArrowVariableShapedTensorType(ndim=1, dtype=double)``), Arrow's for the rest."""
    if isinstance(type_, pa.FixedShapeTensorType):
        return f"ArrowTensorTypeV2(shape={tuple(type_.shape)}, dtype={type_.value_type})"
    if is_ragged(type_):
        return f"ArrowVariableShapedTensorType(ndim={type_.ndim}, dtype={type_.value_type})"
    return str(type_)


class Schema:
    """A dataset's column names and Arrow types (``base_schema``: the ``pyarrow.Schema``)."""

    def __init__(self, base_schema: pa.Schema) -> None:
        self.base_schema = base_schema

    @property
    def names(self) -> list[str]:
        return list(self.base_schema.names)

    @property
    def types(self) -> list[pa.DataType]:
        return list(self.base_schema.types)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Schema):
            other = other.base_schema
        if not isinstance(other, pa.Schema):
            return NotImplemented
        return self.names == list(other.names) and self.types == list(other.types)

    def __hash__(self) -> int:
        return hash((tuple(self.names), tuple(str(t) for t in self.types)))

    def __repr__(self) -> str:
        width = max([len(name) for name in self.names] + [len("Column")]) + 2
        lines = ["Column".ljust(width) + "Type", "------".ljust(width) + "----"]
        lines += [name.ljust(width) + type_name(type_) for name, type_ in zip(self.names, self.types, strict=True)]
        return "\n".join(lines)

    def __len__(self) -> int:
        return len(self.base_schema)

    def __iter__(self) -> Iterator[pa.Field]:
        return iter(self.base_schema)

    def __getitem__(self, key: int | str) -> pa.Field:
        return self.base_schema.field(key)

    def __getattr__(self, name: str) -> Any:
        # only reached for what Ray's Schema lacks: the Arrow schema's own API
        if name == "base_schema":  # not set yet (unpickling)
            raise AttributeError(name)
        return getattr(self.base_schema, name)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Schema, (self.base_schema,))


def arrow_schema(schema: Schema | pa.Schema | None) -> pa.Schema | None:
    """The ``pyarrow.Schema`` of either kind (None stays None)."""
    return schema.base_schema if isinstance(schema, Schema) else schema

"""Hive partitioning: ``key=value`` folders below the root become typed columns.

Types are inferred from the first file's values (``int64`` if the value is an integer, then
``float64``, ``bool``, ``date32``, else ``string``) because the listing streams and later files are
not known yet; pass ``partitioning=pa.schema([...])`` to fix them. A later value that does not
convert to the inferred type raises ``SchemaMismatchError`` naming the file and the column.
Values are percent-decoded; ``__HIVE_DEFAULT_PARTITION__`` is null. Writers use ``folder_name``.
"""

from __future__ import annotations

import datetime
import re
from typing import Any
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from connectors.errors import SchemaMismatchError

NULL_VALUE = "__HIVE_DEFAULT_PARTITION__"
_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")

Partitioning = str | pa.Schema | None
"""What ``partitioning=`` accepts: ``"hive"``, a schema of partition fields (hive, typed), or None."""


def check_partitioning(partitioning: Any) -> None:
    """Raise ``ValueError`` unless ``partitioning`` is ``"hive"``, a ``pa.Schema`` or None."""
    if partitioning is None or partitioning == "hive" or isinstance(partitioning, pa.Schema):
        return
    raise ValueError(
        f"partitioning must be 'hive', a pyarrow.Schema of partition fields, or None; got {partitioning!r}"
    )


def parse_hive(path: str, root: str) -> dict[str, str | None]:
    """``{key: value}`` for the ``key=value`` folders between ``root`` and the file name."""
    path, root = path.replace("\\", "/"), root.replace("\\", "/").rstrip("/")
    relative = path[len(root) + 1 :] if path.startswith(root + "/") else ""
    values: dict[str, str | None] = {}
    for part in relative.split("/")[:-1]:
        key, eq, value = part.partition("=")
        if eq and key:
            decoded = unquote(value)
            values[unquote(key)] = None if decoded == NULL_VALUE else decoded
    return values


def _infer_type(value: str | None) -> pa.DataType:
    if value is None:
        return pa.string()
    if _INT.fullmatch(value) and -(2**63) <= int(value) < 2**63:
        return pa.int64()
    if _FLOAT.fullmatch(value):
        return pa.float64()
    if value.lower() in ("true", "false"):
        return pa.bool_()
    if _DATE.fullmatch(value):
        try:
            datetime.date.fromisoformat(value)
            return pa.date32()
        except ValueError:
            pass
    return pa.string()


def partition_schema(
    partitioning: Partitioning, sample_path: str | None, root: str | None
) -> pa.Schema | None:
    """The partition fields: the given schema, or inferred from ``sample_path``; None when not partitioned."""
    if partitioning is None:
        return None
    if isinstance(partitioning, pa.Schema):
        return partitioning
    if sample_path is None or root is None:
        return None
    values = parse_hive(sample_path, root)
    if not values:
        return None
    return pa.schema([pa.field(k, _infer_type(v)) for k, v in values.items()])


def typed_values(schema: pa.Schema, path: str, root: str, display: str) -> dict[str, pa.Scalar]:
    """This file's partition values converted to ``schema``'s types."""
    raw = parse_hive(path, root)
    out: dict[str, pa.Scalar] = {}
    for field in schema:
        value = raw.get(field.name)
        if field.name not in raw:
            msg = (
                f"the file has no {field.name}=... folder, but other files are partitioned by {field.name!r}"
            )
            raise SchemaMismatchError(msg, path=display, column=field.name)
        try:
            if value is None or pa.types.is_string(field.type):
                out[field.name] = pa.scalar(value, type=field.type)
            else:
                converted = pc.cast(pa.array([value]), field.type)
                out[field.name] = converted[0]
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            msg = (
                f"partition value {value!r} is not a {field.type} like the first file's; "
                f"pass partitioning=pa.schema([...]) with the types you want ({exc})"
            )
            raise SchemaMismatchError(msg, path=display, column=field.name) from exc
    return out


def append_partition_columns(table: pa.Table, values: dict[str, pa.Scalar]) -> pa.Table:
    """``table`` with one constant column per partition value (columns already in the file win)."""
    for name, scalar in values.items():
        if name not in table.column_names:
            table = table.append_column(pa.field(name, scalar.type), pa.repeat(scalar, table.num_rows))
    return table


def partition_expression(values: dict[str, pa.Scalar]) -> pc.Expression | None:
    """An expression true for this file's rows (``k1 == v1 and ...``), for pruning by filter."""
    expr: pc.Expression | None = None
    for name, scalar in values.items():
        term = pads.field(name).is_null() if not scalar.is_valid else pads.field(name) == scalar
        expr = term if expr is None else expr & term
    return expr


def folder_name(key: str, value: Any) -> str:
    """The folder for ``key=value`` as writers name it (percent-encoded; null as the hive default)."""
    if value is None:
        return f"{quote(key, safe='')}={NULL_VALUE}"
    return f"{quote(key, safe='')}={quote(str(value), safe='')}"

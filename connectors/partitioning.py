"""Hive partitioning: ``key=value`` folders in a file's path become columns.

Every folder of the path counts, as in Ray Data: ``read_csv(".../year=2022/month=09/a.csv")``
and ``read_csv(".../year=2022")`` both give ``year`` and ``month`` columns (a folder named with
more than one ``=`` is not a partition, as in Ray). The columns are strings, as in Ray Data
(``year=2022`` gives ``"2022"``): the partition keys come from the first file's folders; a file
without one of them (another path of the list) gets nulls there. Pass ``partitioning=pa.schema([...])`` for other types; a
value that does not convert to its field's type raises ``SchemaMismatchError`` naming the file
and the column. Values are percent-decoded; ``__HIVE_DEFAULT_PARTITION__`` is null. Writers use
``folder_name``. ``PathPartitionFilter`` (Ray's) picks files by their partition values before
anything is read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.compute as pc

from connectors.errors import SchemaMismatchError

NULL_VALUE = "__HIVE_DEFAULT_PARTITION__"

Partitioning = str | pa.Schema | None
"""What ``partitioning=`` accepts: ``"hive"``, a schema of partition fields (hive, typed), or None."""


def check_partitioning(partitioning: Any) -> None:
    """Raise ``ValueError`` unless ``partitioning`` is ``"hive"``, a ``pa.Schema`` or None."""
    if partitioning is None or partitioning == "hive" or isinstance(partitioning, pa.Schema):
        return
    raise ValueError(
        f"partitioning must be 'hive', a pyarrow.Schema of partition fields, or None; got {partitioning!r}"
    )


def parse_hive(path: str, base: str = "") -> dict[str, str | None]:
    """``{key: value}`` for the ``key=value`` folders of ``path`` (below ``base`` when given:
    ``{}`` for a path outside it)."""
    path, base = path.replace("\\", "/"), base.replace("\\", "/").rstrip("/")
    if base:
        if not path.startswith(base + "/"):
            return {}
        path = path[len(base) + 1 :]
    values: dict[str, str | None] = {}
    for part in path.split("/")[:-1]:
        if part.count("=") != 1:
            continue
        key, _, value = part.partition("=")
        if key:
            decoded = unquote(value)
            values[unquote(key)] = None if decoded == NULL_VALUE else decoded
    return values


def partition_schema(partitioning: Partitioning, sample_path: str | None) -> pa.Schema | None:
    """The partition fields: the given schema, or ``sample_path``'s keys as strings; None when not partitioned."""
    if partitioning is None:
        return None
    if isinstance(partitioning, pa.Schema):
        return partitioning
    if sample_path is None:
        return None
    values = parse_hive(sample_path)
    if not values:
        return None
    return pa.schema([pa.field(k, pa.string()) for k in values])


def typed_values(schema: pa.Schema, path: str, display: str) -> dict[str, pa.Scalar]:
    """This file's partition values converted to ``schema``'s types (null for a key its path
    does not have, as Ray's blocks without that column)."""
    raw = parse_hive(path)
    out: dict[str, pa.Scalar] = {}
    for field in schema:
        value = raw.get(field.name)
        try:
            if value is None or pa.types.is_string(field.type):
                out[field.name] = pa.scalar(value, type=field.type)
            else:
                converted = pc.cast(pa.array([value]), field.type)
                out[field.name] = converted[0]
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            msg = (
                f"partition value {value!r} is not a {field.type}, the type partitioning= gives "
                f"{field.name!r} ({exc})"
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
        term = pc.field(name).is_null() if not scalar.is_valid else pc.field(name) == scalar
        expr = term if expr is None else expr & term
    return expr


def folder_name(key: str, value: Any) -> str:
    """The folder for ``key=value`` as writers name it (percent-encoded; null as the hive default)."""
    if value is None:
        return f"{quote(key, safe='')}={NULL_VALUE}"
    return f"{quote(key, safe='')}={quote(str(value), safe='')}"


class PathPartitionFilter:
    """Ray Data's ``PathPartitionFilter``: keep the files whose hive partition values pass ``filter_fn``.

    ``filter_fn`` gets ``{key: value}`` (strings, as the folder names say; ``{}`` for a file in no
    partition folder) and returns True to read the file. Files are picked while listing, before
    anything is read (also for ``count()`` and ``input_files()``). Make one with
    ``PathPartitionFilter.of(lambda d: d["year"] == "2022")``; ``base_dir`` limits the parsing to
    the folders below it (None: every folder of a file's path, as in Ray).
    """

    def __init__(self, filter_fn: Callable[[dict[str, str]], bool], base_dir: str | None = None) -> None:
        if not callable(filter_fn):
            raise TypeError(f"filter_fn must be a function of the partition values, got {type(filter_fn).__name__}")
        self._filter_fn = filter_fn
        self._base_dir = base_dir.rstrip("/") if base_dir else None

    @staticmethod
    def of(
        filter_fn: Callable[[dict[str, str]], bool],
        style: str = "hive",
        base_dir: str | None = None,
        field_names: list[str] | None = None,
        field_types: dict[str, Any] | None = None,
        filesystem: Any = None,
    ) -> PathPartitionFilter:
        """Ray's constructor. Only ``style="hive"`` exists here; values reach ``filter_fn`` as strings."""
        style = getattr(style, "value", style)
        if str(style).lower() != "hive":
            raise ValueError(f"only hive partitions (key=value folders) are supported, got style={style!r}")
        if field_names or field_types:
            raise ValueError("field_names and field_types are for directory partitioning; hive folders name their keys")
        return PathPartitionFilter(filter_fn, base_dir)

    def apply(self, path: str, root: str | None = None) -> bool:
        """Whether to read the file at ``path`` (``root``, the folder it was listed under, is
        not needed: every folder of the path counts)."""
        parsed = parse_hive(path, self._base_dir or "")  # {} for a file outside ``base_dir``
        return bool(self._filter_fn({key: NULL_VALUE if value is None else value for key, value in parsed.items()}))

    def __call__(self, paths: list[str]) -> list[str]:
        """The paths that pass (Ray's call form)."""
        return [path for path in paths if self.apply(path)]

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

import os
from collections.abc import Callable
from enum import StrEnum
from typing import Any
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.compute as pc

from connectors.errors import SchemaMismatchError

NULL_VALUE = "__HIVE_DEFAULT_PARTITION__"

class PartitionStyle(StrEnum):
    """Ray's partition styles: ``key=value`` folders, or folders that are values."""

    HIVE = "hive"
    DIRECTORY = "dir"


_PYTHON_TYPES: dict[Any, pa.DataType] = {int: pa.int64(), float: pa.float64(), str: pa.string(), bool: pa.bool_()}


class Partitioning:
    """Ray Data's ``Partitioning``: partition values in a file's folders.

    ``Partitioning("hive")``: ``key=value`` folders (below ``base_dir`` when given).
    ``Partitioning("dir", field_names=["class"], base_dir=root)``: the folders below
    ``base_dir``, in order, are the values of ``field_names`` (``root/cat/1.png`` gives
    ``class="cat"``, the layout of image classification sets); a file with another number of
    folders below it is an error naming it, a file directly in it has none. ``field_types``
    (``{"year": int}``: int, float, str or bool, or pyarrow types) types the values (strings
    otherwise, as Ray's)."""

    def __init__(self, style: Any = "hive", base_dir: str | None = None, field_names: list[str] | None = None,
                 field_types: dict[str, Any] | None = None, filesystem: Any = None) -> None:
        style = str(getattr(style, "value", style)).lower()
        if style not in ("hive", "dir"):
            raise ValueError(f"Partitioning style must be 'hive' or 'dir', got {style!r}")
        if style == "dir" and not field_names:
            raise ValueError("Partitioning('dir') needs field_names: the name of each folder level's values")
        self.style, self.field_names = style, list(field_names) if field_names else None
        self.base_dir = _listing_path(base_dir) if base_dir else ""
        self.field_types = dict(field_types or {})
        for name, kind in self.field_types.items():
            if not isinstance(kind, pa.DataType) and kind not in _PYTHON_TYPES:
                raise ValueError(f"field_types[{name!r}] must be int, float, str, bool or a pyarrow type, got {kind!r}")
        self.filesystem = filesystem

    def arrow_type(self, name: str) -> pa.DataType:
        kind = self.field_types.get(name, str)
        return kind if isinstance(kind, pa.DataType) else _PYTHON_TYPES[kind]

    def parse(self, path: str, display: str | None = None) -> dict[str, str | None]:
        """``{key: value}`` (strings) for ``path``'s partition folders."""
        if self.style == "hive":
            return parse_hive(path, self.base_dir)
        path = path.replace("\\", "/")
        base = self.base_dir
        if base:
            if not path.startswith(base + "/"):
                return {}
            path = path[len(base) + 1 :]
        folders = [unquote(part) for part in path.split("/")[:-1] if part]
        if not folders:
            return {}
        assert self.field_names is not None
        if len(folders) != len(self.field_names):
            raise SchemaMismatchError(
                f"expected {len(self.field_names)} partition folder(s) below {base or '/'} for {self.field_names}, "
                f"found {len(folders)}: {folders}", path=display or path)
        return dict(zip(self.field_names, folders, strict=True))

    def __repr__(self) -> str:
        return (f"Partitioning(style={self.style!r}, base_dir={self.base_dir!r}, field_names={self.field_names!r}, "
                f"field_types={self.field_types!r})")


def _listing_path(path: str) -> str:
    """``path`` as listings name files: no scheme (``s3://bucket/a`` is ``bucket/a``), local
    paths absolute, ``/`` separators, no trailing one."""
    path = path.replace("\\", "/")
    if "://" in path:
        path = path.split("://", 1)[1]
    elif not path.startswith("/"):
        path = os.path.abspath(path).replace("\\", "/")
    return path.rstrip("/")


def check_partitioning(partitioning: Any) -> None:
    """Raise ``ValueError`` unless ``partitioning`` is ``"hive"``, a ``pa.Schema``, a
    ``Partitioning`` or None."""
    if partitioning is None or partitioning == "hive" or isinstance(partitioning, (pa.Schema, Partitioning)):
        return
    raise ValueError(
        f"partitioning must be 'hive', a Partitioning, a pyarrow.Schema of partition fields, or None; got {partitioning!r}"
    )


def parse_partitions(partitioning: Any, path: str, display: str | None = None) -> dict[str, str | None]:
    """``path``'s partition values as ``partitioning`` reads them (strings)."""
    if isinstance(partitioning, Partitioning):
        return partitioning.parse(path, display)
    return parse_hive(path)


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


def partition_schema(partitioning: Any, sample_path: str | None) -> pa.Schema | None:
    """The partition fields: the given schema, ``field_names`` of a directory ``Partitioning``,
    or ``sample_path``'s keys (typed by ``field_types``, else strings); None when not partitioned."""
    if partitioning is None:
        return None
    if isinstance(partitioning, pa.Schema):
        return partitioning
    if isinstance(partitioning, Partitioning) and partitioning.style == "dir":
        assert partitioning.field_names is not None
        return pa.schema([pa.field(k, partitioning.arrow_type(k)) for k in partitioning.field_names])
    if sample_path is None:
        return None
    values = parse_partitions(partitioning, sample_path)
    if not values:
        return None
    if isinstance(partitioning, Partitioning):
        return pa.schema([pa.field(k, partitioning.arrow_type(k)) for k in values])
    return pa.schema([pa.field(k, pa.string()) for k in values])


def typed_values(schema: pa.Schema, path: str, display: str, partitioning: Any = "hive") -> dict[str, pa.Scalar]:
    """This file's partition values converted to ``schema``'s types (null for a key its path
    does not have, as Ray's blocks without that column)."""
    raw = parse_partitions(partitioning, path, display)
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

    def __init__(self, filter_fn: Callable[[dict[str, str]], bool], base_dir: str | None = None,
                 partitioning: Partitioning | None = None) -> None:
        if not callable(filter_fn):
            raise TypeError(f"filter_fn must be a function of the partition values, got {type(filter_fn).__name__}")
        self._filter_fn = filter_fn
        self._base_dir = base_dir.rstrip("/") if base_dir else None
        self._partitioning = partitioning

    @staticmethod
    def of(
        filter_fn: Callable[[dict[str, str]], bool],
        style: str = "hive",
        base_dir: str | None = None,
        field_names: list[str] | None = None,
        field_types: dict[str, Any] | None = None,
        filesystem: Any = None,
    ) -> PathPartitionFilter:
        """Ray's constructor: ``style="hive"`` (``key=value`` folders) or ``"dir"`` (the folders
        below ``base_dir`` are the values of ``field_names``); values reach ``filter_fn`` as strings."""
        partitioning = Partitioning(style, base_dir, field_names, field_types, filesystem)
        return PathPartitionFilter(filter_fn, base_dir, partitioning)

    def apply(self, path: str, root: str | None = None) -> bool:
        """Whether to read the file at ``path`` (``root``, the folder it was listed under, is
        not needed: every folder of the path counts)."""
        if self._partitioning is not None:
            parsed = self._partitioning.parse(path)  # {} for a file outside ``base_dir``
        else:
            parsed = parse_hive(path, self._base_dir or "")
        return bool(self._filter_fn({key: NULL_VALUE if value is None else value for key, value in parsed.items()}))

    def __call__(self, paths: list[str]) -> list[str]:
        """The paths that pass (Ray's call form)."""
        return [path for path in paths if self.apply(path)]


class PathPartitionParser:
    """Ray Data's ``PathPartitionParser``: a file path's partition values, as a dict.

    ``PathPartitionParser(Partitioning("hive"))(path)`` gives ``{key: value}`` for the
    ``key=value`` folders of ``path`` (``{}`` for a file in none, or outside ``base_dir``);
    ``"dir"`` partitioning maps the folders below ``base_dir`` onto ``field_names``. Values are
    strings, or of the type ``field_types`` gives (Ray's casts: ``int``, ``float``, ``bool`` as
    ``value.lower() == "true"``; a pyarrow type is cast by Arrow).
    """

    def __init__(self, partitioning: Partitioning) -> None:
        if not isinstance(partitioning, Partitioning):
            raise TypeError(f"PathPartitionParser takes a Partitioning, got {type(partitioning).__name__}")
        self._scheme = partitioning

    @staticmethod
    def of(
        style: str = "hive",
        base_dir: str | None = None,
        field_names: list[str] | None = None,
        field_types: dict[str, Any] | None = None,
        filesystem: Any = None,
    ) -> PathPartitionParser:
        """Ray's flattened constructor."""
        return PathPartitionParser(Partitioning(style, base_dir, field_names, field_types, filesystem))

    @property
    def scheme(self) -> Partitioning:
        """The partitioning it parses."""
        return self._scheme

    def __call__(self, path: str) -> dict[str, Any]:
        values: dict[str, Any] = dict(self._scheme.parse(_listing_path(path), path))
        for name, kind in self._scheme.field_types.items():
            if values.get(name) is not None:
                values[name] = _cast_partition_value(values[name], kind)
        return values


def _cast_partition_value(value: str, kind: Any) -> Any:
    if kind is int:
        return int(value)
    if kind is float:
        return float(value)
    if kind is bool:
        return value.lower() == "true"
    if isinstance(kind, pa.DataType):
        return pc.cast(pa.array([value]), kind)[0].as_py()
    return value

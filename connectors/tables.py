"""What the table-format connectors (Lance, Delta, Iceberg) share.

* ``import_extra``: their libraries are imported when a reader or writer is first called.
  ``import dataflow`` never imports them: a job that reads Parquet does not pay for Lance's, Delta's
  or Iceberg's client, and a machine without them still runs everything else. When one is missing
  the error names the pip extra to install.
* ``conform``: rows appended to an existing table take its columns and types, or fail saying which
  columns differ.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import pyarrow as pa

EXTRAS = {
    "lance": ("pylance", "lance"),
    "lance_namespace": ("lance-namespace", "lance"),
    "deltalake": ("deltalake", "delta"),
    "pyiceberg": ("pyiceberg", "iceberg"),
}
"""Import name -> (package on PyPI, dataflow's extra that installs it)."""


def import_extra(module: str, feature: str) -> ModuleType:
    """``module`` imported, or ``ImportError`` saying which extra ``feature`` needs.

    ``module`` may be a submodule (``pyiceberg.catalog``); its top-level package names the extra.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        package, extra = EXTRAS[module.split(".", 1)[0]]
        msg = (
            f"{feature} needs the {package!r} package, which is not installed: "
            f"pip install 'dataflow[{extra}]' (or pip install {package})"
        )
        raise ImportError(msg, name=module) from exc


def conform(table: pa.Table, schema: pa.Schema, what: str, hint: str = "") -> pa.Table:
    """``table`` with ``schema``'s columns, in its order and cast to its types.

    ``ValueError`` naming the missing and extra columns when the names differ; ``what`` names
    the table written to, ``hint`` says what to do instead.
    """
    if table.schema.equals(schema):
        return table
    missing = [name for name in schema.names if name not in table.column_names]
    extra = [name for name in table.column_names if name not in schema.names]
    if missing or extra:
        msg = f"the rows do not match {what}: missing columns {missing}, columns it does not have {extra}{hint}"
        raise ValueError(msg)
    try:
        return table.select(schema.names).cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        for field in schema:  # which column: the error of a cast does not say
            have = table.schema.field(field.name).type
            try:
                table.column(field.name).cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as column_exc:
                msg = f"column {field.name!r} ({have}) cannot be written as {field.type}, its type in {what}: {column_exc}"
                raise ValueError(msg) from exc
        raise

"""connectors: where data enters and leaves dataflow.

Modules, in the order a row meets them on its way in and out:

* ``base``            the contract: ``Datasource`` -> picklable ``ReadTask``s; ``Datasink``.
* ``filesystem``      paths, folders, globs, ``s3://`` -> a ``FileSet`` listed as a stream.
* ``s3_filesystem``   s3fs (imported on first ``s3://``), with retries left to ``retry``.
* ``retry``           error classes (throttled / transient / permanent), backoff, AIMD limiter.
* ``partitioning``    hive ``key=value`` folders <-> typed columns.
* ``file_datasource`` listing -> tasks by bytes (driver); file -> tables (workers).
* ``parquet_format``, ``csv_format``, ``json_format``, ``text_format``, ``binary_format``,
  ``image_format``, ``numpy_format``: one format each (source, and sink where there is one).
* ``file_datasink``   write tasks stage files; the driver commits them or removes them.
* ``errors``          errors that name the file, row and column; ``io_stats`` per-process counters.

``SOURCES`` and ``SINKS`` map a format name to its class, for ``read_*``/``write_*`` wrappers.
"""

from __future__ import annotations

from connectors.base import BlockMetadata, Datasink, Datasource, ReadTask, TaskContext
from connectors.binary_format import BinaryDatasource
from connectors.csv_format import CSVDatasink, CSVDatasource
from connectors.errors import (
    AccessDeniedError,
    FileFormatError,
    PathNotFoundError,
    RetriesExhaustedError,
    SchemaMismatchError,
)
from connectors.image_format import ImageDatasource
from connectors.json_format import JSONDatasink, JSONDatasource
from connectors.numpy_format import NumpyDatasource
from connectors.parquet_format import ParquetDatasink, ParquetDatasource
from connectors.text_format import TextDatasource

SOURCES: dict[str, type[Datasource]] = {
    "parquet": ParquetDatasource,
    "csv": CSVDatasource,
    "json": JSONDatasource,
    "text": TextDatasource,
    "binary": BinaryDatasource,
    "images": ImageDatasource,
    "numpy": NumpyDatasource,
}
"""Format name -> Datasource class (``read_<name>`` builds one)."""

SINKS: dict[str, type[Datasink]] = {
    "parquet": ParquetDatasink,
    "csv": CSVDatasink,
    "json": JSONDatasink,
}
"""Format name -> Datasink class (``Dataset.write_<name>`` builds one)."""

__all__ = [
    "SINKS",
    "SOURCES",
    "AccessDeniedError",
    "BinaryDatasource",
    "BlockMetadata",
    "CSVDatasink",
    "CSVDatasource",
    "Datasink",
    "Datasource",
    "FileFormatError",
    "ImageDatasource",
    "JSONDatasink",
    "JSONDatasource",
    "NumpyDatasource",
    "ParquetDatasink",
    "ParquetDatasource",
    "PathNotFoundError",
    "ReadTask",
    "RetriesExhaustedError",
    "SchemaMismatchError",
    "TaskContext",
    "TextDatasource",
]

"""connectors: where data enters and leaves dataflow.

Modules, in the order a row meets them on its way in and out:

* ``base``            the contract: ``Datasource`` -> picklable ``ReadTask``s; ``Datasink``.
* ``filesystem``      paths, folders, globs, ``s3://`` -> a ``FileSet`` listed as a stream.
* ``s3_filesystem``   s3fs (imported on first ``s3://``), with retries left to ``retry``.
* ``retry``           error classes (throttled / transient / permanent), backoff, AIMD limiter.
* ``partitioning``    hive ``key=value`` folders <-> typed columns.
* ``file_datasource`` listing -> tasks by bytes (driver); file -> tables (workers).
* ``file_based_source``, ``file_based_sinks``, ``file_metadata``: Ray's bases for a custom
  file format (``_read_stream``, ``write_block_to_file``, ``write_row_to_file``) on that machinery.
* ``parquet_format``, ``csv_format``, ``json_format``, ``text_format``, ``binary_format``,
  ``image_format``, ``numpy_format``, ``orc_format``, ``webdataset_format``, ``tfrecords_format``:
  one format each (source, and sink where there is one); ``protobuf_wire`` is the wire format
  of ``tf.train.Example``, for ``tfrecords_format``.
* ``sql``             any DB-API 2 database: a query read in shards, rows written by executemany.
* ``file_datasink``   write tasks stage files; the driver commits them or removes them.
* ``error_sink``      the Parquet files of rows ``on_error="skip"`` dropped, written by tasks.
* ``errors``          errors that name the file, row and column; ``io_stats`` per-process counters.

``SOURCES`` and ``SINKS`` map a file format's name to its class, for ``read_*``/``write_*``
wrappers (``sql``'s classes are reached by name: they read no files).
"""

from __future__ import annotations

import importlib
from typing import Any

from connectors.base import BlockMetadata, Datasink, Datasource, ReadTask, TaskContext

# Formats are imported on first use: ``import dataflow`` must stay fast (pyarrow.dataset,
# pandas and fsspec cost ~0.5 s), and a job that reads Parquet never loads the image reader.
_LAZY: dict[str, str] = {
    "AudioDatasource": "connectors.audio_format",
    "AvroDatasource": "connectors.avro_format",
    "BinaryDatasource": "connectors.binary_format",
    "CSVDatasink": "connectors.csv_format",
    "CSVDatasource": "connectors.csv_format",
    "ImageDatasink": "connectors.image_format",
    "ImageDatasource": "connectors.image_format",
    "JSONDatasink": "connectors.json_format",
    "JSONDatasource": "connectors.json_format",
    "NumpyDatasink": "connectors.numpy_format",
    "NumpyDatasource": "connectors.numpy_format",
    "ORCDatasink": "connectors.orc_format",
    "ORCDatasource": "connectors.orc_format",
    "ParquetDatasink": "connectors.parquet_format",
    "ParquetDatasource": "connectors.parquet_format",
    "SQLDatasink": "connectors.sql",
    "SQLDatasource": "connectors.sql",
    "TextDatasource": "connectors.text_format",
    "VideoDatasource": "connectors.video_format",
    "TFRecordDatasink": "connectors.tfrecords_format",
    "TFRecordDatasource": "connectors.tfrecords_format",
    "WebDatasetDatasink": "connectors.webdataset_format",
    "WebDatasetDatasource": "connectors.webdataset_format",
    "AccessDeniedError": "connectors.errors",
    "FileFormatError": "connectors.errors",
    "NoPathExistsError": "connectors.errors",
    "PathNotFoundError": "connectors.errors",
    "RetriesExhaustedError": "connectors.errors",
    "SchemaMismatchError": "connectors.errors",
}

_SOURCE_NAMES = {
    "parquet": "ParquetDatasource",
    "csv": "CSVDatasource",
    "json": "JSONDatasource",
    "text": "TextDatasource",
    "binary": "BinaryDatasource",
    "images": "ImageDatasource",
    "numpy": "NumpyDatasource",
    "orc": "ORCDatasource",
    "webdataset": "WebDatasetDatasource",
    "tfrecords": "TFRecordDatasource",
    "avro": "AvroDatasource",
    "audio": "AudioDatasource",
    "videos": "VideoDatasource",
}
_SINK_NAMES = {
    "parquet": "ParquetDatasink",
    "csv": "CSVDatasink",
    "json": "JSONDatasink",
    "numpy": "NumpyDatasink",
    "images": "ImageDatasink",
    "orc": "ORCDatasink",
    "webdataset": "WebDatasetDatasink",
    "tfrecords": "TFRecordDatasink",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name == "SOURCES":
        # Format name -> Datasource class (``read_<name>`` builds one).
        return {fmt: __getattr__(cls) for fmt, cls in _SOURCE_NAMES.items()}
    if name == "SINKS":
        # Format name -> Datasink class (``Dataset.write_<name>`` builds one).
        return {fmt: __getattr__(cls) for fmt, cls in _SINK_NAMES.items()}
    msg = f"module 'connectors' has no attribute {name!r}"
    raise AttributeError(msg)


__all__ = [
    "SINKS",
    "SOURCES",
    "AccessDeniedError",
    "AudioDatasource",
    "AvroDatasource",
    "BinaryDatasource",
    "BlockMetadata",
    "CSVDatasink",
    "CSVDatasource",
    "Datasink",
    "Datasource",
    "FileFormatError",
    "ImageDatasink",
    "ImageDatasource",
    "JSONDatasink",
    "JSONDatasource",
    "NoPathExistsError",
    "NumpyDatasink",
    "NumpyDatasource",
    "ORCDatasink",
    "ORCDatasource",
    "ParquetDatasink",
    "ParquetDatasource",
    "PathNotFoundError",
    "ReadTask",
    "RetriesExhaustedError",
    "SQLDatasink",
    "SQLDatasource",
    "SchemaMismatchError",
    "TFRecordDatasink",
    "TFRecordDatasource",
    "TaskContext",
    "TextDatasource",
    "VideoDatasource",
    "WebDatasetDatasink",
    "WebDatasetDatasource",
]

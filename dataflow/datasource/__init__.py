"""Ray's ``ray.data.datasource`` names, so a custom connector ports by changing its imports.

``from dataflow.datasource import Datasource, ReadTask, Datasink, WriteResult`` gives the
classes ``dataflow`` exports, and the bases of a custom file format: ``FileBasedDatasource``
(implement ``_read_stream``), ``BlockBasedFileDatasink`` and ``RowBasedFileDatasink``
(implement ``write_block_to_file`` / ``write_row_to_file``), with the metadata providers and
``PathPartitionParser``. A Ray name this module lacks raises an ``AttributeError`` saying so.
"""

from __future__ import annotations

from connectors.base import Datasink, Datasource, ReadTask, WriteResult, WriteReturnType
from connectors.file_based_sinks import BlockBasedFileDatasink, RowBasedFileDatasink
from connectors.file_based_source import FileBasedDatasource
from connectors.file_datasink import FilenameProvider, SaveMode
from connectors.file_metadata import BaseFileMetadataProvider, DefaultFileMetadataProvider, FileMetadataProvider
from connectors.file_selection import FileShuffleConfig
from connectors.partitioning import Partitioning, PartitionStyle, PathPartitionFilter, PathPartitionParser
from dataflow.ray_api import RAY_DATASOURCE_API, module_getattr

__all__ = [
    "BaseFileMetadataProvider",
    "BlockBasedFileDatasink",
    "Datasink",
    "Datasource",
    "DefaultFileMetadataProvider",
    "FileBasedDatasource",
    "FileMetadataProvider",
    "FileShuffleConfig",
    "FilenameProvider",
    "PartitionStyle",
    "Partitioning",
    "PathPartitionFilter",
    "PathPartitionParser",
    "ReadTask",
    "RowBasedFileDatasink",
    "SaveMode",
    "WriteResult",
    "WriteReturnType",
]

__getattr__ = module_getattr("dataflow.datasource", "ray.data.datasource", RAY_DATASOURCE_API)

"""Ray's ``ray.data.datasource`` names, so a custom connector ports by changing its imports.

``from dataflow.datasource import Datasource, ReadTask, Datasink, WriteResult`` gives the
classes ``dataflow`` exports; a Ray name this module lacks raises an ``AttributeError`` saying
so.
"""

from __future__ import annotations

from connectors.base import Datasink, Datasource, ReadTask, WriteResult, WriteReturnType
from connectors.file_datasink import FilenameProvider, SaveMode
from connectors.file_selection import FileShuffleConfig
from connectors.partitioning import Partitioning, PartitionStyle, PathPartitionFilter
from dataflow.ray_api import RAY_DATASOURCE_API, module_getattr

__all__ = [
    "Datasink",
    "Datasource",
    "FileShuffleConfig",
    "FilenameProvider",
    "PartitionStyle",
    "Partitioning",
    "PathPartitionFilter",
    "ReadTask",
    "SaveMode",
    "WriteResult",
    "WriteReturnType",
]

__getattr__ = module_getattr("dataflow.datasource", "ray.data.datasource", RAY_DATASOURCE_API)

"""Ray's ``ray.data.datasource`` names, so a custom connector ports by changing its imports.

``from dataflow.datasource import Datasource, ReadTask, Datasink, WriteResult`` gives the
classes ``dataflow`` exports; a Ray name this module lacks raises an ``AttributeError`` saying
so.
"""

from __future__ import annotations

from typing import Any

from connectors.base import Datasink, Datasource, ReadTask, WriteResult, WriteReturnType
from connectors.file_datasink import FilenameProvider, SaveMode
from connectors.file_selection import FileShuffleConfig
from connectors.partitioning import PathPartitionFilter

RAY_DATASOURCE_API: tuple[str, ...] = (
    # ray.data.datasource.__all__ in Ray 2.60, its private names left out
    "BaseFileMetadataProvider", "BlockBasedFileDatasink", "Connection", "Datasink", "Datasource",
    "DefaultFileMetadataProvider", "DeltaSharingDatasource", "DummyOutputDatasink",
    "FileBasedDatasource", "FileMetadataProvider", "FileShuffleConfig", "FilenameProvider",
    "LeRobotDatasource", "MCAPDatasource", "PartitionStyle", "Partitioning", "PathPartitionFilter",
    "PathPartitionParser", "RandomIntRowDatasource", "ReadTask", "Reader", "RowBasedFileDatasink",
    "SaveMode", "TimeRange", "TurbopufferDatasink", "WriteResult", "WriteReturnType",
)  # fmt: skip

__all__ = [
    "Datasink",
    "Datasource",
    "FileShuffleConfig",
    "FilenameProvider",
    "PathPartitionFilter",
    "ReadTask",
    "SaveMode",
    "WriteResult",
    "WriteReturnType",
]


def __getattr__(name: str) -> Any:
    from dataflow.ray_api import module_attribute_error

    raise module_attribute_error("dataflow.datasource", name, "ray.data.datasource", RAY_DATASOURCE_API)

"""Ray's ``ray.data.datasource.partitioning``: ``Partitioning`` (``"hive"`` and ``"dir"``
styles), ``PartitionStyle``, ``PathPartitionFilter`` and ``PathPartitionParser``."""

from __future__ import annotations

from connectors.partitioning import Partitioning, PartitionStyle, PathPartitionFilter, PathPartitionParser
from dataflow.ray_api import module_getattr

__all__ = ["PartitionStyle", "Partitioning", "PathPartitionFilter", "PathPartitionParser"]

__getattr__ = module_getattr(
    "dataflow.datasource.partitioning", "ray.data.datasource.partitioning",
    ("PartitionStyle", "Partitioning", "PathPartitionFilter", "PathPartitionParser"),
)

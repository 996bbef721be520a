"""Ray's ``ray.data.datasource.partitioning``: ``Partitioning`` (``"hive"`` and ``"dir"``
styles), ``PartitionStyle`` and ``PathPartitionFilter``; ``PathPartitionParser`` raises an
``AttributeError`` saying it is not provided."""

from __future__ import annotations

from connectors.partitioning import Partitioning, PartitionStyle, PathPartitionFilter
from dataflow.ray_api import module_getattr

__all__ = ["PartitionStyle", "Partitioning", "PathPartitionFilter"]

__getattr__ = module_getattr(
    "dataflow.datasource.partitioning", "ray.data.datasource.partitioning",
    ("PartitionStyle", "Partitioning", "PathPartitionFilter", "PathPartitionParser"),
)

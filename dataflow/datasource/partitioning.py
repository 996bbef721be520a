"""Ray's ``ray.data.datasource.partitioning``: ``PathPartitionFilter`` (hive folders only);
``Partitioning``, ``PartitionStyle`` and ``PathPartitionParser`` raise an ``AttributeError``
saying they are not provided (pass ``partitioning="hive"``, a ``pyarrow.Schema`` of the
partition fields, or None to a read)."""

from __future__ import annotations

from connectors.partitioning import PathPartitionFilter
from dataflow.ray_api import module_getattr

__all__ = ["PathPartitionFilter"]

__getattr__ = module_getattr(
    "dataflow.datasource.partitioning", "ray.data.datasource.partitioning",
    ("PartitionStyle", "Partitioning", "PathPartitionFilter", "PathPartitionParser"),
)

"""Ray's ``ray.data.grouped_data``: ``GroupedData`` (what ``Dataset.groupby`` returns) and its
old name ``GroupedDataset``; they live in ``dataflow.grouped``."""

from __future__ import annotations

from dataflow.grouped import GroupedData

GroupedDataset = GroupedData

__all__ = ["GroupedData", "GroupedDataset"]

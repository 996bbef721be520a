"""Ray's ``ray.data.random_access_dataset``: ``RandomAccessDataset``, defined in ``dataflow.random_access``."""

from __future__ import annotations

from dataflow.random_access import RandomAccessDataset

__all__ = ["RandomAccessDataset"]

"""Ray's ``ray.data.datasource.datasink``: ``Datasink``, ``WriteResult``, ``WriteReturnType``."""

from __future__ import annotations

from connectors.base import Datasink, WriteResult, WriteReturnType

__all__ = ["Datasink", "WriteResult", "WriteReturnType"]

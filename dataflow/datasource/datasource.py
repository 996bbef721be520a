"""Ray's ``ray.data.datasource.datasource``: ``Datasource`` and ``ReadTask``."""

from __future__ import annotations

from connectors.base import Datasource, ReadTask

__all__ = ["Datasource", "ReadTask"]

"""Ray's ``ray.data.datasource.filename_provider``: ``FilenameProvider``."""

from __future__ import annotations

from connectors.file_datasink import FilenameProvider

__all__ = ["FilenameProvider"]

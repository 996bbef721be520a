"""Errors raised by connectors, each naming the file (and row or column where known).

Every class subclasses the builtin a caller would naturally catch, so ``except ValueError`` still
catches a malformed file and ``except FileNotFoundError`` a missing one. They pickle with their
attributes intact, because they are raised on workers and re-raised on the driver.
"""

from __future__ import annotations

from typing import Any


def _where(path: str | None, row: int | None, column: str | None) -> str:
    parts = []
    if path is not None:
        parts.append(str(path))
    if row is not None:
        parts.append(f"row {row}")
    if column is not None:
        parts.append(f"column {column!r}")
    return ", ".join(parts)


class _Located:
    """Mixin: ``path``/``row``/``column`` attributes, a message that names them, and pickling."""

    path: str | None
    row: int | None
    column: str | None

    def _init_located(self, message: str, path: str | None, row: int | None, column: str | None) -> str:
        self.path = path
        self.row = row
        self.column = column
        self.detail = message
        where = _where(path, row, column)
        return f"{where}: {message}" if where else message

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.detail, self.path, self.row, self.column))


def _rebuild(cls: type, message: str, path: str | None, row: int | None, column: str | None) -> Any:
    return cls(message, path=path, row=row, column=column)


class FileFormatError(_Located, ValueError):
    """A file could not be parsed as its format (corrupt, truncated, malformed rows)."""

    def __init__(
        self, message: str, *, path: str | None = None, row: int | None = None, column: str | None = None
    ) -> None:
        ValueError.__init__(self, self._init_located(message, path, row, column))


class SchemaMismatchError(FileFormatError):
    """A file's schema differs from the dataset's (another file's, or the one given)."""


class PathNotFoundError(_Located, FileNotFoundError):
    """A path (file, folder, bucket or glob) does not exist or matched no files."""

    def __init__(
        self, message: str, *, path: str | None = None, row: int | None = None, column: str | None = None
    ) -> None:
        FileNotFoundError.__init__(self, self._init_located(message, path, row, column))


class AccessDeniedError(_Located, PermissionError):
    """The storage refused access to a path; retrying will not help."""

    def __init__(
        self, message: str, *, path: str | None = None, row: int | None = None, column: str | None = None
    ) -> None:
        PermissionError.__init__(self, self._init_located(message, path, row, column))


class RetriesExhaustedError(_Located, OSError):
    """A transient I/O error (throttling, timeout, reset) persisted through every retry."""

    def __init__(
        self, message: str, *, path: str | None = None, row: int | None = None, column: str | None = None
    ) -> None:
        OSError.__init__(self, self._init_located(message, path, row, column))

    def __str__(self) -> str:
        return str(self.args[0])

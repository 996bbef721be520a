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


class NoPathExistsError(PathNotFoundError, ValueError):
    """``ignore_missing_paths=True`` and none of the paths exist: Ray raises ``ValueError``
    here; this one is that and still the ``FileNotFoundError`` it is."""


class NoFilesError(PathNotFoundError, ValueError):
    """A folder or glob that exists holds no file to read: Ray raises ``ValueError`` ("no
    files found") here; this one is that and still a ``FileNotFoundError``."""


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


S3_CREDENTIALS_HELP = (
    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (plus AWS_SESSION_TOKEN for temporary credentials), "
    "or AWS_PROFILE naming a profile in ~/.aws/credentials, or pass filesystem= an s3fs filesystem built with "
    "them, e.g. connectors.s3_filesystem.make_s3_filesystem(key=..., secret=...) (anon=True for a public "
    "bucket); for an S3-compatible store (MinIO, Ceph, a local server) also set AWS_ENDPOINT_URL, or pass "
    "endpoint_url=... to that filesystem"
)
"""How to give S3 credentials and an endpoint, as ``MissingCredentialsError`` states it."""


class MissingCredentialsError(AccessDeniedError):
    """No credentials to sign storage requests with (S3: none in the environment, a profile or the
    filesystem given); retrying will not help. The message names the path and says how to set them."""

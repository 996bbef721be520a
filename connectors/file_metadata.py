"""Ray's file metadata providers: which files a ``FileBasedDatasource`` reads, and what is
known about a read task's output before it runs.

``DefaultFileMetadataProvider`` lists folders as every file reader here does
(``connectors.filesystem``) and sizes a task by its files' bytes, with ``rows_per_file`` rows
per file when the source knows it. A subclass may override ``expand_paths`` (its own listing:
a manifest, a database of files) or ``_get_block_metadata`` (row counts from an index), as a
Ray connector does; ``FileBasedDatasource`` calls both.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from connectors.base import BlockMetadata
from connectors.errors import PathNotFoundError
from connectors.filesystem import FileEntry, FileSet, has_extension
from connectors.retry import Retrier


class FileMetadataProvider:
    """A callable giving the ``BlockMetadata`` of one read task's files (Ray's)."""

    def _get_block_metadata(self, paths: list[str], **kwargs: Any) -> BlockMetadata:
        raise NotImplementedError

    def __call__(self, paths: list[str], **kwargs: Any) -> BlockMetadata:
        return self._get_block_metadata(paths, **kwargs)


class BaseFileMetadataProvider(FileMetadataProvider):
    """A provider that also lists: ``expand_paths`` gives ``(file path, size or None)`` pairs."""

    def _get_block_metadata(
        self, paths: list[str], *, rows_per_file: int | None, file_sizes: list[int | None]
    ) -> BlockMetadata:
        raise NotImplementedError

    def expand_paths(
        self,
        paths: list[str],
        filesystem: pafs.FileSystem | None,
        partitioning: Any = None,
        ignore_missing_paths: bool = False,
    ) -> Iterator[tuple[str, int | None]]:
        raise NotImplementedError


class DefaultFileMetadataProvider(BaseFileMetadataProvider):
    """Bytes are the files' sizes; rows are ``rows_per_file`` times the files, when known."""

    def _get_block_metadata(
        self, paths: list[str], *, rows_per_file: int | None, file_sizes: list[int | None]
    ) -> BlockMetadata:
        return BlockMetadata(
            num_rows=None if rows_per_file is None else len(paths) * rows_per_file,
            size_bytes=None if None in file_sizes else int(sum(s or 0 for s in file_sizes)),
            input_files=tuple(paths),
        )

    def expand_paths(
        self,
        paths: list[str],
        filesystem: pafs.FileSystem | None,
        partitioning: Any = None,
        ignore_missing_paths: bool = False,
    ) -> Iterator[tuple[str, int | None]]:
        """Every file under ``paths`` (folders walked, names starting with ``.`` or ``_`` left
        out), as the readers list them."""
        if filesystem is None:
            raise ValueError("expand_paths needs the filesystem the paths are on")
        files = FileSet(filesystem, tuple(p.rstrip("/") or p for p in paths), ignore_missing=ignore_missing_paths)
        files.check()
        for entry in files.iter_files():
            yield entry.path, entry.size


def lists_its_own_files(provider: FileMetadataProvider) -> bool:
    """True when ``provider`` overrides the default listing."""
    own = getattr(type(provider), "expand_paths", None)
    return own is not None and own is not DefaultFileMetadataProvider.expand_paths


@dataclass(frozen=True)
class ListedFiles(FileSet):
    """The files a metadata provider's ``expand_paths`` named, in its order (no walking)."""

    entries: tuple[FileEntry, ...] = ()

    @staticmethod
    def of(provider: BaseFileMetadataProvider, files: FileSet, partitioning: Any, ignore_missing: bool) -> ListedFiles:
        listed = provider.expand_paths(list(files.roots), files.filesystem, partitioning, ignore_missing)
        entries = tuple(FileEntry(path, size, _root_of(path, files.roots)) for path, size in listed)
        listed_files = ListedFiles(files.filesystem, files.roots, files.uri_prefix, files.extensions,
                                   ignore_missing=ignore_missing, entries=entries)
        listed_files.check()
        return listed_files

    def iter_files(self) -> Iterator[FileEntry]:
        for entry in self.entries:
            if self.extensions is None or has_extension(entry.path, self.extensions):
                yield entry

    def check(self, retrier: Retrier | None = None) -> None:
        if next(self.iter_files(), None) is None:
            raise PathNotFoundError("the metadata provider's expand_paths named no files to read",
                                    path=", ".join(self.display(root) for root in self.roots))


def _root_of(path: str, roots: Sequence[str]) -> str:
    """The root ``path`` was listed under (partition folders are read below it)."""
    for root in roots:
        if path == root:
            return root.rsplit("/", 1)[0] if "/" in root else ""
        if path.startswith(root.rstrip("/") + "/"):
            return root
    return path.rsplit("/", 1)[0] if "/" in path else ""

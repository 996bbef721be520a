"""Which files a read lists, and in what order: Ray's ``partition_filter=``, ``skip_paths=`` and ``shuffle=``.

``SelectedFiles`` is a ``FileSet`` whose ``iter_files()`` keeps only the files a
``PathPartitionFilter`` accepts and ``skip_paths`` does not name (as the user wrote the path, or
its absolute form) and, with ``shuffle``, yields them in a random order. A shuffled
listing is read whole first (as Ray lists every file before it shuffles them). The order of an
execution comes from ``FileShuffleConfig``: ``shuffle="files"`` is a new order every time;
``FileShuffleConfig(seed=s)`` is the same order for the same execution index, a new one for
each execution (``reseed_after_execution=True``, Ray's default), or the same order always.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from connectors.filesystem import FileEntry, FileSet
from connectors.partitioning import PathPartitionFilter


@dataclass(frozen=True)
class FileShuffleConfig:
    """Ray Data's ``FileShuffleConfig``: how ``shuffle=`` orders the files of a read."""

    seed: int | None = None
    reseed_after_execution: bool = True

    def __post_init__(self) -> None:
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError("Seed must be an integer or None.")

    def get_seed(self, execution_idx: int = 0) -> int | None:
        """The seed of execution ``execution_idx`` (Ray's formula, so orders match Ray's)."""
        if self.seed is None:
            return None
        if self.reseed_after_execution:
            return hash((self.seed, execution_idx)) % (2**32)
        return self.seed


def check_shuffle(shuffle: Any) -> None:
    """Raise ``ValueError`` unless ``shuffle`` is None, ``"files"`` or a ``FileShuffleConfig``."""
    if shuffle is None or shuffle == "files" or isinstance(shuffle, FileShuffleConfig):
        return
    raise ValueError(f"Invalid value for 'shuffle': {shuffle!r}. Valid values are None, 'files', a FileShuffleConfig")


@dataclass(frozen=True)
class SelectedFiles(FileSet):
    """A ``FileSet`` filtered by partition values and, with ``shuffle``, in a random order."""

    partition_filter: PathPartitionFilter | None = None
    shuffle: str | FileShuffleConfig | None = None
    skip_paths: frozenset[str] = frozenset()
    inner: FileSet | None = None
    """The file set selected from when it lists its files its own way (a metadata provider's
    listing, a table's log); None: the roots, walked."""
    """Files left out whatever they hold (Ray's ``skip_paths``), as the user or the listing writes them."""
    _executions: list[int] = field(default_factory=lambda: [-1], compare=False, hash=False, repr=False)
    """The index of the execution listing now (shared by copies of the datasource; the first is 0)."""

    @staticmethod
    def of(
        files: FileSet, partition_filter: PathPartitionFilter | None, shuffle: Any, skip_paths: Any = None
    ) -> FileSet:
        """``files`` itself when nothing is filtered or shuffled."""
        check_shuffle(shuffle)
        if partition_filter is not None and not isinstance(partition_filter, PathPartitionFilter):
            raise TypeError(f"partition_filter must be a PathPartitionFilter, got {type(partition_filter).__name__}")
        skip = _skip_set(skip_paths)
        if partition_filter is None and shuffle is None and not skip:
            return files
        inner = None if type(files) is FileSet else files
        return SelectedFiles(files.filesystem, files.roots, files.uri_prefix, files.extensions,
                             ignore_missing=files.ignore_missing, partition_filter=partition_filter, shuffle=shuffle,
                             skip_paths=skip, inner=inner)

    def next_execution(self) -> None:
        """An execution starts listing: a reseeding shuffle takes its next order."""
        self._executions[0] += 1

    def check(self, retrier: Any = None) -> None:
        if self.inner is not None:
            self.inner.check(retrier)
            return
        super().check(retrier)

    def iter_files(self) -> Iterator[FileEntry]:
        files = self.inner.iter_files() if self.inner is not None else super().iter_files()
        if self.skip_paths:
            files = (entry for entry in files
                     if entry.path not in self.skip_paths and self.display(entry.path) not in self.skip_paths)
        if self.partition_filter is not None:
            files = (entry for entry in files if self.partition_filter.apply(entry.path, entry.root))
        if self.shuffle is None:
            yield from files
            return
        yield from shuffled(list(files), self.shuffle, self._executions[0])


def shuffled(entries: list[FileEntry], shuffle: str | FileShuffleConfig, execution: int) -> list[FileEntry]:
    """``entries`` in the order ``shuffle`` gives execution number ``execution``."""
    seed = shuffle.get_seed(execution) if isinstance(shuffle, FileShuffleConfig) else None
    np.random.default_rng(seed).shuffle(entries)  # type: ignore[arg-type]
    return entries


def _skip_set(skip_paths: Any) -> frozenset[str]:
    """Ray's ``skip_paths`` (a path or a list), each as given and, for local paths, absolute."""
    if skip_paths is None:
        return frozenset()
    items = [skip_paths] if isinstance(skip_paths, (str, os.PathLike)) else list(skip_paths)
    out: set[str] = set()
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(f"skip_paths must be a path or a list of paths, got {type(item).__name__}")
        text = os.fspath(item)
        out.add(text)
        if "://" not in text:
            out.add(os.path.abspath(text))
        elif text.startswith("file://"):
            out.add(os.path.abspath(text[len("file://"):]))
    return frozenset(out)

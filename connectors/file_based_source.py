"""Ray's ``FileBasedDatasource``: the base of a custom file format, ported by changing imports.

A subclass implements ``_read_stream(f, path)``, yielding blocks (pyarrow Tables or
RecordBatches, or pandas DataFrames) from one open file, and is read with
``dataflow.read_datasource(MyDatasource(paths))``. Everything around that is the readers' own
machinery (``connectors.file_datasource``): listing (folders walked, ``file_extensions``),
``partitioning``, ``partition_filter``, ``shuffle``, ``include_paths``, read tasks sized by
bytes, and retries that reopen the file and skip the blocks already read. ``_open_input_source``
opens each file (a stream, decompressed by extension or ``open_stream_args["compression"]``);
override it for random access (``filesystem.open_input_file(path)``).

Differences from Ray: ``_NUM_THREADS_PER_TASK`` is not used (read tasks are sized by bytes and
run side by side on the workers); the ``path`` column of ``include_paths`` names the file as the
user wrote its folder (``s3://bucket/key``), as every reader here does.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from connectors.base import BlockMetadata, as_table
from connectors.file_datasource import FileDatasource, FilePiece
from connectors.file_metadata import DefaultFileMetadataProvider, FileMetadataProvider, ListedFiles, lists_its_own_files
from connectors.filesystem import PathArg, StreamArgs, iter_stream, open_stream, resolve_files
from connectors.retry import Retrier


class FileBasedDatasource(FileDatasource):
    """Files read by a subclass's ``_read_stream(f, path)`` (Ray's ``FileBasedDatasource``).

    ``paths``: a file, folder, glob or list of them; ``filesystem``: a pyarrow or fsspec
    filesystem instead of the one the paths imply; ``schema``: kept as ``self._schema`` for the
    subclass; ``open_stream_args``: passed to ``_open_input_source``; ``meta_provider``: a
    ``FileMetadataProvider`` (its ``expand_paths`` lists the files when it overrides it; its
    ``_get_block_metadata`` sizes each read task, with ``_rows_per_file()`` rows per file);
    ``partition_filter``, ``partitioning``, ``ignore_missing_paths``, ``shuffle``,
    ``include_paths``, ``file_extensions`` (default: the class's ``_FILE_EXTENSIONS``): as
    ``read_binary_files`` takes them.
    """

    _FILE_EXTENSIONS: str | list[str] | None = None
    _NUM_THREADS_PER_TASK = 0
    """Ray's threads per read task: accepted, not used (see the module docstring)."""
    _WRITE_FILE_PER_ROW = False

    def __init__(
        self,
        paths: PathArg,
        *,
        filesystem: Any = None,
        schema: Any = None,
        open_stream_args: dict[str, Any] | None = None,
        meta_provider: FileMetadataProvider | None = None,
        partition_filter: Any = None,
        partitioning: Any = None,
        ignore_missing_paths: bool = False,
        shuffle: Any = None,
        include_paths: bool = False,
        file_extensions: Sequence[str] | str | None = None,
    ) -> None:
        provider = meta_provider if meta_provider is not None else DefaultFileMetadataProvider()
        if not isinstance(provider, FileMetadataProvider):
            raise TypeError(f"meta_provider must be a FileMetadataProvider, got {type(provider).__name__}")
        if open_stream_args is not None and not isinstance(open_stream_args, dict):
            raise TypeError(f"open_stream_args must be a dict, got {type(open_stream_args).__name__}")
        if type(self)._open_input_source is FileBasedDatasource._open_input_source:
            StreamArgs.of(open_stream_args)  # the default opener takes compression and buffer_size
        extensions = file_extensions if file_extensions is not None else self._FILE_EXTENSIONS
        if isinstance(extensions, str):
            extensions = [extensions]
        own_listing = lists_its_own_files(provider)
        files = resolve_files(paths, filesystem=filesystem, extensions=extensions, check=not own_listing,
                              ignore_missing=ignore_missing_paths)
        if own_listing:
            files = ListedFiles.of(provider, files, partitioning, ignore_missing_paths)  # type: ignore[arg-type]
        super().__init__(files, include_paths=include_paths, partitioning=partitioning,
                         partition_filter=partition_filter, shuffle=shuffle)
        self._schema = schema
        self._open_stream_args = dict(open_stream_args or {})
        self._meta_provider = provider

    def _read_stream(self, f: pa.NativeFile, path: str) -> Iterator[Any]:
        """The blocks of one file, read from ``f``; ``path`` is the file's path on its filesystem."""
        raise NotImplementedError("Subclasses of FileBasedDatasource must implement _read_stream()")

    def _open_input_source(self, filesystem: pa.fs.FileSystem, path: str, **open_args: Any) -> pa.NativeFile:
        """``path`` opened for ``_read_stream``: a forward-only stream, decompressed by its
        extension (``.gz``...) or with ``open_args["compression"]``, read ahead by
        ``open_args["buffer_size"]`` bytes."""
        return open_stream(filesystem, path, decompress=True, args=StreamArgs.of(open_args))

    def _rows_per_file(self) -> int | None:
        """Rows in each file when every file holds the same number (then ``count()`` reads
        nothing), else None."""
        return None

    def count_rows(self) -> int | None:
        """The metadata provider's row count for every file (``_rows_per_file()`` rows each
        with the default one), when it knows it: ``count()`` then reads nothing, as in Ray."""
        provider = self._meta_provider
        if self._rows_per_file() is None and isinstance(provider, DefaultFileMetadataProvider) and (
            type(provider)._get_block_metadata is DefaultFileMetadataProvider._get_block_metadata
        ):
            return None
        entries = list(self._files.iter_files())
        metadata = provider([e.path for e in entries], rows_per_file=self._rows_per_file(),
                            file_sizes=[e.size for e in entries])
        return metadata.num_rows

    def _read_file(self, fs: Any, piece: FilePiece, display: str, retrier: Retrier) -> Iterator[pa.Table]:
        path = piece.entry.path
        what = f"{type(self).__name__}._read_stream"

        def opener() -> pa.NativeFile:
            return self._open_input_source(fs, path, **self._open_stream_args)

        def parse(f: pa.NativeFile) -> Iterator[pa.Table]:
            return (as_table(block, what) for block in self._read_stream(f, path))

        yield from iter_stream(fs, path, retrier, display, parse, opener=opener)

    def _task_metadata(self, group: Sequence[FilePiece]) -> BlockMetadata:
        paths = [piece.entry.path for piece in group]
        given = self._meta_provider(paths, rows_per_file=self._rows_per_file(),
                                    file_sizes=[piece.entry.size for piece in group])
        known = super()._task_metadata(group)
        return BlockMetadata(
            num_rows=given.num_rows,
            size_bytes=given.size_bytes if given.size_bytes is not None else known.size_bytes,
            input_files=known.input_files,
            schema=given.schema,
        )

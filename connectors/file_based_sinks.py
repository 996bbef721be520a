"""Ray's ``BlockBasedFileDatasink`` and ``RowBasedFileDatasink``: the bases of a custom file
writer, ported by changing imports.

A subclass implements ``write_block_to_file(block, file)`` (a ``BlockAccessor`` of the rows of
one file) or ``write_row_to_file(row, file)`` (one file per row, a dict), and is written with
``ds.write_datasink(MySink(path))``. Around that runs the commit protocol of every file sink
here (``connectors.file_datasink``): files are staged, put in place only when every task
succeeded, ``_SUCCESS`` last, and removed again when the job fails; ``mode`` (``SaveMode``),
``filename_provider``, ``try_create_dir`` and ``open_stream_args`` (passed to
``open_output_stream``: ``compression``, ``buffer_size``, ``metadata``) mean what they mean in
Ray.

Each file is written into memory first and uploaded as one retried request (opened with the
sink's ``open_output_stream``), so a failed upload is retried with the same bytes (Ray reruns
``write_*_to_file`` instead). An error in ``write_*_to_file`` reaches the caller as itself,
naming the method and the file or row it was writing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from connectors import io_stats
from connectors.base import Block, TaskContext, as_table
from connectors.file_datasink import FileDatasink, FilenameProvider, SaveMode, WriteResult, combine
from connectors.retry import Retrier
from engine.transform import UDFFailure


class _RayFileDatasink(FileDatasink):
    """The constructor and attributes of Ray's ``_FileDatasink`` over ``FileDatasink``."""

    def __init__(
        self,
        path: str,
        *,
        filesystem: Any = None,
        try_create_dir: bool = True,
        open_stream_args: dict[str, Any] | None = None,
        filename_provider: FilenameProvider | None = None,
        dataset_uuid: str | None = None,
        file_format: str | None = None,
        mode: SaveMode | str = SaveMode.APPEND,
        min_rows_per_file: int | None = None,
    ) -> None:
        if filename_provider is None and dataset_uuid is not None:
            filename_provider = FilenameProvider(dataset_uuid=dataset_uuid, file_format=file_format)
        self.EXTENSION = f".{file_format}" if file_format else ""
        super().__init__(path, filesystem=filesystem, mode=mode, filename_provider=filename_provider,
                         min_rows_per_file=min_rows_per_file, write_success_marker=True)
        self.set_output_options(try_create_dir, open_stream_args)
        self.unresolved_path = path
        self.dataset_uuid = dataset_uuid
        self.file_format = file_format

    # Ray's attribute names, over the state FileDatasink keeps
    @property
    def path(self) -> str:
        """The destination folder on ``filesystem`` (no scheme), as Ray's sinks name it."""
        return self._root

    @property
    def filesystem(self) -> Any:
        return self._fs

    @property
    def open_stream_args(self) -> dict[str, Any]:
        return self._open_args

    @property
    def filename_provider(self) -> FilenameProvider | None:
        return self._filename_provider

    @property
    def try_create_dir(self) -> bool:
        return self._try_create_dir

    def open_output_stream(self, path: str) -> pa.NativeFile:
        """``path`` opened for writing with ``open_stream_args`` (Ray's); every file of the
        sink is opened with it, so a subclass may override it."""
        return self._fs.open_output_stream(path, **self._open_args)

    def _open_output(self, path: str) -> pa.NativeFile:
        return self.open_output_stream(path)

    def _write_with(self, method: str, write: Any, target: Any, file: pa.NativeFile, where: str) -> None:
        """``write(target, file)``, a subclass's method: its error names the method and the file."""
        try:
            write(target, file)
        except Exception as err:
            raise UDFFailure(f"{type(self).__name__}.{method}", err, f"(writing {where})") from err


class BlockBasedFileDatasink(_RayFileDatasink):
    """One file per write task (more past 512 MiB), written by ``write_block_to_file``.

    ``min_rows_per_file``: blocks are combined until a task has this many rows (Ray's).
    """

    def __init__(self, path: str, *, min_rows_per_file: int | None = None, **file_datasink_kwargs: Any) -> None:
        super().__init__(path, min_rows_per_file=min_rows_per_file, **file_datasink_kwargs)

    def write_block_to_file(self, block: Any, file: pa.NativeFile) -> None:
        """Write ``block`` (a ``dataflow.block.BlockAccessor``) into ``file``."""
        raise NotImplementedError("Subclasses of BlockBasedFileDatasink must implement write_block_to_file()")

    def _encode(self, tables: list[pa.Table]) -> pa.Buffer:
        from dataflow.block import BlockAccessor

        out = pa.BufferOutputStream()
        block = BlockAccessor(combine(tables))
        self._write_with("write_block_to_file", self.write_block_to_file, block, out,
                         f"a file of {block.num_rows()} rows into {self._display(self._root)}")
        return out.getvalue()


class RowBasedFileDatasink(_RayFileDatasink):
    """One file per row, written by ``write_row_to_file``; named
    ``<task's name>_000000_<row>`` plus the task name's extension, as Ray names them."""

    def __init__(self, path: str, **file_datasink_kwargs: Any) -> None:
        if SaveMode(file_datasink_kwargs.get("mode", SaveMode.APPEND)) is SaveMode.RESUME:
            raise ValueError("mode='resume' is not available for a RowBasedFileDatasink: its files are "
                             "named by row, not by input unit")
        super().__init__(path, **file_datasink_kwargs)

    def write_row_to_file(self, row: dict[str, Any], file: pa.NativeFile) -> None:
        """Write ``row`` (a dict of column name to value) into ``file``."""
        raise NotImplementedError("Subclasses of RowBasedFileDatasink must implement write_row_to_file()")

    def write(self, blocks: Iterable[Block], ctx: TaskContext) -> WriteResult:
        from engine.block_format import iter_rows

        retrier = Retrier(self._retry_policy)
        tables = [as_table(block, "a write task's input") for block in blocks]
        table = combine(tables) if tables else None
        if table is None or table.num_rows == 0:
            return WriteResult((), 0, 0)
        provider = self._filename_provider or FilenameProvider(file_format=self.file_format)
        task_name = str(provider.get_filename_for_task(self._write_id, ctx.task_index))
        base, ext = _split_base_and_ext(task_name)
        files: list[str] = []
        size = 0
        for row_index, row in enumerate(iter_rows(table)):
            out = pa.BufferOutputStream()
            name = f"{base}_{0:06}_{row_index:06}{ext}"
            self._write_with("write_row_to_file", self.write_row_to_file, row, out,
                             f"row {row_index} of write task {ctx.task_index} as {self._display(self._root)}/{name}")
            size += self._upload((name, out.getvalue()), retrier, files, ctx)
        io_stats.record(files_written=len(files), rows_written=table.num_rows)
        return WriteResult(tuple(files), table.num_rows, size)


def _split_base_and_ext(filename: str) -> tuple[str, str]:
    """``("name", ".ext")``: everything after the last dot is the extension (Ray's rule)."""
    if "." in filename:
        base, ext = filename.rsplit(".", 1)
        return base, f".{ext}"
    return filename, ""

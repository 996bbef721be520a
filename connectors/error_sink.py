"""The error sink: where ``map(..., on_error="skip", error_sink=path)`` puts the rows it dropped.

Each task that skipped rows writes its own Parquet file into the folder (local, ``s3://`` or
any fsspec URL), named so no two runs or tasks collide: a folder collects the errors of every
run until it is emptied. The columns are ``engine.row_errors.ROW_ERROR_SCHEMA``'s; read them
back with ``dataflow.read_parquet(path)``. Files are written directly, not staged: a task that
fails after writing its file (or a job that fails later) leaves the file in place.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from connectors.filesystem import resolve_filesystem
from connectors.retry import call_with_retry


class ParquetErrorSink:
    """A folder of Parquet files of skipped rows; picklable (its filesystem travels with it)."""

    def __init__(self, path: str | os.PathLike[str], filesystem: Any = None) -> None:
        if not isinstance(path, str | os.PathLike) or not os.fspath(path):
            msg = f"error_sink must be a folder path or URL such as 's3://bucket/errors/', got {path!r}"
            raise TypeError(msg)
        fs, roots, prefix = resolve_filesystem([os.fspath(path)], filesystem)
        self._fs: pafs.FileSystem = fs
        self._root = roots[0].rstrip("/") or roots[0]
        self.path = prefix + self._root

    def write(self, table: pa.Table, task_index: int) -> None:
        """Write ``table`` as a new file in the folder (created if missing)."""
        target = f"{self._root}/errors-{task_index:06d}-{uuid.uuid4().hex[:12]}.parquet"
        buffer = pa.BufferOutputStream()
        pq.write_table(table, buffer)
        data = buffer.getvalue()

        def put() -> None:
            self._fs.create_dir(self._root, recursive=True)
            with self._fs.open_output_stream(target) as out:
                out.write(data)

        call_with_retry(put, path=f"{self.path}/{target.rsplit('/', 1)[1]}", action="write")

    def __repr__(self) -> str:
        return f"ParquetErrorSink({self.path!r})"

"""The bytes behind a column of URIs (the ``download(column)`` expression): each URI read
whole, on up to ``threads`` threads at once, with the connectors' retries.

A URI is a local path (``/data/a.jpg``, ``file:///data/a.jpg``), ``s3://bucket/key``, or any
scheme fsspec knows (``gs://``, ``https://``...); a filesystem given by the caller (pyarrow or
fsspec) reads every URI instead. A null URI gives null. A URI that cannot be read gives null
too (Ray's behaviour), and one warning per column lists how many failed and the first
failures with their errors; ``on_error="raise"`` raises the first failure, naming its URI.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from connectors import io_stats
from connectors.filesystem import _scheme, path_for, read_file_bytes, resolve_filesystem
from connectors.retry import Retrier

log = logging.getLogger("dataflow")

SHOWN_FAILURES = 3
"""Failed URIs a warning names (the rest are counted)."""


class DownloadError(OSError):
    """A URI of a ``download`` column could not be read (``on_error="raise"``)."""


def download_all(uris: Sequence[str | None], filesystem: Any, on_error: str, threads: int) -> pa.Array:
    """A binary array of the bytes at each of ``uris`` (null where the URI is null or failed)."""
    targets = _targets(uris, filesystem)
    retrier = Retrier()

    def fetch(index: int) -> bytes | BaseException | None:
        target = targets[index]
        if target is None:
            return None
        fs, path = target
        if isinstance(fs, BaseException):
            return fs
        try:
            data = read_file_bytes(fs, path, retrier, str(uris[index]), decompress=False)
        except Exception as err:  # reported below: as null (with a warning) or raised
            return err
        io_stats.record(bytes_read=len(data), files_read=1)
        return data

    indices = range(len(uris))
    if threads > 1 and len(uris) > 1:
        with ThreadPoolExecutor(min(threads, len(uris)), thread_name_prefix="download") as pool:
            fetched = list(pool.map(fetch, indices))
    else:
        fetched = [fetch(i) for i in indices]
    failures = [(uris[i], value) for i, value in enumerate(fetched) if isinstance(value, BaseException)]
    if failures:
        uri, err = failures[0]
        if on_error == "raise":
            msg = f"download could not read {uri!r}: {type(err).__name__}: {err}"
            raise DownloadError(msg) from err
        shown = "; ".join(f"{u!r}: {type(e).__name__}: {e}" for u, e in failures[:SHOWN_FAILURES])
        more = f" (and {len(failures) - SHOWN_FAILURES} more)" if len(failures) > SHOWN_FAILURES else ""
        log.warning("download: %d of %d URIs could not be read and are null: %s%s",
                    len(failures), len(uris), shown, more)
    values = [None if isinstance(v, BaseException) else v for v in fetched]
    large = sum(len(v) for v in values if v is not None) >= 2**31
    return pa.array(values, type=pa.large_binary() if large else pa.binary())


def _targets(uris: Sequence[str | None], filesystem: Any) -> list[tuple[Any, str] | None]:
    """For each URI its (filesystem, path), each filesystem made once per scheme; None for a
    null URI, and the exception in place of the filesystem where none could be made."""
    made: dict[str, Any] = {}
    out: list[tuple[Any, str] | None] = []
    for uri in uris:
        if uri is None:
            out.append(None)
            continue
        scheme = _scheme(uri)
        key = "" if filesystem is not None else scheme
        if key not in made:
            try:
                made[key] = resolve_filesystem([uri], filesystem)[0]
            except Exception as err:  # an unknown scheme, a missing fsspec backend
                made[key] = err
        fs = made[key]
        if isinstance(fs, BaseException):
            out.append((fs, uri))
        elif filesystem is None and scheme in ("", "file"):
            out.append((fs, os.path.abspath(os.path.expanduser(path_for(fs, uri)))))
        else:
            out.append((fs, path_for(fs, uri)))
    return out

"""Paths to files: resolve a filesystem, check the paths exist, and list files as a stream.

``resolve_files(paths, filesystem=None, extensions=...)`` turns what a user passes to ``read_*``
(a path or URI, a folder, a glob, a list of them; ``s3://`` or local) into a ``FileSet``. It checks
every path at once (a missing one raises ``PathNotFoundError`` naming it; a folder without a
matching file says so) but lists nothing more: ``FileSet.iter_files()`` is a generator, walking
local folders with ``os.scandir`` and S3 one 1,000-key page at a time, so a folder of 100,000
files yields its first file in milliseconds.

Rules for folders: recursive; files and folders whose name starts with ``.`` or ``_`` are
skipped (``_SUCCESS``, ``.crc``, our own ``_staging-*`` folders); only files with one of the
format's extensions are kept, optionally followed by a compression suffix (``.csv.gz``).
Files named explicitly or matched by a glob are always read. ``**`` in a glob matches any depth.

Every filesystem is a ``pyarrow.fs.FileSystem``; fsspec filesystems (s3fs included) are wrapped
in ``PyFileSystem(FSSpecHandler(...))``. s3fs is imported only when an ``s3://`` path is seen.

Reading: ``read_file_bytes`` reads a whole file; ``open_input_stream`` and ``iter_stream`` read it
as a stream (decompressed by extension as it goes), so a text format (CSV, JSON Lines) holds a few
MiB of it at a time, whatever the file's size. ``StreamArgs`` (Ray's ``arrow_open_stream_args``)
names a codec for every file instead, and a read buffer.
"""

from __future__ import annotations

import contextvars
import dataclasses
import fnmatch
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs

from connectors.errors import NoFilesError, NoPathExistsError, PathNotFoundError
from connectors.retry import ErrorKind, Retrier

T = TypeVar("T")

PathArg = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]

COMPRESSION_SUFFIXES = (".gz", ".bz2", ".zst", ".lz4", ".br")
_CODECS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".lz4": "lz4", ".br": "brotli"}
MiB = 1 << 20
STREAM_BUFFER_BYTES = 8 * MiB
"""Read-ahead of a file streamed through fsspec (s3fs's own default is 50 MiB per open file)."""
STREAM_BLOCK_BYTES = 16 * MiB
"""About how many bytes of table a streamed format (CSV, JSON Lines) yields at a time."""
_GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True)
class FileEntry:
    """One file to read: its path on the filesystem, its size, and the root it was found under."""

    path: str
    size: int | None
    root: str


@dataclass(frozen=True)
class FileSet:
    """Resolved input: a filesystem, normalized roots, and the rule for which files count.

    Picklable; ``iter_files()`` lists lazily and may be called again (it lists again).
    """

    filesystem: pafs.FileSystem
    roots: tuple[str, ...]
    uri_prefix: str = ""
    extensions: tuple[str, ...] | None = None
    ignore_missing: bool = False
    """Ray's ``ignore_missing_paths``: a root that does not exist (or a glob that matches nothing)
    is skipped, as long as another holds files."""

    def display(self, path: str) -> str:
        """``path`` as the user would write it (``s3://bucket/key`` for S3)."""
        return self.uri_prefix + path

    def iter_files(self) -> Iterator[FileEntry]:
        """Every file to read, root by root, in a stable order (sorted within each folder)."""
        for root in self.roots:
            yield from self._iter_root(root)

    def check(self, retrier: Retrier | None = None) -> None:
        """Raise ``PathNotFoundError`` for a root that does not exist or holds no file to read."""
        retrier = retrier or Retrier()
        if self.ignore_missing:
            missing = [root for root in self.roots if next(self._iter_root(root), None) is None]
            if len(missing) < len(self.roots):
                return
            try:  # nothing anywhere: say why for the first root, as without ignore_missing_paths
                self._check_roots(retrier)
            except PathNotFoundError as exc:
                msg = f"none of the paths exist (ignore_missing_paths=True); the first: {exc.detail}"
                raise NoPathExistsError(msg, path=exc.path) from None
            return
        self._check_roots(retrier)

    def _check_roots(self, retrier: Retrier) -> None:
        for root in self.roots:
            if _has_glob(root):
                base = _glob_base(root)
                info = self._info(base, retrier)
                if info.type == pafs.FileType.NotFound:
                    raise PathNotFoundError("no such folder for this glob", path=self.display(root))
                if next(self._iter_root(root), None) is None:
                    raise NoFilesError("the glob matched no files", path=self.display(root))
                continue
            info = self._info(root, retrier)
            if info.type == pafs.FileType.NotFound:
                raise PathNotFoundError("no such file or folder", path=self.display(root))
            if info.type == pafs.FileType.Directory and next(self._iter_root(root), None) is None:
                wanted = "/".join(self.extensions) if self.extensions else "any"
                msg = (
                    f"the folder holds no files to read (looked for {wanted} files, recursively; "
                    "names starting with '.' or '_' are skipped)"
                )
                raise NoFilesError(msg, path=self.display(root))

    def _info(self, path: str, retrier: Retrier) -> pafs.FileInfo:
        return retrier.call(lambda: self.filesystem.get_file_info(path), path=self.display(path), action="look up")

    def _iter_root(self, root: str) -> Iterator[FileEntry]:
        if _has_glob(root):
            base = _glob_base(root)
            pattern = _split(root)[len(_split(base)) :]
            if self.ignore_missing and self._info(base, Retrier()).type == pafs.FileType.NotFound:
                return
            for path, size in self._walk(base):
                if _glob_match(pattern, _split(_relative(path, base))):
                    yield FileEntry(path, size, base)
            return
        info = self._info(root, Retrier())
        if info.type == pafs.FileType.File:
            yield FileEntry(root, info.size, _parent(root))
            return
        if info.type == pafs.FileType.NotFound and self.ignore_missing:
            return
        for path, size in self._walk(root):
            relative = _split(_relative(path, root))
            if any(part.startswith((".", "_")) for part in relative):
                continue
            if self.extensions is None or has_extension(relative[-1], self.extensions):
                yield FileEntry(path, size, root)

    def _walk(self, root: str) -> Iterator[tuple[str, int | None]]:
        fs = self.filesystem
        if isinstance(fs, pafs.LocalFileSystem):
            yield from _walk_local(root)
            return
        inner = _fsspec_of(fs)
        if inner is not None and type(inner).__module__.startswith(("s3fs", "connectors.s3_filesystem")):
            from connectors.s3_filesystem import iter_s3_objects

            yield from iter_s3_objects(inner, root, Retrier())
            return
        yield from _walk_pyarrow(fs, root)


def resolve_files(
    paths: PathArg,
    *,
    filesystem: Any = None,
    extensions: Sequence[str] | None = None,
    check: bool = True,
    ignore_missing: bool = False,
) -> FileSet:
    """A checked ``FileSet`` for ``paths``; see the module docstring for the rules
    (``ignore_missing``: see ``FileSet.ignore_missing``)."""
    raw = [os.fspath(paths)] if isinstance(paths, str | os.PathLike) else [os.fspath(p) for p in paths]
    if not raw:
        raise ValueError("no paths given: pass a file, a folder, a glob or a list of them")
    fs, roots, prefix = resolve_filesystem(raw, filesystem)
    exts = tuple(e if e.startswith(".") else f".{e}" for e in extensions) if extensions is not None else None
    file_set = FileSet(fs, tuple(roots), prefix, exts, ignore_missing)
    if check:
        file_set.check()
    return file_set


def resolve_filesystem(paths: list[str], filesystem: Any = None) -> tuple[pafs.FileSystem, list[str], str]:
    """``(filesystem, paths without scheme, uri prefix)``; every path must use the same scheme."""
    schemes = {_scheme(p) for p in paths}
    if len(schemes) > 1:
        raise ValueError(f"all paths must be on one filesystem, got schemes {sorted(schemes)}: {paths}")
    scheme = schemes.pop()
    stripped = [p.split("://", 1)[1] if "://" in p else p for p in paths]
    prefix = f"{scheme}://" if scheme not in ("", "file") else ""
    if filesystem is not None:
        fs = as_pyarrow_filesystem(filesystem)
        if _fsspec_of(fs) is not None:
            stripped = [path_for(fs, p) for p in paths]
            if all("://" in p for p in stripped):
                prefix = ""
        return fs, [p.rstrip("/") or p for p in stripped], prefix
    if scheme in ("", "file"):
        return pafs.LocalFileSystem(), [os.path.abspath(os.path.expanduser(p)) for p in stripped], ""
    if scheme in ("s3", "s3a"):
        from connectors.s3_filesystem import make_s3_filesystem

        return as_pyarrow_filesystem(make_s3_filesystem()), [p.rstrip("/") for p in stripped], "s3://"
    import fsspec

    fs = as_pyarrow_filesystem(fsspec.filesystem(scheme))
    named = [path_for(fs, p).rstrip("/") for p in paths]
    if all("://" in p for p in named):  # (http's paths are whole URLs: nothing to put back)
        prefix = ""
    return fs, named, prefix


def path_for(fs: pafs.FileSystem, uri: str) -> str:
    """``uri`` as ``fs`` names it: for an fsspec filesystem its own reading of the URI (``http``
    keeps the whole URL, ``gs://b/k`` is ``b/k``), else the URI without its scheme."""
    inner = _fsspec_of(fs)
    if inner is not None:
        return inner._strip_protocol(uri)  # type: ignore[no-any-return]
    return uri.split("://", 1)[1] if "://" in uri else uri


def as_pyarrow_filesystem(filesystem: Any) -> pafs.FileSystem:
    """``filesystem`` itself if it is a pyarrow one, else an fsspec one wrapped for pyarrow."""
    if isinstance(filesystem, pafs.FileSystem):
        return filesystem
    try:
        from fsspec import AbstractFileSystem
    except ImportError:  # pragma: no cover - fsspec is a dependency
        AbstractFileSystem = ()  # type: ignore[assignment,misc]
    if isinstance(filesystem, AbstractFileSystem):
        return pafs.PyFileSystem(FSSpecHandler(filesystem))
    raise TypeError(f"filesystem must be a pyarrow.fs.FileSystem or an fsspec filesystem, got {filesystem!r}")


class FSSpecHandler(pafs.FSSpecHandler):
    """pyarrow's handler for an fsspec filesystem, but opening a file lets fsspec's own error through.

    pyarrow's asks ``isfile`` first, which answers False for any error: a read without
    credentials would fail as "not found" (and every open would cost one more request).
    """

    def open_input_stream(self, path: str) -> pa.NativeFile:
        return pa.PythonFile(self.fs.open(path, mode="rb"), mode="r")

    def open_input_file(self, path: str) -> pa.NativeFile:
        return pa.PythonFile(self.fs.open(path, mode="rb"), mode="r")


@dataclass(frozen=True)
class StreamArgs:
    """Ray's ``arrow_open_stream_args`` for the formats read as streams: ``compression`` is the
    codec of every file (instead of the one each file's extension names; None: by extension),
    ``buffer_size`` the bytes read ahead (None: the filesystem's default)."""

    compression: str | None = None
    buffer_size: int | None = None

    @classmethod
    def of(cls, args: Mapping[str, Any] | None) -> StreamArgs:
        """Checked: the arguments ``open_input_stream`` takes, a codec that can be streamed."""
        if args is None:
            return NO_STREAM_ARGS
        if not isinstance(args, Mapping):
            raise TypeError(f"arrow_open_stream_args must be a dict, got {type(args).__name__}")
        unknown = sorted(set(args) - {"compression", "buffer_size"})
        if unknown:
            raise TypeError(f"arrow_open_stream_args: {unknown[0]!r} is not an argument of pyarrow's "
                            "open_input_stream (compression, buffer_size)")
        compression = args.get("compression")
        if compression is not None:
            if not isinstance(compression, str):
                raise TypeError(f"arrow_open_stream_args: compression must be a codec name, got {compression!r}")
            compression = compression.lower()
            try:
                pa.CompressedInputStream(pa.BufferReader(b""), compression)
            except (ValueError, NotImplementedError, pa.ArrowException) as err:
                raise ValueError(f"arrow_open_stream_args: compression={compression!r} cannot be read "
                                 f"as a stream: {err}") from None
        size = args.get("buffer_size")
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
            raise ValueError(f"arrow_open_stream_args: buffer_size must be a whole number of bytes, got {size!r}")
        return cls(compression, size or None)

    def codec(self, path: str, by_extension: bool) -> str | None:
        """The codec to read ``path`` with: the one given, else (when asked) its extension's."""
        if self.compression is not None:
            return self.compression
        return compression_of(path) if by_extension else None


NO_STREAM_ARGS = StreamArgs()


def read_file_bytes(
    fs: pafs.FileSystem, path: str, retrier: Retrier, display: str, *, decompress: bool = True,
    args: StreamArgs = NO_STREAM_ARGS,
) -> bytes:
    """The whole file, retried as a unit; decompressed by extension (``.gz``...) when asked, or
    with the codec ``args`` names."""
    compression = args.compression or ("detect" if decompress else None)

    def read() -> bytes:
        with fs.open_input_stream(path, compression=compression, buffer_size=args.buffer_size) as stream:
            return stream.read()

    return retrier.call(read, path=display)


def compression_of(path: str) -> str | None:
    """The codec that ``path``'s extension names (``gzip`` for ``.gz``...), or None."""
    lower = path.lower()
    for suffix, codec in _CODECS.items():
        if lower.endswith(suffix):
            return codec
    return None


def open_input_stream(
    fs: pafs.FileSystem, path: str, retrier: Retrier, display: str, *, decompress: bool = True,
    args: StreamArgs = NO_STREAM_ARGS,
) -> pa.NativeFile:
    """A forward-only stream of ``path``, decompressed by extension when asked (or with the codec
    ``args`` names).

    Opening is retried; reads are the caller's (``iter_stream`` retries them too).
    """
    return retrier.call(lambda: open_stream(fs, path, decompress, args), path=display, action="open")


def iter_stream(
    fs: pafs.FileSystem,
    path: str,
    retrier: Retrier,
    display: str,
    parse: Callable[[pa.NativeFile], Iterator[T]],
    *,
    decompress: bool = True,
    args: StreamArgs = NO_STREAM_ARGS,
    opener: Callable[[], pa.NativeFile] | None = None,
) -> Iterator[T]:
    """The items ``parse`` makes of ``path``'s stream (see ``open_input_stream``), as they are needed.

    ``opener``, when given, opens the file instead (on every attempt), as a connector that
    opens its own files wants.

    A transient I/O error reopens the file and skips the items already yielded
    (``Retrier.iterate``), so ``parse`` must be deterministic. A ``ValueError`` (pyarrow's
    ``ArrowInvalid``, a ``FileFormatError``) is a parse error and raised at once, as it is: the
    same bytes would fail again.
    """
    def open_items() -> _StreamItems[T]:
        stream = opener() if opener is not None else open_stream(fs, path, decompress, args)
        try:
            return _StreamItems(parse(stream), stream)
        except BaseException:
            stream.close()
            raise

    yield from parsing(retrier).iterate(open_items, path=display)


def parsing(retrier: Retrier) -> Retrier:
    """``retrier`` for reads that parse as they go: a ``ValueError`` (pyarrow's ``ArrowInvalid``,
    a ``FileFormatError``) is a parse error, raised at once as it is (the same bytes would fail
    again); I/O errors are retried as ``retrier`` says."""
    classify = retrier.classify

    def classify_parse_errors(exc: BaseException) -> ErrorKind:
        return ErrorKind.PERMANENT if isinstance(exc, ValueError) else classify(exc)

    return dataclasses.replace(retrier, classify=classify_parse_errors)


class _StreamItems(Generic[T]):
    """``items`` as an iterator whose ``close()`` also closes the stream they are parsed from."""

    def __init__(self, items: Iterator[T], stream: pa.NativeFile) -> None:
        self._items = items
        self._stream = stream

    def __iter__(self) -> _StreamItems[T]:
        return self

    def __next__(self) -> T:
        return next(self._items)

    def close(self) -> None:
        try:
            close = getattr(self._items, "close", None)
            if close is not None:
                close()
        finally:
            self._stream.close()


def open_stream(fs: pafs.FileSystem, path: str, decompress: bool, args: StreamArgs = NO_STREAM_ARGS) -> pa.NativeFile:
    """``path`` opened once as a forward-only stream (no retries), decompressed as ``args`` and
    ``decompress`` say (see ``StreamArgs.codec``)."""
    inner = _fsspec_of(fs)
    if inner is not None:
        # through fsspec itself, to bound its read-ahead (pyarrow's handler opens with the default)
        block_size = args.buffer_size or STREAM_BUFFER_BYTES
        stream = pa.PythonFile(inner.open(path, mode="rb", block_size=block_size), mode="r")
    else:
        stream = fs.open_input_stream(path, compression=None, buffer_size=args.buffer_size)
    codec = args.codec(path, decompress)
    return pa.CompressedInputStream(stream, codec) if codec is not None else stream


def open_input_file(fs: pafs.FileSystem, path: str, retrier: Retrier, display: str) -> pa.NativeFile:
    """A random-access handle on ``path`` (opening is retried; later reads are the caller's)."""
    return retrier.call(lambda: fs.open_input_file(path), path=display, action="open")


METADATA_THREADS = 16
"""Threads reading small things (footers) from many remote files at once: each is a round trip."""

U = TypeVar("U")


def map_small_reads(fs: pafs.FileSystem, fn: Callable[[T], U], items: Sequence[T]) -> list[U]:
    """``fn`` over ``items`` in order: one after the other on a local disk (a footer read is
    tens of microseconds there, less than starting a thread), on threads elsewhere (each read
    is a network round trip)."""
    if isinstance(fs, pafs.LocalFileSystem) or len(items) < 2:
        return [fn(item) for item in items]
    from concurrent.futures import ThreadPoolExecutor

    # each call in a copy of the caller's context: a planning scope's cache reaches the threads
    contexts = [contextvars.copy_context() for _ in items]
    with ThreadPoolExecutor(max_workers=min(METADATA_THREADS, len(items)), thread_name_prefix="footers") as pool:
        return list(pool.map(lambda ctx, item: ctx.run(fn, item), contexts, items))


def _fsspec_of(fs: pafs.FileSystem) -> Any:
    if isinstance(fs, pafs.PyFileSystem) and isinstance(fs.handler, pafs.FSSpecHandler):
        return fs.handler.fs
    return None


def _walk_local(root: str) -> Iterator[tuple[str, int | None]]:
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except NotADirectoryError:
            continue
        subfolders = []
        for entry in entries:
            if entry.is_dir():
                if not entry.name.startswith((".", "_")):
                    subfolders.append(entry.path)
            elif entry.is_file():
                yield entry.path, entry.stat().st_size
        stack.extend(reversed(subfolders))


def _walk_pyarrow(fs: pafs.FileSystem, root: str) -> Iterator[tuple[str, int | None]]:
    stack = [root]
    while stack:
        folder = stack.pop()
        infos = sorted(fs.get_file_info(pafs.FileSelector(folder, recursive=False)), key=lambda i: i.path)
        subfolders = []
        for info in infos:
            if info.type == pafs.FileType.Directory:
                if not info.base_name.startswith((".", "_")):
                    subfolders.append(info.path)
            elif info.type == pafs.FileType.File:
                yield info.path, info.size
        stack.extend(reversed(subfolders))


def _scheme(path: str) -> str:
    if "://" not in path:
        return ""
    return path.split("://", 1)[0].lower()


def _has_glob(path: str) -> bool:
    return any(c in _GLOB_CHARS for c in path)


def _glob_base(pattern: str) -> str:
    parts = _split(pattern)
    base: list[str] = []
    for part in parts:
        if _has_glob(part):
            break
        base.append(part)
    joined = "/".join(base)
    return ("/" + joined) if pattern.startswith("/") else joined


def _glob_match(pattern: list[str], parts: list[str]) -> bool:
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_glob_match(pattern[1:], parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pattern[0]) and _glob_match(pattern[1:], parts[1:])


def _split(path: str) -> list[str]:
    return [p for p in path.replace(os.sep, "/").split("/") if p]


def _relative(path: str, root: str) -> str:
    path, root = path.replace(os.sep, "/"), root.replace(os.sep, "/").rstrip("/")
    return path[len(root) + 1 :] if path.startswith(root + "/") else path


def _parent(path: str) -> str:
    path = path.replace(os.sep, "/")
    return path.rsplit("/", 1)[0] if "/" in path else ""


def has_extension(name: str, extensions: tuple[str, ...]) -> bool:
    """Whether file ``name`` ends in one of ``extensions``, compressed (``.csv.gz``) or not."""
    lower = name.lower()
    for suffix in ("", *COMPRESSION_SUFFIXES):
        stem = lower.removesuffix(suffix) if suffix else lower
        if (not suffix or stem != lower) and stem.endswith(extensions):
            return True
    return False

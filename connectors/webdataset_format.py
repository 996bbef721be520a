"""WebDataset: tar shards whose members are grouped into samples by key, read and written.

A shard is a tar file; ``images/n01440764_10026.jpg`` and ``images/n01440764_10026.cls`` make one
sample with key ``images/n01440764_10026`` (the member name up to the first dot of its last path
part, as the ``webdataset`` library and Ray Data split it) and columns ``jpg`` and ``cls`` (the
rest of the name). Members of one sample must follow each other in the tar; a key seen again later
starts a new sample. Rows have ``__key__``, one column per suffix and ``__url__`` (the shard),
in Ray Data's order; ``include_paths=True`` adds ``path`` too.

Reading streams through each shard with ``tarfile`` in stream mode (``r|*``): nothing but the
current member and the block being built is in memory, whatever the shard's size, and the
member list ``tarfile`` keeps is emptied as it goes. Shards are listed on the driver and read in
parallel, one task per shard or group of small shards (``FileDatasource``); ``s3://`` works
through the filesystem layer, with transient errors retried by reopening the shard and skipping
the blocks already produced. A damaged shard (bad header checksum, a member cut short, a broken
compressed stream) fails with a ``FileFormatError`` naming the shard, the member and its byte
offset; ``tarfile`` alone would end the shard silently at a bad header.

``decoder`` follows Ray Data: True (or a format string) applies ``default_decoder``; a callable
``sample -> sample``, or a list of callables and format strings, is applied in order; False or
None keeps every value as bytes. The default decoder turns ``txt``/``text`` into ``str``,
``cls``/``cls2`` into ``int``, images (``jpg jpeg png ppm pgm pbm pnm``) into ``uint8`` arrays
with Pillow, ``json`` into Python values, ``npy`` into arrays (``allow_pickle=False``) and
``mp``/``msgpack`` with msgpack. Unlike Ray it leaves ``pickle``/``pkl``/``pt``/``pth`` as bytes:
unpickling a data file runs code of the file's choosing; pass a decoder to opt in.

Images of one shape share a fixed-shape tensor column; a block ends where a shape changes (as
``read_images`` does), so shards of many image sizes give small blocks: resize in a decoder.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import io
import json
import pickle
import re
import sys
import tarfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa

from connectors.errors import FileFormatError
from connectors.file_datasink import FileDatasink
from connectors.file_datasource import FilePiece, ProjectingFileDatasource
from connectors.filesystem import compression_of, iter_stream
from connectors.retry import Retrier

MiB = 1 << 20
BLOCK_BYTES = 16 * MiB
"""Decoded bytes gathered into one block before it is built and yielded."""
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "ppm", "pgm", "pbm", "pnm")
_IMAGE_FORMATS = {"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "ppm": "PPM", "pgm": "PPM", "pbm": "PPM", "pnm": "PPM"}
_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_TARFILE_CODECS = {"gzip", "bz2"}
"""Compressed shards that ``tarfile``'s ``r|*`` opens itself; others are decompressed by pyarrow."""

Sample = dict[str, Any]
SampleFn = Callable[[Sample], Sample]


def base_plus_ext(name: str) -> tuple[str | None, str | None]:
    """``(key, suffix)`` of a member name, split at the first dot of its last path part."""
    match = _KEY.match(name)
    if not match:
        return None, None
    return match.group(1), match.group(2)


def check_suffix(suffix: str, patterns: Sequence[str] | Callable[[str], bool] | None) -> bool:
    """Whether ``suffix`` passes ``patterns``: None passes all; globs (``*``, ``?``) match ``.suffix``;
    other strings match the suffix with or without its leading dot; a callable decides."""
    if patterns is None:
        return True
    if callable(patterns):
        return bool(patterns(suffix))
    for pattern in patterns:
        if "*" in pattern or "?" in pattern:
            if fnmatch.fnmatch("." + suffix, pattern):
                return True
        elif suffix == pattern or "." + suffix == pattern:
            return True
    return False


def _apply(fns: Any, value: Any, default: Callable[..., Any] | None = None) -> Any:
    """``value`` through a callable or a list of them (non-callables become ``default(format=...)``)."""
    if fns is None:
        return value
    for fn in fns if isinstance(fns, list) else [fns]:
        if not callable(fn):
            if default is None:
                raise TypeError(f"expected a callable, got {fn!r}")
            fn = partial(default, format=fn)
        value = fn(value)
    return value


# ----- decoding ----------------------------------------------------------------------------------


def _extension(key: str) -> str:
    return key.rsplit(".", 1)[-1].lower()


def decode_value(key: str, value: bytes) -> Any:
    """One member's bytes decoded by its extension (the default decoder's rules)."""
    ext = _extension(key)
    if ext in ("txt", "text"):
        return value.decode("utf-8")
    if ext in ("cls", "cls2"):
        return int(value.decode("utf-8"))
    if ext in IMAGE_EXTENSIONS:
        from PIL import Image

        with Image.open(io.BytesIO(value)) as image:
            return np.asarray(image)
    if ext == "json":
        return json.loads(value)
    if ext == "npy":
        return np.load(io.BytesIO(value), allow_pickle=False)
    if ext in ("mp", "msgpack"):
        try:
            import msgpack
        except ImportError as exc:
            raise ImportError(f"decoding .{ext} members needs msgpack: pip install msgpack") from exc
        return msgpack.unpackb(value, raw=False)
    return value


def default_decoder(sample: Sample, format: bool | str = True) -> Sample:
    """``sample`` with each value decoded by its key's extension (``__`` keys kept as they are)."""
    if format == "PIL":
        msg = "decoder='PIL' gives PIL images, which an Arrow column cannot hold; use decoder=True for uint8 arrays"
        raise ValueError(msg)
    out = {}
    for key, value in sample.items():
        if key.startswith("__") or not isinstance(value, bytes):
            out[key] = value
            continue
        try:
            out[key] = decode_value(key, value)
        except ImportError:
            raise
        except Exception as exc:  # a member that is not what its extension says: name it
            msg = f"could not decode sample {sample.get('__key__')!r}'s {key!r} member ({type(exc).__name__}: {exc})"
            raise ValueError(msg) from exc
    return out


def _check_decoder(decoder: Any) -> None:
    specs = decoder if isinstance(decoder, list) else [decoder]
    for spec in specs:
        if spec == "PIL":
            default_decoder({}, format="PIL")
        if not (callable(spec) or spec is True or isinstance(spec, str)):
            msg = f"decoder must be True, False, None, a format string, a callable or a list of them; got {spec!r}"
            raise TypeError(msg)


def _decoders_are_default(decoder: Any) -> bool:
    specs = decoder if isinstance(decoder, list) else [decoder]
    return not any(callable(spec) for spec in specs)


# ----- the tar stream ----------------------------------------------------------------------------


class _StrictTarInfo(tarfile.TarInfo):
    """A ``TarInfo`` whose bad headers raise: ``tarfile`` ends an archive at one silently."""

    @classmethod
    def fromtarfile(cls, archive: tarfile.TarFile) -> tarfile.TarInfo:
        try:
            return super().fromtarfile(archive)
        except (tarfile.EOFHeaderError, tarfile.EmptyHeaderError):
            raise  # the end-of-archive blocks, or the end of the file: a normal end
        except tarfile.HeaderError as exc:
            msg = f"invalid tar header at byte offset {archive.offset} ({exc})"
            raise tarfile.ReadError(msg) from None


def iter_members(
    fileobj: Any,
    display: str,
    *,
    fileselect: Any = None,
    filerename: Any = None,
    verbose_open: bool = False,
) -> Iterator[tuple[str, bytes]]:
    """``(name, data)`` of each regular member of the tar stream ``fileobj``, in order."""
    if verbose_open:
        print(f"start {display}", file=sys.stderr)  # noqa: T201 - asked for, as in Ray Data
    last = "(none: the shard's first header)"
    try:
        tar = tarfile.open(fileobj=fileobj, mode="r|*", tarinfo=_StrictTarInfo)
        with tar:
            for info in tar:
                last = f"{info.name!r} (header at byte offset {info.offset})"
                if info.isreg() and info.name is not None:
                    member = tar.extractfile(info)
                    data = member.read() if member is not None else b""
                    name = _apply(filerename, info.name)
                    if not isinstance(name, str):
                        raise TypeError(f"filerename must return a str, got {type(name).__name__} for {info.name!r}")
                    if check_suffix(name, fileselect):
                        yield name, data
                tar.members = []  # tarfile keeps every TarInfo; a long shard must not
    except (tarfile.TarError, EOFError) as exc:
        raise FileFormatError(f"corrupt tar (last member read: {last}): {exc}", path=display) from exc
    if verbose_open:
        print(f"done {display}", file=sys.stderr)  # noqa: T201


def group_samples(
    members: Iterator[tuple[str, bytes]], display: str, suffixes: Any = None
) -> Iterator[Sample]:
    """Consecutive members with one key grouped into ``{"__key__": key, suffix: data, ...}``."""
    current: Sample | None = None
    for name, data in members:
        key, suffix = base_plus_ext(name)
        if key is None or suffix is None:
            continue
        if current is None or key != current["__key__"]:
            if current is not None:
                yield current
            current = {"__key__": key}
        if suffix in current:
            msg = f"member {name!r}: sample {key!r} already has a {suffix!r} file (duplicate name in the shard)"
            raise FileFormatError(msg, path=display)
        if check_suffix(suffix, suffixes):
            current[suffix] = data
    if current is not None:
        yield current


# ----- samples -> blocks -------------------------------------------------------------------------


def _value_bytes(value: Any) -> int:
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, bytes | str):
        return len(value)
    return 16


def _column(name: str, values: list[Any], display: str) -> pa.Array:
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, np.ndarray) for v in present):
        from engine.block_format import tensor_array

        stacked = tensor_array(np.stack(present))
        if len(present) == len(values):
            return stacked
        mask = np.array([v is None for v in values])
        index = pa.array(np.cumsum(~mask) - 1, pa.int64(), mask=mask)
        return stacked.take(index)
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        kinds = sorted({type(v).__name__ for v in present})
        msg = (
            f"the decoded {name!r} values ({', '.join(kinds)}) do not make one Arrow column ({exc}); "
            "pass a decoder that gives them one type"
        )
        raise FileFormatError(msg, path=display, column=name) from exc


def samples_table(samples: list[Sample], display: str) -> pa.Table:
    """One table of ``samples``; keys missing from a sample are nulls."""
    names: dict[str, None] = {}
    for sample in samples:
        names.update(dict.fromkeys(sample))
    arrays = [_column(name, [s.get(name) for s in samples], display) for name in names]
    return pa.Table.from_arrays(arrays, names=list(names))


def _shapes(sample: Sample) -> dict[str, tuple[Any, ...]]:
    return {k: (v.shape, v.dtype.str) for k, v in sample.items() if isinstance(v, np.ndarray)}


def iter_sample_tables(samples: Iterator[Sample], display: str, block_bytes: int = BLOCK_BYTES) -> Iterator[pa.Table]:
    """``samples`` gathered into tables of about ``block_bytes``; a new table where an array's shape changes."""
    pending: list[Sample] = []
    size = 0
    shapes: dict[str, tuple[Any, ...]] = {}
    for sample in samples:
        sample_shapes = _shapes(sample)
        if pending and any(shapes.get(k, s) != s for k, s in sample_shapes.items()):
            yield samples_table(pending, display)
            pending, size, shapes = [], 0, {}
        shapes.update(sample_shapes)
        pending.append(sample)
        size += sum(_value_bytes(v) for v in sample.values())
        if size >= block_bytes:
            yield samples_table(pending, display)
            pending, size, shapes = [], 0, {}
    if pending:
        yield samples_table(pending, display)


class WebDatasetDatasource(ProjectingFileDatasource):
    """Samples of WebDataset tar shards, one row each; see the module docstring."""

    FILE_EXTENSIONS = None  # a folder: every file but hidden ones, as Ray's read_webdataset

    def __init__(
        self,
        paths: Any,
        *,
        decoder: Any = True,
        fileselect: Any = None,
        filerename: Any = None,
        suffixes: Any = None,
        verbose_open: bool = False,
        columns: Sequence[str] | None = None,
        expand_json: bool = False,
        **kwargs: Any,
    ) -> None:
        if decoder is not None and decoder is not False:
            _check_decoder(decoder)
        super().__init__(paths, **kwargs)
        self._expand_json = bool(expand_json)
        self._decoder = None if decoder is False else decoder
        self._fileselect = fileselect
        self._filerename = filerename
        self._suffixes = suffixes
        self._verbose_open = verbose_open
        self._columns = list(columns) if columns is not None else None

    def get_name(self) -> str:
        """``ReadWebDataset``."""
        return "WebDataset"

    def _samples(self, fileobj: Any, display: str) -> Iterator[Sample]:
        members = iter_members(
            fileobj, display, fileselect=self._fileselect, filerename=self._filerename, verbose_open=self._verbose_open
        )
        keep = None
        if self._columns is not None and _decoders_are_default(self._decoder) and not self._expand_json:
            keep = {*self._columns, "__key__"}  # members nobody asked for are neither kept nor decoded
        for sample in group_samples(members, display, self._suffixes):
            if keep is not None:
                sample = {k: v for k, v in sample.items() if k in keep}
            if self._decoder is not None:  # a decoder's own errors go up as they are
                sample = _apply(self._decoder, sample, default=default_decoder)
            if self._expand_json:
                _expand_json(sample, display)
            sample["__url__"] = display
            yield sample

    def _read_file(self, fs: Any, piece: FilePiece, display: str, retrier: Retrier) -> Iterator[pa.Table]:
        codec = self._stream_args.compression or compression_of(piece.entry.path)

        def parse(stream: pa.NativeFile) -> Iterator[pa.Table]:
            if codec is not None and codec not in _TARFILE_CODECS:
                stream = pa.CompressedInputStream(stream, codec)
            return iter_sample_tables(self._samples(stream, display), display)

        yield from iter_stream(fs, piece.entry.path, retrier, display, parse, decompress=False,
                               args=dataclasses.replace(self._stream_args, compression=None))


def _expand_json(sample: Sample, display: str) -> None:
    """Ray's ``expand_json=True``: each field of the sample's ``json`` member becomes a column of
    its own (a member of the same name is kept as it is)."""
    if "json" not in sample:
        raise FileFormatError(f"expand_json=True, but sample {sample.get('__key__')!r} has no .json member",
                              path=display)
    value = sample["json"]
    if isinstance(value, (bytes, str)):
        value = json.loads(value)
    if not isinstance(value, dict):
        raise FileFormatError(f"expand_json=True: sample {sample.get('__key__')!r} holds a JSON "
                              f"{type(value).__name__}, not an object", path=display)
    for key, field_value in value.items():
        sample.setdefault(key, field_value)


# ----- writing -----------------------------------------------------------------------------------


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def encode_value(key: str, value: Any) -> Any:
    """One value encoded by its key's extension (the default encoder's rules); bytes pass as they are."""
    if isinstance(value, bytes):
        return value
    ext = _extension(key)
    if ext in ("txt", "text"):
        return str(value).encode("utf-8")
    if ext in ("cls", "cls2"):
        return str(int(value)).encode("utf-8")
    if ext in IMAGE_EXTENSIONS:
        from PIL import Image

        image = Image.fromarray(np.asarray(value)) if not isinstance(value, Image.Image) else value
        if image.mode not in ("L", "RGB") and _IMAGE_FORMATS[ext] == "JPEG":
            image = image.convert("RGB")
        out = io.BytesIO()
        image.save(out, format=_IMAGE_FORMATS[ext])
        return out.getvalue()
    if ext == "json":
        return json.dumps(value, default=_json_default).encode("utf-8")
    if ext == "npy":
        out = io.BytesIO()
        np.save(out, np.asarray(value), allow_pickle=False)
        return out.getvalue()
    if ext in ("mp", "msgpack"):
        import msgpack

        return msgpack.packb(value, default=_json_default)
    if ext in ("pickle", "pkl"):
        return pickle.dumps(value)
    if ext in ("pt", "pth"):
        import torch

        out = io.BytesIO()
        torch.save(value, out)
        return out.getvalue()
    return value


def default_encoder(sample: Sample, format: bool | str = True) -> Sample:
    """``sample`` with each value encoded by its key's extension (``__`` keys kept as they are)."""
    return {key: value if key.startswith("__") else encode_value(key, value) for key, value in sample.items()}


def _validate_key(key: str) -> None:
    if base_plus_ext(f"{key}.x") != (key, "x"):
        msg = (
            f"WebDataset readers cannot recover the key {key!r}: they split each member name at the first dot "
            "of its last path part; use a key whose last part is not empty and has no dots"
        )
        raise ValueError(msg)


def encode_shard(rows: Iterator[Sample], encoder: Any = True, mtime: float | None = None) -> bytes:
    """A tar shard of ``rows``: member ``<__key__>.<column>`` per non-null value (``__`` columns left out)."""
    out = io.BytesIO()
    stamp = int(time.time() if mtime is None else mtime)
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for row in rows:
            sample = _apply(encoder, row, default=default_encoder) if encoder is not None and encoder is not False else row
            key = sample.get("__key__")
            key = uuid.uuid4().hex if key is None else str(key)
            _validate_key(key)
            for column, value in sample.items():
                if value is None or column.startswith("__"):
                    continue
                if isinstance(value, str):
                    value = value.encode("utf-8")
                if not isinstance(value, bytes | bytearray | memoryview):
                    msg = (
                        f"column {column!r} of sample {key!r} is a {type(value).__name__} after encoding; a tar member "
                        "holds bytes: name the column by an extension the encoder knows (txt, cls, json, npy, jpg, "
                        "png...) or pass an encoder that returns bytes"
                    )
                    raise TypeError(msg)
                info = tarfile.TarInfo(f"{key}.{column}")
                info.size = len(value)
                info.mtime = stamp
                info.mode, info.uname, info.gname = 0o644, "data", "data"
                tar.addfile(info, io.BytesIO(value))
    return out.getvalue()


class WebDatasetDatasink(FileDatasink):
    """WebDataset ``.tar`` shards under ``path``, one sample per row, staged and committed.

    ``encoder`` (as in Ray Data): True applies ``default_encoder`` (``txt``/``cls`` as text,
    images as JPEG/PNG by their column's extension, ``json``, ``npy``, ``mp``, ``pickle``);
    a callable or a list of them is applied in order; False or None writes bytes and strings as
    they are. A row's ``__key__`` names its members (a random one when there is none).
    """

    EXTENSION = ".tar"

    def __init__(self, path: str, *, encoder: Any = True, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self._encoder = encoder

    def _encode(self, tables: list[pa.Table]) -> pa.Buffer:
        from engine.block_format import iter_rows

        rows = (row for table in tables for row in iter_rows(table))
        return pa.py_buffer(encode_shard(rows, self._encoder))

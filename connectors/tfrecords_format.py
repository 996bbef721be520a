"""TFRecord files of ``tf.train.Example`` records, read and written without TensorFlow.

A TFRecord file is a sequence of records, each framed as::

    uint64 length (little-endian) | uint32 masked CRC32C of the length | data[length] | uint32 masked CRC32C of data

Both checksums are verified: a record whose length or data does not match its CRC, or a file cut
short inside a record, fails with a ``FileFormatError`` naming the file, the record's index
(``row``) and its byte offset (in the uncompressed stream when the file is compressed). CRC32C
comes from ``google_crc32c`` (the ``tfrecords`` extra; C, a few GB/s) when it is installed, else
from a pure-Python table (correct, about 10 MB/s): ``CRC32C_IMPLEMENTATION`` says which.

Files are streamed (``connectors.filesystem.iter_stream``): a task holds about one block of
records at a time, whatever the file's size. ``compression``: ``"gzip"``, ``"zlib"`` (TensorFlow's
``ZLIB``) or None; by default it follows the extension (``.gz``, ``.zst``...).

Columns, as Ray Data's ``read_tfrecords`` makes them: one per feature; ``bytes_list`` ->
``binary``, ``float_list`` -> ``float32``, ``int64_list`` -> ``int64``. Without ``tf_schema``, a
feature that holds exactly one value in every record of a block is a scalar column, and a feature
holding another number of values in some record is a list column. Two cases Ray Data's reader
cannot combine into one block are given a type here: a feature holding one value in some records
and none in others is a scalar column with nulls for the empty ones (the rule of Ray's tfx-bsl
reader), and one holding one value in some records and several in others is a list column. A
record without a feature has a null there. The rule is applied per block (up to
``BLOCK_BYTES`` of records): pass ``tf_schema`` to fix the types up front, which (as in Ray)
makes every feature a list column and rejects features the schema does not name.

``tf_schema`` is a ``tensorflow_metadata`` ``Schema`` (anything with ``.feature`` items having
``.name`` and ``.type``: 1 bytes, 2 int, 3 float) or a mapping ``{name: "bytes" | "int" | "float"}``.
"""

from __future__ import annotations

import dataclasses
import struct
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.errors import FileFormatError
from connectors.file_datasink import FileDatasink
from connectors.file_datasource import FilePiece, ProjectingFileDatasource
from connectors.filesystem import compression_of, iter_stream
from connectors.protobuf_wire import (
    KIND_BYTES,
    KIND_FLOAT,
    KIND_INT64,
    KIND_NAMES,
    KIND_NONE,
    WireFormatError,
    decode_example,
    encode_feature,
    map_entry_prefix,
    varint,
)
from connectors.retry import Retrier

MiB = 1 << 20
BLOCK_BYTES = 16 * MiB
"""Record bytes gathered into one block before it is built and yielded."""
READ_CHUNK_BYTES = 4 * MiB
_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8
_ARROW_TYPES = {KIND_BYTES: pa.binary(), KIND_FLOAT: pa.float32(), KIND_INT64: pa.int64(), KIND_NONE: pa.null()}
_SCHEMA_KINDS = {"bytes": KIND_BYTES, "int": KIND_INT64, "int64": KIND_INT64, "float": KIND_FLOAT, 1: KIND_BYTES, 2: KIND_INT64, 3: KIND_FLOAT}


# ----- CRC32C ------------------------------------------------------------------------------------


def _crc32c_table() -> list[int]:
    table = []
    for index in range(256):
        crc = index
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c_python(data: bytes) -> int:
    """CRC32C (Castagnoli) of ``data``, in pure Python."""
    crc = 0xFFFFFFFF
    table = _TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


try:
    import google_crc32c as _google_crc32c

    crc32c: Callable[[bytes], int] = _google_crc32c.value
    CRC32C_IMPLEMENTATION = f"google_crc32c ({_google_crc32c.implementation})"
except ImportError:  # pragma: no cover - depends on the environment
    crc32c = crc32c_python
    CRC32C_IMPLEMENTATION = "pure Python"


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC32C of ``data``."""
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


# ----- record framing ----------------------------------------------------------------------------


def frame_record(data: bytes) -> bytes:
    """One record: its length, the length's masked CRC, the data and the data's masked CRC."""
    length = struct.pack("<Q", len(data))
    return length + _CRC.pack(masked_crc32c(length)) + data + _CRC.pack(masked_crc32c(data))


def iter_records(read: Callable[[int], bytes], display: str, *, where: str = "") -> Iterator[tuple[int, bytes]]:
    """``(byte offset, data)`` of each record read through ``read(n)``, both CRCs checked.

    ``where`` qualifies offsets in messages (" of the uncompressed stream" for compressed files).
    """
    buf = b""
    pos = 0
    base = 0  # offset in the stream of buf[0]
    index = 0
    eof = False

    def fill(need: int) -> None:
        nonlocal buf, pos, base, eof
        chunks = [buf[pos:]]
        have = len(chunks[0])
        while have < need and not eof:
            chunk = read(max(READ_CHUNK_BYTES, need - have))
            if not chunk:
                eof = True
                break
            chunks.append(chunk)
            have += len(chunk)
        base += pos
        buf = b"".join(chunks)
        pos = 0

    while True:
        if len(buf) - pos < 12:
            fill(12)
            if len(buf) - pos == 0:
                return
        offset = base + pos
        if len(buf) - pos < 12:
            msg = (
                f"file ends inside the header of TFRecord {index} at byte offset {offset}{where} "
                f"({len(buf) - pos} of its 12 bytes are there): the file is truncated"
            )
            raise FileFormatError(msg, path=display, row=index)
        length, length_crc = _HEADER.unpack_from(buf, pos)
        if masked_crc32c(buf[pos : pos + 8]) != length_crc:
            msg = (
                f"corrupt TFRecord {index} at byte offset {offset}{where}: the CRC of its length field does not "
                "match (not a TFRecord file, or damaged)"
            )
            raise FileFormatError(msg, path=display, row=index)
        need = 16 + length
        if len(buf) - pos < need:
            fill(need)
            if len(buf) - pos < need:
                msg = (
                    f"file ends inside TFRecord {index} at byte offset {offset}{where}: it holds {length} bytes of "
                    f"data but only {max(0, len(buf) - pos - 12)} follow: the file is truncated"
                )
                raise FileFormatError(msg, path=display, row=index)
        data = buf[pos + 12 : pos + 12 + length]
        (data_crc,) = _CRC.unpack_from(buf, pos + 12 + length)
        if masked_crc32c(data) != data_crc:
            msg = f"corrupt TFRecord {index} at byte offset {offset}{where}: the CRC of its {length} bytes of data does not match"
            raise FileFormatError(msg, path=display, row=index)
        yield offset, data
        pos += need
        index += 1


class _ZlibStream:
    """A ``read(n)`` over a zlib (TensorFlow ``ZLIB``) stream."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self._inflate = zlib.decompressobj()
        self._done = False

    def read(self, size: int) -> bytes:
        out = []
        have = 0
        while have < size and not self._done:
            data = self._inflate.unconsumed_tail or self._raw.read(READ_CHUNK_BYTES)
            if not data:
                out.append(self._inflate.flush())
                self._done = True
                break
            piece = self._inflate.decompress(data, size - have)
            out.append(piece)
            have += len(piece)
            if self._inflate.eof:
                self._done = True
        return b"".join(out)


def _codec(compression: str | None, path: str) -> str | None:
    if compression == "auto":
        return compression_of(path)
    if compression is None or compression.lower() in ("", "none"):
        return None
    name = compression.lower()
    if name in ("gzip", "gz"):
        return "gzip"
    if name == "zlib":
        return "zlib"
    return name  # any pyarrow codec (zstd, bz2, lz4...)


def _reader(stream: Any, codec: str | None) -> Callable[[int], bytes]:
    if codec is None:
        return stream.read  # type: ignore[no-any-return]
    if codec == "zlib":
        return _ZlibStream(stream).read
    return pa.CompressedInputStream(stream, codec).read  # type: ignore[no-any-return]


# ----- records -> columns ------------------------------------------------------------------------


class _Column:
    """One feature's values across the records of a block: counts per record (-1: absent)."""

    __slots__ = ("counts", "floats", "kind", "values")

    def __init__(self, rows_before: int) -> None:
        self.kind = KIND_NONE
        self.counts: list[int] = [-1] * rows_before
        self.values: list[Any] = []  # bytes or ints
        self.floats: list[bytes] = []

    def drop_last(self) -> None:
        """Forget the current record's values (the feature appears again in the same record)."""
        count = self.counts.pop()
        if count > 0:
            if self.kind == KIND_FLOAT:
                self.floats.pop()
            else:
                del self.values[-count:]

    def build(self, kind: int, as_list: bool) -> pa.Array:
        counts = np.asarray(self.counts, dtype=np.int64)
        value_type = _ARROW_TYPES[kind]
        if kind == KIND_FLOAT:
            values: pa.Array = pa.array(np.frombuffer(b"".join(self.floats), "<f4"), pa.float32())
        elif kind == KIND_NONE:
            values = pa.nulls(int(np.maximum(counts, 0).sum()))
        else:
            values = pa.array(self.values, value_type)
        absent = counts < 0
        if not as_list and len(counts) and counts.max() <= 1 and (counts == 1).any():
            if (counts == 1).all():
                return values
            index = pa.array(np.cumsum(counts == 1) - 1, pa.int64(), mask=counts != 1)
            return values.take(index)
        offsets = np.zeros(len(counts) + 1, dtype=np.int32)
        np.cumsum(np.maximum(counts, 0), out=offsets[1:])
        mask = pa.array(absent) if absent.any() else None
        return pa.ListArray.from_arrays(pa.array(offsets), values, type=pa.list_(value_type), mask=mask)


class _BlockBuilder:
    """Decoded records gathered into columns; ``table()`` builds the block and starts a new one."""

    def __init__(self, display: str, schema_kinds: dict[str, int] | None, wanted: frozenset[str] | None) -> None:
        self._display = display
        self._schema_kinds = schema_kinds
        self._wanted = wanted
        self._columns: dict[str, _Column] = {}
        self.rows = 0
        self.bytes = 0
        self._offset = 0
        self._index = 0
        self._sink = self._add_feature

    def add(self, data: bytes, offset: int, index: int) -> None:
        self._offset, self._index = offset, index
        try:
            decode_example(data, self._sink, self._wanted)
        except WireFormatError as exc:
            msg = f"TFRecord {index} at byte offset {offset} is not a valid tf.train.Example: {exc}"
            raise FileFormatError(msg, path=self._display, row=index) from exc
        self.rows += 1
        self.bytes += len(data)
        rows = self.rows
        for column in self._columns.values():
            if len(column.counts) < rows:
                column.counts.append(-1)

    def _add_feature(self, name: str, kind: int, count: int, payload: Any) -> None:
        column = self._columns.get(name)
        if column is None:
            if self._schema_kinds is not None and name not in self._schema_kinds:
                msg = (
                    f"TFRecord {self._index} at byte offset {self._offset} has feature {name!r}, which tf_schema "
                    f"does not name (it names {sorted(self._schema_kinds)})"
                )
                raise FileFormatError(msg, path=self._display, row=self._index, column=name)
            column = self._columns[name] = _Column(self.rows)
        elif len(column.counts) > self.rows:  # the same feature again in this record: the later one counts
            column.drop_last()
        if kind != KIND_NONE:
            expected = column.kind if self._schema_kinds is None else self._schema_kinds[name]
            if expected == KIND_NONE:
                column.kind = kind
            elif kind != expected:
                source = "tf_schema says" if self._schema_kinds is not None else "earlier records hold"
                msg = (
                    f"feature {name!r} of TFRecord {self._index} (byte offset {self._offset}) holds "
                    f"{KIND_NAMES[kind]} values, but {source} {KIND_NAMES[expected]} values"
                )
                raise FileFormatError(msg, path=self._display, row=self._index, column=name)
            else:
                column.kind = kind
        column.counts.append(count)
        if count:
            if kind == KIND_FLOAT:
                column.floats.append(payload)
            else:
                column.values.extend(payload)

    def table(self) -> pa.Table:
        names: list[str] = list(self._columns)
        if self._schema_kinds is not None:
            names = [n for n in self._schema_kinds if self._wanted is None or n in self._wanted]
        arrays = []
        for name in names:
            column = self._columns.get(name) or _Column(self.rows)
            kind = column.kind if self._schema_kinds is None else self._schema_kinds[name]
            arrays.append(column.build(kind, as_list=self._schema_kinds is not None))
        if names:
            table = pa.Table.from_arrays(arrays, names=names)
        else:  # no feature asked for (only ``path``, or a count): the rows without columns
            table = pa.table({"_": pa.nulls(self.rows)}).drop_columns(["_"])
        self._columns = {}
        self.rows = 0
        self.bytes = 0
        return table


def schema_kinds(tf_schema: Any) -> dict[str, int] | None:
    """``{feature: kind}`` from a ``tensorflow_metadata`` Schema or a ``{name: type}`` mapping."""
    if tf_schema is None:
        return None
    if isinstance(tf_schema, Mapping):
        items = list(tf_schema.items())
    elif hasattr(tf_schema, "feature"):
        items = [(feature.name, feature.type) for feature in tf_schema.feature]
    else:
        msg = (
            "tf_schema must be a tensorflow_metadata Schema or a mapping {feature: 'bytes' | 'int' | 'float'}, "
            f"got {type(tf_schema).__name__}"
        )
        raise TypeError(msg)
    kinds = {}
    for name, typ in items:
        key = typ.lower() if isinstance(typ, str) else int(typ)
        if key not in _SCHEMA_KINDS:
            msg = f"tf_schema gives feature {name!r} type {typ!r}; TFRecords hold bytes (1), int (2) or float (3)"
            raise ValueError(msg)
        kinds[str(name)] = _SCHEMA_KINDS[key]
    return kinds


def iter_example_tables(
    read: Callable[[int], bytes],
    display: str,
    *,
    tf_schema: dict[str, int] | None = None,
    columns: frozenset[str] | None = None,
    where: str = "",
    block_bytes: int = BLOCK_BYTES,
) -> Iterator[pa.Table]:
    """Tables of the Examples in one TFRecord stream, each about ``block_bytes`` of records."""
    builder = _BlockBuilder(display, tf_schema, columns)
    for index, (offset, data) in enumerate(iter_records(read, display, where=where)):
        builder.add(data, offset, index)
        if builder.bytes >= block_bytes:
            yield builder.table()
    if builder.rows:
        yield builder.table()


class TFRecordDatasource(ProjectingFileDatasource):
    """``tf.train.Example`` records of TFRecord files, one row each; see the module docstring."""

    FILE_EXTENSIONS = None  # a folder: every file but hidden ones, as Ray's read_tfrecords

    def __init__(
        self,
        paths: Any,
        *,
        tf_schema: Any = None,
        compression: str | None = "auto",
        columns: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(paths, **kwargs)
        self._schema_kinds = schema_kinds(tf_schema)
        self._compression = compression
        self._columns = list(columns) if columns is not None else None

    def get_name(self) -> str:
        """``ReadTFRecord``, as in Ray Data's plans."""
        return "TFRecord"

    def _read_file(self, fs: Any, piece: FilePiece, display: str, retrier: Retrier) -> Iterator[pa.Table]:
        compression = self._compression
        if compression == "auto" and self._stream_args.compression is not None:  # the codec is the reader's
            compression = self._stream_args.compression
        codec = _codec(compression, piece.entry.path)
        wanted = frozenset(self._columns) if self._columns is not None else None
        where = " of the uncompressed stream" if codec else ""

        def parse(stream: pa.NativeFile) -> Iterator[pa.Table]:
            return iter_example_tables(
                _reader(stream, codec), display, tf_schema=self._schema_kinds, columns=wanted, where=where
            )

        yield from iter_stream(fs, piece.entry.path, retrier, display, parse, decompress=False,
                               args=dataclasses.replace(self._stream_args, compression=None))


# ----- writing -----------------------------------------------------------------------------------


def _column_kind(name: str, typ: pa.DataType) -> tuple[int, bool]:
    """``(kind, is_list)`` for a column of type ``typ``; TypeError for what a Feature cannot hold."""
    is_list = False
    value_type = typ
    if isinstance(typ, pa.FixedShapeTensorType):
        is_list, value_type = True, typ.value_type
    elif pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        is_list, value_type = True, typ.value_type
    if pa.types.is_integer(value_type) or pa.types.is_boolean(value_type):
        return KIND_INT64, is_list
    if pa.types.is_floating(value_type):
        return KIND_FLOAT, is_list
    if (
        pa.types.is_binary(value_type)
        or pa.types.is_large_binary(value_type)
        or pa.types.is_string(value_type)
        or pa.types.is_large_string(value_type)
        or pa.types.is_fixed_size_binary(value_type)
    ):
        return KIND_BYTES, is_list
    if pa.types.is_null(value_type):
        return KIND_NONE, is_list
    msg = (
        f"column {name!r} has type {typ}, which a tf.train.Feature cannot hold: it stores lists of "
        "ints, floats or bytes; convert the column first (e.g. with map_batches)"
    )
    raise TypeError(msg)


def _row_values(column: pa.ChunkedArray) -> list[Any]:
    """Per row: a list of values, or None for a null."""
    typ = column.type
    if isinstance(typ, pa.FixedShapeTensorType):
        array = column.combine_chunks().to_numpy_ndarray()
        return [row.reshape(-1).tolist() for row in array]
    if pa.types.is_dictionary(typ):
        column = column.cast(typ.value_type)
    return column.to_pylist()  # type: ignore[no-any-return]


def _features(name: str, column: pa.ChunkedArray, kind_override: int | None) -> list[bytes]:
    """The serialized Feature of every row of ``column``."""
    kind, is_list = _column_kind(name, column.type)
    if kind_override is not None:
        if KIND_BYTES in (kind, kind_override) and kind != kind_override and kind != KIND_NONE:
            raise TypeError(
                f"column {name!r} holds {KIND_NAMES[kind]} values but tf_schema says {KIND_NAMES[kind_override]}"
            )
        kind = kind_override
    if kind == KIND_FLOAT and not is_list:  # the common case, without a Python list per row
        floats = pc.cast(column, pa.float32()).combine_chunks() if len(column) else pa.array([], pa.float32())
        raw = np.asarray(floats.fill_null(0).to_numpy(zero_copy_only=False), dtype="<f4").tobytes()
        valid = np.asarray(floats.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        empty = encode_feature(KIND_FLOAT, b"")
        return [b"\x12\x06\x0a\x04" + raw[4 * i : 4 * i + 4] if ok else empty for i, ok in enumerate(valid)]
    out = []
    for value in _row_values(column):
        if value is None:
            values: list[Any] = []
        elif is_list:
            values = [v for v in value if v is not None]
        else:
            values = [value]
        if kind == KIND_BYTES:
            values = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in values]
        elif kind == KIND_INT64:
            values = [int(v) for v in values]
        elif kind == KIND_FLOAT:
            values = [float(v) for v in values]
        out.append(encode_feature(kind, values))
    return out


def encode_tfrecords(table: pa.Table, kinds: dict[str, int] | None = None) -> bytes:
    """``table``'s rows as framed ``tf.train.Example`` records (one per row)."""
    names = table.column_names
    if kinds is not None:
        extra = [n for n in names if n not in kinds]
        if extra:
            raise ValueError(f"columns {extra} are not in tf_schema (it names {sorted(kinds)})")
    prefixes = [map_entry_prefix(n) for n in names]
    columns = [_features(n, table[n], kinds.get(n) if kinds else None) for n in names]
    parts = []
    for row in range(table.num_rows):
        entries = []
        for prefix, features in zip(prefixes, columns, strict=True):
            feature = features[row]
            entry = prefix + b"\x12" + varint(len(feature)) + feature
            entries.append(b"\x0a" + varint(len(entry)) + entry)
        body = b"".join(entries)
        parts.append(frame_record(b"\x0a" + varint(len(body)) + body if body else b""))
    return b"".join(parts)


class TFRecordDatasink(FileDatasink):
    """``tf.train.Example`` records (one per row) in ``.tfrecords`` files under ``path``.

    Integer and boolean columns become ``int64_list``, floating ones ``float_list`` (float32),
    binary and string ones ``bytes_list`` (strings in UTF-8), list and tensor columns lists of
    those; a null is a Feature with no values. ``compression="gzip"`` (or ``"zlib"``) compresses
    each file, named ``.tfrecords.gz`` (``.tfrecords.zz``).
    """

    EXTENSION = ".tfrecords"

    def __init__(self, path: str, *, tf_schema: Any = None, compression: str | None = None, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self._kinds = schema_kinds(tf_schema)
        codec = _codec(compression, path)
        if codec not in (None, "gzip", "zlib"):
            raise ValueError(f"compression must be 'gzip', 'zlib' or None, got {compression!r}")
        self._codec = codec
        if codec == "gzip":
            self.EXTENSION = ".tfrecords.gz"
        elif codec == "zlib":
            self.EXTENSION = ".tfrecords.zz"

    def _encode(self, tables: list[pa.Table]) -> pa.Buffer:
        data = b"".join(encode_tfrecords(table, self._kinds) for table in tables)
        # gzip: the upload compresses it (pyarrow's output streams do, for a name ending in .gz)
        if self._codec == "zlib":
            data = zlib.compress(data, 6)
        return pa.py_buffer(data)

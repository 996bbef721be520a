"""``tf.train.Example`` in protobuf's wire format, decoded and encoded without TensorFlow.

The three messages that make an Example, as ``tensorflow/core/example/{example,feature}.proto``
declares them::

    Example  { Features features = 1; }
    Features { map<string, Feature> feature = 1; }      // entries: key = 1, value = 2
    Feature  { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }
    FloatList { repeated float value = 1 [packed = true]; }
    Int64List { repeated int64 value = 1 [packed = true]; }

The decoder accepts what any conforming writer may produce: packed and unpacked repeated
floats and ints, fields in any order, unknown fields (skipped), a message field given more than
once (merged, as protobuf does: list values are appended, a later map entry for the same key
wins). ``decode_example`` calls ``sink(name, kind, count, payload)`` once per feature instead of
building objects, so a reader can append straight into its columns; float values come back as
the raw little-endian bytes (``count * 4`` of them), ready for ``numpy.frombuffer``.

The encoder writes what TensorFlow writes: packed floats and ints, features in the given order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

KIND_NONE = 0
"""A Feature with no list set (``Feature()``)."""
KIND_BYTES = 1
KIND_FLOAT = 2
KIND_INT64 = 3
KIND_NAMES = {KIND_NONE: "empty", KIND_BYTES: "bytes", KIND_FLOAT: "float", KIND_INT64: "int64"}

_WIRE_VARINT = 0
_WIRE_FIXED64 = 1
_WIRE_LEN = 2
_WIRE_FIXED32 = 5
_U64 = 1 << 64
_I64_MIN = 1 << 63

FeatureSink = Callable[[str, int, int, Any], None]
"""``sink(name, kind, count, payload)``: payload is a list of bytes (bytes), the little-endian
float32 bytes (float), a list of ints (int64) or None (empty)."""


class WireFormatError(ValueError):
    """The bytes are not a well-formed ``tf.train.Example``; the message says where."""


def read_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """The unsigned varint at ``buf[pos]`` and the position after it."""
    if pos >= end:
        raise WireFormatError(f"truncated varint at byte {pos}")
    byte = buf[pos]
    if byte < 0x80:
        return byte, pos + 1
    result = byte & 0x7F
    shift = 7
    pos += 1
    while True:
        if pos >= end:
            raise WireFormatError(f"truncated varint at byte {pos}")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise WireFormatError(f"varint longer than 10 bytes ending at byte {pos}")


def _skip(buf: bytes, pos: int, end: int, wire: int) -> int:
    """The position after a field's value of wire type ``wire`` (an unknown field)."""
    if wire == _WIRE_VARINT:
        return read_varint(buf, pos, end)[1]
    if wire == _WIRE_LEN:
        length, pos = read_varint(buf, pos, end)
        pos += length
    elif wire == _WIRE_FIXED64:
        pos += 8
    elif wire == _WIRE_FIXED32:
        pos += 4
    else:
        raise WireFormatError(f"unsupported wire type {wire} at byte {pos}")
    if pos > end:
        raise WireFormatError(f"field runs past the end of its message (byte {pos} > {end})")
    return pos


def _length(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """A length-delimited field's ``(start, stop)`` after its tag."""
    length, pos = read_varint(buf, pos, end)
    stop = pos + length
    if stop > end:
        raise WireFormatError(f"field of {length} bytes at byte {pos} runs past the end of its message ({end})")
    return pos, stop


def _int64_values(buf: bytes, pos: int, end: int, out: list[int]) -> None:
    """Packed varints in ``buf[pos:end]`` appended to ``out`` as signed int64."""
    while pos < end:
        byte = buf[pos]
        if byte < 0x80:
            out.append(byte)
            pos += 1
            continue
        value, pos = read_varint(buf, pos, end)
        out.append(value - _U64 if value >= _I64_MIN else value)
    if pos != end:
        raise WireFormatError(f"packed int64 values run past their field (byte {pos} > {end})")


def _list_values(buf: bytes, pos: int, end: int, kind: int, bytes_out: list[bytes], ints_out: list[int]) -> bytes:
    """The values of a BytesList/FloatList/Int64List message; float bytes are returned."""
    floats = b""
    while pos < end:
        tag, pos = read_varint(buf, pos, end)
        field, wire = tag >> 3, tag & 7
        if field != 1:
            pos = _skip(buf, pos, end, wire)
            continue
        if kind == KIND_BYTES and wire == _WIRE_LEN:
            start, pos = _length(buf, pos, end)
            bytes_out.append(buf[start:pos])
        elif kind == KIND_FLOAT and wire == _WIRE_LEN:  # packed
            start, pos = _length(buf, pos, end)
            if (pos - start) % 4:
                raise WireFormatError(f"packed floats of {pos - start} bytes (not a multiple of 4) at byte {start}")
            floats += buf[start:pos]
        elif kind == KIND_FLOAT and wire == _WIRE_FIXED32:  # unpacked
            if pos + 4 > end:
                raise WireFormatError(f"truncated float at byte {pos}")
            floats += buf[pos : pos + 4]
            pos += 4
        elif kind == KIND_INT64 and wire == _WIRE_LEN:  # packed
            start, pos = _length(buf, pos, end)
            _int64_values(buf, start, pos, ints_out)
        elif kind == KIND_INT64 and wire == _WIRE_VARINT:  # unpacked
            value, pos = read_varint(buf, pos, end)
            ints_out.append(value - _U64 if value >= _I64_MIN else value)
        else:
            raise WireFormatError(f"{KIND_NAMES[kind]} list value with wire type {wire} at byte {pos}")
    return floats


def _feature(buf: bytes, pos: int, end: int) -> tuple[int, int, Any]:
    """``(kind, count, payload)`` of a Feature message in ``buf[pos:end]``."""
    kind = KIND_NONE
    bytes_values: list[bytes] = []
    ints: list[int] = []
    floats = b""
    while pos < end:
        tag, pos = read_varint(buf, pos, end)
        field, wire = tag >> 3, tag & 7
        if wire != _WIRE_LEN or field not in (1, 2, 3):
            pos = _skip(buf, pos, end, wire)
            continue
        start, pos = _length(buf, pos, end)
        if field != kind:  # another member of the oneof replaces the one set before
            kind = field
            bytes_values, ints, floats = [], [], b""
        floats += _list_values(buf, start, pos, kind, bytes_values, ints)
    if kind == KIND_BYTES:
        return kind, len(bytes_values), bytes_values
    if kind == KIND_FLOAT:
        return kind, len(floats) // 4, floats
    if kind == KIND_INT64:
        return kind, len(ints), ints
    return kind, 0, None


_NAMES: dict[bytes, str] = {}
"""Feature names seen, by their bytes: every record of a file repeats them."""


def _name(key: bytes, at: int) -> str:
    name = _NAMES.get(key)
    if name is None:
        try:
            name = key.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise WireFormatError(f"feature name at byte {at} is not UTF-8: {exc}") from exc
        if len(_NAMES) > 65536:
            _NAMES.clear()
        _NAMES[key] = name
    return name


def _entry(data: bytes, pos: int, end: int, sink: FeatureSink, wanted: frozenset[str] | None) -> None:
    """One ``Features.feature`` map entry in ``data[pos:end]``, in any field order (the general path)."""
    name = ""
    value: tuple[int, int] | None = None
    while pos < end:  # key = 1, value = 2
        tag, pos = read_varint(data, pos, end)
        if tag == (1 << 3 | _WIRE_LEN):
            kstart, pos = _length(data, pos, end)
            name = _name(data[kstart:pos], kstart)
        elif tag == (2 << 3 | _WIRE_LEN):
            value = _length(data, pos, end)
            pos = value[1]
        else:
            pos = _skip(data, pos, end, tag & 7)
    if wanted is not None and name not in wanted:
        return
    if value is None:
        sink(name, KIND_NONE, 0, None)
    else:
        sink(name, *_feature(data, value[0], value[1]))


def _feature_fast(data: bytes, pos: int, end: int) -> tuple[int, int, Any] | None:
    """``_feature`` for the layout every writer produces (one list field, packed values), else None."""
    if end - pos < 2:
        return None
    tag = data[pos]
    if tag not in (0x0A, 0x12, 0x1A):
        return None
    size = data[pos + 1]
    if size >= 0x80:
        return None
    start = pos + 2
    stop = start + size
    if stop != end:
        return None
    kind = tag >> 3
    if start == stop:
        return kind, 0, (b"" if kind == KIND_FLOAT else [])
    if kind == KIND_BYTES:
        values = []
        while start < stop:
            if data[start] != 0x0A:
                return None
            size = data[start + 1]
            if size < 0x80:
                start += 2
            else:
                size, start = read_varint(data, start + 1, stop)
            values.append(data[start : start + size])
            start += size
        if start != stop:
            return None
        return KIND_BYTES, len(values), values
    if data[start] != 0x0A:  # unpacked floats or ints
        return None
    size = data[start + 1]
    if size >= 0x80:
        size, start = read_varint(data, start + 1, stop)
    else:
        start += 2
    if start + size != stop:
        return None
    if kind == KIND_FLOAT:
        if size % 4:
            return None
        return KIND_FLOAT, size // 4, data[start:stop]
    if size == 1 and data[start] < 0x80:  # one small int: the commonest feature of all
        return KIND_INT64, 1, [data[start]]
    ints: list[int] = []
    _int64_values(data, start, stop, ints)
    return KIND_INT64, len(ints), ints


def decode_example(data: bytes, sink: FeatureSink, wanted: frozenset[str] | None = None) -> None:
    """Each feature of the serialized Example ``data`` passed to ``sink``, in the order stored.

    ``wanted``: names to decode (others are skipped without decoding their values); None: all.
    A feature stored twice is passed twice, the later one last (it is the one that counts).
    Entries laid out as every writer lays them out take a fast path; anything else is parsed
    field by field.
    """
    try:
        _decode_example(data, sink, wanted)
    except IndexError:
        raise WireFormatError(f"a field runs past the end of the {len(data)}-byte message") from None


def _decode_example(data: bytes, sink: FeatureSink, wanted: frozenset[str] | None) -> None:
    end = len(data)
    pos = 0
    while pos < end:
        tag, pos = read_varint(data, pos, end)
        if tag != (1 << 3 | _WIRE_LEN):  # not Example.features
            pos = _skip(data, pos, end, tag & 7)
            continue
        fpos, fend = _length(data, pos, end)
        pos = fend
        while fpos < fend:  # Features: map entries
            if data[fpos] != 0x0A:
                tag, fpos = read_varint(data, fpos, fend)
                fpos = _skip(data, fpos, fend, tag & 7)
                continue
            size = data[fpos + 1]
            if size < 0x80:
                estart = fpos + 2
            else:
                size, estart = read_varint(data, fpos + 1, fend)
            eend = estart + size
            if eend > fend:
                raise WireFormatError(f"map entry of {size} bytes at byte {estart} runs past its message ({fend})")
            fpos = eend
            # fast path: key (field 1) then value (field 2), short lengths
            ksize = data[estart + 1] if size > 2 and data[estart] == 0x0A else 0x80
            if ksize < 0x80:
                kstop = estart + 2 + ksize
                if kstop + 2 <= eend and data[kstop] == 0x12 and data[kstop + 1] < 0x80:
                    vstart = kstop + 2
                    vstop = vstart + data[kstop + 1]
                    if vstop == eend:
                        name = _name(data[estart + 2 : kstop], estart + 2)
                        if wanted is not None and name not in wanted:
                            continue
                        feature = _feature_fast(data, vstart, vstop)
                        sink(name, *(feature if feature is not None else _feature(data, vstart, vstop)))
                        continue
            _entry(data, estart, eend, sink, wanted)


def decode_example_dict(data: bytes) -> dict[str, tuple[int, list[Any]]]:
    """The Example as ``{name: (kind, values)}`` (floats as Python floats): for tests and tools."""
    out: dict[str, tuple[int, list[Any]]] = {}

    def sink(name: str, kind: int, count: int, payload: Any) -> None:
        if kind == KIND_FLOAT:
            payload = np.frombuffer(payload, "<f4").tolist()
        out[name] = (kind, list(payload or []))

    decode_example(data, sink)
    return out


# ----- encoding ----------------------------------------------------------------------------------


def varint(value: int) -> bytes:
    """``value`` (an int64 or a length) as a varint; negative values take ten bytes."""
    if value < 0:
        value += _U64
    if value < 0x80:
        return _SMALL_VARINTS[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL_VARINTS = [bytes([i]) for i in range(0x80)]


def _len_field(tag: bytes, payload: bytes) -> bytes:
    return tag + varint(len(payload)) + payload


def encode_feature(kind: int, values: Sequence[Any] | bytes) -> bytes:
    """A serialized Feature. ``values``: bytes values, floats (or their float32 bytes), ints.

    ``KIND_NONE`` gives an empty Feature; an empty ``values`` gives a list with no values.
    """
    if kind == KIND_NONE:
        return b""
    if kind == KIND_BYTES:
        inner = b"".join(b"\x0a" + varint(len(v)) + v for v in values)  # type: ignore[operator]
        return _len_field(b"\x0a", inner)
    if kind == KIND_FLOAT:
        raw = values if isinstance(values, bytes) else np.asarray(values, dtype="<f4").tobytes()
        inner = _len_field(b"\x0a", raw) if raw else b""
        return _len_field(b"\x12", inner)
    if kind == KIND_INT64:
        packed = b"".join(varint(int(v)) for v in values)  # type: ignore[union-attr]
        inner = _len_field(b"\x0a", packed) if packed else b""
        return _len_field(b"\x1a", inner)
    raise ValueError(f"unknown feature kind {kind}")


def map_entry_prefix(name: str) -> bytes:
    """The bytes of a Features map entry's key field (``name``), shared by every row of a column."""
    key = name.encode("utf-8")
    return b"\x0a" + varint(len(key)) + key


def encode_example_from_features(entries: Iterable[tuple[bytes, bytes]]) -> bytes:
    """A serialized Example from ``(map_entry_prefix(name), encode_feature(...))`` pairs."""
    parts = []
    for prefix, feature in entries:
        entry = prefix + b"\x12" + varint(len(feature)) + feature
        parts.append(b"\x0a" + varint(len(entry)) + entry)
    features = b"".join(parts)
    return _len_field(b"\x0a", features) if features else b""


def encode_example(features: dict[str, tuple[int, Sequence[Any]]]) -> bytes:
    """A serialized Example from ``{name: (kind, values)}``."""
    return encode_example_from_features(
        (map_entry_prefix(name), encode_feature(kind, values)) for name, (kind, values) in features.items()
    )


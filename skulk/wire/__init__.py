"""Skulk's wire format: frozen attrs frames in tagged unions, strict CBOR, length-prefixed framing.

Quick use::

    from skulk.wire import Codec, FrameReader
    from skulk.wire.runner import ToRunner, Generate

    codec: Codec[ToRunner] = Codec(ToRunner)
    body = codec.encode(frame)       # one CBOR item: a WebSocket message
    frame = codec.decode(body)
    wire = codec.pack(frame)         # 4-byte big-endian length + body: for byte streams
    reader: FrameReader[ToRunner] = FrameReader(codec)
    frames = reader.feed(chunk)      # sans-IO: any chunking in, complete frames out

A frame is a CBOR map of its fields plus ``"t": "<ClassName>"``; nested unions are tagged the
same way. Decoding is strict: unknown keys, wrong types (no coercion), unknown tags, duplicate
map keys, CBOR tags, trailing bytes and oversized frames are typed :class:`WireError`\\ s, and
untrusted input never raises anything else. See ``specs/wire.cddl`` for the normative format
and :mod:`skulk.wire._convert` for the type rules.

Two small helpers that are not frames: state-machine snapshot images (canonical CBOR compressed
with zstd, :mod:`skulk.wire._image`) and the type of a JSON view::

    from skulk.wire import pack, unpack, unpack_as, SnapshotCorrupt, JsonValue

    image = pack({"nodes": [...]})   # equal values give equal bytes
    value = unpack_as(image, dict)   # SnapshotCorrupt for anything pack() did not write
"""

from ._codec import DEFAULT_MAX_DEPTH, DEFAULT_MAX_FRAME_SIZE, Codec
from ._errors import (
    DuplicateKey,
    EncodeError,
    ForbiddenTag,
    FrameTooLarge,
    MalformedFrame,
    NestingTooDeep,
    ReaderPoisoned,
    SchemaError,
    TrailingBytes,
    TruncatedFrame,
    UnknownTag,
    WireError,
)
from ._framing import LENGTH_PREFIX_SIZE, FrameReader
from ._image import SnapshotCorrupt, pack, unpack, unpack_as
from ._json import JsonValue
from ._schema import TAG_KEY

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "DEFAULT_MAX_FRAME_SIZE",
    "LENGTH_PREFIX_SIZE",
    "TAG_KEY",
    "Codec",
    "DuplicateKey",
    "EncodeError",
    "ForbiddenTag",
    "FrameReader",
    "FrameTooLarge",
    "JsonValue",
    "MalformedFrame",
    "NestingTooDeep",
    "ReaderPoisoned",
    "SchemaError",
    "SnapshotCorrupt",
    "TrailingBytes",
    "TruncatedFrame",
    "UnknownTag",
    "WireError",
    "pack",
    "unpack",
    "unpack_as",
]

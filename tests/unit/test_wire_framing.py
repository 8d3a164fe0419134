"""Length-prefixed framing and the sans-IO FrameReader."""

from __future__ import annotations

import pytest

from skulk.wire import (
    LENGTH_PREFIX_SIZE,
    Codec,
    FrameReader,
    FrameTooLarge,
    MalformedFrame,
    ReaderPoisoned,
    SchemaError,
    TruncatedFrame,
    WireError,
)
from skulk.wire.runner import (
    FromRunner,
    Heartbeat,
    TokenChunk,
)

FROM: Codec[FromRunner] = Codec(FromRunner, max_frame_size=1024)
FRAMES: list[FromRunner] = [
    Heartbeat(1, 0, 0),
    TokenChunk("r1", (10, 11), "hi"),
    TokenChunk("r1", (), ""),
    Heartbeat(2, 0, 0),
]


def reader() -> FrameReader[FromRunner]:
    return FrameReader(FROM)


def test_pack_is_a_big_endian_length_then_the_body() -> None:
    body = FROM.encode(Heartbeat(7, 0, 0))
    packed = FROM.pack(Heartbeat(7, 0, 0))
    assert LENGTH_PREFIX_SIZE == 4
    assert packed == len(body).to_bytes(4, "big") + body


def test_whole_stream_in_one_feed() -> None:
    stream = b"".join(FROM.pack(f) for f in FRAMES)
    r = reader()
    assert r.feed(stream) == FRAMES
    assert r.buffered == 0
    r.feed_eof()


def test_byte_by_byte() -> None:
    stream = b"".join(FROM.pack(f) for f in FRAMES)
    r = reader()
    out: list[FromRunner] = []
    for i in range(len(stream)):
        out += r.feed(stream[i : i + 1])
    assert out == FRAMES
    assert r.buffered == 0


def test_partial_frames_are_buffered_until_complete() -> None:
    packed = FROM.pack(TokenChunk("r1", (1,), "abc"))
    r = reader()
    assert r.feed(packed[:2]) == []  # half a prefix
    assert r.buffered == 2
    assert r.feed(packed[2:-1]) == []  # all but the last body byte
    assert r.feed(packed[-1:] + packed[:5]) == [TokenChunk("r1", (1,), "abc")]
    assert r.buffered == 5
    assert r.feed(packed[5:]) == [TokenChunk("r1", (1,), "abc")]


def test_empty_feed_is_a_no_op() -> None:
    r = reader()
    assert r.feed(b"") == []
    assert r.buffered == 0


def test_accepts_bytearray_and_memoryview() -> None:
    stream = b"".join(FROM.pack(f) for f in FRAMES)
    r = reader()
    assert r.feed(bytearray(stream[:7])) + r.feed(memoryview(stream)[7:]) == FRAMES


def test_accepts_views_of_any_item_size() -> None:
    stream = b"".join(FROM.pack(f) for f in FRAMES)
    padded = stream + b"\x00" * (-len(stream) % 4)
    words = memoryview(padded).cast("I")  # 4-byte items: must be read as bytes
    r = reader()
    assert r.feed(words) == FRAMES
    assert r.buffered == len(padded) - len(stream)


def test_many_small_frames_in_one_chunk() -> None:
    frames = [Heartbeat(i, 0, 0) for i in range(20_000)]
    stream = b"".join(FROM.pack(f) for f in frames)
    r = reader()
    out: list[FromRunner] = []
    for start in range(0, len(stream), 65_536):  # chunks that split frames anywhere
        out += r.feed(stream[start : start + 65_536])
    assert out == frames


def test_too_large_is_detected_from_the_prefix_alone() -> None:
    r = reader()
    with pytest.raises(FrameTooLarge) as info:
        r.feed((1025).to_bytes(4, "big"))  # no body byte has arrived
    assert (info.value.size, info.value.limit) == (1025, 1024)
    assert r.buffered == 0


def test_too_large_after_good_frames_in_the_same_chunk() -> None:
    r = reader()
    with pytest.raises(FrameTooLarge):
        r.feed(FROM.pack(Heartbeat(1, 0, 0)) + (2**32 - 1).to_bytes(4, "big"))


def test_limit_is_inclusive() -> None:
    codec: Codec[FromRunner] = Codec(
        FromRunner, max_frame_size=len(FROM.encode(Heartbeat(1, 0, 0)))
    )
    r = FrameReader(codec)
    assert r.feed(codec.pack(Heartbeat(1, 0, 0))) == [Heartbeat(1, 0, 0)]
    with pytest.raises(FrameTooLarge):
        codec.pack(Heartbeat(1000, 0, 0))


def test_reader_is_poisoned_after_an_error() -> None:
    r = reader()
    bad_body = b"\xa1\x61t\x64Nope"  # {"t": "Nope"}
    with pytest.raises(SchemaError) as first:
        r.feed(len(bad_body).to_bytes(4, "big") + bad_body)
    assert r.error is first.value
    with pytest.raises(ReaderPoisoned) as again:
        r.feed(FROM.pack(Heartbeat(1, 0, 0)))
    assert again.value.original is first.value
    assert again.value.__cause__ is first.value
    with pytest.raises(ReaderPoisoned):
        r.feed(b"")
    with pytest.raises(ReaderPoisoned):
        r.feed_eof()


def test_malformed_body_poisons_the_reader() -> None:
    r = reader()
    body = FROM.encode(Heartbeat(1, 0, 0)) + b"\x00"  # prefix covers a trailing byte
    with pytest.raises(MalformedFrame):
        r.feed(len(body).to_bytes(4, "big") + body)
    with pytest.raises(ReaderPoisoned):
        r.feed(FROM.pack(Heartbeat(1, 0, 0)))


def test_zero_length_frame_is_truncated() -> None:
    with pytest.raises(TruncatedFrame):
        reader().feed(b"\x00\x00\x00\x00")


def test_eof_inside_a_frame_is_truncated() -> None:
    packed = FROM.pack(Heartbeat(5, 0, 0))
    for cut in range(1, len(packed)):
        r = reader()
        assert r.feed(packed[:cut]) == []
        with pytest.raises(TruncatedFrame, match="stream ended inside a frame"):
            r.feed_eof()
        with pytest.raises(ReaderPoisoned):
            r.feed(b"")


def test_eof_between_frames_is_clean() -> None:
    r = reader()
    assert r.feed(FROM.pack(Heartbeat(5, 0, 0))) == [Heartbeat(5, 0, 0)]
    r.feed_eof()
    assert r.error is None


def test_poisoned_error_is_a_wire_error() -> None:
    assert issubclass(ReaderPoisoned, WireError)

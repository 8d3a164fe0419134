"""Strict CBOR bodies: exactly one well-formed, untagged item, or a typed MalformedFrame."""

from __future__ import annotations

import cbor2
import pytest

from skulk.wire import (
    Codec,
    DuplicateKey,
    ForbiddenTag,
    MalformedFrame,
    NestingTooDeep,
    SchemaError,
    TrailingBytes,
    TruncatedFrame,
    WireError,
)
from skulk.wire._cbor import BUILTIN_TAGS, loads
from skulk.wire.runner import Cancel, TextPrompt, ToRunner

TO: Codec[ToRunner] = Codec(ToRunner)
CANCEL = TO.encode(Cancel("r1"))


def test_trailing_bytes_are_rejected() -> None:
    with pytest.raises(TrailingBytes) as info:
        TO.decode(CANCEL + b"\x00")
    assert (info.value.offset, info.value.extra) == (len(CANCEL), 1)
    # A second complete frame glued on is trailing bytes too, not a second frame.
    with pytest.raises(TrailingBytes):
        TO.decode(CANCEL + CANCEL)


def test_trailing_bytes_after_a_large_item_are_rejected() -> None:
    # cbor2 reads its input in 4096-byte blocks; the check must not depend on that.
    for size in (4000, 4096, 5000, 70_000):
        body = TO.encode(Cancel("x" * size))
        assert TO.decode(body) == Cancel("x" * size)
        with pytest.raises(TrailingBytes):
            TO.decode(body + b"\xf6")


def test_truncated_bodies_are_rejected() -> None:
    for cut in range(len(CANCEL)):
        with pytest.raises(TruncatedFrame):
            TO.decode(CANCEL[:cut])


def test_huge_declared_lengths_fail_cleanly() -> None:
    for header in (b"\x9b", b"\xbb", b"\x7b", b"\x5b"):  # array, map, text, bytes with 8-byte len
        with pytest.raises(TruncatedFrame):
            TO.decode(header + b"\x7f\xff\xff\xff\xff\xff\xff\xff")


def test_duplicate_map_keys_are_rejected() -> None:
    # {"t": "Cancel", "request_id": "a", "request_id": "b"}
    body = (
        b"\xa3\x61t\x66Cancel"
        + b"\x6arequest_id\x61a"
        + b"\x6arequest_id\x61b"
    )  # fmt: skip
    with pytest.raises(DuplicateKey):
        TO.decode(body)
    with pytest.raises(DuplicateKey):
        TO.decode(b"\xa2\x01\x01\x01\x02")  # {1: 1, 1: 2}, keys of any type


@pytest.mark.parametrize("tag", [*BUILTIN_TAGS, 6, 21, 24, 32, 1000, 2**32, 2**64 - 1])
def test_every_cbor_tag_is_rejected(tag: int) -> None:
    body = cbor2.dumps(cbor2.CBORTag(tag, "x"))
    with pytest.raises(ForbiddenTag) as info:
        TO.decode(body)
    assert info.value.tag == tag


def test_no_tag_is_decoded_by_cbor2_behind_our_back() -> None:
    # If a cbor2 upgrade adds a built-in tag, it must still be refused.
    for tag in range(0, 2000):
        with pytest.raises(ForbiddenTag):
            loads(cbor2.dumps(cbor2.CBORTag(tag, None)), max_depth=8)


def test_tags_inside_values_and_keys_are_rejected() -> None:
    bignum = TO.unstructure(Cancel("r"))
    bignum["request_id"] = 2**70  # cbor2 encodes this as tag 2
    with pytest.raises(ForbiddenTag):
        TO.decode(cbor2.dumps(bignum))
    with pytest.raises(ForbiddenTag):
        TO.decode(b"\xa1\xc1\x01\x01")  # {1(1): 1}
    shared = cbor2.dumps([1, 2], value_sharing=True)  # tag 28 (shareable) and friends
    with pytest.raises(ForbiddenTag):
        TO.decode(shared)


def test_nesting_depth_is_bounded() -> None:
    shallow: Codec[ToRunner] = Codec(ToRunner, max_depth=4)
    with pytest.raises(NestingTooDeep) as info:
        shallow.decode(b"\x81" * 10 + b"\x01")
    assert info.value.limit == 4
    with pytest.raises(NestingTooDeep):
        TO.decode(b"\x81" * 100_000 + b"\x01")
    with pytest.raises(NestingTooDeep):
        TO.decode(b"\xa1\x61a" * 1_000 + b"\x01")


def test_indefinite_length_items_are_rejected() -> None:
    for body in (b"\x9f\x01\xff", b"\xbf\x61a\x01\xff", b"\x7f\x61a\xff", b"\x5f\x41a\xff"):
        with pytest.raises(MalformedFrame):
            TO.decode(body)


@pytest.mark.parametrize(
    "body",
    [
        b"\x62\xff\xfe",  # text string that is not UTF-8
        b"\xff",  # break outside an indefinite item
        b"\x1c",  # reserved additional information
        b"\xf8\x10",  # two-byte simple value below 32
    ],
)
def test_ill_formed_cbor_is_malformed(body: bytes) -> None:
    with pytest.raises(MalformedFrame):
        TO.decode(body)


def test_well_formed_values_that_no_frame_accepts_are_schema_errors() -> None:
    for value in (cbor2.undefined, cbor2.CBORSimpleValue(100), float("nan"), b"bytes", 3):
        with pytest.raises(SchemaError):
            TO.decode(cbor2.dumps(value))


def test_unicode_round_trips() -> None:
    text = "héllo \x00 \u2028 \U0001f600"
    frame = TO.decode(TO.encode(Cancel(text)))
    assert frame == Cancel(text)
    assert isinstance(TextPrompt(text).text, str)


def test_malformed_errors_are_wire_errors_with_messages() -> None:
    for cls in (TruncatedFrame, TrailingBytes, DuplicateKey, ForbiddenTag, NestingTooDeep):
        assert issubclass(cls, MalformedFrame)
        assert issubclass(cls, WireError)
    with pytest.raises(MalformedFrame, match="CBOR tag 1 is not allowed"):
        TO.decode(b"\xc1\x01")
    with pytest.raises(TrailingBytes, match=r"^malformed frame: 1 trailing byte\(s\)"):
        TO.decode(CANCEL + b"\x00")


def test_decode_accepts_any_bytes_like() -> None:
    assert TO.decode(bytearray(CANCEL)) == Cancel("r1")
    assert TO.decode(memoryview(b"xx" + CANCEL)[2:]) == Cancel("r1")

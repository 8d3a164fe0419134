"""Properties of the wire codec.

* Every frame class of ``ToRunner`` and ``FromRunner`` round-trips through encode/decode and
  through pack + FrameReader in any chunking. Strategies are derived from the attrs fields, so a
  frame added to either union is covered without touching this file (and a frame class that is
  in neither union fails ``test_every_runner_class_is_reachable``).
* Arbitrary bytes, arbitrary well-formed CBOR values and mutated valid frames only ever produce
  ``WireError`` subclasses; whatever decodes re-encodes to the same frame.
"""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, get_args, get_origin

import attrs
import cbor2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skulk.wire import Codec, FrameReader, MalformedFrame, SchemaError, WireError
from skulk.wire import runner as runner_module
from skulk.wire.runner import FromRunner, ToRunner

TO: Codec[ToRunner] = Codec(ToRunner)
FROM: Codec[FromRunner] = Codec(FromRunner)
CODECS: tuple[Codec[Any], ...] = (TO, FROM)
SMALL_FROM: Codec[FromRunner] = Codec(FromRunner, max_frame_size=512)

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---- strategies derived from the types ---


def strategy_for(tp: Any) -> st.SearchStrategy[Any]:
    """Values of type ``tp`` that the strict codec must round-trip (the codec's domain)."""
    origin = get_origin(tp)
    if tp is int:
        return st.integers(min_value=-(2**64), max_value=2**64 - 1)
    if tp is float:
        return st.floats(allow_nan=False, allow_infinity=False)
    if tp is str:
        return st.text(max_size=20)
    if tp is bytes:
        return st.binary(max_size=20)
    if tp is bool:
        return st.booleans()
    if tp is type(None):
        return st.none()
    if origin is Literal:
        return st.sampled_from(get_args(tp))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return st.sampled_from(list(tp))
    if origin is tuple:
        args = get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return st.lists(strategy_for(args[0]), max_size=4).map(tuple)
        return st.tuples(*(strategy_for(a) for a in args))
    if origin in (dict, Mapping):
        key, value = get_args(tp)
        return st.dictionaries(strategy_for(key), strategy_for(value), max_size=3)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(strategy_for(a) for a in get_args(tp)))
    if isinstance(tp, type) and attrs.has(tp):
        attrs.resolve_types(tp)
        fields = {a.name: strategy_for(a.type) for a in attrs.fields(tp) if a.init}
        return st.builds(tp, **fields)
    raise TypeError(f"no strategy for {tp!r}: teach strategy_for about it")


def classes_reachable_from(tp: Any, seen: set[type] | None = None) -> set[type]:
    """Every attrs class a value of type ``tp`` can contain (including nested fields)."""
    seen = set() if seen is None else seen
    if isinstance(tp, type) and attrs.has(tp):
        if tp in seen:
            return seen
        seen.add(tp)
        attrs.resolve_types(tp)
        for a in attrs.fields(tp):
            classes_reachable_from(a.type, seen)
    for arg in get_args(tp):
        classes_reachable_from(arg, seen)
    return seen


FRAME_PAIRS: list[tuple[Codec[Any], type]] = [
    (codec, cls) for codec in CODECS for cls in codec.frame_types
]
FRAME_CASES = [pytest.param(codec, cls, id=cls.__name__) for codec, cls in FRAME_PAIRS]


def test_every_union_member_is_covered() -> None:
    covered = {cls for _, cls in FRAME_PAIRS}
    assert covered == set(get_args(ToRunner)) | set(get_args(FromRunner))


def test_every_runner_class_is_reachable() -> None:
    defined = {
        obj
        for obj in vars(runner_module).values()
        if isinstance(obj, type) and attrs.has(obj) and obj.__module__ == runner_module.__name__
    }
    reachable = classes_reachable_from(ToRunner) | classes_reachable_from(FromRunner)
    assert defined - reachable == set(), (
        "a runner frame class is in neither ToRunner nor FromRunner"
    )


# ---- round trips ---


@FAST
@pytest.mark.parametrize(("codec", "cls"), FRAME_CASES)
@given(data=st.data())
def test_encode_decode_round_trip(codec: Codec[Any], cls: type, data: st.DataObject) -> None:
    frame = data.draw(strategy_for(cls))
    decoded = codec.decode(codec.encode(frame))
    assert decoded == frame
    assert type(decoded) is cls
    assert codec.encode(decoded) == codec.encode(frame)


@FAST
@given(
    frames=st.lists(strategy_for(FromRunner), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=4096), max_size=10),
)
def test_pack_then_feed_in_any_chunking(frames: list[FromRunner], cuts: list[int]) -> None:
    stream = b"".join(FROM.pack(f) for f in frames)
    points = sorted({c % (len(stream) + 1) for c in cuts})
    pieces = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    reader = FrameReader(FROM)
    out: list[FromRunner] = []
    for piece in pieces:
        out += reader.feed(piece)
    reader.feed_eof()
    assert out == frames


# ---- hostile input: only WireErrors ---


def _decode_or_wire_error(codec: Codec[Any], body: bytes) -> None:
    try:
        frame = codec.decode(body)
    except WireError as exc:
        _assert_designed(exc)
        return
    # Whatever decodes is a valid frame: it re-encodes and decodes to itself.
    assert codec.decode(codec.encode(frame)) == frame


def _assert_designed(exc: WireError) -> None:
    """The error came from a deliberate check, not from the last-resort catch-all that turns an
    unexpected exception (a missing check) into a generic error."""
    if isinstance(exc, SchemaError):
        assert not exc.message.startswith("invalid value ("), exc
    if isinstance(exc, MalformedFrame):
        assert not exc.detail.startswith("invalid CBOR ("), exc


@FAST
@given(body=st.binary(max_size=300))
def test_arbitrary_bytes_only_raise_wire_errors(body: bytes) -> None:
    for codec in CODECS:
        _decode_or_wire_error(codec, body)


@FAST
@given(chunks=st.lists(st.binary(max_size=64), max_size=8), prefixed=st.booleans())
def test_arbitrary_streams_only_raise_wire_errors(chunks: list[bytes], prefixed: bool) -> None:
    if prefixed:  # give random bodies plausible prefixes so they get past the size check
        chunks = [len(c).to_bytes(4, "big") + c for c in chunks]
    reader = FrameReader(SMALL_FROM)
    try:
        for chunk in chunks:
            for frame in reader.feed(chunk):
                assert SMALL_FROM.decode(SMALL_FROM.encode(frame)) == frame
        reader.feed_eof()
    except WireError as exc:
        _assert_designed(exc)


FIELD_NAMES = sorted(
    {a.name for cls in classes_reachable_from(ToRunner | FromRunner) for a in attrs.fields(cls)}
)
CLASS_NAMES = sorted(cls.__name__ for cls in classes_reachable_from(ToRunner | FromRunner))

CBOR_LEAVES: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64 - 1),
    st.floats(),
    st.text(max_size=10),
    st.binary(max_size=10),
    st.sampled_from(CLASS_NAMES),
    st.sampled_from(["stop", "length", "cancelled", "user"]),
    st.just(cbor2.undefined),
    st.builds(cbor2.CBORSimpleValue, st.integers(0, 19) | st.integers(32, 255)),
)
CBOR_KEYS: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from(FIELD_NAMES), st.just("t"), st.text(max_size=5), st.integers(-5, 5)
)


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    field_map = st.fixed_dictionaries(
        {"t": st.sampled_from(CLASS_NAMES)},
        optional=dict.fromkeys(FIELD_NAMES, children),
    )
    return st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(CBOR_KEYS, children, max_size=5),
        field_map,
        st.builds(cbor2.CBORTag, st.integers(0, 2**64 - 1), children),
    )


CBOR_VALUES = st.recursive(CBOR_LEAVES, _containers, max_leaves=25)


@FAST
@given(value=CBOR_VALUES)
def test_arbitrary_cbor_values_only_raise_wire_errors(value: Any) -> None:
    body = cbor2.dumps(value)
    for codec in CODECS:
        _decode_or_wire_error(codec, body)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            out += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            out += _paths(child, (*prefix, index))
    return out


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _replace(value[head], rest, new)}
    copy = list(value)
    copy[head] = _replace(copy[head], rest, new)
    return copy


REPLACEMENTS = st.recursive(CBOR_LEAVES, _containers, max_leaves=4)


@settings(FAST, max_examples=300)
@given(data=st.data())
def test_mutated_frames_only_raise_wire_errors(data: st.DataObject) -> None:
    codec, cls = data.draw(st.sampled_from(FRAME_PAIRS))
    value = codec.unstructure(data.draw(strategy_for(cls)))
    path = data.draw(st.sampled_from(_paths(value)))
    mutated = _replace(value, path, data.draw(REPLACEMENTS))
    if isinstance(mutated, dict) and mutated and data.draw(st.booleans()):
        del mutated[data.draw(st.sampled_from(sorted(mutated, key=repr)))]
    _decode_or_wire_error(codec, cbor2.dumps(mutated))


CONFUSIONS: tuple[Any, ...] = (
    None,
    True,
    0,
    -1,
    2**64 - 1,
    1.5,
    float("nan"),
    "",
    "stop",
    b"",
    [],
    [1, "a"],
    {},
    {"t": "Nope"},
    {"t": 1},
    {1: 2},
    cbor2.undefined,
)


@settings(FAST, max_examples=15)
@pytest.mark.parametrize(("codec", "cls"), FRAME_CASES)
@given(data=st.data())
def test_every_node_replaced_by_every_kind_of_value(
    codec: Codec[Any], cls: type, data: st.DataObject
) -> None:
    value = codec.unstructure(data.draw(strategy_for(cls)))
    for path in _paths(value):
        for confusion in CONFUSIONS:
            _decode_or_wire_error(codec, cbor2.dumps(_replace(value, path, confusion)))
        if path:  # and dropping that node's key / element
            _decode_or_wire_error(codec, cbor2.dumps(_drop(value, path)))


def _drop(value: Any, path: tuple[Any, ...]) -> Any:
    head, rest = path[0], path[1:]
    if not rest:
        if isinstance(value, dict):
            return {k: v for k, v in value.items() if k != head}
        return value[:head] + value[head + 1 :]
    if isinstance(value, dict):
        return {**value, head: _drop(value[head], rest)}
    copy = list(value)
    copy[head] = _drop(copy[head], rest)
    return copy

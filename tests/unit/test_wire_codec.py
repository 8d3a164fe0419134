"""The strict codec: exact schema errors with paths, encode-side checks, supported types."""

from __future__ import annotations

import copy
import enum
import math
from collections.abc import Mapping
from typing import Any, Literal

import attrs
import cbor2
import pytest

from skulk.wire import (
    Codec,
    EncodeError,
    FrameTooLarge,
    SchemaError,
    UnknownTag,
    WireError,
)
from skulk.wire.runner import (
    PROTOCOL_VERSION,
    Cancel,
    ChatMessage,
    ChatPrompt,
    Finished,
    FromRunner,
    Generate,
    GenerationEnd,
    Hello,
    SamplingParams,
    Shutdown,
    TextPrompt,
    TokenChunk,
    ToolCall,
    ToRunner,
    Usage,
)

TO: Codec[ToRunner] = Codec(ToRunner)
FROM: Codec[FromRunner] = Codec(FromRunner)

GENERATE = Generate(
    request_id="r1",
    prompt=ChatPrompt((ChatMessage("system", "be brief"), ChatMessage("user", "hi"))),
    params=SamplingParams(temperature=0.5, top_k=40, seed=7, max_tokens=16, stop=("\n",)),
)


def plain(frame: ToRunner) -> dict[str, Any]:
    value = TO.unstructure(frame)
    assert isinstance(value, dict)
    return copy.deepcopy(value)


def schema_error(value: object, codec: Codec[Any] = TO) -> SchemaError:
    """Decode ``value`` through real CBOR and return the SchemaError it must raise."""
    with pytest.raises(SchemaError) as info:
        codec.decode(cbor2.dumps(value))
    return info.value


# ---- happy paths --------------------------------------------------------------------------------


def test_wire_shape_is_a_tagged_map() -> None:
    assert plain(GENERATE) == {
        "t": "Generate",
        "request_id": "r1",
        "prompt": {
            "t": "ChatPrompt",
            "messages": [
                {"role": "system", "content": "be brief", "tool_calls": [], "tool_call_id": None},
                {"role": "user", "content": "hi", "tool_calls": [], "tool_call_id": None},
            ],
            "tools": None,
        },
        "params": {
            "temperature": 0.5,
            "top_p": 1.0,
            "top_k": 40,
            "seed": 7,
            "max_tokens": 16,
            "stop": ["\n"],
            "logprobs": None,
            "json_schema": None,
            "tool_call": False,
        },
    }
    assert next(iter(plain(GENERATE))) == "t"


@pytest.mark.parametrize(
    "frame",
    [
        GENERATE,
        Generate("r2", TextPrompt("once upon"), SamplingParams()),
        Generate(
            "r3",
            ChatPrompt(
                (
                    ChatMessage("assistant", "", (ToolCall("c1", "f", '{"a": 1}'),)),
                    ChatMessage("tool", "42", tool_call_id="c1"),
                ),
                tools='[{"type": "function", "function": {"name": "f"}}]',
            ),
            SamplingParams(json_schema='{"type":"object"}', tool_call=True),
        ),
        Cancel("r1"),
        Shutdown(),
    ],
)
def test_round_trip(frame: ToRunner) -> None:
    decoded = TO.decode(TO.encode(frame))
    assert decoded == frame
    assert type(decoded) is type(frame)


def test_tuples_come_back_as_tuples() -> None:
    frame = FROM.decode(FROM.encode(TokenChunk("r", (1, 2, 3), "abc")))
    assert isinstance(frame, TokenChunk)
    assert frame.token_ids == (1, 2, 3)
    assert type(frame.token_ids) is tuple


def test_int_is_accepted_for_float_and_becomes_float() -> None:
    value = plain(GENERATE)
    value["params"]["temperature"] = 1
    frame = TO.decode(cbor2.dumps(value))
    assert isinstance(frame, Generate)
    assert frame.params.temperature == 1.0
    assert type(frame.params.temperature) is float


def test_fields_with_defaults_may_be_absent() -> None:
    value = plain(GENERATE)
    value["params"] = {"top_k": 3}
    frame = TO.decode(cbor2.dumps(value))
    assert isinstance(frame, Generate)
    assert frame.params == SamplingParams(top_k=3)


def test_frame_types_and_limits() -> None:
    assert FROM.frame_types[0].__name__ == "Hello"
    assert set(TO.frame_types) == {Generate, Cancel, Shutdown, *TO.frame_types}
    assert TO.max_frame_size == 16 * 1024 * 1024
    hello = FROM.decode(FROM.encode(Hello(PROTOCOL_VERSION, 42, "0.1.0")))
    assert hello == Hello(PROTOCOL_VERSION, 42, "0.1.0")


# ---- decode: schema errors, each with its exact path ---------------------------------------------


@pytest.mark.parametrize(
    ("field", "bad", "message"),
    [
        ("top_k", "40", "expected int"),
        ("top_k", True, "expected int"),
        ("top_k", 40.0, "expected int"),
        ("top_k", None, "expected int"),
        ("temperature", "0.5", "expected float"),
        ("temperature", False, "expected float"),
        ("temperature", math.nan, "expected finite float"),
        ("temperature", math.inf, "expected finite float"),
        ("seed", "7", "expected int or null"),
        ("seed", 7.5, "expected int or null"),
        ("stop", "\n", "expected array"),
        ("stop", {"a": 1}, "expected array"),
    ],
)
def test_wrong_type_is_rejected_without_coercion(field: str, bad: object, message: str) -> None:
    value = plain(GENERATE)
    value["params"][field] = bad
    error = schema_error(value)
    assert (error.path, error.message) == (f"$.params.{field}", message)
    assert str(error) == f"{message} @ $.params.{field}"


def test_ints_outside_the_cbor_range_are_refused() -> None:
    value = plain(GENERATE)
    value["params"]["top_k"] = 2**64  # not even expressible without a bignum tag in CBOR
    with pytest.raises(SchemaError, match=r"^expected int @ \$\.params\.top_k$"):
        TO.structure(value)
    value["params"]["top_k"] = 2**64 - 1
    assert TO.structure(value).params.top_k == 2**64 - 1  # type: ignore[union-attr]
    value["params"]["top_k"] = -(2**64)
    assert TO.decode(cbor2.dumps(value)).params.top_k == -(2**64)  # type: ignore[union-attr]


def test_str_instead_of_int_message() -> None:
    value = plain(GENERATE)
    value["params"]["top_k"] = "40"
    assert str(schema_error(value)) == "expected int @ $.params.top_k"


def test_wrong_element_in_array_has_index_path() -> None:
    value = plain(GENERATE)
    value["params"]["stop"] = ["a", "b", 3]
    assert str(schema_error(value)) == "expected str @ $.params.stop[2]"
    value = plain(GENERATE)
    value["prompt"]["messages"][1]["content"] = b"hi"
    assert str(schema_error(value)) == "expected str @ $.prompt.messages[1].content"
    value["prompt"]["messages"][1] = ["user", "hi"]
    assert str(schema_error(value)) == "expected map @ $.prompt.messages[1]"


def test_unknown_key_is_rejected() -> None:
    value = plain(GENERATE)
    value["params"]["top_kk"] = 3
    assert str(schema_error(value)) == "unknown field @ $.params.top_kk"
    value = plain(GENERATE)
    value["extra"] = 1
    assert str(schema_error(value)) == "unknown field @ $.extra"
    value = plain(GENERATE)
    value["params"][7] = 1
    assert str(schema_error(value)) == "unknown field @ $.params[7]"
    value = plain(GENERATE)
    value["params"]["not an identifier"] = 1
    assert str(schema_error(value)) == "unknown field @ $.params['not an identifier']"


def test_missing_field() -> None:
    value = plain(GENERATE)
    del value["request_id"]
    assert str(schema_error(value)) == "missing required field @ $.request_id"
    value = plain(GENERATE)
    del value["prompt"]["messages"][0]["role"]
    assert str(schema_error(value)) == "missing required field @ $.prompt.messages[0].role"


def test_unknown_tag_at_top_level() -> None:
    value = plain(GENERATE)
    value["t"] = "Nope"
    error = schema_error(value)
    assert isinstance(error, UnknownTag)
    assert (error.tag, error.path) == ("Nope", "$")
    assert error.expected == ("Load", "Generate", "Tokenize", "Embed", "Cancel", "Shutdown")
    assert str(error) == (
        "unknown tag 'Nope' (expected one of Load, Generate, Tokenize, Embed, Cancel, Shutdown) @ $"
    )


def test_unknown_tag_in_nested_union() -> None:
    value = plain(GENERATE)
    value["prompt"]["t"] = "ImagePrompt"
    error = schema_error(value)
    assert isinstance(error, UnknownTag)
    assert (error.tag, error.path) == ("ImagePrompt", "$.prompt")
    assert error.expected == ("ChatPrompt", "TextPrompt")


def test_a_frame_of_the_other_direction_is_an_unknown_tag() -> None:
    error = schema_error(FROM.unstructure(TokenChunk("r", (1,), "x")))
    assert isinstance(error, UnknownTag)
    assert error.tag == "TokenChunk"


def test_missing_or_bad_tag() -> None:
    value = plain(GENERATE)
    del value["t"]
    assert str(schema_error(value)) == "missing required field @ $.t"
    value = plain(GENERATE)
    del value["prompt"]["t"]
    assert str(schema_error(value)) == "missing required field @ $.prompt.t"
    value = plain(GENERATE)
    value["t"] = 3
    assert str(schema_error(value)) == "expected str @ $.t"


def test_tag_of_a_nested_union_member_is_not_a_field() -> None:
    value = plain(GENERATE)
    value["params"]["t"] = "SamplingParams"  # untagged position: "t" is just an unknown key
    assert str(schema_error(value)) == "unknown field @ $.params.t"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ([1, 2], "expected map @ $"),
        ("Generate", "expected map @ $"),
        (None, "expected map @ $"),
        (7, "expected map @ $"),
    ],
)
def test_top_level_must_be_a_map(value: object, expected: str) -> None:
    assert str(schema_error(value)) == expected


def test_literal_is_checked() -> None:
    value = FROM.unstructure(Finished("r", GenerationEnd("stop", Usage(1, 2))))
    value["end"]["finish_reason"] = "eos"
    assert str(schema_error(value, FROM)) == (
        "expected one of 'stop', 'length', 'cancelled' @ $.end.finish_reason"
    )
    value["end"]["finish_reason"] = 1
    assert schema_error(value, FROM).path == "$.end.finish_reason"


def test_nested_class_field_errors() -> None:
    value = FROM.unstructure(Finished("r", GenerationEnd("stop", Usage(1, 2))))
    value["end"]["usage"]["completion_tokens"] = -1.5
    assert str(schema_error(value, FROM)) == "expected int @ $.end.usage.completion_tokens"


def test_first_problem_in_field_order_is_reported() -> None:
    value = plain(GENERATE)
    value["request_id"] = 1
    value["params"]["top_k"] = "x"
    assert schema_error(value).path == "$.request_id"


def test_long_peer_strings_are_shortened_in_messages() -> None:
    value = plain(GENERATE)
    value["t"] = "N" * 10_000
    error = schema_error(value)
    assert isinstance(error, UnknownTag)
    assert error.tag == "N" * 10_000
    assert len(str(error)) < 200


def test_cbor_simple_values_are_schema_errors() -> None:
    value = plain(GENERATE)
    value["params"]["seed"] = cbor2.undefined
    assert str(schema_error(value)) == "expected int or null @ $.params.seed"
    value["params"]["seed"] = cbor2.CBORSimpleValue(99)
    assert str(schema_error(value)) == "expected int or null @ $.params.seed"


def test_structure_of_plain_values_has_the_same_rules() -> None:
    with pytest.raises(SchemaError, match=r"expected int @ \$\.params\.top_k"):
        value = plain(GENERATE)
        value["params"]["top_k"] = "1"
        TO.structure(value)
    assert TO.structure(plain(GENERATE)) == GENERATE


# ---- encode side --------------------------------------------------------------------------------


def _generate(prompt: object = None, params: object = None, **sampling: object) -> Any:
    """A Generate frame built without attrs validation, so fields can hold wrong types."""
    if params is None:
        params = SamplingParams(**sampling)  # type: ignore[arg-type]
    return Generate("r", prompt or TextPrompt("x"), params)  # type: ignore[arg-type]


ONE_OF_TO = "expected one of Load, Generate, Tokenize, Embed, Cancel, Shutdown"


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        (_generate(top_k="5"), "expected int @ $.params.top_k"),
        (_generate(top_k=True), "expected int @ $.params.top_k"),
        (_generate(seed=2**64), "expected int or None @ $.params.seed"),
        (_generate(top_p=math.nan), "expected finite float @ $.params.top_p"),
        (_generate(stop=("a", 3)), "expected str @ $.params.stop[1]"),
        (_generate(stop=["a"]), "expected tuple @ $.params.stop"),
        (_generate(prompt=Cancel("x")), "expected one of ChatPrompt, TextPrompt @ $.prompt"),
        (_generate(params={}), "expected SamplingParams @ $.params"),
        (TokenChunk("r", (1,), "x"), f"{ONE_OF_TO} @ $"),
    ],
)
def test_encode_checks_every_value(frame: Any, expected: str) -> None:
    with pytest.raises(EncodeError) as info:
        TO.encode(frame)
    assert f"{info.value.message} @ {info.value.path}" == expected
    assert str(info.value) == f"cannot encode: {expected}"


def test_int_stored_in_float_field_encodes_as_float() -> None:
    frame = Generate("r", TextPrompt("x"), SamplingParams(temperature=1))
    assert plain(frame)["params"]["temperature"] == 1.0
    assert type(plain(frame)["params"]["temperature"]) is float


def test_unencodable_string_is_an_encode_error() -> None:
    with pytest.raises(EncodeError):
        TO.encode(Cancel("\ud800"))


def test_encode_refuses_frames_over_the_limit() -> None:
    small: Codec[ToRunner] = Codec(ToRunner, max_frame_size=64)
    small.encode(Cancel("x" * 40))
    with pytest.raises(FrameTooLarge) as info:
        small.encode(Cancel("x" * 100))
    assert info.value.limit == 64
    assert info.value.size > 100
    with pytest.raises(FrameTooLarge):
        small.pack(Cancel("x" * 100))


def test_decode_refuses_bodies_over_the_limit_before_parsing() -> None:
    small: Codec[ToRunner] = Codec(ToRunner, max_frame_size=64)
    with pytest.raises(FrameTooLarge) as info:
        small.decode(b"\xff" * 65)  # not even CBOR: the size is checked first
    assert (info.value.size, info.value.limit) == (65, 64)
    assert str(info.value) == "frame of 65 bytes exceeds the limit of 64 bytes"


# ---- other supported types, and refusing unsupported ones ----------------------------------------


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@attrs.frozen
class Leaf:
    n: int


@attrs.frozen
class Other:
    s: str


@attrs.frozen
class Rich:
    colour: Colour
    level: Level
    labels: Mapping[str, int]
    by_id: dict[int, Leaf]
    pair: tuple[int, str]
    blob: bytes
    flag: bool
    maybe: Leaf | Other | None
    mode: Literal["a", 1, True]
    nested: tuple[tuple[Leaf, ...], ...] = ()


RICH = Rich(
    colour=Colour.BLUE,
    level=Level.HIGH,
    labels={"zone": 1},
    by_id={3: Leaf(4)},
    pair=(1, "x"),
    blob=b"\x00\xff",
    flag=True,
    maybe=Other("o"),
    mode=1,
    nested=((Leaf(1), Leaf(2)), ()),
)
RICH_CODEC: Codec[Rich] = Codec(Rich)


def test_rich_types_round_trip() -> None:
    assert RICH_CODEC.decode(RICH_CODEC.encode(RICH)) == RICH
    value = RICH_CODEC.unstructure(RICH)
    assert value["colour"] == "blue"
    assert value["level"] == 2
    assert value["maybe"] == {"t": "Other", "s": "o"}
    assert value["by_id"] == {3: {"n": 4}}
    none = attrs.evolve(RICH, maybe=None, mode=True)
    assert RICH_CODEC.decode(RICH_CODEC.encode(none)) == none


@pytest.mark.parametrize(
    ("field", "bad", "expected"),
    [
        ("colour", "green", "expected one of 'red', 'blue' @ $.colour"),
        ("level", 3, "expected one of 1, 2 @ $.level"),
        ("level", True, "expected one of 1, 2 @ $.level"),
        ("labels", {"zone": "x"}, "expected int @ $.labels.zone"),
        ("labels", {"a b": "x"}, "expected int @ $.labels['a b']"),
        ("labels", {5: 1}, "invalid key: expected str @ $.labels[5]"),
        ("labels", [1], "expected map @ $.labels"),
        ("by_id", {3: {"n": "4"}}, "expected int @ $.by_id[3].n"),
        ("pair", [1], "expected array of length 2 @ $.pair"),
        ("pair", [1, 2], "expected str @ $.pair[1]"),
        ("blob", "00ff", "expected bytes @ $.blob"),
        ("flag", 1, "expected bool @ $.flag"),
        ("maybe", {"t": "Leaf", "n": "x"}, "expected int @ $.maybe.n"),
        ("maybe", {"t": "Nope"}, "unknown tag 'Nope' (expected one of Leaf, Other) @ $.maybe"),
        ("maybe", 5, "expected map or null @ $.maybe"),
        ("mode", True, "ok"),
        ("mode", 1, "ok"),
        ("mode", "a", "ok"),
        ("mode", False, "expected one of 'a', 1, True @ $.mode"),
        ("mode", 1.0, "expected one of 'a', 1, True @ $.mode"),
        ("nested", [[{"n": 1}, {"n": None}]], "expected int @ $.nested[0][1].n"),
    ],
)
def test_rich_type_errors(field: str, bad: object, expected: str) -> None:
    value = RICH_CODEC.unstructure(RICH)
    value[field] = bad
    body = cbor2.dumps(value)
    if expected == "ok":
        assert getattr(RICH_CODEC.decode(body), field) == bad
        return
    with pytest.raises(SchemaError) as info:
        RICH_CODEC.decode(body)
    assert str(info.value) == expected


def test_single_class_codec_is_tagged_too() -> None:
    assert RICH_CODEC.unstructure(RICH)["t"] == "Rich"


@attrs.frozen
class Tree:
    label: str
    children: tuple[Tree, ...] = ()
    parent: Tree | None = None


def test_self_referencing_classes_are_supported() -> None:
    codec: Codec[Tree] = Codec(Tree)
    tree = Tree("root", (Tree("a"), Tree("b", (Tree("c", parent=Tree("p")),))))
    assert codec.decode(codec.encode(tree)) == tree
    value = codec.unstructure(tree)
    assert value["children"][1]["children"][0]["parent"] == {
        "label": "p",
        "children": [],
        "parent": None,
    }  # an optional class is not tagged; only unions of several classes are
    value["children"][1]["children"][0]["label"] = 5
    with pytest.raises(
        SchemaError, match=r"^expected str @ \$\.children\[1\]\.children\[0\]\.label$"
    ):
        codec.structure(value)


@attrs.frozen
class HasList:
    items: list[int]


@attrs.frozen
class HasAny:
    value: Any


@attrs.frozen
class HasPrimitiveUnion:
    value: int | str


@attrs.frozen
class HasTagField:
    t: str


@attrs.frozen
class HasFloatEnum:
    value: Literal[1.5]  # type: ignore[valid-type]


@attrs.frozen
class WrapsList:
    inner: HasList


@pytest.mark.parametrize(
    "frames",
    [HasList, HasAny, HasPrimitiveUnion, HasTagField, WrapsList, HasFloatEnum, int, Leaf | None],
)
def test_unsupported_schemas_fail_at_construction(frames: object) -> None:
    with pytest.raises(TypeError):
        Codec(frames)


def test_duplicate_class_names_in_a_union_are_refused() -> None:
    def make() -> type:
        @attrs.frozen
        class Leaf:
            x: int

        return Leaf

    with pytest.raises(TypeError, match="named 'Leaf'"):
        Codec(Leaf | make())


@pytest.mark.parametrize(
    "kwargs", [{"max_frame_size": 0}, {"max_frame_size": 2**32}, {"max_depth": 0}]
)
def test_limits_are_validated(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        Codec(ToRunner, **kwargs)


def test_errors_are_wire_errors() -> None:
    for cls in (SchemaError, UnknownTag, EncodeError, FrameTooLarge):
        assert issubclass(cls, WireError)
    assert issubclass(UnknownTag, SchemaError)

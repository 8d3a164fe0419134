"""The sans-IO OpenAI layer: request validation, response/chunk formatting, SSE, errors.

Shapes are checked against the official ``openai`` package twice: its pydantic response types
(strictly: no unknown fields) and the real client talking to a fake transport (no sockets).
"""

from __future__ import annotations

import importlib
import json
import math
import typing
from collections.abc import Callable, Iterator

import openai
import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types import Completion
from openai.types import completion_create_params as completions_params
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.chat import completion_create_params as chat_params

from skulk.api._openai import (
    SSE_DONE,
    ApiError,
    ChatCompletionsRequest,
    ChatStream,
    CompletionsRequest,
    CompletionStream,
    chat_chunk,
    chat_completion,
    chat_content_chunk,
    chat_finish_chunk,
    chat_role_chunk,
    chat_usage_chunk,
    completion,
    completion_chunk,
    completion_usage_chunk,
    new_request_id,
    openai_finish_reason,
    parse_chat_completions,
    parse_completions,
    sse_event,
)
from skulk.wire.runner import ChatMessage, ChatPrompt, SamplingParams, TextPrompt, Usage

# The HTTP library the SDK itself uses (httpx, or its fork httpx2 in newer releases).
HTTPX = importlib.import_module(openai.DefaultHttpxClient.__mro__[1].__module__.partition(".")[0])

DELETE = object()
USER_HI = {"role": "user", "content": "hi"}


def chat(**fields: object) -> dict[str, object]:
    body: dict[str, object] = {"model": "m", "messages": [USER_HI]}
    for key, value in fields.items():
        if value is DELETE:
            body.pop(key, None)
        else:
            body[key] = value
    return body


def comp(**fields: object) -> dict[str, object]:
    body: dict[str, object] = {"model": "m", "prompt": "Once upon"}
    for key, value in fields.items():
        if value is DELETE:
            body.pop(key, None)
        else:
            body[key] = value
    return body


def user(content: object) -> dict[str, object]:
    return chat(messages=[{"role": "user", "content": content}])


def msg(**message: object) -> dict[str, object]:
    return chat(messages=[message])


def rejected(parse: Callable[[object], object], body: object) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse(body)
    return info.value


# ---- valid requests --------------------------------------------------------------------------


def test_minimal_chat_request_gets_defaults() -> None:
    request = parse_chat_completions(chat())
    assert request == ChatCompletionsRequest(
        model="m",
        prompt=ChatPrompt((ChatMessage("user", "hi"),)),
        params=SamplingParams(),
        stream=False,
        include_usage=False,
    )
    # No seed means random, not a fixed default; no max_tokens means up to the context.
    assert request.params.seed is None
    assert request.params.max_tokens is None


def test_full_chat_request() -> None:
    body = chat(
        messages=[
            {"role": "developer", "content": "be brief"},
            {"role": "system", "content": [{"type": "text", "text": "be kind"}], "name": "s"},
            {"role": "user", "content": "hi", "name": "alice"},
            {"role": "assistant", "content": "hello", "tool_calls": [], "refusal": None},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
        ],
        max_tokens=64,
        max_completion_tokens=64,
        temperature=0,
        top_p=0.5,
        top_k=40,
        seed=-(2**63),
        stop=["\n\n", "END"],
        stream=True,
        stream_options={"include_usage": True, "include_obfuscation": False},
        user="u-1",
        metadata={"tag": "x"},
        parallel_tool_calls=False,
    )
    request = parse_chat_completions(body)
    assert request.prompt.messages == (
        ChatMessage("system", "be brief"),
        ChatMessage("system", "be kind"),
        ChatMessage("user", "hi"),
        ChatMessage("assistant", "hello"),
        ChatMessage("user", "ab"),
    )
    assert request.params == SamplingParams(
        temperature=0.0, top_p=0.5, top_k=40, seed=-(2**63), max_tokens=64, stop=("\n\n", "END")
    )
    assert isinstance(request.params.temperature, float)
    assert request.stream and request.include_usage


def test_text_parts_are_concatenated_as_written() -> None:
    parts = [
        {"type": "text", "text": "Hello, "},
        {"type": "text", "text": ""},
        {"type": "text", "text": "world"},
    ]
    request = parse_chat_completions(user(parts))
    assert request.prompt.messages == (ChatMessage("user", "Hello, world"),)


@pytest.mark.parametrize("content", [None, DELETE])
def test_assistant_content_may_be_null(content: object) -> None:
    message: dict[str, object] = {"role": "assistant"}
    if content is not DELETE:
        message["content"] = content
    request = parse_chat_completions(chat(messages=[USER_HI, message]))
    assert request.prompt.messages[1] == ChatMessage("assistant", "")


@pytest.mark.parametrize(
    ("max_tokens", "max_completion_tokens", "expected"),
    [(5, None, 5), (None, 7, 7), (9, 9, 9), (None, None, None), (DELETE, 3, 3)],
)
def test_max_tokens_aliases(
    max_tokens: object, max_completion_tokens: object, expected: int | None
) -> None:
    body = chat(max_tokens=max_tokens, max_completion_tokens=max_completion_tokens)
    assert parse_chat_completions(body).params.max_tokens == expected


@pytest.mark.parametrize(
    ("stop", "expected"),
    [(None, ()), ("x", ("x",)), ([], ()), (["a", "b", "c", "d"], ("a", "b", "c", "d"))],
)
def test_stop_forms(stop: object, expected: tuple[str, ...]) -> None:
    assert parse_chat_completions(chat(stop=stop)).params.stop == expected
    assert parse_completions(comp(stop=stop)).params.stop == expected


def test_stop_strings_are_bounded_in_length() -> None:
    assert parse_chat_completions(chat(stop="x" * 1024)).params.stop == ("x" * 1024,)
    for parse, body in ((parse_chat_completions, chat), (parse_completions, comp)):
        with pytest.raises(ApiError) as info:
            parse(body(stop=["ok", "x" * 1025]))
        assert info.value.status == 400 and info.value.param == "stop[1]"


@pytest.mark.parametrize(
    ("fields", "stream", "include_usage"),
    [
        ({}, False, False),
        ({"stream": None}, False, False),
        ({"stream": False}, False, False),
        ({"stream": False, "stream_options": None}, False, False),
        ({"stream": True}, True, False),
        ({"stream": True, "stream_options": {}}, True, False),
        ({"stream": True, "stream_options": {"include_usage": False}}, True, False),
        ({"stream": True, "stream_options": {"include_usage": None}}, True, False),
        ({"stream": True, "stream_options": {"include_usage": True}}, True, True),
    ],
)
def test_streaming_flags(fields: dict[str, object], stream: bool, include_usage: bool) -> None:
    for request in (parse_chat_completions(chat(**fields)), parse_completions(comp(**fields))):
        assert (request.stream, request.include_usage) == (stream, include_usage)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n", 1),
        ("n", None),
        ("presence_penalty", 0),
        ("presence_penalty", 0.0),
        ("frequency_penalty", 0),
        ("frequency_penalty", None),
        ("logit_bias", {}),
        ("logit_bias", None),
        ("logprobs", False),
        ("logprobs", None),
        ("top_logprobs", 0),
        ("top_logprobs", None),
        ("tools", []),
        ("tools", None),
        ("tool_choice", "none"),
        ("tool_choice", None),
        ("functions", []),
        ("functions", None),
        ("function_call", "none"),
        ("response_format", {"type": "text"}),
        ("response_format", None),
        ("audio", None),
        ("prediction", None),
        ("modalities", ["text"]),
        ("modalities", None),
        ("reasoning_effort", None),
        ("service_tier", "auto"),
        ("service_tier", "default"),
        ("service_tier", None),
        ("store", False),
        ("store", None),
        ("web_search_options", None),
        ("verbosity", "medium"),
        ("moderation", None),
        ("prompt_cache_retention", None),
        ("prompt_cache_options", {}),
        # informational
        ("user", "someone"),
        ("user", None),
        ("metadata", {"a": "b", "c": ""}),
        ("metadata", None),
        ("parallel_tool_calls", True),
        ("parallel_tool_calls", False),
        ("safety_identifier", "hash"),
        ("prompt_cache_key", "k"),
    ],
)
def test_chat_no_op_and_informational_values_are_accepted(field: str, value: object) -> None:
    assert parse_chat_completions(chat(**{field: value})) == parse_chat_completions(chat())


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n", 1),
        ("presence_penalty", 0),
        ("frequency_penalty", 0.0),
        ("logit_bias", {}),
        ("logprobs", None),
        ("echo", False),
        ("echo", None),
        ("best_of", 1),
        ("best_of", None),
        ("suffix", None),
        ("suffix", ""),
        ("user", "someone"),
        ("max_tokens", None),
    ],
)
def test_completions_no_op_and_informational_values_are_accepted(field: str, value: object) -> None:
    assert parse_completions(comp(**{field: value})) == parse_completions(comp())


def test_minimal_completions_request_gets_defaults() -> None:
    request = parse_completions(comp())
    assert request == CompletionsRequest(
        model="m",
        prompt=TextPrompt("Once upon"),
        params=SamplingParams(max_tokens=16),  # OpenAI's legacy default
        stream=False,
        include_usage=False,
    )


@pytest.mark.parametrize("prompt", ["Once upon", ["Once upon"], ""])
def test_completions_prompt_forms(prompt: object) -> None:
    expected = prompt[0] if isinstance(prompt, list) else prompt
    assert parse_completions(comp(prompt=prompt)).prompt == TextPrompt(str(expected))


def test_full_completions_request() -> None:
    body = comp(max_tokens=100, temperature=1.5, top_p=1, top_k=0, seed=7, stop="\n", stream=True)
    request = parse_completions(body)
    assert request.params == SamplingParams(
        temperature=1.5, top_p=1.0, top_k=0, seed=7, max_tokens=100, stop=("\n",)
    )


# ---- rejected requests -----------------------------------------------------------------------

MISSING = "missing_required_parameter"
TYPE = "invalid_type"
VALUE = "invalid_value"
UNSUPPORTED = "unsupported_parameter"
UNKNOWN = "unknown_parameter"

IMAGE = {"type": "image_url", "image_url": {"url": "http://x/y.png"}}
TEXT = {"type": "text", "text": "x"}
TOOL_CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}

CHAT_REJECTIONS: list[tuple[dict[str, object], str, str]] = [
    # model
    (chat(model=DELETE), "model", MISSING),
    (chat(model=None), "model", MISSING),
    (chat(model=5), "model", TYPE),
    (chat(model=""), "model", VALUE),
    # messages
    (chat(messages=DELETE), "messages", MISSING),
    (chat(messages="hi"), "messages", TYPE),
    (chat(messages={}), "messages", TYPE),
    (chat(messages=[]), "messages", VALUE),
    (chat(messages=["hi"]), "messages[0]", TYPE),
    (chat(messages=[USER_HI, None]), "messages[1]", TYPE),
    (msg(content="x"), "messages[0].role", MISSING),
    (msg(role=5, content="x"), "messages[0].role", TYPE),
    (msg(role="robot", content="x"), "messages[0].role", VALUE),
    (msg(role="function", content="x", name="f"), "messages[0].role", UNSUPPORTED),
    (msg(role="tool", content="x"), "messages[0].tool_call_id", MISSING),
    (msg(role="function", content="x", name="f"), "messages[0].role", UNSUPPORTED),
    (msg(role="user"), "messages[0].content", MISSING),
    (msg(role="system", content=None), "messages[0].content", MISSING),
    (user(5), "messages[0].content", TYPE),
    (user({"type": "text", "text": "x"}), "messages[0].content", TYPE),
    (user([]), "messages[0].content", VALUE),
    (user(["x"]), "messages[0].content[0]", TYPE),
    (user([IMAGE]), "messages[0].content[0].type", UNSUPPORTED),
    (
        user([TEXT, {"type": "input_audio", "input_audio": {}}]),
        "messages[0].content[1].type",
        UNSUPPORTED,
    ),
    (user([{"type": "file", "file": {}}]), "messages[0].content[0].type", UNSUPPORTED),
    (user([{"text": "x"}]), "messages[0].content[0].type", MISSING),
    (user([{"type": 1, "text": "x"}]), "messages[0].content[0].type", TYPE),
    (user([{"type": "text"}]), "messages[0].content[0].text", MISSING),
    (user([{"type": "text", "text": 5}]), "messages[0].content[0].text", TYPE),
    (user([{**TEXT, "foo": 1}]), "messages[0].content[0].foo", UNKNOWN),
    (
        user([{**TEXT, "prompt_cache_breakpoint": {"ttl": "1h"}}]),
        "messages[0].content[0].prompt_cache_breakpoint",
        UNSUPPORTED,
    ),
    (
        chat(messages=[USER_HI, {"role": "user", "content": [TEXT, IMAGE]}]),
        "messages[1].content[1].type",
        UNSUPPORTED,
    ),
    (msg(role="user", content="x", foo=1), "messages[0].foo", UNKNOWN),
    (msg(role="user", content="x", tool_calls=[]), "messages[0].tool_calls", UNKNOWN),
    (msg(role="user", content="x", name=5), "messages[0].name", TYPE),
    (
        msg(role="assistant", content=None, tool_calls=[{**TOOL_CALL, "id": 1}]),
        "messages[0].tool_calls[0].id",
        TYPE,
    ),
    (msg(role="assistant", content="x", tool_calls={}), "messages[0].tool_calls", TYPE),
    (
        msg(role="assistant", content=None, function_call={"name": "f", "arguments": "{}"}),
        "messages[0].function_call",
        UNSUPPORTED,
    ),
    (msg(role="assistant", content=None, refusal="no"), "messages[0].refusal", UNSUPPORTED),
    (msg(role="assistant", content=None, audio={"id": "a"}), "messages[0].audio", UNSUPPORTED),
    (
        msg(role="assistant", content=[{"type": "refusal", "refusal": "no"}]),
        "messages[0].content[0].type",
        UNSUPPORTED,
    ),
    # max tokens
    (chat(max_tokens=0), "max_tokens", VALUE),
    (chat(max_tokens=-3), "max_tokens", VALUE),
    (chat(max_tokens=1.5), "max_tokens", TYPE),
    (chat(max_tokens=2.0), "max_tokens", TYPE),  # integral floats are rejected, as by OpenAI
    (chat(max_tokens="5"), "max_tokens", TYPE),
    (chat(max_tokens=True), "max_tokens", TYPE),
    (chat(max_tokens=2**63), "max_tokens", VALUE),
    (chat(max_completion_tokens=0), "max_completion_tokens", VALUE),
    (chat(max_completion_tokens=[]), "max_completion_tokens", TYPE),
    (chat(max_tokens=5, max_completion_tokens=6), "max_completion_tokens", VALUE),
    # sampling
    (chat(temperature=-0.1), "temperature", VALUE),
    (chat(temperature=2.01), "temperature", VALUE),
    (chat(temperature=3), "temperature", VALUE),
    (chat(temperature=10**400), "temperature", VALUE),
    (chat(temperature=math.nan), "temperature", VALUE),
    (chat(temperature=math.inf), "temperature", VALUE),
    (chat(temperature=True), "temperature", TYPE),
    (chat(temperature="1"), "temperature", TYPE),
    (chat(top_p=0), "top_p", VALUE),
    (chat(top_p=1.0000001), "top_p", VALUE),
    (chat(top_p=-1), "top_p", VALUE),
    (chat(top_p=False), "top_p", TYPE),
    (chat(top_k=-1), "top_k", VALUE),
    (chat(top_k=1.0), "top_k", TYPE),
    (chat(top_k=True), "top_k", TYPE),
    (chat(seed=1.5), "seed", TYPE),
    (chat(seed="1"), "seed", TYPE),
    (chat(seed=True), "seed", TYPE),
    (chat(seed=2**63), "seed", VALUE),
    (chat(seed=-(2**63) - 1), "seed", VALUE),
    (chat(stop=""), "stop", VALUE),
    (chat(stop=5), "stop", TYPE),
    (chat(stop={"a": 1}), "stop", TYPE),
    (chat(stop=["a", "b", "c", "d", "e"]), "stop", VALUE),
    (chat(stop=["a", 5]), "stop[1]", TYPE),
    (chat(stop=["a", ""]), "stop[1]", VALUE),
    # streaming
    (chat(stream="yes"), "stream", TYPE),
    (chat(stream=1), "stream", TYPE),
    (chat(stream_options={}), "stream_options", VALUE),
    (chat(stream_options={"include_usage": True}), "stream_options", VALUE),
    (chat(stream=False, stream_options={"include_usage": True}), "stream_options", VALUE),
    (chat(stream=True, stream_options=5), "stream_options", TYPE),
    (chat(stream=True, stream_options=[]), "stream_options", TYPE),
    (
        chat(stream=True, stream_options={"include_usage": "yes"}),
        "stream_options.include_usage",
        TYPE,
    ),
    (chat(stream=True, stream_options={"include_usage": 1}), "stream_options.include_usage", TYPE),
    (chat(stream=True, stream_options={"foo": True}), "stream_options.foo", UNKNOWN),
    (
        chat(stream=True, stream_options={"include_obfuscation": True}),
        "stream_options.include_obfuscation",
        UNSUPPORTED,
    ),
    # fields we cannot honour: only their no-op value is accepted
    (chat(n=9), "n", VALUE),  # n is honoured up to MAX_CHOICES (8)
    (chat(n=0), "n", VALUE),
    (chat(n=1.0), "n", TYPE),
    (chat(n="1"), "n", TYPE),
    (chat(presence_penalty=0.5), "presence_penalty", UNSUPPORTED),
    (chat(presence_penalty=True), "presence_penalty", TYPE),
    (chat(frequency_penalty=-1), "frequency_penalty", UNSUPPORTED),
    (chat(frequency_penalty="0"), "frequency_penalty", TYPE),
    (chat(logit_bias={"50256": -100}), "logit_bias", UNSUPPORTED),
    (chat(logit_bias=[]), "logit_bias", TYPE),
    (chat(logprobs=True, top_logprobs=21), "top_logprobs", VALUE),
    (chat(logprobs=1), "logprobs", TYPE),
    (chat(top_logprobs=3), "top_logprobs", VALUE),  # needs logprobs: true
    (chat(top_logprobs=False), "top_logprobs", TYPE),
    (chat(tools=[{"type": "code_interpreter"}]), "tools[0].type", UNSUPPORTED),
    (chat(tools={}), "tools", TYPE),
    (chat(tool_choice="sometimes"), "tool_choice", "invalid_value"),
    (chat(tool_choice="required"), "tool_choice", "invalid_value"),
    (
        chat(tool_choice={"type": "function", "function": {"name": "f"}}),
        "tool_choice.function.name",
        "invalid_value",
    ),
    (chat(tool_choice=1), "tool_choice", TYPE),
    (chat(functions=[{"name": "f"}]), "functions", UNSUPPORTED),
    (chat(function_call="auto"), "function_call", UNSUPPORTED),
    (
        chat(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "string", "not": {}}},
            }
        ),
        "response_format.json_schema.schema",
        "unsupported_schema",
    ),
    (
        chat(response_format={"type": "json_schema", "json_schema": {}}),
        "response_format.json_schema.name",
        MISSING,
    ),
    (chat(response_format={"type": "xml"}), "response_format.type", "invalid_value"),
    (chat(response_format="text"), "response_format", TYPE),
    (chat(audio={"voice": "alloy", "format": "mp3"}), "audio", UNSUPPORTED),
    (chat(prediction={"type": "content", "content": "x"}), "prediction", UNSUPPORTED),
    (chat(modalities=["text", "audio"]), "modalities", UNSUPPORTED),
    (chat(modalities="text"), "modalities", TYPE),
    (chat(reasoning_effort="low"), "reasoning_effort", UNSUPPORTED),
    (chat(service_tier="flex"), "service_tier", UNSUPPORTED),
    (chat(service_tier=1), "service_tier", TYPE),
    (chat(store=True), "store", UNSUPPORTED),
    (chat(store="no"), "store", TYPE),
    (chat(web_search_options={}), "web_search_options", UNSUPPORTED),
    (chat(verbosity="low"), "verbosity", UNSUPPORTED),
    (chat(moderation={"model": "x"}), "moderation", UNSUPPORTED),
    (chat(prompt_cache_retention="24h"), "prompt_cache_retention", UNSUPPORTED),
    (chat(prompt_cache_options={"ttl": "1h"}), "prompt_cache_options", UNSUPPORTED),
    # informational fields of the wrong type
    (chat(user=5), "user", TYPE),
    (chat(metadata="x"), "metadata", TYPE),
    (chat(metadata={"k": 1}), "metadata.k", TYPE),
    (chat(parallel_tool_calls="yes"), "parallel_tool_calls", TYPE),
    (chat(safety_identifier=1), "safety_identifier", TYPE),
    (chat(prompt_cache_key=[]), "prompt_cache_key", TYPE),
    # fields the format does not define (here: legacy-completions-only ones, and inventions)
    (chat(foo=1), "foo", UNKNOWN),
    (chat(prompt="hi"), "prompt", UNKNOWN),
    (chat(echo=False), "echo", UNKNOWN),
    (chat(best_of=1), "best_of", UNKNOWN),
]


@pytest.mark.parametrize(("body", "param", "code"), CHAT_REJECTIONS)
def test_chat_rejections(body: dict[str, object], param: str, code: str) -> None:
    error = rejected(parse_chat_completions, body)
    assert (error.status, error.param, error.code) == (400, param, code)
    assert error.type == "invalid_request_error"
    assert param.split(".")[-1].split("[")[0] in error.message


COMPLETIONS_REJECTIONS: list[tuple[dict[str, object], str, str]] = [
    (comp(model=DELETE), "model", MISSING),
    (comp(prompt=DELETE), "prompt", MISSING),
    (comp(prompt=None), "prompt", MISSING),
    (comp(prompt=5), "prompt", TYPE),
    (comp(prompt={"text": "x"}), "prompt", TYPE),
    (comp(prompt=[]), "prompt", VALUE),
    (comp(prompt=["a", "b"]), "prompt", UNSUPPORTED),
    (comp(prompt=[1, 2, 3]), "prompt", UNSUPPORTED),
    (comp(prompt=[[1, 2], [3]]), "prompt", UNSUPPORTED),
    (comp(prompt=[["a"]]), "prompt", TYPE),
    (comp(prompt=[5, "a"]), "prompt", TYPE),
    (comp(prompt=[True]), "prompt", TYPE),
    (comp(echo=True), "echo", UNSUPPORTED),
    (comp(echo="no"), "echo", TYPE),
    (comp(best_of=2), "best_of", UNSUPPORTED),
    (comp(suffix="!"), "suffix", UNSUPPORTED),
    (comp(suffix=1), "suffix", TYPE),
    (comp(logprobs=6), "logprobs", VALUE),
    (comp(logprobs=True), "logprobs", TYPE),
    (comp(n=9), "n", VALUE),
    (comp(presence_penalty=1), "presence_penalty", UNSUPPORTED),
    (comp(max_tokens=0), "max_tokens", VALUE),
    (comp(temperature=-1), "temperature", VALUE),
    (comp(top_k=0.5), "top_k", TYPE),
    (comp(stop=[""]), "stop[0]", VALUE),
    (comp(stream_options={"include_usage": True}), "stream_options", VALUE),
    (comp(user=1), "user", TYPE),
    (comp(messages=[USER_HI]), "messages", UNKNOWN),
    (comp(max_completion_tokens=5), "max_completion_tokens", UNKNOWN),
    (comp(tools=[]), "tools", UNKNOWN),
    (comp(metadata={}), "metadata", UNKNOWN),
]


@pytest.mark.parametrize(("body", "param", "code"), COMPLETIONS_REJECTIONS)
def test_completions_rejections(body: dict[str, object], param: str, code: str) -> None:
    error = rejected(parse_completions, body)
    assert (error.status, error.param, error.code) == (400, param, code)


@pytest.mark.parametrize("body", [None, [], [chat()], "x", 1, 1.5, True])
@pytest.mark.parametrize("parse", [parse_chat_completions, parse_completions])
def test_non_object_body(parse: Callable[[object], object], body: object) -> None:
    error = rejected(parse, body)
    assert (error.status, error.param) == (400, None)
    assert "request body must be a JSON object" in error.message


def test_unsupported_message_says_what_is_supported() -> None:
    error = rejected(parse_chat_completions, chat(presence_penalty=1))
    assert "'presence_penalty'" in error.message and "0 or null" in error.message
    error = rejected(parse_chat_completions, user([IMAGE]))
    assert '"image_url"' in error.message and '"text"' in error.message
    error = rejected(parse_chat_completions, chat(foo=1))
    assert error.message == "Unrecognized request argument supplied: foo"


def test_huge_values_are_cut_short_in_messages() -> None:
    error = rejected(parse_chat_completions, chat(tools=[{"name": "x" * 10_000}]))
    assert len(error.message) < 300


@pytest.mark.parametrize("field", ["tools", "stop", "audio", "metadata", "logit_bias", "messages"])
def test_deeply_nested_values_are_plain_errors(field: str) -> None:
    deep = json.loads("[" * 900 + "]" * 900)  # about as deep as json.loads goes
    assert rejected(parse_chat_completions, chat(**{field: deep})).status == 400
    assert rejected(parse_completions, comp(prompt=deep)).param == "prompt"


def test_every_openai_sdk_field_is_recognised() -> None:
    """Each field the official SDK can send is handled (honoured, no-op or informational), so
    none is rejected merely for existing; a new SDK field fails here until we decide on it."""
    for parse, base, params in [
        (parse_chat_completions, chat(), chat_params.CompletionCreateParamsBase),
        (parse_completions, comp(), completions_params.CompletionCreateParamsBase),
    ]:
        for field in typing.get_type_hints(params):
            if field in base:
                continue
            try:
                parse({**base, field: None})
            except ApiError as error:  # pragma: no cover - the assertion is the point
                pytest.fail(f"{parse.__name__}: SDK field {field!r} rejected: {error.message}")


# ---- property: only ever ApiError ------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)

# Values that pass some checks and fail others, so that generated bodies get deep.
plausible = st.sampled_from(
    [
        *(None, 0, 1, 2, -1, 0.5, 2.0, 2**63, True, False, "", "x", "none", "auto"),
        *([], ["text"], ["a", "b"], {}, {"type": "text"}, {"include_usage": True}),
    ]
)
field_values = plausible | json_values
SDK_CHAT_FIELDS = typing.get_type_hints(chat_params.CompletionCreateParamsBase)
SDK_COMPLETION_FIELDS = typing.get_type_hints(completions_params.CompletionCreateParamsBase)
CHAT_FIELDS = sorted({*SDK_CHAT_FIELDS, "stream", "top_k", "foo"} - {"model", "messages"})
COMPLETION_FIELDS = sorted({*SDK_COMPLETION_FIELDS, "stream", "top_k"} - {"model", "prompt"})


def mostly(
    usual: st.SearchStrategy[object], other: st.SearchStrategy[object]
) -> st.SearchStrategy[object]:
    """``usual`` nine times in ten (``|`` would flatten nested choices into equal odds)."""
    return st.integers(0, 9).flatmap(lambda i: usual if i else other)


part = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "text", "text", "image_url", 5])},
    optional={"text": mostly(st.text(max_size=3), field_values)},
)


roles = st.sampled_from(["system", "developer", "user", "assistant"])
contents = st.text(max_size=5) | st.lists(part, min_size=1, max_size=2)
message = st.fixed_dictionaries(
    {  # mostly valid, so that the fields after messages get checked too
        "role": mostly(roles, field_values),
        "content": mostly(contents, field_values),
    },
    optional={"name": mostly(st.text(max_size=3), field_values), "tool_calls": field_values},
)
near_valid_chat = st.builds(
    lambda messages, extra: {"model": "m", "messages": messages, **extra},
    mostly(st.lists(message, min_size=1, max_size=2), field_values),
    st.dictionaries(st.sampled_from(CHAT_FIELDS), field_values, max_size=3),
)
near_valid_completion = st.builds(
    lambda prompt, extra: {"model": "m", "prompt": prompt, **extra},
    mostly(st.text(max_size=5) | st.lists(st.text(max_size=3), max_size=2), field_values),
    st.dictionaries(st.sampled_from(COMPLETION_FIELDS), field_values, max_size=3),
)

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check_only_api_errors(parse: Callable[[object], object], body: object) -> None:
    try:
        request = parse(body)
    except ApiError as error:
        assert error.status == 400
        assert error.param is None or isinstance(error.param, str)
        json.dumps(error.envelope())  # always serialisable
        return
    assert isinstance(request, ChatCompletionsRequest | CompletionsRequest)
    params = request.params
    assert 0 <= params.temperature <= 2 and 0 < params.top_p <= 1 and params.top_k >= 0
    assert params.max_tokens is None or params.max_tokens >= 1
    assert all(isinstance(s, str) and s for s in params.stop)


@FAST
@given(body=json_values)
def test_arbitrary_json_only_raises_api_error(body: object) -> None:
    check_only_api_errors(parse_chat_completions, body)
    check_only_api_errors(parse_completions, body)


@FAST
@given(body=near_valid_chat)
def test_near_valid_chat_only_raises_api_error(body: object) -> None:
    check_only_api_errors(parse_chat_completions, body)


@FAST
@given(body=near_valid_completion)
def test_near_valid_completion_only_raises_api_error(body: object) -> None:
    check_only_api_errors(parse_completions, body)


# ---- formatting, checked against the openai package's types ----------------------------------

ID, CREATED, MODEL = "chatcmpl-abc", 1_700_000_000, "llama-3.2-1b"
USAGE = Usage(prompt_tokens=12, completion_tokens=5)


def strictly(model_type: type[pydantic.BaseModel], obj: dict[str, object]) -> pydantic.BaseModel:
    """Validate with the SDK type and insist that no field is unknown to it (its models accept
    extra fields silently, which would hide a typo)."""
    validated = model_type.model_validate(obj)

    def walk(value: object) -> Iterator[pydantic.BaseModel]:
        if isinstance(value, pydantic.BaseModel):
            yield value
            for name in type(value).model_fields:
                yield from walk(getattr(value, name))
        elif isinstance(value, list):
            for item in value:
                yield from walk(item)

    for model in walk(validated):
        assert not model.model_extra, (
            f"{type(model).__name__} got unknown fields {model.model_extra}"
        )
    return validated


@pytest.mark.parametrize("reason", ["stop", "length"])
def test_chat_completion_shape(reason: typing.Literal["stop", "length"]) -> None:
    obj = chat_completion(ID, CREATED, MODEL, "Hello!", reason, USAGE)
    parsed = strictly(ChatCompletion, obj)
    assert isinstance(parsed, ChatCompletion)
    assert parsed.object == "chat.completion" and parsed.id == ID and parsed.created == CREATED
    (choice,) = parsed.choices
    assert (choice.index, choice.message.role, choice.message.content) == (0, "assistant", "Hello!")
    assert choice.finish_reason == reason and choice.logprobs is None
    assert parsed.usage is not None
    assert (
        parsed.usage.prompt_tokens,
        parsed.usage.completion_tokens,
        parsed.usage.total_tokens,
    ) == (12, 5, 17)


def test_chat_chunk_shapes() -> None:
    role = chat_role_chunk(ID, CREATED, MODEL)
    content = chat_content_chunk(ID, CREATED, MODEL, "Hel")
    finish = chat_finish_chunk(ID, CREATED, MODEL, "length")
    usage = chat_usage_chunk(ID, CREATED, MODEL, USAGE)
    for obj in (role, content, finish, usage):
        parsed = strictly(ChatCompletionChunk, obj)
        assert isinstance(parsed, ChatCompletionChunk)
        assert parsed.object == "chat.completion.chunk"
    assert "usage" not in role and "usage" not in content and "usage" not in finish
    assert role["choices"] == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
    ]
    assert content["choices"] == [
        {"index": 0, "delta": {"content": "Hel"}, "logprobs": None, "finish_reason": None}
    ]
    assert finish["choices"] == [
        {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
    ]
    assert usage["choices"] == [] and usage["usage"] == {
        "prompt_tokens": 12,
        "completion_tokens": 5,
        "total_tokens": 17,
    }


def test_chat_chunk_usage_field() -> None:
    with_null = chat_chunk(
        ID, CREATED, MODEL, delta={"content": "x"}, finish_reason=None, include_usage_field=True
    )
    assert "usage" in with_null and with_null["usage"] is None
    filled = chat_chunk(ID, CREATED, MODEL, delta={}, finish_reason="stop", usage=USAGE)
    assert filled["usage"] == {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
    strictly(ChatCompletionChunk, with_null)
    strictly(ChatCompletionChunk, filled)


@pytest.mark.parametrize("include_usage", [False, True])
def test_chat_stream_sequence(include_usage: bool) -> None:
    stream = ChatStream(ID, CREATED, MODEL, include_usage=include_usage)
    chunks = [
        stream.opening(),
        stream.content("Hi"),
        stream.content(" there"),
        *stream.closing("stop", USAGE),
    ]
    assert len(chunks) == (5 if include_usage else 4)
    for chunk in chunks:
        strictly(ChatCompletionChunk, chunk)
        assert chunk["id"] == ID and chunk["created"] == CREATED and chunk["model"] == MODEL
    if include_usage:
        assert all("usage" in c and c["usage"] is None for c in chunks[:-1])
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
            "prompt_tokens": 12,
            "completion_tokens": 5,
            "total_tokens": 17,
        }
    else:
        assert all("usage" not in c for c in chunks)


def test_completion_shape() -> None:
    obj = completion("cmpl-1", CREATED, MODEL, " a time", "length", USAGE)
    parsed = strictly(Completion, obj)
    assert isinstance(parsed, Completion)
    assert parsed.object == "text_completion"
    (choice,) = parsed.choices
    assert (choice.text, choice.index, choice.logprobs, choice.finish_reason) == (
        " a time",
        0,
        None,
        "length",
    )
    assert parsed.usage is not None and parsed.usage.total_tokens == 17


@pytest.mark.parametrize("include_usage", [False, True])
def test_completion_stream_sequence(include_usage: bool) -> None:
    stream = CompletionStream("cmpl-1", CREATED, MODEL, include_usage=include_usage)
    middle = stream.content(" a")
    closing = stream.closing("stop", USAGE)
    # The SDK's Completion type requires a finish_reason, but OpenAI streams null until the
    # end (the SDK builds stream chunks without validation); check that is the only gap.
    with pytest.raises(pydantic.ValidationError) as info:
        Completion.model_validate(middle)
    assert [e["loc"] for e in info.value.errors()] == [("choices", 0, "finish_reason")]
    assert middle["choices"] == [
        {"text": " a", "index": 0, "logprobs": None, "finish_reason": None}
    ]
    for chunk in closing:
        strictly(Completion, chunk)
    assert closing[0]["choices"] == [
        {"text": "", "index": 0, "logprobs": None, "finish_reason": "stop"}
    ]
    if include_usage:
        assert middle["usage"] is None and closing[0]["usage"] is None
        assert closing[1]["choices"] == [] and closing[1]["usage"] == {
            "prompt_tokens": 12,
            "completion_tokens": 5,
            "total_tokens": 17,
        }
    else:
        assert len(closing) == 1 and "usage" not in middle and "usage" not in closing[0]


def test_completion_chunk_direct() -> None:
    chunk = completion_chunk(
        "cmpl-1", CREATED, MODEL, text="x", finish_reason="length", usage=USAGE
    )
    strictly(Completion, chunk)
    strictly(Completion, completion_usage_chunk("cmpl-1", CREATED, MODEL, USAGE))


def test_cancelled_is_never_formatted() -> None:
    assert openai_finish_reason("stop") == "stop"
    assert openai_finish_reason("length") == "length"
    with pytest.raises(ValueError, match="cancelled"):
        openai_finish_reason("cancelled")
    with pytest.raises(ValueError):
        chat_completion(ID, CREATED, MODEL, "", "cancelled", USAGE)
    with pytest.raises(ValueError):
        ChatStream(ID, CREATED, MODEL, include_usage=False).closing("cancelled", USAGE)


def test_new_request_id() -> None:
    ids = {new_request_id("chatcmpl") for _ in range(100)}
    assert len(ids) == 100
    for request_id in ids:
        prefix, _, suffix = request_id.partition("-")
        assert prefix == "chatcmpl" and len(suffix) == 24 and int(suffix, 16) >= 0
    assert new_request_id("cmpl").startswith("cmpl-")


# ---- SSE and the error envelope --------------------------------------------------------------


def test_sse_event_framing() -> None:
    assert (
        sse_event({"a": 1, "b": [1, None], "c": "é\n"})
        == b'data: {"a":1,"b":[1,null],"c":"\xc3\xa9\\n"}\n\n'
    )
    assert sse_event("[DONE]") == SSE_DONE == b"data: [DONE]\n\n"
    assert sse_event("one\ntwo\r\nthree") == b"data: one\ndata: two\ndata: three\n\n"
    assert sse_event({"lone": "\ud800"}) == b'data: {"lone":"\\ud800"}\n\n'
    with pytest.raises(ValueError):
        sse_event({"x": math.nan})


def test_error_envelope() -> None:
    error = ApiError.unsupported("n", 2, supported="1 or null")
    assert error.envelope() == {
        "error": {
            "message": error.message,
            "type": "invalid_request_error",
            "param": "n",
            "code": "unsupported_parameter",
        }
    }
    assert str(error) == error.message
    assert "ApiError(status=400" in repr(error)
    not_found = ApiError.model_not_found("nope")
    assert (not_found.status, not_found.param, not_found.code) == (404, "model", "model_not_found")
    assert "nope" in not_found.message
    invalid = ApiError.invalid("messages[1].content", "bad")
    assert (invalid.status, invalid.param, invalid.message) == (400, "messages[1].content", "bad")
    for other, status in [
        (ApiError.unauthorized(), 401),
        (ApiError.over_capacity(), 429),
        (ApiError.server_error("boom"), 500),
        (ApiError.unavailable("no instance"), 503),
        (ApiError.timeout(), 504),
    ]:
        assert other.status == status
        assert set(typing.cast(dict[str, object], other.envelope()["error"])) == {
            "message",
            "type",
            "param",
            "code",
        }


# ---- the official client against a fake transport (no sockets) -------------------------------


def fake_server(request: typing.Any) -> typing.Any:  # HTTPX.Request -> HTTPX.Response
    """A minimal stand-in for the HTTP layer: parse, then answer with canned text."""
    body = json.loads(request.content)
    try:
        if request.url.path.endswith("/chat/completions"):
            chat_request = parse_chat_completions(body)
            if chat_request.model != "m":
                raise ApiError.model_not_found(chat_request.model)
            if not chat_request.stream:
                return HTTPX.Response(
                    200, json=chat_completion(ID, CREATED, "m", "Hi there", "stop", USAGE)
                )
            stream = ChatStream(ID, CREATED, "m", include_usage=chat_request.include_usage)
            chunks = [
                stream.opening(),
                stream.content("Hi"),
                stream.content(" there"),
                *stream.closing("stop", USAGE),
            ]
        else:
            comp_request = parse_completions(body)
            if not comp_request.stream:
                return HTTPX.Response(
                    200, json=completion("cmpl-1", CREATED, "m", " a time", "length", USAGE)
                )
            cstream = CompletionStream(
                "cmpl-1", CREATED, "m", include_usage=comp_request.include_usage
            )
            chunks = [
                cstream.content(" a"),
                cstream.content(" time"),
                *cstream.closing("length", USAGE),
            ]
    except ApiError as error:
        return HTTPX.Response(error.status, json=error.envelope())
    payload = b"".join(sse_event(c) for c in chunks) + SSE_DONE
    return HTTPX.Response(200, content=payload, headers={"content-type": "text/event-stream"})


@pytest.fixture
def client() -> Iterator[openai.OpenAI]:
    http = HTTPX.Client(transport=HTTPX.MockTransport(fake_server))
    with openai.OpenAI(
        api_key="k", base_url="http://skulk.test/v1", http_client=http, max_retries=0
    ) as c:
        yield c


def test_openai_client_chat(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="m",
        messages=[{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}],
        max_completion_tokens=8,
        temperature=0.2,
        top_p=0.9,
        seed=1,
        stop=["\n"],
        n=1,
        user="u",
        extra_body={"top_k": 20},
    )
    assert response.choices[0].message.content == "Hi there"
    assert response.usage is not None and response.usage.total_tokens == 17


def test_openai_client_chat_stream_with_usage(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hi there"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 5
    assert all(c.usage is None for c in chunks[:-1])


def test_openai_client_completions(client: openai.OpenAI) -> None:
    response = client.completions.create(model="m", prompt="Once upon", max_tokens=4)
    assert response.choices[0].text == " a time"
    chunks = list(
        client.completions.create(
            model="m", prompt=["Once upon"], stream=True, stream_options={"include_usage": True}
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == " a time"
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 17


def test_openai_client_sees_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], n=9)
    assert (bad.value.status_code, bad.value.param, bad.value.code) == (
        400,
        "n",
        "invalid_value",
    )
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(
            model="m",
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "http://x"}}],
                }
            ],
        )
    assert bad.value.param == "messages[0].content[0].type"
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert missing.value.code == "model_not_found"


def test_names_a_client_chose_are_echoed_short() -> None:
    """A megabyte-long field name or model is named, not sent back in full."""
    huge = "k" * 100_000
    err = rejected(parse_chat_completions, {**chat(), huge: 1})
    assert err.code == "unknown_parameter"
    assert err.param is not None and len(err.param) <= 80 and err.param.startswith("kkk")
    assert len(err.message) < 200
    body = {"model": "m", "prompt": "x", "stream": True, "stream_options": {huge: 1}}
    err = rejected(parse_completions, body)
    assert (
        err.param is not None and err.param.startswith("stream_options.") and len(err.param) <= 80
    )
    assert len(ApiError.model_not_found(huge).message) < 200


@pytest.mark.parametrize("value", [2**63, 2**70, -(2**63) - 1, 10**30])
@pytest.mark.parametrize("field", ["seed", "max_tokens", "max_completion_tokens", "top_k"])
def test_integers_beyond_64_bits_are_range_errors(field: str, value: int) -> None:
    err = rejected(parse_chat_completions, chat(**{field: value}))
    assert (err.param, err.code) == (field, "invalid_value")

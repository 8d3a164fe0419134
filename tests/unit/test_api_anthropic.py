"""Anthropic's Messages format: the parser's strictness, stop reasons, the renderer's events,
the app's routes (through a real router to a scripted service) and the official client reading
what we send."""

from __future__ import annotations

import importlib
import json
import typing
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from skulk.api._anthropic import (
    COUNT_PARAMS,
    MAX_STOP_SEQUENCES,
    parse_count_tokens,
    parse_messages,
    stop_reason,
)
from skulk.api._errors import ApiError
from skulk.api._sse import sse_frame
from skulk.wire.runner import ChatMessage, ChatPrompt, GenerationEnd, SamplingParams, Usage
from skulk.worker import RequestFailure
from tests.unit.test_api_edge import MODEL, FakeService, app_for, call

HTTPX = importlib.import_module(
    anthropic.DefaultHttpxClient.__mro__[1].__module__.partition(".")[0]
)
USAGE = Usage(prompt_tokens=5, completion_tokens=2)
STOP = GenerationEnd("stop", USAGE)
LENGTH = GenerationEnd("length", USAGE)
USER: Any = [{"role": "user", "content": "hi"}]


def body(**fields: object) -> dict[str, object]:
    return {"model": "m", "max_tokens": 8, "messages": USER, **fields}


def refused(raw: object) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_messages(raw)
    assert caught.value.status == 400
    return caught.value


# ---- parsing ---------------------------------------------------------------------------------


def test_minimal_request() -> None:
    req = parse_messages(body())
    assert req.prompt == ChatPrompt((ChatMessage("user", "hi"),))
    assert req.params == SamplingParams(max_tokens=8)
    assert not req.stream and req.format.prompt_param == "messages"


def test_system_blocks_sampling_and_stops() -> None:
    req = parse_messages(
        body(
            system=[{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}
                    ],
                },
                {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"},
            ],
            temperature=0,
            top_p=0.5,
            top_k=3,
            stop_sequences=["\n\nHuman:", "END"],
            metadata={"user_id": "u1"},
            stream=True,
            tools=[],
            tool_choice={"type": "auto"},
            thinking={"type": "disabled"},
            service_tier="auto",
        )
    )
    assert req.prompt.messages == (  # type: ignore[union-attr]
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "a"),
        ChatMessage("assistant", "b"),
        ChatMessage("user", "c"),
    )
    assert req.params == SamplingParams(
        temperature=0.0, top_p=0.5, top_k=3, max_tokens=8, stop=("\n\nHuman:", "END")
    )
    assert req.stream


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"max_tokens": None}, "max_tokens", "missing_required_parameter"),
        ({"max_tokens": 0}, "max_tokens", "invalid_value"),
        ({"temperature": 1.5}, "temperature", "invalid_value"),
        ({"top_k": -1}, "top_k", "invalid_value"),
        ({"tools": [{"name": "f"}]}, "tools[0].input_schema", "invalid_type"),
        ({"tool_choice": {"type": "any"}}, "tool_choice", "invalid_value"),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 1024}},
            "thinking",
            "unsupported_parameter",
        ),
        ({"mcp_servers": [{"url": "x"}]}, "mcp_servers", "unsupported_parameter"),
        ({"container": "c1"}, "container", "unsupported_parameter"),
        ({"speed": "fast"}, "speed", "unsupported_parameter"),
        ({"metadata": {"other": "x"}}, "metadata.other", "unknown_parameter"),
        ({"stop_sequences": "x"}, "stop_sequences", "invalid_type"),
        ({"stop_sequences": [""]}, "stop_sequences[0]", "invalid_value"),
        ({"stop_sequences": ["x"] * (MAX_STOP_SEQUENCES + 1)}, "stop_sequences", "invalid_value"),
        ({"n": 2}, "n", "unknown_parameter"),
        ({"system": [{"type": "image"}]}, "system[0].type", "unsupported_parameter"),
        ({"messages": []}, "messages", "invalid_value"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role", "invalid_value"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages[0].content[0].type",
            "unsupported_parameter",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f"}]}
                ]
            },
            "messages[0].content[0].type",
            "unsupported_parameter",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": "Sure,"},
                ]
            },
            "messages[1].role",
            "unsupported_parameter",
        ),
    ],
)
def test_refused_fields_are_named(fields: dict[str, object], param: str, code: str) -> None:
    err = refused(body(**fields))
    assert (err.param, err.code) == (param, code)
    assert param in err.message  # Anthropic's envelope has no "param": the message names it


def test_count_tokens_takes_prompt_fields_only() -> None:
    req = parse_count_tokens({"model": "m", "messages": USER, "system": "s"})
    assert req.prompt.messages[0] == ChatMessage("system", "s")  # type: ignore[union-attr]
    assert req.params == COUNT_PARAMS == SamplingParams(temperature=0.0, max_tokens=1)
    with pytest.raises(ApiError) as caught:
        parse_count_tokens({"model": "m", "messages": USER, "max_tokens": 3})
    assert (caught.value.param, caught.value.code) == ("max_tokens", "unknown_parameter")


# ---- rendering -------------------------------------------------------------------------------


def test_stop_reasons() -> None:
    assert stop_reason("length") == "max_tokens"
    assert stop_reason("stop") == "end_turn"
    assert stop_reason("stop", "END") == "stop_sequence"
    with pytest.raises(ValueError, match="cancelled"):
        stop_reason("cancelled")


def test_whole_message() -> None:
    r = parse_messages(body()).format.renderer("m")
    message = r.whole("Hello", LENGTH)
    assert message["id"].startswith("msg_")  # type: ignore[attr-defined]
    assert {k: v for k, v in message.items() if k != "id"} == {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": "Hello"}],
        "model": "m",
        "stop_reason": "max_tokens",
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 2},
    }


def test_stream_events_in_order() -> None:
    r = parse_messages(body(stream=True)).format.renderer("m")
    events = [*r.opening(), *r.delta("Hel"), *r.delta("lo"), *r.closing(STOP)]
    for e in events:
        assert isinstance(e.data, dict) and e.name == e.data["type"]
    datas = [typing.cast(dict[str, Any], e.data) for e in events]
    assert [d["type"] for d in datas] == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert datas[0]["message"]["content"] == [] and datas[0]["message"]["stop_reason"] is None
    assert datas[3]["delta"] == {"type": "text_delta", "text": "Hel"}
    assert datas[6]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert datas[6]["usage"] == {"input_tokens": 5, "output_tokens": 2}


def test_failure_is_an_error_event() -> None:
    r = parse_messages(body(stream=True)).format.renderer("m")
    (event,) = r.failure(ApiError.server_error("boom", code="runner_crashed"))
    assert event.name == "error"
    assert event.data == {"type": "error", "error": {"type": "api_error", "message": "boom"}}
    assert sse_frame(event).startswith(b"event: error\ndata: ")


# ---- the official client reads what we render ------------------------------------------------


def fake_server(http_request: Any) -> Any:
    path = http_request.url.path
    try:
        if path.endswith("/count_tokens"):
            parse_count_tokens(json.loads(http_request.content))
            return HTTPX.Response(200, json={"input_tokens": 5})
        req = parse_messages(json.loads(http_request.content))
    except ApiError as err:
        from skulk.api._error_formats import anthropic_envelope

        return HTTPX.Response(err.status, json=anthropic_envelope(err))
    r = req.format.renderer(req.model)
    if not req.stream:
        return HTTPX.Response(200, json=r.whole("Hello", STOP))
    events = [*r.opening(), *r.delta("Hel"), *r.delta("lo"), *r.closing(STOP)]
    payload = b"".join(sse_frame(e) for e in events)
    return HTTPX.Response(200, content=payload, headers={"content-type": "text/event-stream"})


@pytest.fixture
def client() -> Iterator[anthropic.Anthropic]:
    http = HTTPX.Client(transport=HTTPX.MockTransport(fake_server))
    with anthropic.Anthropic(
        api_key="k", base_url="http://skulk.test", http_client=http, max_retries=0
    ) as c:
        yield c


def test_official_client_stream(client: anthropic.Anthropic) -> None:
    with client.messages.stream(model="m", max_tokens=8, messages=USER) as stream:
        text = list(stream.text_stream)
        final = stream.get_final_message()
    assert text == ["Hel", "lo"]
    assert final.content[0].text == "Hello"  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (5, 2)


def test_official_client_create_and_errors(client: anthropic.Anthropic) -> None:
    m = client.messages.create(model="m", max_tokens=8, messages=USER)
    assert m.content[0].text == "Hello"  # type: ignore[union-attr]
    with pytest.raises(anthropic.BadRequestError, match="thinking"):
        client.messages.create(
            model="m",
            max_tokens=8,
            messages=USER,
            thinking={"type": "enabled", "budget_tokens": 1024},
        )


# ---- the routes ------------------------------------------------------------------------------


async def test_route_mid_stream_failure_ends_with_error_event() -> None:
    fake = FakeService(["Hel", RequestFailure("runner_crashed", "gone")])
    async with app_for(fake).test_app() as test_app:
        response = await call(
            test_app.test_client(),
            "POST",
            "/v1/messages",
            {"model": MODEL, "max_tokens": 4, "messages": USER, "stream": True},
            headers={"content-type": "application/json", "anthropic-version": "2023-06-01"},
        )
    assert response.status_code == 200
    frames = [f for f in (await response.get_data()).decode().split("\n\n") if f]
    names = [f.split("\n")[0].removeprefix("event: ") for f in frames]
    assert names == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "error",
    ]
    error = json.loads(frames[-1].split("\n")[1].removeprefix("data: "))
    assert error["type"] == "error" and error["error"]["type"] == "api_error"
    assert fake.closed == 1


async def test_route_errors_in_anthropic_envelope() -> None:
    fake = FakeService([RequestFailure("prompt_too_long", "too long")])
    async with app_for(fake).test_app() as test_app:
        c = test_app.test_client()
        long = await call(c, "POST", "/v1/messages", body(model=MODEL))
        missing = await call(c, "POST", "/v1/messages", body(model="nope"))
        bad = await call(c, "POST", "/v1/messages", body(model=MODEL, top_k="x"))
    assert long.status_code == 400
    assert json.loads(await long.get_data()) == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "too long",
            "request_id": long.headers["x-request-id"],
        },
    }
    assert missing.status_code == 404
    assert json.loads(await missing.get_data())["error"]["type"] == "not_found_error"
    assert bad.status_code == 400
    assert "top_k" in json.loads(await bad.get_data())["error"]["message"]


class CountingService(FakeService):
    """Counts a prompt as the runner's ``Tokenize`` would: remembers what it was asked."""

    def __init__(self, script: list[object]) -> None:
        super().__init__(script)
        self.counted: list[Any] = []

    async def count_tokens(self, prompt: Any) -> int:
        self.counted.append(prompt)
        return 11


async def test_count_tokens_route_counts_through_the_runner() -> None:
    fake = CountingService([])
    async with app_for(fake).test_app() as test_app:
        response = await call(
            test_app.test_client(),
            "POST",
            "/v1/messages/count_tokens",
            {"model": MODEL, "messages": USER},
        )
    assert response.status_code == 200
    assert json.loads(await response.get_data()) == {"input_tokens": 11}
    assert fake.started == 0  # nothing generated: the runner only tokenizes
    assert len(fake.counted) == 1

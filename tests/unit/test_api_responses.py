"""OpenAI's Responses format: the parser's strictness, the renderer's events, the app's route
(through a real router to a scripted service), and the official client reading what we send."""

from __future__ import annotations

import importlib
import json
import typing
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from skulk.api._errors import ApiError
from skulk.api._request import GenerateRequest
from skulk.api._responses_format import ResponsesFormat
from skulk.api._responses_parse import parse_responses
from skulk.api._sse import sse_frame
from skulk.wire.runner import ChatMessage, ChatPrompt, GenerationEnd, SamplingParams, Usage
from skulk.worker import RequestFailure
from tests.unit.test_api_edge import MODEL, FakeService, app_for, call

HTTPX = importlib.import_module(openai.DefaultHttpxClient.__mro__[1].__module__.partition(".")[0])
USAGE = Usage(prompt_tokens=5, completion_tokens=2)
STOP = GenerationEnd("stop", USAGE)
LENGTH = GenerationEnd("length", USAGE)


def body(**fields: object) -> dict[str, object]:
    return {"model": "m", "input": "hi", **fields}


def refused(raw: object) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_responses(raw)
    assert caught.value.status == 400
    return caught.value


# ---- parsing ---------------------------------------------------------------------------------


def test_string_input_and_defaults() -> None:
    req = parse_responses(body())
    assert req.model == "m"
    assert req.prompt == ChatPrompt((ChatMessage("user", "hi"),))
    assert req.params == SamplingParams()
    assert not req.stream
    assert req.format.prompt_param == "input"


def test_instructions_messages_and_sampling() -> None:
    req = parse_responses(
        body(
            instructions="Be brief.",
            input=[
                {"role": "developer", "content": "Rules."},
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "a"},
                        {"type": "input_text", "text": "b"},
                    ],
                },
                {
                    "role": "assistant",
                    "id": "msg_1",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "ok", "annotations": []}],
                },
            ],
            max_output_tokens=7,
            temperature=0.5,
            top_p=0.9,
            stream=True,
            store=False,
            metadata={"k": "v"},
            tools=[],
            tool_choice="auto",
            truncation="disabled",
            text={"format": {"type": "text"}},
            user="alice",
        )
    )
    assert req.prompt.messages == (  # type: ignore[union-attr]
        ChatMessage("system", "Be brief."),
        ChatMessage("system", "Rules."),
        ChatMessage("user", "ab"),
        ChatMessage("assistant", "ok"),
    )
    assert req.params == SamplingParams(temperature=0.5, top_p=0.9, max_tokens=7)
    assert req.stream
    assert isinstance(req.format, ResponsesFormat)
    assert req.format.metadata == {"k": "v"} and req.format.user == "alice"


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"tools": [{"type": "function", "name": "f"}]}, "tools", "unsupported_parameter"),
        ({"tool_choice": "required"}, "tool_choice", "unsupported_parameter"),
        ({"previous_response_id": "resp_1"}, "previous_response_id", "unsupported_parameter"),
        ({"conversation": "conv_1"}, "conversation", "unsupported_parameter"),
        ({"reasoning": {"effort": "high"}}, "reasoning", "unsupported_parameter"),
        ({"include": ["reasoning.encrypted_content"]}, "include[0]", "unsupported_parameter"),
        ({"background": True}, "background", "unsupported_parameter"),
        ({"store": True}, "store", "unsupported_parameter"),
        ({"top_logprobs": 21}, "top_logprobs", "invalid_value"),
        ({"truncation": "auto"}, "truncation", "unsupported_parameter"),
        ({"prompt": {"id": "p"}}, "prompt", "unsupported_parameter"),
        ({"max_tool_calls": 2}, "max_tool_calls", "unsupported_parameter"),
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"not": {}}}}},
            "text.format.schema",
            "unsupported_schema",
        ),
        (
            {"text": {"format": {"type": "json_schema", "schema": {}}}},
            "text.format.name",
            "missing_required_parameter",
        ),
        ({"text": {"format": {"type": "yaml"}}}, "text.format.type", "invalid_value"),
        ({"text": {"verbosity": "low"}}, "text.verbosity", "unsupported_parameter"),
        ({"service_tier": "flex"}, "service_tier", "unsupported_parameter"),
        ({"seed": 1}, "seed", "unknown_parameter"),
        ({"max_output_tokens": 0}, "max_output_tokens", "invalid_value"),
        ({"temperature": 2.5}, "temperature", "invalid_value"),
        ({"top_p": 0}, "top_p", "invalid_value"),
        ({"instructions": 3}, "instructions", "invalid_type"),
        ({"stream_options": {}}, "stream_options", "invalid_value"),
        (
            {"stream": True, "stream_options": {"include_obfuscation": True}},
            "stream_options.include_obfuscation",
            "unsupported_parameter",
        ),
        ({"input": []}, "input", "invalid_value"),
        ({"input": 3}, "input", "invalid_type"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "invalid_value"),
        (
            {"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]},
            "input[0].type",
            "unsupported_parameter",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            "input[0].content[0].type",
            "unsupported_parameter",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}]},
            "input[0].content[0].type",
            "unsupported_parameter",
        ),
        ({"input": [{"role": "user"}]}, "input[0].content", "missing_required_parameter"),
        ({"model": None}, "model", "missing_required_parameter"),
    ],
)
def test_refused_fields_are_named(fields: dict[str, object], param: str, code: str) -> None:
    err = refused(body(**fields))
    assert (err.param, err.code) == (param, code)


def test_a_non_object_body_is_refused() -> None:
    assert refused([1]).code == "invalid_body"


# ---- rendering -------------------------------------------------------------------------------


def request(**fields: object) -> GenerateRequest:
    return parse_responses(body(**fields))


def stream_events(end: GenerationEnd) -> list[dict[str, Any]]:
    r = request(stream=True).format.renderer("m")
    events = [*r.opening(), *r.delta("Hel"), *r.delta("lo"), *r.closing(end)]
    for e in events:
        assert isinstance(e.data, dict) and e.name == e.data["type"]
    return [dict(typing.cast(dict[str, Any], e.data)) for e in events]


def test_stream_events_order_and_sequence_numbers() -> None:
    events = stream_events(STOP)
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(10))
    assert events[6]["text"] == "Hello"
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["incomplete_details"] is None
    assert final["usage"]["input_tokens"] == 5 and final["usage"]["total_tokens"] == 7
    assert final["output"][0]["content"][0]["text"] == "Hello"
    assert events[0]["response"]["status"] == "in_progress"


def test_the_token_limit_makes_an_incomplete_response() -> None:
    events = stream_events(LENGTH)
    assert events[-1]["type"] == "response.incomplete"
    final = events[-1]["response"]
    assert final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"][0]["status"] == "incomplete"
    whole = request().format.renderer("m").whole("x", LENGTH)
    assert (whole["status"], whole["incomplete_details"]) == (
        "incomplete",
        {"reason": "max_output_tokens"},
    )


def test_failure_sends_error_then_response_failed() -> None:
    r = request(stream=True).format.renderer("m")
    r.opening()
    r.delta("Hel")
    events = r.failure(ApiError.server_error("boom", code="runner_crashed"))
    assert [e.name for e in events] == ["error", "response.failed"]
    error = typing.cast(dict[str, Any], events[0].data)
    assert (error["code"], error["message"], error["sequence_number"]) == (
        "runner_crashed",
        "boom",
        5,
    )
    failed = typing.cast(dict[str, Any], events[1].data)["response"]
    assert failed["status"] == "failed"
    assert failed["error"] == {"code": "server_error", "message": "boom"}


def test_sse_frame_names_the_event() -> None:
    event = request(stream=True).format.renderer("m").opening()[0]
    frame = sse_frame(event).decode()
    assert frame.startswith("event: response.created\ndata: {")
    assert frame.endswith("\n\n")


# ---- the official client reads what we render ------------------------------------------------


def fake_server(end: GenerationEnd) -> Any:
    def handle(http_request: Any) -> Any:
        try:
            req = parse_responses(json.loads(http_request.content))
        except ApiError as err:
            return HTTPX.Response(err.status, json=err.envelope())
        r = req.format.renderer(req.model)
        if not req.stream:
            return HTTPX.Response(200, json=r.whole("Hello", end))
        events = [*r.opening(), *r.delta("Hel"), *r.delta("lo"), *r.closing(end)]
        payload = b"".join(sse_frame(e) for e in events)
        return HTTPX.Response(200, content=payload, headers={"content-type": "text/event-stream"})

    return handle


@pytest.fixture
def client() -> Iterator[openai.OpenAI]:
    http = HTTPX.Client(transport=HTTPX.MockTransport(fake_server(STOP)))
    with openai.OpenAI(
        api_key="k", base_url="http://skulk.test/v1", http_client=http, max_retries=0
    ) as c:
        yield c


def test_official_client_create(client: openai.OpenAI) -> None:
    r = client.responses.create(model="m", input="hi", instructions="x", metadata={"a": "b"})
    assert r.output_text == "Hello"
    assert r.status == "completed"
    assert r.usage is not None and r.usage.output_tokens == 2
    assert r.instructions == "x" and r.metadata == {"a": "b"}


def test_official_client_stream_final_response(client: openai.OpenAI) -> None:
    with client.responses.stream(model="m", input="hi") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert deltas == ["Hel", "lo"]
    assert final.output_text == "Hello"
    assert final.usage is not None and final.usage.total_tokens == 7


def test_official_client_sees_a_refused_field(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="m", input="hi", reasoning={"effort": "high"})
    assert caught.value.body["param"] == "reasoning"  # type: ignore[index]


# ---- the route -------------------------------------------------------------------------------


async def test_route_mid_stream_failure_is_an_error_then_failed() -> None:
    fake = FakeService(["Hel", RequestFailure("runner_crashed", "gone")])
    async with app_for(fake).test_app() as test_app:
        response = await call(
            test_app.test_client(),
            "POST",
            "/v1/responses",
            {"model": MODEL, "input": "hi", "stream": True},
        )
    assert response.status_code == 200 and response.mimetype == "text/event-stream"
    frames = [f for f in (await response.get_data()).decode().split("\n\n") if f]
    names = [f.split("\n")[0].removeprefix("event: ") for f in frames]
    assert names[-2:] == ["error", "response.failed"]
    assert json.loads(frames[-2].split("\n")[1].removeprefix("data: "))["code"] == "runner_crashed"
    assert fake.closed == 1


async def test_route_prompt_failure_names_input() -> None:
    fake = FakeService([RequestFailure("prompt_too_long", "too long")])
    async with app_for(fake).test_app() as test_app:
        response = await call(
            test_app.test_client(), "POST", "/v1/responses", {"model": MODEL, "input": "hi"}
        )
    assert response.status_code == 400
    err = json.loads(await response.get_data())["error"]
    assert (err["param"], err["code"]) == ("input", "prompt_too_long")


async def test_route_whole_response_and_unknown_model() -> None:
    fake = FakeService()
    async with app_for(fake).test_app() as test_app:
        c = test_app.test_client()
        ok = await call(c, "POST", "/v1/responses", {"model": MODEL, "input": "hi"})
        missing = await call(c, "POST", "/v1/responses", {"model": "nope", "input": "hi"})
    whole = json.loads(await ok.get_data())
    assert whole["output"][0]["content"][0]["text"] == "Hello"
    assert whole["usage"]["output_tokens"] == 2
    assert ok.headers["x-skulk-instance"] == "i1"
    assert missing.status_code == 404
    assert json.loads(await missing.get_data())["error"]["code"] == "model_not_found"

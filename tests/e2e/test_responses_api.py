"""OpenAI's Responses API (``POST /v1/responses``) of a real server, driven by the official
``openai`` client's ``responses.create`` and ``responses.stream``."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from skulk.harness import NodeProcess

MODEL = "skulk-demo"


def client(server: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def chat_text(server: NodeProcess, messages: list[dict[str, str]], max_tokens: int) -> str:
    reply = client(server).chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=max_tokens,
        temperature=0,
    )
    return reply.choices[0].message.content or ""


def test_create_with_a_string_input(server: NodeProcess) -> None:
    r = client(server).responses.create(
        model=MODEL, input="Hello there", max_output_tokens=8, temperature=0
    )
    assert r.object == "response"
    assert r.id.startswith("resp_")
    assert r.status in ("completed", "incomplete")
    assert r.model == MODEL
    assert r.usage is not None
    assert r.usage.input_tokens > 0
    assert 1 <= r.usage.output_tokens <= 8
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    message = r.output[0]
    assert message.type == "message" and message.role == "assistant"
    # Greedy: the same prompt through chat completions gives the same text.
    assert r.output_text == chat_text(server, [{"role": "user", "content": "Hello there"}], 8)
    if r.status == "incomplete":
        assert r.incomplete_details is not None
        assert r.incomplete_details.reason == "max_output_tokens"


def test_instructions_and_a_message_list_are_the_chat_prompt(server: NodeProcess) -> None:
    items: Any = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "Tell me more"}]},
    ]
    r = client(server).responses.create(
        model=MODEL,
        instructions="Be brief.",
        input=items,
        max_output_tokens=10,
        temperature=0,
        metadata={"run": "e2e"},
    )
    assert r.instructions == "Be brief."
    assert r.metadata == {"run": "e2e"}
    expected = chat_text(
        server,
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Tell me more"},
        ],
        10,
    )
    assert r.output_text == expected


def test_stream_gives_the_same_text_and_usage(server: NodeProcess) -> None:
    """The demo model never ends a greedy answer by itself, so the limit ends it: the stream
    ends with ``response.incomplete``, as OpenAI's does (the client's ``get_final_response``
    wants ``response.completed``; the unit tests drive it with a finished response)."""
    c = client(server)
    whole = c.responses.create(
        model=MODEL, input="Count with me", max_output_tokens=12, temperature=0
    )
    assert whole.status == "incomplete"
    with c.responses.stream(
        model=MODEL, input="Count with me", max_output_tokens=12, temperature=0
    ) as stream:
        events = list(stream)
    types = [event.type for event in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    last = events[-1]
    assert last.type == "response.incomplete"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    assert last.response.output_text == whole.output_text
    assert last.response.usage is not None and whole.usage is not None
    assert last.response.usage.output_tokens == whole.usage.output_tokens == 12


def test_wire_events_are_named_and_numbered(server: NodeProcess) -> None:
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 4, "stream": True}
    with httpx.stream("POST", server.url + "/v1/responses", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    names = [line[len("event: ") :] for line in lines if line.startswith("event: ")]
    datas = [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: ")]
    assert [d["type"] for d in datas] == names
    assert [d["sequence_number"] for d in datas] == list(range(len(datas)))
    deltas = [n for n in names if n == "response.output_text.delta"]
    assert names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        names[-1],
    ]
    assert names[-1] in ("response.completed", "response.incomplete")
    assert datas[-1]["response"]["usage"]["output_tokens"] >= 1


def test_refused_field_and_unknown_model(server: NodeProcess) -> None:
    c = client(server)
    with pytest.raises(openai.BadRequestError) as bad:
        c.responses.create(model=MODEL, input="hi", previous_response_id="resp_123")
    assert bad.value.body["param"] == "previous_response_id"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="store"):
        c.responses.create(model=MODEL, input="hi", store=True)
    with pytest.raises(openai.NotFoundError):
        c.responses.create(model="no-such-model", input="hi")

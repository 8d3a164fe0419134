"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``) of a real
server, driven by the official ``anthropic`` client."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import openai
import pytest

from skulk.harness import NodeProcess

MODEL = "skulk-demo"
GREEDY = {"temperature": 0}  # this client version has no temperature argument


def client(server: NodeProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def chat_text(server: NodeProcess, messages: list[dict[str, str]], max_tokens: int) -> str:
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    reply = c.chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=max_tokens,
        temperature=0,
    )
    return reply.choices[0].message.content or ""


def test_create_matches_chat_completions(server: NodeProcess) -> None:
    m = client(server).messages.create(
        model=MODEL,
        max_tokens=10,
        system="Be brief.",
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hello there"}]}],
        extra_body=GREEDY,
    )
    assert m.type == "message" and m.role == "assistant"
    assert m.id.startswith("msg_")
    assert m.model == MODEL
    assert m.stop_reason == "max_tokens"  # the demo model never ends a greedy answer itself
    assert m.stop_sequence is None
    assert m.usage.input_tokens > 0 and m.usage.output_tokens == 10
    assert [b.type for b in m.content] == ["text"]
    expected = chat_text(
        server,
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}],
        10,
    )
    assert m.content[0].text == expected  # type: ignore[union-attr]


def test_stream_text_and_final_message(server: NodeProcess) -> None:
    c = client(server)
    whole = c.messages.create(
        model=MODEL, max_tokens=12, messages=[{"role": "user", "content": "Hi"}], extra_body=GREEDY
    )
    with c.messages.stream(
        model=MODEL, max_tokens=12, messages=[{"role": "user", "content": "Hi"}], extra_body=GREEDY
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text  # type: ignore[union-attr]
    assert final.content[0].text == text  # type: ignore[union-attr]
    assert final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens == whole.usage.input_tokens  # from message_delta


def test_wire_events_in_order(server: NodeProcess) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
    }
    headers = {"anthropic-version": "2023-06-01", "x-api-key": "anything"}
    with httpx.stream(
        "POST", server.url + "/v1/messages", json=body, headers=headers, timeout=60
    ) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line]
    names = [line[len("event: ") :] for line in lines if line.startswith("event: ")]
    datas = [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: ")]
    assert [d["type"] for d in datas] == names
    deltas = [n for n in names if n == "content_block_delta"]
    assert deltas
    assert names == [
        "message_start",
        "content_block_start",
        "ping",
        *deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert datas[names.index("message_delta")]["usage"]["output_tokens"] == 4


def test_stop_sequence_cuts_the_text(server: NodeProcess) -> None:
    c = client(server)
    messages: Any = [{"role": "user", "content": "The"}]
    base = c.messages.create(model=MODEL, max_tokens=30, messages=messages, extra_body=GREEDY)
    text = base.content[0].text  # type: ignore[union-attr]
    if len(text) < 6:
        pytest.fail(f"greedy demo output too short to pick a stop sequence: {text!r}")
    stop = text[3:5]
    cut = c.messages.create(
        model=MODEL,
        max_tokens=30,
        messages=messages,
        stop_sequences=[stop],
        extra_body=GREEDY,
    )
    assert cut.content[0].text == text[: text.index(stop)]  # type: ignore[union-attr]
    # The runner's stop matcher says which stop ended it.
    assert cut.stop_reason == "stop_sequence"
    assert cut.stop_sequence == stop


def test_count_tokens_is_the_prompt_the_model_sees(server: NodeProcess) -> None:
    c = client(server)
    messages: Any = [{"role": "user", "content": "Count these tokens"}]
    counted = c.messages.count_tokens(model=MODEL, system="Be brief.", messages=messages)
    served = c.messages.create(
        model=MODEL,
        max_tokens=1,
        system="Be brief.",
        messages=messages,
        extra_body=GREEDY,
    )
    assert counted.input_tokens == served.usage.input_tokens > 0


def test_errors_in_anthropic_shape(server: NodeProcess) -> None:
    c = client(server)
    with pytest.raises(anthropic.BadRequestError, match="tools"):
        c.messages.create(
            model=MODEL,
            max_tokens=4,
            messages=[{"role": "user", "content": "hi"}],
            tools=[{"name": "f g", "input_schema": {"type": "object"}}],
        )
    with pytest.raises(anthropic.NotFoundError) as missing:
        c.messages.create(
            model="no-such-model", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
    assert missing.value.body == {
        "type": "error",
        "error": {
            "type": "not_found_error",
            "message": "The model 'no-such-model' does not exist.",
            "request_id": missing.value.response.headers["x-request-id"],
        },
    }
    r = server.post(
        "/v1/messages", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
    )
    assert r.status_code == 400
    assert "max_tokens" in r.json()["error"]["message"]

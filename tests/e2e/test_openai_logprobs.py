"""Log-probabilities through the official ``openai`` client against a real server: chat
(``logprobs`` + ``top_logprobs``, plain and streamed) and legacy completions (``logprobs``)."""

from __future__ import annotations

import math

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from skulk.harness import NodeProcess

MODEL = "skulk-demo"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me a story"}]


def client(server: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_chat_logprobs_plain(server: NodeProcess) -> None:
    reply = client(server).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=10, temperature=0, logprobs=True, top_logprobs=3
    )
    choice = reply.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    content = choice.logprobs.content
    assert reply.usage is not None
    # one entry per emitted token (an end-of-sequence token is not emitted)
    assert len(content) in (reply.usage.completion_tokens, reply.usage.completion_tokens - 1)
    assert content
    for entry in content:
        assert entry.logprob <= 0 and math.isfinite(entry.logprob)
        assert entry.bytes is not None and bytes(entry.bytes).decode("utf-8", "backslashreplace")
        assert len(entry.top_logprobs) == 3
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True)
        # greedy: the chosen token is the likeliest one
        assert entry.top_logprobs[0].token == entry.token
        assert entry.logprob == pytest.approx(values[0])
    text = b"".join(bytes(e.bytes or []) for e in content).decode("utf-8", "replace")
    assert text.strip() == (choice.message.content or "").strip()


def test_chat_logprobs_streamed_match_plain(server: NodeProcess) -> None:
    ask = dict(model=MODEL, messages=MESSAGES, max_tokens=10, temperature=0, logprobs=True)
    plain = client(server).chat.completions.create(**ask, top_logprobs=2)  # type: ignore[call-overload]
    stream = client(server).chat.completions.create(**ask, top_logprobs=2, stream=True)  # type: ignore[call-overload]
    streamed = []
    for chunk in stream:
        for choice in chunk.choices:
            if choice.logprobs is not None and choice.logprobs.content:
                streamed += choice.logprobs.content
    want = plain.choices[0].logprobs.content
    assert [e.token for e in streamed] == [e.token for e in want]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in want], abs=1e-4)
    assert all(len(e.top_logprobs) == 2 for e in streamed)


def test_chat_without_logprobs_has_none(server: NodeProcess) -> None:
    reply = client(server).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
    assert reply.choices[0].logprobs is None


def test_completions_logprobs_plain_and_streamed(server: NodeProcess) -> None:
    ask = dict(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0, logprobs=2)
    reply = client(server).completions.create(**ask)  # type: ignore[call-overload]
    lp = reply.choices[0].logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs
    assert lp.text_offset is not None
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert lp.text_offset[0] == 0
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert token in top and top[token] == pytest.approx(value)
        assert 2 <= len(top) <= 3
    streamed_tokens: list[str] = []
    offsets: list[int] = []
    for chunk in client(server).completions.create(**ask, stream=True):  # type: ignore[call-overload]
        for choice in chunk.choices:
            if choice.logprobs is not None and choice.logprobs.tokens:
                streamed_tokens += choice.logprobs.tokens
                offsets += choice.logprobs.text_offset or []
    assert streamed_tokens == lp.tokens
    assert offsets == lp.text_offset


@pytest.mark.parametrize(
    ("endpoint", "body", "param"),
    [
        (
            "/v1/chat/completions",
            {"messages": MESSAGES, "logprobs": True, "top_logprobs": 21},
            "top_logprobs",
        ),
        ("/v1/chat/completions", {"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs"),
        ("/v1/chat/completions", {"messages": MESSAGES, "logprobs": 1}, "logprobs"),
        ("/v1/completions", {"prompt": "x", "logprobs": 6}, "logprobs"),
        ("/v1/completions", {"prompt": "x", "logprobs": True}, "logprobs"),
    ],
)
def test_out_of_range_logprobs_are_400_naming_the_field(
    server: NodeProcess, endpoint: str, body: dict[str, object], param: str
) -> None:
    answer = server.post(endpoint, json={"model": MODEL, **body})
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == param


def test_responses_logprobs_plain_and_streamed(server: NodeProcess) -> None:
    ask = dict(
        model=MODEL,
        input="Tell me a story",
        max_output_tokens=8,
        temperature=0,
        include=["message.output_text.logprobs"],
        top_logprobs=2,
    )
    reply = client(server).responses.create(**ask)  # type: ignore[call-overload]
    part = reply.output[0].content[0]
    assert part.type == "output_text" and part.logprobs
    assert reply.top_logprobs == 2
    for entry in part.logprobs:
        assert len(entry.top_logprobs) == 2 and entry.logprob <= 0
    text = b"".join(bytes(e.bytes) for e in part.logprobs).decode("utf-8", "replace")
    assert text.strip() == part.text.strip()
    streamed = []
    with client(server).responses.stream(**ask) as stream:  # type: ignore[call-overload]
        for event in stream:
            if event.type == "response.output_text.delta":
                streamed += event.logprobs
    assert [e.token for e in streamed] == [e.token for e in part.logprobs]


def test_responses_other_include_values_are_refused(server: NodeProcess) -> None:
    body = {"model": MODEL, "input": "x", "include": ["reasoning.encrypted_content"]}
    answer = server.post("/v1/responses", json=body)
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "include[0]"

"""The OpenAI-compatible API of a real server process, driven by the official client."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from skulk.harness import NodeProcess

MODEL = "skulk-demo"


def client(server: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_health_and_models(server: NodeProcess) -> None:
    health = server.get("/health")
    assert health.status_code == 200
    assert health.json()["status"] == "ok"
    models = client(server).models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_chat_completion(server: NodeProcess) -> None:
    reply = client(server).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hello there"}],
        max_tokens=12,
        temperature=0.7,
        seed=1,
    )
    assert reply.object == "chat.completion"
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert reply.usage is not None
    assert reply.usage.prompt_tokens > 0
    assert 1 <= reply.usage.completion_tokens <= 12
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_same_seed_same_text_and_length_limit(server: NodeProcess) -> None:
    def ask(seed: int) -> tuple[str, str | None]:
        r = client(server).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Tell me a story"}],
            max_tokens=20,
            temperature=1.0,
            seed=seed,
        )
        return r.choices[0].message.content or "", r.choices[0].finish_reason

    assert ask(7) == ask(7)


def test_chat_streaming_with_usage(server: NodeProcess) -> None:
    stream = client(server).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count with me"}],
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
        temperature=0,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("stop", "length")
    assert all(f is None for f in finishes[:-1])
    usage_chunks = [c for c in chunks if c.usage is not None]
    assert len(usage_chunks) == 1 and usage_chunks[0] is chunks[-1]
    assert chunks[-1].choices == []
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    # Greedy: the streamed text equals the non-streamed text for the same request.
    whole = client(server).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count with me"}],
        max_tokens=16,
        temperature=0,
    )
    assert text == whole.choices[0].message.content
    assert usage_chunks[0].usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]


def test_sse_wire_format_ends_with_done(server: NodeProcess) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "stream": True,
    }
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events)
    assert json.loads(events[0][6:])["object"] == "chat.completion.chunk"


def test_completions(server: NodeProcess) -> None:
    c = client(server)
    reply = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, seed=3)
    assert reply.object == "text_completion"
    assert reply.usage is not None and 1 <= reply.usage.completion_tokens <= 8
    streamed = c.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=8, seed=3, stream=True
    )
    text = "".join(ch.choices[0].text for ch in streamed if ch.choices)
    assert text == reply.choices[0].text


def test_stop_string_is_not_emitted(server: NodeProcess) -> None:
    c = client(server)
    base = c.completions.create(model=MODEL, prompt="The", max_tokens=30, temperature=0)
    text = base.choices[0].text
    if len(text) < 6:
        pytest.fail(f"greedy demo output too short to pick a stop string: {text!r}")
    stop = text[3:5]
    cut = c.completions.create(model=MODEL, prompt="The", max_tokens=30, temperature=0, stop=stop)
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[: text.index(stop)]


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, 400, "model"),
        ({"model": MODEL}, 400, "messages"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 9}, 400, "n"),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": "hot"},
            400,
            "temperature",
        ),
        (
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": "f g"}}],
            },
            400,
            "tools[0].function.name",
        ),
        ({"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
    ],
)
def test_bad_requests_name_the_field(
    server: NodeProcess, body: dict[str, object], status: int, param: str
) -> None:
    r = server.post("/v1/chat/completions", json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param
    assert err["message"]


def test_malformed_json_is_400(server: NodeProcess) -> None:
    r = server.post(
        "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_json"


def test_informational_fields_accepted(server: NodeProcess) -> None:
    reply = client(server).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=2,
        user="alice",
        n=1,
        presence_penalty=0,
        frequency_penalty=0,
    )
    assert reply.choices[0].message.content is not None


def test_openai_client_sees_errors(server: NodeProcess) -> None:
    with pytest.raises(openai.NotFoundError):
        client(server).chat.completions.create(
            model="nope", messages=[{"role": "user", "content": "hi"}]
        )
    with pytest.raises(openai.BadRequestError):
        client(server).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], n=9
        )


def test_unknown_route_is_404_envelope(server: NodeProcess) -> None:
    r = server.get("/v1/nothing-here")
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "not_found_error"

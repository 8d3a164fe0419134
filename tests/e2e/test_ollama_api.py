"""The Ollama API of a real server process, driven by the official ``ollama`` client."""

from __future__ import annotations

import httpx
import ollama
import pytest

from skulk.harness import NodeProcess

MODEL = "skulk-demo"
GREEDY = {"temperature": 0, "num_predict": 12}


def client(server: NodeProcess) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=60)


def test_chat(server: NodeProcess) -> None:
    reply = client(server).chat(
        model=MODEL, messages=[{"role": "user", "content": "Hello there"}], options=GREEDY
    )
    assert reply.message.role == "assistant"
    assert isinstance(reply.message.content, str)
    assert reply.done is True and reply.done_reason in ("stop", "length")
    assert reply.prompt_eval_count is not None and reply.prompt_eval_count > 0
    assert reply.eval_count is not None and 1 <= reply.eval_count <= 12
    assert reply.total_duration is not None and reply.total_duration > 0


def test_chat_stream_matches_the_plain_answer(server: NodeProcess) -> None:
    messages = [{"role": "user", "content": "Count with me"}]
    parts = list(client(server).chat(model=MODEL, messages=messages, options=GREEDY, stream=True))
    assert [p.done for p in parts[:-1]] == [False] * (len(parts) - 1)
    assert parts[-1].done is True and parts[-1].done_reason in ("stop", "length")
    assert parts[-1].eval_count is not None and parts[-1].eval_count >= 1
    streamed = "".join(p.message.content or "" for p in parts)
    whole = client(server).chat(model=MODEL, messages=messages, options=GREEDY)
    assert streamed == whole.message.content  # greedy: the same text either way
    # The same greedy prompt through the OpenAI route gives the same text.
    openai_reply = httpx.post(
        server.url + "/v1/chat/completions",
        json={"model": MODEL, "messages": messages, "temperature": 0, "max_tokens": 12},
        timeout=60,
    ).json()
    assert openai_reply["choices"][0]["message"]["content"] == streamed


def test_generate_plain_stream_and_length_limit(server: NodeProcess) -> None:
    options = {"temperature": 0, "num_predict": 4}
    reply = client(server).generate(model=MODEL, prompt="Once upon a time", options=options)
    assert isinstance(reply.response, str)
    assert reply.eval_count is not None and reply.eval_count <= 4
    parts = list(
        client(server).generate(
            model=MODEL, prompt="Once upon a time", options=options, stream=True
        )
    )
    assert "".join(p.response or "" for p in parts) == reply.response
    assert parts[-1].done_reason == reply.done_reason
    raw = client(server).generate(model=MODEL, prompt="abc", raw=True, options=options)
    assert raw.done is True


def test_list_show_ps_and_version(server: NodeProcess) -> None:
    listed = client(server).list()
    assert [m.model for m in listed.models] == [MODEL]
    assert listed.models[0].details is not None and listed.models[0].details.family == "llama"
    shown = client(server).show(MODEL)
    assert shown.modelinfo is not None
    assert shown.modelinfo["general.architecture"] == "llama"
    assert shown.capabilities == ["completion"]
    running = client(server).ps()
    assert [m.model for m in running.models] == [MODEL]
    assert running.models[0].context_length is not None and running.models[0].context_length > 0
    # The client has no version() call: the route, as Ollama answers it.
    version = server.get("/api/version")
    assert version.status_code == 200 and isinstance(version.json()["version"], str)


def test_errors_are_response_errors_with_their_status(server: NodeProcess) -> None:
    with pytest.raises(ollama.ResponseError) as bad:
        client(server).chat(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            options={"mirostat": 2},
        )
    assert bad.value.status_code == 400 and "options.mirostat" in bad.value.error
    with pytest.raises(ollama.ResponseError) as streamed_bad:
        bad_schema = {"type": "object", "propertyNames": {"maxLength": 2}}
        list(client(server).generate(model=MODEL, prompt="x", format=bad_schema, stream=True))
    assert streamed_bad.value.status_code == 400 and "format" in streamed_bad.value.error
    with pytest.raises(ollama.ResponseError) as unknown:
        client(server).show("no-such-model")
    assert unknown.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as missing:
        client(server).generate(model="no-such-model", prompt="x")
    assert missing.value.status_code == 404

"""Embeddings (``/v1/embeddings``, ``/api/embed``, ``/api/embeddings``), token counting and
Anthropic's ``stop_sequence`` on a real server, driven by the official clients."""

from __future__ import annotations

import math
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from skulk.harness import NodeProcess

MODEL = "skulk-demo"


def oai(server: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def norm(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


def close(a: list[float], b: list[float], tol: float = 1e-4) -> bool:
    return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b, strict=True)) < tol


def test_openai_single_and_batch(server: NodeProcess) -> None:
    c = oai(server)
    one = c.embeddings.create(model=MODEL, input="The quick brown fox", encoding_format="float")
    assert one.object == "list" and one.model == MODEL
    assert len(one.data) == 1 and one.data[0].index == 0
    vector = one.data[0].embedding
    assert len(vector) > 0 and math.isclose(norm(vector), 1.0, rel_tol=1e-4)
    assert one.usage.prompt_tokens > 0 and one.usage.total_tokens == one.usage.prompt_tokens
    texts = ["The quick brown fox", "jumps over", "the lazy dog"]
    batch = c.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    assert [d.index for d in batch.data] == [0, 1, 2]
    assert close(batch.data[0].embedding, vector)  # batched or alone: the same vector
    assert not close(batch.data[1].embedding, batch.data[2].embedding)
    assert batch.usage.prompt_tokens > one.usage.prompt_tokens
    listed = c.models.retrieve(MODEL)
    assert listed.model_extra is not None
    assert listed.model_extra["embedding_dimensions"] == len(vector)


def test_openai_base64_is_the_clients_default(server: NodeProcess) -> None:
    c = oai(server)
    floats = c.embeddings.create(model=MODEL, input="hello", encoding_format="float")
    default = c.embeddings.create(model=MODEL, input="hello")  # the client asks for base64
    assert close(default.data[0].embedding, floats.data[0].embedding, 1e-6)


def test_openai_token_arrays(server: NodeProcess) -> None:
    c = oai(server)
    one = c.embeddings.create(model=MODEL, input=[5, 6, 7, 8], encoding_format="float")
    assert len(one.data) == 1 and one.usage.prompt_tokens == 4
    many = c.embeddings.create(model=MODEL, input=[[5, 6, 7, 8], [9, 10]], encoding_format="float")
    assert len(many.data) == 2 and many.usage.prompt_tokens == 6
    assert close(many.data[0].embedding, one.data[0].embedding)


def test_openai_refusals_name_the_field(server: NodeProcess) -> None:
    c = oai(server)
    with pytest.raises(openai.BadRequestError) as dims:
        c.embeddings.create(model=MODEL, input="x", dimensions=8)
    assert dims.value.body["param"] == "dimensions"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as many:
        c.embeddings.create(model=MODEL, input=["x"] * 1000)
    assert many.value.body["param"] == "input"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as vocab:
        c.embeddings.create(model=MODEL, input=[[1, 10**9]])
    assert vocab.value.body["code"] == "invalid_request"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        c.embeddings.create(model="no-such-model", input="x")


def test_ollama_embed(server: NodeProcess) -> None:
    c = ollama.Client(host=server.url, timeout=60)
    one = c.embed(model=MODEL, input="The quick brown fox")
    assert len(one.embeddings) == 1
    assert math.isclose(norm(list(one.embeddings[0])), 1.0, rel_tol=1e-4)
    assert one.prompt_eval_count and one.prompt_eval_count > 0
    both = c.embed(model=MODEL, input=["The quick brown fox", "jumps"], truncate=True)
    assert len(both.embeddings) == 2
    assert close(list(both.embeddings[0]), list(one.embeddings[0]))
    floats = oai(server).embeddings.create(
        model=MODEL, input="The quick brown fox", encoding_format="float"
    )
    assert close(list(one.embeddings[0]), floats.data[0].embedding)  # one pooling, two formats
    old = c.embeddings(model=MODEL, prompt="The quick brown fox")
    assert close(list(old.embedding), list(one.embeddings[0]))
    with pytest.raises(ollama.ResponseError) as err:
        c.embed(model=MODEL, input="x", dimensions=8)
    assert err.value.status_code == 400 and "dimensions" in err.value.error


def test_ollama_embed_refuses_bad_input_in_its_envelope(server: NodeProcess) -> None:
    r = httpx.post(server.url + "/api/embed", json={"model": MODEL, "input": [1, 2]}, timeout=30)
    assert r.status_code == 400
    assert set(r.json()) == {"error", "request_id"}  # the id, top level in Ollama's envelope
    assert r.json()["request_id"] == r.headers["x-request-id"]


def test_count_tokens_equals_the_input_tokens_billed(server: NodeProcess) -> None:
    c = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    messages: Any = [{"role": "user", "content": "How many tokens is this?"}]
    counted = c.messages.count_tokens(model=MODEL, system="Be brief.", messages=messages)
    served = c.messages.create(
        model=MODEL,
        max_tokens=2,
        system="Be brief.",
        messages=messages,
        extra_body={"temperature": 0},
    )
    assert counted.input_tokens == served.usage.input_tokens > 0


def test_a_stop_sequence_is_reported(server: NodeProcess) -> None:
    c = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    messages: Any = [{"role": "user", "content": "Once upon a time"}]
    greedy = {"temperature": 0}
    base = c.messages.create(model=MODEL, max_tokens=30, messages=messages, extra_body=greedy)
    text = base.content[0].text  # type: ignore[union-attr]
    if len(text) < 8:
        pytest.fail(f"greedy demo output too short to pick a stop sequence: {text!r}")
    stop = text[4:7]
    kwargs: Any = {
        "model": MODEL,
        "max_tokens": 30,
        "messages": messages,
        "stop_sequences": ["never-seen-stop", stop],
        "extra_body": greedy,
    }
    cut = c.messages.create(**kwargs)
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == text[: text.index(stop)]
    with c.messages.stream(**kwargs) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == stop
    # OpenAI keeps its own vocabulary: a stop string ends with finish_reason "stop".
    chat = oai(server).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=30, temperature=0, stop=[stop]
    )
    assert chat.choices[0].finish_reason == "stop"

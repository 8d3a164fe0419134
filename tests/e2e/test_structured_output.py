"""Structured output through a real server, with the official ``openai`` and ``ollama`` clients:
every answer that ends with "stop" parses and validates against the schema asked for, and a
schema feature we cannot enforce is a 400 naming it."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import ollama
import openai
import pytest

from skulk.api._structured import CHECK_HERE_BYTES
from skulk.harness import NodeProcess

MODEL = "skulk-demo"
ITEM = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 12},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "done": {"type": "boolean"},
    },
    "required": ["title", "count", "done"],
    "additionalProperties": False,
}
MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [
    {"role": "user", "content": "Describe one task as JSON"}
]


def client(server: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=60)


@pytest.mark.parametrize("seed", [1, 2])
def test_chat_json_schema_answers_validate(server: NodeProcess, seed: int) -> None:
    reply = client(server).chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        seed=seed,
        max_tokens=120,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "task", "schema": ITEM, "strict": True},
        },
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content or ""), ITEM)


def test_chat_json_object_streamed_is_one_object(server: NodeProcess) -> None:
    stream = client(server).chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        seed=3,
        max_tokens=200,
        response_format={"type": "json_object"},
        stream=True,
    )
    parts, reasons = [], []
    for chunk in stream:
        for c in chunk.choices:
            parts.append(c.delta.content or "")
            reasons.append(c.finish_reason)
    if reasons[-1] == "stop":  # json_object has no bound: the budget may run out first
        assert isinstance(json.loads("".join(parts)), dict)
    else:
        assert reasons[-1] == "length" and "".join(parts).startswith("{")


def test_responses_text_format_json_schema(server: NodeProcess) -> None:
    reply = client(server).responses.create(
        model=MODEL,
        input="Describe one task",
        max_output_tokens=120,
        text={"format": {"type": "json_schema", "name": "task", "schema": ITEM, "strict": True}},
    )
    assert reply.status == "completed"
    jsonschema.validate(json.loads(reply.output_text), ITEM)
    assert reply.text is not None and reply.text.format is not None
    assert reply.text.format.type == "json_schema"


def test_ollama_format_schema_and_json(server: NodeProcess) -> None:
    ol = ollama.Client(host=server.url, timeout=60)
    reply = ol.chat(
        model=MODEL,
        messages=[{"role": "user", "content": "A task?"}],
        format=ITEM,
        options={"seed": 4, "num_predict": 120},
    )
    assert reply.done_reason == "stop"
    jsonschema.validate(json.loads(reply.message.content or ""), ITEM)
    parts = list(
        ol.generate(
            model=MODEL,
            prompt="A task?",
            format=ITEM,
            options={"seed": 5, "num_predict": 120},
            stream=True,
        )
    )
    assert parts[-1].done_reason == "stop"
    jsonschema.validate(json.loads("".join(p.response or "" for p in parts)), ITEM)


def test_an_unsupported_schema_keyword_is_a_400_naming_it(server: NodeProcess) -> None:
    schema = {"type": "object", "propertyNames": {"maxLength": 3}}
    response_format: Any = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    with pytest.raises(openai.BadRequestError) as caught:
        client(server).chat.completions.create(
            model=MODEL, messages=MESSAGES, response_format=response_format
        )
    assert "propertyNames" in caught.value.message
    body = caught.value.body
    assert isinstance(body, dict) and body.get("param") == "response_format.json_schema.schema"
    with pytest.raises(ollama.ResponseError) as refused:
        ollama.Client(host=server.url, timeout=60).chat(
            model=MODEL, messages=[{"role": "user", "content": "x"}], format=schema
        )
    assert refused.value.status_code == 400 and "propertyNames" in refused.value.error


def test_a_large_schema_is_refused_by_the_runner_naming_the_keyword(server: NodeProcess) -> None:
    """Over the size the API checks itself, the runner's prompt-preparing thread refuses it."""
    properties = {f"field_{i:04d}": {"type": "string", "description": "x" * 40} for i in range(80)}
    schema = {"type": "object", "properties": properties, "not": {"required": ["field_0000"]}}
    assert len(json.dumps(schema, separators=(",", ":"))) > CHECK_HERE_BYTES
    response_format: Any = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    with pytest.raises(openai.BadRequestError) as caught:
        client(server).chat.completions.create(
            model=MODEL, messages=MESSAGES, response_format=response_format
        )
    assert '"not"' in caught.value.message

"""Tool calling through a real server with the official clients: a forced call (required, or a
named tool) is a well-formed call whose arguments validate against the tool's schema, even from
the demo model; a tool result renders back into the conversation; streaming gives each format's
tool-call deltas."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import jsonschema
import ollama
import openai
import pytest

from skulk.harness import NodeProcess

MODEL = "skulk-demo"
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Oslo", "Rome", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "maxLength": 10}},
    "required": ["zone"],
    "additionalProperties": False,
}
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
OPENAI_TOOLS: list[Any] = [
    {"type": "function", "function": {"name": n, "description": f"{n}.", "parameters": s}}
    for n, s in SCHEMAS.items()
]
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Oslo?"}]


def client(server: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=60)


def check_call(name: str, arguments: str | dict[str, Any]) -> None:
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(args, SCHEMAS[name])


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_time"}}]
)
def test_openai_forced_call_validates(server: NodeProcess, choice: Any) -> None:
    reply = client(server).chat.completions.create(
        model=MODEL, messages=ASK, tools=OPENAI_TOOLS, tool_choice=choice, max_tokens=80, seed=2
    )
    c = reply.choices[0]
    assert c.finish_reason == "tool_calls"
    calls = c.message.tool_calls or []
    assert len(calls) == 1 and calls[0].id and calls[0].type == "function"
    function = calls[0].function
    if isinstance(choice, dict):
        assert function.name == "get_time"
    check_call(function.name, function.arguments)


def test_openai_forced_call_streams_tool_call_deltas(server: NodeProcess) -> None:
    stream = client(server).chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=OPENAI_TOOLS,
        tool_choice="required",
        max_tokens=80,
        seed=3,
        stream=True,
    )
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    reasons = []
    for chunk in stream:
        for choice in chunk.choices:
            reasons.append(choice.finish_reason)
            for d in choice.delta.tool_calls or []:
                assert d.function is not None
                names[d.index] = names.get(d.index, "") + (d.function.name or "")
                arguments[d.index] = arguments.get(d.index, "") + (d.function.arguments or "")
    assert reasons[-1] == "tool_calls" and list(names) == [0]
    check_call(names[0], arguments[0])


def test_openai_tool_result_round_trip(server: NodeProcess) -> None:
    first = client(server).chat.completions.create(
        model=MODEL, messages=ASK, tools=OPENAI_TOOLS, tool_choice="required", max_tokens=80
    )
    call = (first.choices[0].message.tool_calls or [])[0]
    follow_up: list[Any] = [
        *ASK,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 21}'},
    ]
    reply = client(server).chat.completions.create(
        model=MODEL, messages=follow_up, tools=OPENAI_TOOLS, max_tokens=8
    )
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert reply.usage is not None and first.usage is not None
    # The call and its result are rendered into the prompt: it grows by at least their text.
    grown = reply.usage.prompt_tokens - first.usage.prompt_tokens
    assert grown >= len(call.function.arguments) // 4  # type: ignore[union-attr]


def test_openai_unsupported_keyword_in_a_forced_tool_is_a_400(server: NodeProcess) -> None:
    bad: Any = [{"type": "function", "function": {"name": "f", "parameters": {"not": {}}}}]
    with pytest.raises(openai.BadRequestError) as caught:
        client(server).chat.completions.create(
            model=MODEL,
            messages=ASK,
            tools=bad,
            tool_choice="required",
        )
    assert '"not"' in caught.value.message
    body = caught.value.body
    assert isinstance(body, dict) and body.get("param") == "tools[0].parameters"


# ---- Anthropic -------------------------------------------------------------------------------

ANTHROPIC_TOOLS: list[Any] = [
    {"name": n, "description": f"{n}.", "input_schema": s} for n, s in SCHEMAS.items()
]


def claude(server: NodeProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}])
def test_anthropic_forced_tool_use_validates(server: NodeProcess, choice: Any) -> None:
    reply = claude(server).messages.create(
        model=MODEL, max_tokens=80, messages=ASK, tools=ANTHROPIC_TOOLS, tool_choice=choice
    )
    assert reply.stop_reason == "tool_use"
    (block,) = [b for b in reply.content if b.type == "tool_use"]
    assert block.id.startswith("toolu_")
    if choice["type"] == "tool":
        assert block.name == "get_weather"
    check_call(block.name, block.input)


def test_anthropic_streamed_tool_use_and_result_round_trip(server: NodeProcess) -> None:
    with claude(server).messages.stream(
        model=MODEL,
        max_tokens=80,
        messages=ASK,
        tools=ANTHROPIC_TOOLS,
        tool_choice={"type": "any"},
    ) as stream:
        partial = "".join(
            e.delta.partial_json
            for e in stream
            if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
        )
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    (block,) = [b for b in final.content if b.type == "tool_use"]
    assert json.loads(partial) == block.input
    check_call(block.name, block.input)
    follow_up: list[Any] = [
        *ASK,
        {"role": "assistant", "content": [block.model_dump()]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": block.id, "content": "21 C"}],
        },
    ]
    reply = claude(server).messages.create(
        model=MODEL, max_tokens=4, messages=follow_up, tools=ANTHROPIC_TOOLS
    )
    assert reply.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert reply.usage.input_tokens > final.usage.input_tokens


# ---- Ollama ----------------------------------------------------------------------------------


def test_ollama_tools_and_a_tool_turn_are_rendered(server: NodeProcess) -> None:
    ol = ollama.Client(host=server.url, timeout=60)
    options = {"temperature": 0, "num_predict": 4}
    plain = ol.chat(model=MODEL, messages=ASK, options=options)
    with_tools = ol.chat(model=MODEL, messages=ASK, tools=OPENAI_TOOLS, options=options)
    assert with_tools.done_reason in ("stop", "length")
    assert (with_tools.prompt_eval_count or 0) > (plain.prompt_eval_count or 0)
    turns: list[Any] = [
        *ASK,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 1}}}
            ],
        },
        {"role": "tool", "content": "21 C", "tool_name": "get_weather"},
    ]
    parts = list(
        ol.chat(model=MODEL, messages=turns, tools=OPENAI_TOOLS, options=options, stream=True)
    )
    assert parts[-1].done is True
    assert (parts[-1].prompt_eval_count or 0) > (with_tools.prompt_eval_count or 0)


#: Tool parameters as clients (and pydantic's model_json_schema) write them: no
#: additionalProperties. The grammar admits no other key (docs/api.md), so even the demo model
#: ends its call instead of writing made-up keys until max_tokens.
OPEN_WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_forced_call_without_additional_properties_ends_as_a_call(
    server: NodeProcess, seed: int
) -> None:
    tools: list[Any] = [
        {"type": "function", "function": {"name": "get_weather", "parameters": OPEN_WEATHER}}
    ]
    reply = client(server).chat.completions.create(
        model=MODEL, messages=ASK, tools=tools, tool_choice="required", max_tokens=80, seed=seed
    )
    c = reply.choices[0]
    assert c.finish_reason == "tool_calls"
    (call,) = c.message.tool_calls or []
    args = json.loads(call.function.arguments)
    assert set(args) == {"city", "days"}
    jsonschema.validate(args, OPEN_WEATHER)


def test_an_ollama_format_schema_without_additional_properties_is_closed(
    server: NodeProcess,
) -> None:
    ol = ollama.Client(host=server.url, timeout=60)
    reply = ol.generate(
        model=MODEL, prompt="Weather?", format=OPEN_WEATHER, options={"num_predict": 80, "seed": 4}
    )
    assert reply.done_reason == "stop"
    args = json.loads(reply.response)
    assert set(args) == {"city", "days"}

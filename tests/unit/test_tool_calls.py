"""Tool calling pieces without a server: reading calls out of answers, forcing a call, the
OpenAI adapter's parsing and rendering, and the runner's prompt rendering (native and
fallback)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from skulk.api._errors import ApiError
from skulk.api._openai_parse import parse_chat_completions
from skulk.api._openai_tools import ToolsFormat
from skulk.api._tool_calls import Tool, forced_params, parse_calls
from skulk.engine._tools import FALLBACK_PROMPT, chat_inputs
from skulk.wire.runner import (
    ChatMessage,
    ChatPrompt,
    GenerationEnd,
    SamplingParams,
    ToolCall,
    Usage,
)

WEATHER: dict[str, object] = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
TOOLS: list[Any] = [{"type": "function", "function": {"name": "w", "parameters": WEATHER}}]
USER = [{"role": "user", "content": "hi"}]


def chat(**fields: object) -> dict[str, object]:
    return {"model": "m", "messages": USER, **fields}


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ('{"name": "w", "arguments": {"city": "Oslo"}}', "", [("w", {"city": "Oslo"})]),
        (
            'Sure.\n<tool_call>\n{"name": "w", "arguments": {"city": "Rome"}}\n</tool_call>',
            "Sure.",
            [("w", {"city": "Rome"})],
        ),
        ('{"name": "w", "arguments": "{\\"city\\": \\"Lima\\"}"}', "", [("w", {"city": "Lima"})]),
        ("just text", "just text", []),
        ('{"name": "w"}', '{"name": "w"}', []),  # not a call: no arguments
        ("<tool_call>{oops</tool_call>", "<tool_call>{oops</tool_call>", []),
    ],
)
def test_calls_are_read_from_an_answer(
    text: str, content: str, calls: list[tuple[str, dict[str, object]]]
) -> None:
    left, found = parse_calls(text)
    assert left == content
    assert [(c.name, c.input) for c in found] == calls
    assert all(c.id.startswith("call_") for c in found)


def test_forcing_a_call_constrains_to_the_chosen_tools() -> None:
    tools = [Tool("w", None, WEATHER), Tool("t", "time", None)]
    assert forced_params(SamplingParams(), tools, "auto", "tools") == SamplingParams()
    named = forced_params(SamplingParams(), tools, "t", "tools")
    assert named.tool_call and named.json_schema is not None
    assert json.loads(named.json_schema)["properties"]["name"] == {"const": "t"}
    required = forced_params(SamplingParams(), tools, "required", "tools")
    assert required.json_schema is not None
    schema = json.loads(required.json_schema)
    jsonschema.validate({"name": "w", "arguments": {"city": "x"}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "w", "arguments": {}}, schema)


def test_a_refused_tool_schema_names_the_tool() -> None:
    bad = [Tool("ok", None, WEATHER), Tool("bad", None, {"type": "object", "not": {}})]
    with pytest.raises(ApiError) as caught:
        forced_params(SamplingParams(), bad, "required", "tools")
    assert caught.value.param == "tools[1].parameters" and '"not"' in str(caught.value)


def test_openai_tools_tool_choice_and_tool_turns_are_parsed() -> None:
    messages = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    req = parse_chat_completions(chat(messages=messages, tools=TOOLS, tool_choice="required"))
    assert req.params.tool_call and req.prompt.tools is not None
    assert req.prompt.messages[1].tool_calls == (ToolCall("c1", "w", "{}"),)
    assert req.prompt.messages[2] == ChatMessage("tool", "sunny", tool_call_id="c1")
    assert isinstance(req.generate_request().format, ToolsFormat)
    none = parse_chat_completions(chat(tools=TOOLS, tool_choice="none"))
    assert none.prompt.tools is None and none.params.json_schema is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice.function.name",
        ),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "tools[1]"),
        ({"tools": TOOLS, "n": 2}, "n"),
        (
            {"messages": [{"role": "tool", "content": "x"}]},
            "messages[0].tool_call_id",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "c",
                                "type": "function",
                                "function": {"name": "w", "arguments": "[1]"},
                            }
                        ],
                    }
                ]
            },
            "messages[0].tool_calls[0].function.arguments",
        ),
    ],
)
def test_openai_tool_fields_are_checked(fields: dict[str, object], param: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_chat_completions(chat(**fields))
    assert caught.value.param == param


def test_the_openai_answer_carries_tool_calls_streamed_or_whole() -> None:
    end = GenerationEnd("stop", Usage(3, 5))
    renderer = ToolsFormat(include_usage=False).renderer("m")
    assert renderer.delta('{"name": "w", ') == []  # held back until the end
    renderer.delta('"arguments": {"city": "Oslo"}}')
    events = [e.data for e in renderer.closing(end)]
    assert isinstance(events[0], dict) and isinstance(events[1], dict) and events[2] == "[DONE]"
    (call,) = events[0]["choices"][0]["delta"]["tool_calls"]
    assert call["index"] == 0 and call["function"]["name"] == "w"
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    assert events[1]["choices"][0]["finish_reason"] == "tool_calls"
    whole = ToolsFormat(include_usage=False).renderer("m").whole("plain words", end)
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": "plain words"}  # type: ignore[index]
    assert whole["choices"][0]["finish_reason"] == "stop"  # type: ignore[index]


def test_a_template_with_tools_gets_them_natively() -> None:
    prompt = ChatPrompt(
        (
            ChatMessage("user", "hi"),
            ChatMessage("assistant", "", (ToolCall("c1", "w", '{"city": "Oslo"}'),)),
            ChatMessage("tool", "sunny", tool_call_id="c1"),
        ),
        tools=json.dumps(TOOLS),
    )
    messages, tools = chat_inputs(prompt, "{% for tool in tools %}{% endfor %}")
    assert tools == TOOLS
    assert messages[1]["tool_calls"][0]["function"] == {"name": "w", "arguments": {"city": "Oslo"}}
    assert messages[2] == {"role": "tool", "content": "sunny", "tool_call_id": "c1"}


def test_a_template_without_tools_gets_the_fallback() -> None:
    prompt = ChatPrompt(
        (
            ChatMessage("system", "Be brief."),
            ChatMessage("assistant", "", (ToolCall("c1", "w", '{"city": "Oslo"}'),)),
            ChatMessage("tool", "sunny", tool_call_id="c1"),
        ),
        tools=json.dumps(TOOLS),
    )
    messages, tools = chat_inputs(prompt, "{{ messages }}")
    assert tools is None
    assert messages[0]["content"].startswith("Be brief.\n\n" + FALLBACK_PROMPT)
    assert json.dumps(TOOLS[0]) in messages[0]["content"]
    assert messages[1] == {
        "role": "assistant",
        "content": '{"name": "w", "arguments": {"city": "Oslo"}}',
    }
    assert messages[2] == {"role": "user", "content": "Tool result: sunny"}
    plain = ChatPrompt((ChatMessage("user", "hi"),))
    assert chat_inputs(plain, "{{ tools }}") == ([{"role": "user", "content": "hi"}], None)

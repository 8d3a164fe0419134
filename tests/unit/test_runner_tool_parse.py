"""The runner reads a finished answer's tool calls with the model's own mlx-lm tool parser
(:mod:`skulk.engine._tool_parse`) and reports them on ``Finished``; the API prefers them.

The models are the demo model with ``tool_parser_type`` set in its ``tokenizer_config.json``
(what mlx-lm's tokenizer ``load`` reads to pick a parser)."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any, cast

import pytest
import trio
import trio.testing

from skulk.api._tool_calls import answer_calls
from skulk.engine._batch import Row
from skulk.engine._engine import Engine
from skulk.engine._scheduler import finished
from skulk.engine._tool_parse import ToolText, parse_tool_text
from skulk.grammar import schema_text, tool_call_schema
from skulk.models import ensure_demo_model
from skulk.routing._hop import ITEM_CODEC, RouteTimeouts
from skulk.routing._serving import RouteServer
from skulk.wire import Codec
from skulk.wire.routing import RouteDelta, RouteEnd, RouteItem, RouteRequest
from skulk.wire.runner import (
    ChatMessage,
    ChatPrompt,
    Finished,
    FromRunner,
    Generate,
    GenerationEnd,
    RequestFailed,
    SamplingParams,
    TextPrompt,
    ToolCall,
    Usage,
)
from tests._doubles import FakeLink
from tests.unit.test_engine_batch import Loop
from tests.unit.test_routing_caller import answer_with, collect, routing
from tests.unit.test_routing_caller import request as remote_request

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
PROMPT = ChatPrompt((ChatMessage("user", "weather in Oslo?"),), tools=json.dumps(TOOLS))
PARAMS = SamplingParams(temperature=0.0, max_tokens=40)


def with_parser(demo: Path, out: Path, parser: str) -> Path:
    """A copy of the demo model whose tokenizer config names mlx-lm's ``parser``."""
    shutil.copytree(demo, out)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tool_parser_type"] = parser
    config_path.write_text(json.dumps(config))
    return out


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Engine]:
    root = tmp_path_factory.mktemp("tool-models")
    demo = ensure_demo_model(root / "home")
    return {
        name: Engine.load(with_parser(demo, root / name, name), lambda n, t: None)
        for name in ("pythonic", "mistral", "json_tools")
    }


def ended_with(engine: Engine, text: str, prompt: ChatPrompt | TextPrompt = PROMPT) -> Finished:
    """The ``Finished`` the runner sends for a request whose emitted text was ``text``."""
    row = Row.open(engine, "r1", engine.tokenize(prompt), PARAMS)
    row.tool_text = ToolText.open(engine.tokenizer, prompt)
    if row.tool_text is not None:
        row.tool_text.add(text)
    return finished(row, "stop")


def end_prompt(engine: Engine) -> int:
    return len(engine.tokenize(PROMPT))


def test_the_model_parser_reads_pythonic_calls(engines: dict[str, Engine]) -> None:
    engine = engines["pythonic"]
    assert engine.tokenizer.tool_call_start == "<|tool_call_start|>"
    calls = '[weather(city="Oslo"), weather(city="Bergen")]'
    text = f"Let me look. <|tool_call_start|>{calls}<|tool_call_end|>"
    end = ended_with(engine, text).end
    assert [(c.name, json.loads(c.arguments)) for c in end.tool_calls] == [
        ("weather", {"city": "Oslo"}),
        ("weather", {"city": "Bergen"}),
    ]
    assert end.content == "Let me look."
    assert all(c.id == "" for c in end.tool_calls)  # the API names them in its format's style


def test_the_model_parser_reads_mistral_calls_without_an_end_marker(
    engines: dict[str, Engine],
) -> None:
    end = ended_with(engines["mistral"], '[TOOL_CALLS]weather[ARGS]{"city": "Oslo"}').end
    assert [(c.name, c.arguments) for c in end.tool_calls] == [("weather", '{"city":"Oslo"}')]
    assert end.content == ""


def test_no_calls_leave_finished_as_it_was(engines: dict[str, Engine]) -> None:
    engine = engines["pythonic"]
    no_calls = GenerationEnd("stop", Usage(end_prompt(engine), 0))
    assert ended_with(engine, "Just words.") == Finished("r1", no_calls)
    # No tools offered: the text is not even kept.
    plain = ChatPrompt((ChatMessage("user", "hi"),))
    assert ToolText.open(engine.tokenizer, plain) is None
    assert ToolText.open(engine.tokenizer, TextPrompt("hi")) is None


@pytest.mark.parametrize(
    "text",
    [
        "<|tool_call_start|>no call here<|tool_call_end|>",  # the parser raises
        '<|tool_call_start|>[weather(city="Oslo")]',  # never closed
    ],
)
def test_a_call_that_does_not_parse_leaves_the_text(engines: dict[str, Engine], text: str) -> None:
    end = ended_with(engines["pythonic"], text).end
    assert end.tool_calls == () and end.content is None


def test_a_parser_exception_or_odd_shape_never_fails_the_request() -> None:
    def broken(text: str, tools: Any) -> Any:
        raise RuntimeError("parser bug")

    assert parse_tool_text("<a>x</a>", broken, "<a>", "</a>", None) is None
    shapes: list[object] = ["a string", {"name": 3}, [{"name": "w", "arguments": [1]}], {"x": 1}]
    for shape in shapes:

        def odd(text: str, tools: Any, shape: object = shape) -> Any:
            return shape

        assert parse_tool_text("<a>x</a>", odd, "<a>", "</a>", None) is None
    got = parse_tool_text(
        "a <a>x</a> b",
        lambda t, tools: {"name": "w", "arguments": '{"k": 1}', "id": "m1"},
        "<a>",
        "</a>",
        None,
    )
    assert got == ("a  b", (ToolCall("m1", "w", '{"k":1}'),))


def test_the_runner_loop_reports_a_forced_call_parsed_by_the_model_parser(
    engines: dict[str, Engine],
) -> None:
    """A real generation: a forced call (wrapped in ``<tool_call>`` by the grammar) on a model
    whose tokenizer names ``json_tools`` comes out on ``Finished`` as a parsed call."""
    from skulk.engine._grammar import request_constraint
    from skulk.engine._prepare import Prepared

    engine = engines["json_tools"]
    city = {"enum": ["Oslo", "Bergen"]}  # short, so the call ends well within max_tokens
    parameters = {"type": "object", "properties": {"city": city}, "required": ["city"]}
    schema = tool_call_schema({"weather": parameters | {"additionalProperties": False}})
    params = SamplingParams(
        temperature=0.0, max_tokens=200, json_schema=schema_text(schema, "tools"), tool_call=True
    )
    loop = Loop(engine)
    loop.requests.waiting["t1"] = 1
    request = Generate("t1", PROMPT, params)
    constraint = request_constraint(engine.tokenizer, params)
    loop.requests.start(Prepared(1, request, tuple(engine.tokenize(PROMPT)), constraint=constraint))
    for _ in range(500):
        if not loop.requests.busy:
            break
        loop.requests.advance()
    assert not [f for f in loop.link.sent if isinstance(f, RequestFailed)]
    (end,) = [f.end for f in loop.link.sent if isinstance(f, Finished)]
    assert end.finish_reason == "stop"
    (call,) = end.tool_calls
    assert call.name == "weather" and json.loads(call.arguments)["city"] in ("Oslo", "Bergen")
    assert end.content == ""


def test_the_api_prefers_the_runner_calls_over_its_own_parse() -> None:
    runner_call = ToolCall("", "weather", '{"city":"Oslo"}')
    hermes = '<tool_call>{"name": "other", "arguments": {}}</tool_call>'
    end = GenerationEnd("stop", Usage(3, 5), tool_calls=(runner_call,), content="Sure.")
    text, calls = answer_calls(hermes, end, id_prefix="toolu_")
    assert text == "Sure."
    assert [(c.name, c.arguments) for c in calls] == [("weather", '{"city":"Oslo"}')]
    assert calls[0].id.startswith("toolu_")
    kept = GenerationEnd("stop", Usage(3, 5), tool_calls=(ToolCall("m1", "w", "{}"),))
    assert answer_calls("x", kept)[1][0].id == "m1"
    # Without runner calls, the API's own parse; cut short, none at all.
    text, calls = answer_calls(hermes, GenerationEnd("stop", Usage(3, 5)))
    assert text == "" and [c.name for c in calls] == ["other"]
    cut = GenerationEnd("length", Usage(3, 5), tool_calls=(runner_call,))
    assert answer_calls(hermes, cut) == (
        hermes,
        [],
    )


def test_the_calls_cross_the_runner_link_and_the_mesh() -> None:
    calls = (ToolCall("", "weather", '{"city":"Oslo"}'),)
    end = GenerationEnd("stop", Usage(3, 5), None, calls, "Sure.")
    frame = Finished("r1", end)
    runner_codec: Codec[FromRunner] = Codec(FromRunner)
    assert runner_codec.decode(runner_codec.encode(frame)) == frame
    assert ITEM_CODEC.decode(ITEM_CODEC.encode(RouteEnd(end))) == RouteEnd(end)
    # A peer without the fields (an older node) decodes to none.
    bare = runner_codec.unstructure(Finished("r1", GenerationEnd("stop", Usage(3, 5))))
    for key in ("tool_calls", "content"):
        bare["end"].pop(key, None)
    assert runner_codec.structure(bare) == Finished("r1", GenerationEnd("stop", Usage(3, 5)))


CALLS = (ToolCall("", "weather", '{"city":"Oslo"}'),)


class CallingService:
    """A model service whose generation ended with calls the runner read."""

    async def generate(
        self, prompt: object, params: object
    ) -> AsyncGenerator[str | GenerationEnd, None]:
        await trio.lowlevel.checkpoint()
        yield "Sure."
        yield GenerationEnd("stop", Usage(1, 1), None, CALLS, "Sure.")


async def test_the_serving_node_carries_the_calls_onto_route_end() -> None:
    server = RouteServer(cast(Any, None), lambda i: None, cast(Any, None), RouteTimeouts())
    request = RouteRequest("r1", "i1", TextPrompt("hi"), SamplingParams())
    send, receive = trio.open_memory_channel[RouteItem](10)
    await server._pump(request, cast(Any, CallingService()), send)
    items = [item async for item in receive]
    assert items[-1] == RouteEnd(GenerationEnd("stop", Usage(1, 1), None, CALLS, "Sure."))


async def test_the_calling_node_carries_them_onto_its_generation(
    autojump_clock: trio.testing.MockClock,
) -> None:
    link = FakeLink()
    r = routing(link)
    end = RouteEnd(GenerationEnd("stop", Usage(2, 3), None, CALLS, ""))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer_with, r, link, RouteDelta("a"), end)
        got = await collect(remote_request(r))
    assert got == ["a", GenerationEnd("stop", Usage(2, 3), None, CALLS, "")]

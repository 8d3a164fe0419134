"""A real runner process reads a forced call with the model's mlx-lm tool parser, and the
worker's ``GenerationEnd`` carries it (:mod:`skulk.engine._tool_parse`)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import trio

from skulk.grammar import schema_text, tool_call_schema
from skulk.models import ensure_demo_model
from skulk.runner import RunnerConfig
from skulk.wire.runner import ChatMessage, ChatPrompt, GenerationEnd, SamplingParams
from skulk.worker import ModelService
from tests.unit.test_runner_tool_parse import TOOLS, with_parser


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tools")
    return with_parser(ensure_demo_model(root / "home"), root / "json_tools", "json_tools")


async def test_a_forced_call_comes_back_parsed_on_the_generation(model_dir: Path) -> None:
    async def resolve() -> Path:
        return model_dir

    svc = ModelService("skulk-demo", resolve, RunnerConfig(), rng=random.Random(0))
    city = {"enum": ["Oslo", "Bergen"]}
    parameters = {"type": "object", "properties": {"city": city}, "required": ["city"]}
    schema = tool_call_schema({"weather": parameters | {"additionalProperties": False}})
    params = SamplingParams(
        temperature=0.0, max_tokens=200, json_schema=schema_text(schema, "tools"), tool_call=True
    )
    prompt = ChatPrompt((ChatMessage("user", "weather in Oslo?"),), tools=json.dumps(TOOLS))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(svc.run)
        with trio.fail_after(60):
            while not svc.status().ready:  # noqa: ASYNC110 - the service has no events
                await trio.sleep(0.02)
            items = [item async for item in svc.generate(prompt, params)]
        nursery.cancel_scope.cancel()
    text = "".join(i for i in items if isinstance(i, str))
    end = items[-1]
    assert isinstance(end, GenerationEnd) and end.finish_reason == "stop"
    assert text.startswith("<tool_call>")  # the markers are in the text the client would get
    (call,) = end.tool_calls
    assert call.name == "weather" and json.loads(call.arguments)["city"] in ("Oslo", "Bergen")
    assert end.content == ""

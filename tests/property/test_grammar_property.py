"""Constrained generation always produces a valid document: hypothesis generates JSON schemas
(objects with typed properties and required lists, enums, consts, arrays with minItems/maxItems,
nested objects, anyOf, strings, numbers, integers, booleans, null), the demo model generates
under the schema's constraint (greedy and sampled), and every output parses with ``json.loads``
and validates with ``jsonschema``. Forced tool calls (``{"name": …, "arguments": …}`` between
``<tool_call>`` lines, for one or two tools) name a tool and carry arguments valid for it.

llguidance cannot force the shortest completion when a token budget runs out, so the schemas are
bounded (``maxLength``, ``maxItems``, bounded integers, ``multipleOf`` numbers, no additional
properties) and the budget is the longest instance's length in bytes (:func:`max_bytes`; a token
is at least one byte): every generation must then end by itself, with EOS.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import jsonschema
import mlx.core as mx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlx_lm.models.cache import make_prompt_cache

from skulk.engine._engine import Engine
from skulk.engine._grammar import GrammarTokenizer, grammar_tokenizer
from skulk.grammar import check_schema, schema_text, tool_call_schema
from skulk.models import ensure_demo_model
from skulk.wire.runner import ChatMessage, ChatPrompt

Schema = dict[str, Any]

NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=6)
WORDS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz ", max_size=5)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-999, 999), WORDS)


@st.composite
def strings(draw: st.DrawFn) -> Schema:
    longest = draw(st.integers(0, 6))
    return {"type": "string", "minLength": draw(st.integers(0, longest)), "maxLength": longest}


@st.composite
def integers(draw: st.DrawFn) -> Schema:
    low = draw(st.integers(-1000, 1000))
    return {"type": "integer", "minimum": low, "maximum": low + draw(st.integers(0, 2000))}


@st.composite
def numbers(draw: st.DrawFn) -> Schema:
    low = draw(st.integers(-100, 100))
    high = low + draw(st.integers(1, 200))
    step = draw(st.sampled_from([0.5, 0.25, 1]))
    return {"type": "number", "minimum": low, "maximum": high, "multipleOf": step}


LEAVES = st.one_of(
    strings(),
    integers(),
    numbers(),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.lists(SCALARS, min_size=1, max_size=4, unique=True).map(lambda v: {"enum": v}),
    SCALARS.map(lambda v: {"const": v}),
)


def containers(children: st.SearchStrategy[Schema]) -> st.SearchStrategy[Schema]:
    return st.one_of(objects(children), arrays(children), any_of(children))


@st.composite
def objects(draw: st.DrawFn, children: st.SearchStrategy[Schema], least: int = 0) -> Schema:
    properties = draw(st.dictionaries(NAMES, children, min_size=least, max_size=least + 3))
    required = [name for name in properties if draw(st.booleans())]
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


@st.composite
def arrays(draw: st.DrawFn, children: st.SearchStrategy[Schema]) -> Schema:
    most = draw(st.integers(0, 3))
    least = draw(st.integers(0, most))
    return {"type": "array", "items": draw(children), "minItems": least, "maxItems": most}


@st.composite
def any_of(draw: st.DrawFn, children: st.SearchStrategy[Schema]) -> Schema:
    return {"anyOf": draw(st.lists(children, min_size=1, max_size=2))}


#: Objects at the root (what OpenAI's json_schema requires), or any value (Ollama's ``format``
#: and tool parameters take any schema).
OBJECTS = objects(st.recursive(LEAVES, containers, max_leaves=8), least=1)
VALUES = st.recursive(LEAVES, containers, max_leaves=4)


def max_bytes(schema: Schema) -> int:
    """The longest instance of ``schema`` as compact JSON with ``", "`` and ``": "``, in UTF-8
    bytes (a character of a string is at most six: ``\\u001f``)."""
    if "enum" in schema:
        return max(len(json.dumps(v)) for v in schema["enum"])
    if "const" in schema:
        return len(json.dumps(schema["const"]))
    if "anyOf" in schema:
        return max(max_bytes(s) for s in schema["anyOf"])
    kind = schema["type"]
    if kind == "string":
        return 2 + 6 * int(schema["maxLength"])
    if kind in ("integer", "number"):
        digits = max(len(str(abs(schema["minimum"]))), len(str(abs(schema["maximum"]))))
        return 1 + digits + (3 if kind == "number" else 0)  # sign, digits, ".25"
    if kind == "array":
        most = int(schema["maxItems"])
        return 2 + most * max_bytes(schema["items"]) + 2 * max(most - 1, 0)
    if kind == "object":
        props = schema["properties"]
        members = sum(len(json.dumps(k)) + 2 + max_bytes(s) for k, s in props.items())
        return 2 + members + 2 * max(len(props) - 1, 0)
    return {"boolean": 5, "null": 4}[kind]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    path = ensure_demo_model(tmp_path_factory.mktemp("home"))
    return Engine.load(Path(path), lambda n, total: None)


@pytest.fixture(scope="module")
def prompt(engine: Engine) -> list[int]:
    return engine.tokenize(ChatPrompt((ChatMessage("user", "Reply in JSON."),)))


def generate(
    engine: Engine,
    gtok: GrammarTokenizer,
    prompt: list[int],
    schema: Schema,
    seed: int | None,
    wrap: tuple[str, str] = ("", ""),
) -> tuple[str, str]:
    """A minimal decode loop: ``(text, finish_reason)``; greedy when ``seed`` is None."""
    before, after = wrap
    constraint = gtok.constraint(schema_text(schema), before=before, after=after)
    budget = len(before + after) + max_bytes(schema) + 1  # the text, then EOS
    cache = make_prompt_cache(engine.model)
    key = None if seed is None else mx.random.key(seed)
    tokens, out = mx.array(prompt), list[int]()
    for _ in range(budget):
        logits = constraint.mask(engine.model(tokens[None], cache=cache)[:, -1, :])
        if key is None:
            token = cast(int, mx.argmax(logits, axis=-1).item())
        else:
            key, sub = mx.random.split(key)
            token = cast(int, mx.random.categorical(logits, key=sub).item())
        if token in gtok.eos_token_ids:
            assert constraint.allows_eos
            return engine.tokenizer.decode(out), "stop"
        constraint.accept(token)
        out.append(token)
        if constraint.is_finished:
            return engine.tokenizer.decode(out), "stop"
        tokens = mx.array([token])
    return engine.tokenizer.decode(out), "length"


SETTINGS = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
SEEDS = st.none() | st.integers(0, 2**32 - 1)  # None: greedy


@settings(SETTINGS, max_examples=40)
@given(schema=OBJECTS, seed=SEEDS)
def test_every_constrained_object_is_valid_for_its_schema(
    engine: Engine, prompt: list[int], schema: Schema, seed: int | None
) -> None:
    assert_valid_output(engine, prompt, schema, seed)


@settings(SETTINGS, max_examples=25)
@given(schema=VALUES, seed=SEEDS)
def test_every_constrained_value_is_valid_for_its_schema(
    engine: Engine, prompt: list[int], schema: Schema, seed: int | None
) -> None:
    assert_valid_output(engine, prompt, schema, seed)


@settings(SETTINGS, max_examples=15)
@given(tools=st.dictionaries(NAMES, OBJECTS, min_size=1, max_size=2), seed=SEEDS)
def test_every_forced_tool_call_is_valid_for_its_tool(
    engine: Engine, prompt: list[int], tools: dict[str, Schema], seed: int | None
) -> None:
    # tool_choice "required" (or one named function) with mlx-lm's json_tools format.
    schema = tool_call_schema(tools)
    wrap = ("<tool_call>\n", "\n</tool_call>")
    gtok = grammar_tokenizer(engine.tokenizer)
    text, finish = generate(engine, gtok, prompt, schema, seed, wrap)
    assert finish == "stop", text
    assert text.startswith(wrap[0]) and text.endswith(wrap[1])
    call = json.loads(text.removeprefix(wrap[0]).removesuffix(wrap[1]))
    assert call["name"] in tools
    jsonschema.validate(call["arguments"], tools[call["name"]])


def assert_valid_output(
    engine: Engine, prompt: list[int], schema: Schema, seed: int | None
) -> None:
    jsonschema.Draft202012Validator.check_schema(schema)
    check_schema(schema)  # what the API does first
    text, finish = generate(engine, grammar_tokenizer(engine.tokenizer), prompt, schema, seed)
    assert finish == "stop", (text, max_bytes(schema))
    instance = json.loads(text)
    jsonschema.validate(instance, schema, cls=jsonschema.Draft202012Validator)

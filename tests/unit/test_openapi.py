"""The OpenAPI document (``GET /openapi.json``) says exactly what the parsers accept.

For every route with a JSON body: each property the document lists is known to the route's
parser (sending it is never ``unknown_parameter``), and a field the document does not list is
refused as unknown — probed through the parsers themselves, with every field name any route
knows, so a field added to a parser without its schema (or the other way round) fails here.
Nested objects (messages, content parts, Ollama options) get the same check. Every no-op value
the document offers is accepted; the document's routes are the app's routes; every ``$ref``
resolves; the route serves the document, behind the key when keys are set.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import jsonschema
import pytest
import trio

from skulk.api import _anthropic, _ollama_parse, _openai_messages, _responses_parse, create_app
from skulk.api._anthropic import parse_count_tokens, parse_messages
from skulk.api._cluster_routes import parse_placement
from skulk.api._diagnostic_routes import parse_timeline_query
from skulk.api._embeddings import parse_ollama, parse_ollama_legacy, parse_openai
from skulk.api._errors import ApiError
from skulk.api._ollama_parse import parse_chat, parse_generate, parse_options, parse_show
from skulk.api._openai_parse import parse_chat_completions, parse_completions
from skulk.api._openapi import openapi_document, request_bodies
from skulk.api._openapi_answers import NDJSON, SSE
from skulk.api._pull_format import parse_ollama_pull, parse_pull
from skulk.api._responses_parse import parse_responses
from skulk.routing import Admission, Router
from tests.unit.test_api_edge import FakeNode, FakeService, app_for

Parser = Callable[[object], object]

PARSERS: dict[str, Parser] = {
    "/v1/chat/completions": parse_chat_completions,
    "/v1/completions": parse_completions,
    "/v1/responses": parse_responses,
    "/v1/messages": parse_messages,
    "/v1/messages/count_tokens": parse_count_tokens,
    "/api/chat": parse_chat,
    "/api/generate": parse_generate,
    "/api/show": parse_show,
    "/v1/placements": parse_placement,
    "/v1/embeddings": parse_openai,
    "/api/embed": parse_ollama,
    "/api/embeddings": parse_ollama_legacy,
    "/v1/pulls": parse_pull,
    "/api/pull": parse_ollama_pull,
}

#: A body each parser accepts, to which one field at a time is added.
VALID: dict[str, dict[str, object]] = {
    "/v1/chat/completions": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"model": "m", "prompt": "hi"},
    "/v1/responses": {"model": "m", "input": "hi"},
    "/v1/messages": {
        "model": "m",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}],
    },
    "/v1/messages/count_tokens": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "/api/chat": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "/api/generate": {"model": "m", "prompt": "hi"},
    "/api/show": {"model": "m"},
    "/v1/placements": {"model": "m"},
    "/v1/embeddings": {"model": "m", "input": "hi"},
    "/api/embed": {"model": "m", "input": "hi"},
    "/api/embeddings": {"model": "m", "prompt": "hi"},
    "/v1/pulls": {"model": "org/m"},
    "/api/pull": {"model": "org/m"},
}


def outcome(parse: Parser, body: object) -> str | None:
    """The parser's error code for ``body`` (``None``: accepted)."""
    try:
        parse(body)
    except ApiError as exc:
        return exc.code
    return None


def every_field_name() -> set[str]:
    names = {"zzz_not_a_field", "Model", "messages ", ""}
    for props, _ in request_bodies().values():
        names |= set(props)
    return names


def test_every_body_route_is_probed() -> None:
    assert set(request_bodies()) == set(PARSERS) == set(VALID)
    for path, parse in PARSERS.items():
        assert outcome(parse, VALID[path]) is None, path


@pytest.mark.parametrize("path", sorted(PARSERS))
def test_the_documented_fields_are_exactly_the_ones_the_parser_knows(path: str) -> None:
    props, required = request_bodies()[path]
    parse = PARSERS[path]
    assert set(required) <= set(props)
    for name in sorted(every_field_name()):
        code = outcome(parse, {**VALID[path], name: None})
        known = code != "unknown_parameter"
        assert known == (name in props), (path, name, code)


@pytest.mark.parametrize("path", sorted(PARSERS))
def test_every_no_op_value_the_document_offers_is_accepted(path: str) -> None:
    props, _ = request_bodies()[path]
    offered = [(n, v) for n, s in props.items() for v in s.get("enum", ())]  # type: ignore[attr-defined]
    # every other route has no-op or enum fields
    no_enums = ("/api/show", "/api/embed", "/api/embeddings", "/v1/pulls", "/api/pull")
    assert path in no_enums or offered
    for name, value in offered:
        assert outcome(PARSERS[path], {**VALID[path], name: value}) is None, (path, name, value)


def test_a_refused_no_op_value_is_a_400_naming_the_field() -> None:
    """What ``No-op only`` in a description means: any other value is refused."""
    body = {**VALID["/v1/chat/completions"], "presence_penalty": 0.5}
    with pytest.raises(ApiError) as info:
        parse_chat_completions(body)
    assert (info.value.param, info.value.code) == ("presence_penalty", "unsupported_parameter")
    schema = request_bodies()["/v1/chat/completions"][0]["presence_penalty"]
    assert schema["enum"] == [0, None]
    assert str(schema["description"]).startswith("No-op only")


def components() -> dict[str, Any]:
    schemas = openapi_document()["components"]
    assert isinstance(schemas, dict)
    found: dict[str, Any] = schemas["schemas"]
    return found


def props_of(schema: dict[str, Any]) -> set[str]:
    return set(schema["properties"])


def test_chat_message_schemas_match_the_parser_keys() -> None:
    user, assistant, tool = components()["ChatMessage"]["anyOf"]
    keys = _openai_messages._MESSAGE_KEYS
    assert props_of(user) == set(keys["user"]) == set(keys["system"])
    assert props_of(assistant) == set(keys["assistant"])
    assert props_of(tool) == set(keys["tool"])
    part = user["properties"]["content"]["anyOf"][1]["items"]
    assert props_of(part) == set(_openai_messages._TEXT_PART_KEYS)


def test_nested_schemas_match_the_parser_keys() -> None:
    schemas = components()
    for branch in schemas["InputMessage"]["anyOf"]:
        assert props_of(branch) == set(_responses_parse._MESSAGE_KEYS)
    assert props_of(schemas["InputText"]) == set(_responses_parse._PART_KEYS["input_text"])
    assert props_of(schemas["OutputText"]) == set(_responses_parse._PART_KEYS["output_text"])
    assert props_of(schemas["Message"]) == set(_anthropic._MESSAGE_KEYS)
    assert props_of(schemas["TextBlock"]) == set(_anthropic._TEXT_BLOCK_KEYS)
    assert props_of(schemas["OllamaMessage"]) == set(_ollama_parse._MESSAGE_KEYS)


def test_ollama_options_are_exactly_the_documented_ones() -> None:
    options = components()["OllamaOptions"]["properties"]
    names = set(options) | {"zzz", "temp", "stop_sequences", "max_tokens"}
    for name in sorted(names):
        code = outcome(parse_options, {name: None})
        assert (code != "unknown_parameter") == (name in options), name
    for name, schema in options.items():
        for value in schema.get("enum", ()):
            assert outcome(parse_options, {name: value}) is None, (name, value)


def refs(node: object) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from refs(item)


def test_every_reference_resolves_and_the_document_is_json() -> None:
    document = openapi_document()
    schemas = components()
    targets = set(refs(document))
    assert targets
    for target in targets:
        assert target.startswith("#/components/schemas/")
        assert target.removeprefix("#/components/schemas/") in schemas, target
    assert json.loads(json.dumps(document)) == document


def test_streamed_routes_document_their_content_types() -> None:
    paths: dict[str, Any] = openapi_document()["paths"]  # type: ignore[assignment]
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"):
        assert set(paths[path]["post"]["responses"]["200"]["content"]) == {
            "application/json",
            SSE,
        }
    for path in ("/api/chat", "/api/generate"):
        assert NDJSON in paths[path]["post"]["responses"]["200"]["content"]
        error = paths[path]["post"]["responses"]["400"]["content"]["application/json"]
        assert error["schema"] == {"$ref": "#/components/schemas/OllamaError"}
    error = paths["/v1/messages"]["post"]["responses"]["401"]["content"]["application/json"]
    assert error["schema"] == {"$ref": "#/components/schemas/AnthropicError"}
    assert paths["/health"]["get"]["security"] == []


def quart_to_openapi(rule: str) -> str:
    for converter in ("path:", "int:", "string:"):
        rule = rule.replace("<" + converter, "<")
    return rule.replace("<", "{").replace(">", "}")


#: The dashboard's page, assets and live feed (an endless stream): not API operations.
DASHBOARD = {"/", "/dashboard/{name}", "/v1/dashboard/events"}


def routes_of(app: Any) -> set[tuple[str, str]]:
    routes = {
        (quart_to_openapi(rule.rule), method.lower())
        for rule in app.url_map.iter_rules()
        for method in rule.methods or ()
        if method not in ("HEAD", "OPTIONS")
    } | {
        (quart_to_openapi(rule.rule), "get")
        for rule in app.url_map.iter_rules()
        if getattr(rule, "websocket", False)
    }
    return {(path, method) for path, method in routes if path not in DASHBOARD}


def documented(document: dict[str, object]) -> set[tuple[str, str]]:
    paths: dict[str, dict[str, object]] = document["paths"]  # type: ignore[assignment]
    return {(path, method) for path, ops in paths.items() for method in ops}


def test_the_document_lists_every_route_of_the_app() -> None:
    """A plain node: no control routes, no timeline; and one with both."""
    app = app_for(FakeService())
    assert routes_of(app) == documented(openapi_document(cluster=False, timeline=False))
    node = FakeNode(FakeService())
    router = Router("n1", lambda: node.state, lambda i: None, lambda p: False, None, Admission())  # type: ignore[arg-type]
    full = create_app(
        router,
        node,  # type: ignore[arg-type]
        control=object(),  # type: ignore[arg-type]  # routes only: never called here
        timeline=object(),  # type: ignore[arg-type]
    )
    assert routes_of(full) == documented(openapi_document())


async def test_the_route_serves_the_document_behind_the_key() -> None:
    plain = app_for(FakeService())
    async with plain.test_app() as test_app:
        with trio.fail_after(10):
            response = await test_app.test_client().get("/openapi.json")
        assert response.status_code == 200
        assert await response.get_json() == openapi_document(cluster=False, timeline=False)
    keyed = app_for(FakeService(), api_keys=("k1",))
    async with keyed.test_app() as test_app:
        client = test_app.test_client()
        with trio.fail_after(10):
            refused = await client.get("/openapi.json")
            allowed = await client.get("/openapi.json", headers={"x-api-key": "k1"})
        assert refused.status_code == 401
        assert allowed.status_code == 200
        assert (await allowed.get_json())["info"]["title"] == "Skulk"


def body_validator(path: str) -> jsonschema.Draft202012Validator:
    """The route's body schema, its ``$ref`` s resolved against the document's components."""
    document = openapi_document()
    paths: dict[str, Any] = document["paths"]  # type: ignore[assignment]
    schema = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    rooted = {**schema, "components": document["components"]}
    jsonschema.Draft202012Validator.check_schema(rooted)
    return jsonschema.Draft202012Validator(rooted)


@pytest.mark.parametrize("path", sorted(PARSERS))
def test_body_schemas_are_valid_and_accept_the_valid_bodies(path: str) -> None:
    validator = body_validator(path)
    assert validator.is_valid(VALID[path])
    assert not validator.is_valid({**VALID[path], "zzz_not_a_field": 1})


def test_the_examples_match_their_schemas_and_the_parsers() -> None:
    paths: dict[str, Any] = openapi_document()["paths"]  # type: ignore[assignment]
    seen = 0
    for path, ops in paths.items():
        body = ops.get("post", {}).get("requestBody")
        for example in (
            (body or {}).get("content", {}).get("application/json", {}).get("examples", {}).values()
        ):
            seen += 1
            body_validator(path).validate(example["value"])
            assert outcome(PARSERS[path], example["value"]) is None, (path, example)
    assert seen == 12  # a plain and a streamed one for each of the six generating routes


#: Bodies each parser refuses for a rule across fields, which the document states too.
CROSS_FIELD = [
    ("/v1/chat/completions", {"stream_options": {"include_usage": True}}),
    ("/v1/completions", {"stream_options": {}, "stream": False}),
    ("/v1/responses", {"stream_options": {}}),
    ("/api/generate", {"raw": True, "system": "be brief"}),
    (
        "/v1/responses",
        {"input": [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}]},
    ),
]


@pytest.mark.parametrize(("path", "extra"), CROSS_FIELD)
def test_rules_across_fields_are_in_the_document(path: str, extra: dict[str, object]) -> None:
    body = {**VALID[path], **extra}
    assert outcome(PARSERS[path], body) is not None
    assert not body_validator(path).is_valid(body)


def test_show_needs_a_model_or_a_name() -> None:
    validator = body_validator("/api/show")
    refused: list[dict[str, object]] = [{}, {"verbose": True}, {"model": None}]
    for body in refused:
        assert outcome(parse_show, body) is not None
        assert not validator.is_valid(body)
    accepted: list[dict[str, object]] = [
        {"model": "m"},
        {"name": "m"},
        {"model": None, "name": "m"},
    ]
    for body in accepted:
        assert outcome(parse_show, body) is None
        assert validator.is_valid(body)


def test_the_timeline_query_parameters_are_the_documented_ones() -> None:
    paths: dict[str, Any] = openapi_document()["paths"]  # type: ignore[assignment]
    params = paths["/v1/diagnostics/cluster/timeline"]["get"]["parameters"]
    names = {p["name"] for p in params}
    assert names == {"limit", "since"}
    for name in sorted(names | {"until", "offset", "node"}):
        code = outcome(lambda args: parse_timeline_query(args), {name: ["1"]})  # type: ignore[arg-type]
        assert (code != "unknown_parameter") == (name in names), name

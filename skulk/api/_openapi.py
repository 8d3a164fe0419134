"""The OpenAPI 3.1 document of the HTTP API (``GET /openapi.json``), built from the parsers' tables.

Request bodies are not written here: each parser module keeps, per format, one table of the
fields it knows with the JSON Schema of what each accepts (:mod:`skulk.api._schema`), and its
parser's set of known fields is that table's keys. This module only assembles them — body
properties, the shared schemas each module lists in ``SCHEMAS``, the query parameters of the
timeline route — so a field cannot be accepted by a parser and missing from the document, or
described and refused as unknown (``tests/unit/test_openapi.py`` checks both, route by route).

What is written here is what the parsers do not know: which route takes which body and which
statuses it answers, the examples, the security schemes; the answers (success shapes, each
format's error envelope, one event of each stream) are in :mod:`skulk.api._openapi_answers`.

``/openapi.json`` needs the API key when keys are set, as every route but ``/health`` does: an
operator who sets a key expects nothing else to answer without one, and the document (every
route and field) is a map for whoever probes the node. Tools that read it send the key too.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping

from quart import Response
from quart_trio import QuartTrio

from skulk import __version__
from skulk.api import (
    _anthropic,
    _embeddings,
    _ollama_parse,
    _openai_messages,
    _openai_parse,
    _responses_parse,
)
from skulk.api._cluster_routes import _PLACEMENT_FIELDS
from skulk.api._diagnostic_routes import _TIMELINE_PARAMS
from skulk.api._error_formats import OLLAMA_PREFIX
from skulk.api._fields import STREAM_OPTIONS_NEED_STREAM, Check
from skulk.api._http_errors import json_response
from skulk.api._openapi_answers import (
    ANSWERS,
    EVENTS,
    INT,
    JSON,
    NDJSON,
    SSE,
    STR,
    error_schema,
    list_of,
    shape,
)
from skulk.api._openapi_models import PULL_ERRORS, REASONS, model_paths, pull_bodies
from skulk.api._pull_format import OLLAMA_PULL_FIELDS, PULL_FIELDS
from skulk.api._schema import Schema, obj, ref
from skulk.models import DEMO_MODEL_ID


def fields(honoured: Mapping[str, Schema], *checks: Mapping[str, Check]) -> dict[str, Schema]:
    """A body's properties: the honoured fields' schemas, then each check's ``schema`` (the
    no-op and informational tables, :class:`~skulk.api._fields.Check`)."""
    props = dict(honoured)
    for table in checks:
        for name, check in table.items():
            props.setdefault(name, check.schema)
    return props


def request_bodies() -> dict[str, tuple[dict[str, Schema], tuple[str, ...]]]:
    """Each JSON-body route's properties and required fields, from the parsers' tables."""
    oa, an, ol = _openai_parse, _anthropic, _ollama_parse
    return {
        "/v1/chat/completions": (
            fields(oa._CHAT_HONOURED, oa._CHAT_NO_OPS, oa._CHAT_INFO),
            ("model", "messages"),
        ),
        "/v1/completions": (
            fields(oa._COMPLETIONS_HONOURED, oa._COMPLETIONS_NO_OPS, oa._COMPLETIONS_INFO),
            ("model", "prompt"),
        ),
        "/v1/responses": (
            fields(_responses_parse._HONOURED, _responses_parse._NO_OPS, _responses_parse._INFO),
            ("model", "input"),
        ),
        "/v1/messages": (
            fields(an._MESSAGES_HONOURED, an._MESSAGES_NO_OPS, an._MESSAGES_INFO),
            ("model", "messages", "max_tokens"),
        ),
        "/v1/messages/count_tokens": (
            fields(an._PROMPT_HONOURED, an._COMMON_NO_OPS, an._COMMON_INFO),
            ("model", "messages"),
        ),
        "/api/chat": (fields(ol._CHAT_HONOURED, ol._CHAT_FIELDS), ("model",)),
        "/api/generate": (fields(ol._GENERATE_HONOURED, ol._GENERATE_FIELDS), ("model",)),
        "/api/show": (dict(ol._SHOW_FIELDS), ()),
        "/v1/embeddings": (dict(_embeddings.OPENAI_FIELDS), ("model", "input")),
        "/api/embed": (dict(_embeddings.OLLAMA_FIELDS), ("model", "input")),
        "/api/embeddings": (dict(_embeddings.OLLAMA_LEGACY_FIELDS), ("model", "prompt")),
        "/v1/placements": (dict(_PLACEMENT_FIELDS), ("model",)),
        **pull_bodies(PULL_FIELDS, OLLAMA_PULL_FIELDS),
    }


_REASONS = {
    200: "OK",
    201: "Created",
    202: "Accepted",
    400: "The request is invalid (the message, and OpenAI's param, name the field).",
    401: "A missing or wrong API key (when the node has keys).",
    404: "Unknown model, instance, node or route.",
    408: "The body took longer than 60 s to arrive.",
    409: "A conflict with the cluster's State (the code names it).",
    413: "The body is larger than 8 MiB.",
    415: "The body is not JSON.",
    429: "The instance's admission bound is full (Retry-After).",
    500: "The runner failed during the request.",
    502: "The node serving the request was lost.",
    503: "Nothing can serve it now (model not ready, no quorum, ...).",
    504: "A runner deadline ended the request.",
    **REASONS,
}
_BODY_ERRORS = (400, 408, 413, 415)
_SERVING_ERRORS = (404, 429, 500, 502, 503, 504)


def _json(schema: Schema) -> dict[str, object]:
    return {JSON: {"schema": schema}}


def _operation(
    path: str,
    summary: str,
    answers: Mapping[int, dict[str, object]],
    errors: Iterable[int] = (),
    *,
    body: dict[str, object] | None = None,
    parameters: list[dict[str, object]] | None = None,
    open_route: bool = False,
) -> dict[str, object]:
    """One operation: its successful ``answers`` (status → content) and ``errors`` in the
    path's envelope (401 added unless the route is open)."""
    envelope = _json(ref(error_schema(path)))
    responses: dict[str, object] = {
        str(status): {"description": _REASONS[status], "content": content}
        for status, content in answers.items()
    }
    statuses = set(errors) | (set() if open_route else {401})
    if body is not None:
        statuses |= set(_BODY_ERRORS)
    for status in sorted(statuses):
        response: dict[str, object] = {"description": _REASONS[status], "content": envelope}
        if status == 401:
            response["headers"] = {"WWW-Authenticate": {"schema": STR}}
        responses.setdefault(str(status), response)
    op: dict[str, object] = {"summary": summary, "responses": responses}
    if body is not None:
        op["requestBody"] = body
    if parameters:
        op["parameters"] = parameters
    if open_route:
        op["security"] = []
    return op


def _path_param(name: str, description: str, example: str | None = None) -> dict[str, object]:
    param: dict[str, object] = {
        "name": name,
        "in": "path",
        "required": True,
        "schema": STR,
        "description": description,
    }
    if example is not None:
        param["example"] = example
    return param


def _streamed(path: str, schema: str, stream_type: str, description: str) -> dict[str, object]:
    """A 200 that is JSON, or a stream when the request asked for one (each SSE event's schema;
    NDJSON lines are not described beyond the content type)."""
    stream: dict[str, object] = {"description": description}
    if (event := EVENTS.get(path)) is not None:
        stream["schema"] = event
    return {JSON: {"schema": ref(schema)}, stream_type: stream}


#: What the parsers enforce across a body's fields, as JSON Schema (each next to its check).
_CROSS_FIELD: dict[str, list[Schema]] = {
    "/v1/chat/completions": [STREAM_OPTIONS_NEED_STREAM],
    "/v1/completions": [STREAM_OPTIONS_NEED_STREAM],
    "/v1/responses": [STREAM_OPTIONS_NEED_STREAM],
    "/api/generate": [_ollama_parse.RAW_HAS_NO_SYSTEM],
    "/api/show": [_ollama_parse.SHOW_NEEDS_A_MODEL],
    "/api/pull": [_ollama_parse.SHOW_NEEDS_A_MODEL],  # model, or the older name
}


def _body_schema(path: str) -> Schema:
    props, required = request_bodies()[path]
    schema = obj(props, required=required)
    if rules := _CROSS_FIELD.get(path):
        schema["allOf"] = rules
    return schema


_HELLO = [{"role": "user", "content": "Say hello."}]
#: A plain request per generating route, shown in the document (and sent by schemathesis'
#: examples phase, with its streamed twin, so every stream format is exercised).
_EXAMPLES: dict[str, dict[str, object]] = {
    "/v1/chat/completions": {"model": DEMO_MODEL_ID, "messages": _HELLO, "max_tokens": 4},
    "/v1/completions": {"model": DEMO_MODEL_ID, "prompt": "Once upon", "max_tokens": 4},
    "/v1/responses": {"model": DEMO_MODEL_ID, "input": "Say hello.", "max_output_tokens": 4},
    "/v1/messages": {"model": DEMO_MODEL_ID, "messages": _HELLO, "max_tokens": 4},
    "/api/chat": {"model": DEMO_MODEL_ID, "messages": _HELLO, "options": {"num_predict": 4}},
    "/api/generate": {"model": DEMO_MODEL_ID, "prompt": "Once upon", "options": {"num_predict": 4}},
}


def _body(path: str) -> dict[str, object]:
    """A route's request body: its schema and, for a generating route, a plain and a streamed
    example."""
    content: dict[str, object] = {"schema": _body_schema(path)}
    if (example := _EXAMPLES.get(path)) is not None:
        ollama = path.startswith(OLLAMA_PREFIX)  # Ollama streams unless told not to
        content["examples"] = {
            "plain": {"value": {**example, "stream": False}},
            "streamed": {"value": {**example, "stream": True} if not ollama else example},
        }
    return {"required": True, "content": {JSON: content}}


def _paths(*, cluster: bool, timeline: bool) -> dict[str, dict[str, object]]:
    any_json = _json({"type": "object"})
    sse = "Server-sent events when stream is true"
    paths: dict[str, dict[str, object]] = {
        "/health": {
            "get": _operation(
                "/health",
                "Whether this node can serve a model (open without a key).",
                {200: _json(ref("Health")), 503: _json(ref("Health"))},
                open_route=True,
            )
        },
        "/openapi.json": {"get": _operation("/openapi.json", "This document.", {200: any_json})},
        "/metrics": {
            "get": _operation(
                "/metrics",
                "This node's Prometheus metrics (text format 0.0.4).",
                {200: {"text/plain": {"schema": STR}}},
            )
        },
        "/v1/models": {
            "get": _operation("/v1/models", "The cluster's models.", {200: _json(ref("ModelList"))})
        },
        "/v1/models/{model_id}": {
            "get": _operation(
                "/v1/models/{model_id}",
                "One model (its id may contain slashes).",
                {200: _json(ref("Model"))},
                (404,),
                parameters=[_path_param("model_id", "The model's id.", DEMO_MODEL_ID)],
            )
        },
    }
    inference = {
        "/v1/chat/completions": ("OpenAI Chat Completions.", "ChatCompletion", SSE),
        "/v1/completions": ("OpenAI Completions.", "Completion", SSE),
        "/v1/responses": ("OpenAI Responses.", "Response", SSE),
        "/v1/messages": ("Anthropic Messages.", "AnthropicMessage", SSE),
        "/api/chat": ("Ollama chat.", "OllamaAnswer", NDJSON),
        "/api/generate": ("Ollama generate.", "OllamaAnswer", NDJSON),
    }
    for path, (summary, answer, stream_type) in inference.items():
        how = sse if stream_type == SSE else "NDJSON lines unless stream is false"
        paths[path] = {
            "post": _operation(
                path,
                summary,
                {200: _streamed(path, answer, stream_type, how)},
                _SERVING_ERRORS,
                body=_body(path),
            )
        }
    paths["/v1/messages/count_tokens"] = {
        "post": _operation(
            "/v1/messages/count_tokens",
            "Anthropic token count: the prompt as the model's tokenizer counts it.",
            {200: _json(ref("TokenCount"))},
            _SERVING_ERRORS,
            body=_body("/v1/messages/count_tokens"),
        )
    }
    ollama_get = {
        "/api/tags": ("Models with an instance.", "OllamaModels"),
        "/api/ps": ("Models with a ready instance.", "OllamaModels"),
        "/api/version": ("The Ollama API level.", "OllamaVersion"),
    }
    for path, (summary, answer) in ollama_get.items():
        paths[path] = {"get": _operation(path, summary, {200: _json(ref(answer))})}
    paths["/api/show"] = {
        "post": _operation(
            "/api/show",
            "What the cluster knows of a model.",
            {200: _json(ref("OllamaShow"))},
            (404,),
            body=_body("/api/show"),
        )
    }
    embeddings = {
        "/v1/embeddings": ("OpenAI embeddings (pooled final hidden states).", "Embeddings"),
        "/api/embed": ("Ollama embeddings.", "OllamaEmbed"),
        "/api/embeddings": ("Ollama embedding (the older route).", "OllamaEmbedding"),
    }
    for path, (summary, answer) in embeddings.items():
        paths[path] = {
            "post": _operation(
                path, summary, {200: _json(ref(answer))}, _SERVING_ERRORS, body=_body(path)
            )
        }
    paths["/v1/ws"] = {
        "get": _operation(
            "/v1/ws",
            "WebSocket streaming (a request per message, the chat body with an id); a GET "
            "without a WebSocket upgrade is refused.",
            {},
            (400,),
        )
    }
    node = {
        "/v1/diagnostics/node": "This node's model services and runners.",
        "/v1/cluster/links": "This node's federation links.",
        "/v1/cluster/raft": "This node's consensus view.",
        "/v1/cluster/nodes": "Every node's gossiped readings, status, health and runners.",
    }
    for path, summary in node.items():
        errors = (503,) if path == "/v1/cluster/raft" else ()
        paths[path] = {"get": _operation(path, summary, {200: any_json}, errors)}
    paths["/v1/diagnostics/node/retry"] = {
        "post": _operation(
            "/v1/diagnostics/node/retry",
            "End the cool-down of every failed model on this node.",
            {202: any_json},
            (409,),
        )
    }
    if timeline:
        params: list[dict[str, object]] = [
            {"name": name, "in": "query", "required": False, "schema": schema}
            for name, schema in _TIMELINE_PARAMS.items()
        ]
        paths["/v1/diagnostics/cluster/timeline"] = {
            "get": _operation(
                "/v1/diagnostics/cluster/timeline",
                "Every reachable node's runner events, merged.",
                {200: any_json},
                (400,),
                parameters=params,
            )
        }
        paths["/v1/requests/{request_id}"] = {
            "get": _operation(
                "/v1/requests/{request_id}",
                "One request's events (x-request-id) from every node it touched, merged.",
                {200: any_json},
                (400, 404),
                parameters=[_path_param("request_id", "The request's id.", "req-0123abcd")],
            )
        }
    if cluster:
        paths.update(_cluster_paths())
        paths.update(model_paths(_operation, _body, _path_param))
    return paths


def _cluster_paths() -> dict[str, dict[str, object]]:
    key = {
        "name": "Idempotency-Key",
        "in": "header",
        "required": False,
        "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[ -~]+$"},
        "description": "A retry with the same key answers as the first did and changes nothing "
        "(kept in the replicated State, the last 1024 keys); a key used for another request "
        "is a 422 key_reused.",
    }
    instance_id = [_path_param("instance_id", "The instance's id.")]
    control = (503,)  # decided by the leader: no quorum, not leader, ...
    return {
        "/v1/placements": {
            "post": _operation(
                "/v1/placements",
                "Place a model (the leader decides); dry_run only plans.",
                {
                    200: _json(shape({"plan": {"type": "object"}})),
                    201: _json(shape({"instance": {"type": "object"}})),
                },
                PULL_ERRORS,  # a Hub id is pulled first: its failures too (409: placement)
                body=_body("/v1/placements"),
                parameters=[key],
            )
        },
        "/v1/instances": {
            "get": _operation(
                "/v1/instances",
                "Every instance.",
                {200: _json(shape({"instances": list_of("Instance")}))},
            )
        },
        "/v1/instances/{instance_id}": {
            "get": _operation(
                "/v1/instances/{instance_id}",
                "One instance.",
                {200: _json(ref("Instance"))},
                (404,),
                parameters=instance_id,
            ),
            "delete": _operation(
                "/v1/instances/{instance_id}",
                "Delete an instance: its runners stop.",
                {200: _json(shape({"deleted": STR}))},
                (400, 404, 409, 422, *control),  # 400: a bad key; 422: key_reused
                parameters=[*instance_id, key],
            ),
        },
        "/v1/cluster/state": {
            "get": _operation(
                "/v1/cluster/state",
                "The replicated State and the Raft index it was applied at.",
                {200: _json(shape({"applied": INT}))},
            )
        },
        "/v1/cluster/nodes/{node_id}": {
            "delete": _operation(
                "/v1/cluster/nodes/{node_id}",
                "Remove a stopped node for good (State and Raft membership).",
                {200: _json(shape({"removed": STR}))},
                (404, 409, *control),
                parameters=[_path_param("node_id", "The node's id.")],
            )
        },
    }


@functools.cache
def openapi_document(*, cluster: bool = True, timeline: bool = True) -> dict[str, object]:
    """The OpenAPI 3.1 document of a node's API: ``cluster`` with the control routes,
    ``timeline`` with the cluster timeline (as :func:`~skulk.api.create_app` installs them).
    Built once per combination; callers must not change it."""
    schemas: dict[str, Schema] = {}
    for module_schemas in (
        _openai_messages.SCHEMAS,
        _responses_parse.SCHEMAS,
        _anthropic.SCHEMAS,
        _ollama_parse.SCHEMAS,
        ANSWERS,
    ):
        schemas.update(module_schemas)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Skulk",
            "version": __version__,
            "description": "One API for the cluster's models in four wire formats (OpenAI "
            "Chat Completions, Completions and Responses; Anthropic Messages; Ollama), and "
            "the cluster's control routes. Field descriptions say whether a field is "
            "honoured, accepted only with its no-op value, or informational; any field not "
            "listed is refused (400). With API keys set, every route but /health needs one "
            "(Authorization: Bearer, or x-api-key). docs/api.md has the details.",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}, {"apiKey": []}],
        "paths": _paths(cluster=cluster, timeline=timeline),
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            },
        },
    }


def install_openapi_route(app: QuartTrio, *, cluster: bool, timeline: bool) -> None:
    """Add ``GET /openapi.json`` to ``app``: the document of the routes installed there
    (``cluster``: the cluster routes; ``timeline``: the timeline route), behind the key when
    keys are set."""

    @app.get("/openapi.json")
    async def openapi() -> Response:
        return json_response(openapi_document(cluster=cluster, timeline=timeline), 200)

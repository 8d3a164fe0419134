"""The model routes in the OpenAPI document (:mod:`skulk.api._model_routes`): pulls, the
downloads and the model stores. Bodies come from the parser's tables
(:mod:`skulk.api._pull_format`); this module says which route answers what."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from skulk.api._openapi_answers import INT, JSON, NDJSON, STR, shape
from skulk.api._schema import Schema

#: Status descriptions the model routes add to the document's.
REASONS = {
    403: "The Hub refused the token given (a gated repo whose terms it did not accept).",
    422: "The Hub repo is not a model mlx-lm loads (architecture, no safetensors).",
    507: "No node has room for the model (disk or --store-budget).",
}
#: ``POST /v1/pulls`` and ``POST /api/pull``: the check's failures, then the cluster's.
PULL_ERRORS = (401, 403, 404, 409, 422, 502, 503, 507)

_ANY: Schema = {"type": "object"}
_ARRAY: Schema = {"type": "array"}
_NULL_INT: Schema = {"type": ["integer", "null"]}
_STATUS = shape(
    {
        "model": STR,
        "phase": {"enum": ["checking", "downloading", "spreading", "done"]},
        "done_bytes": INT,
        "target_bytes": INT,
        "holders": {"type": "array", "items": STR},
        "nodes": {"type": "array", "items": STR},
        "transfers": {"type": "array", "items": _ANY},
    },
    repo=STR,
    commit=STR,
    total_bytes=INT,
    downloader={"type": ["string", "null"]},
)
_OLLAMA_PROGRESS = shape({"status": STR}, digest=STR, total=INT, completed=INT)
_STORE = shape(
    {
        "used_bytes": INT,
        "budget_bytes": _NULL_INT,
        "available_bytes": INT,
        "stored": {"type": "array", "items": _ANY},
    }
)

Operation = Callable[..., dict[str, object]]


def _json(schema: Schema) -> dict[str, object]:
    return {JSON: {"schema": schema}}


def model_paths(
    operation: Operation,
    body: Callable[[str], dict[str, object]],
    path_param: Callable[[str, str], dict[str, object]],
) -> dict[str, dict[str, object]]:
    """The model routes' paths, built with the document's ``operation``, ``body`` and
    ``path_param`` helpers (:mod:`skulk.api._openapi`)."""
    streamed = "NDJSON status lines unless stream is false"
    paths: dict[str, dict[str, object]] = {
        "/v1/pulls": {
            "post": operation(
                "/v1/pulls",
                "Pull a Hugging Face Hub model into the cluster: one node downloads it, the "
                "others fetch it from their peers.",
                {200: {JSON: {"schema": _STATUS}, NDJSON: {"description": streamed}}},
                PULL_ERRORS,
                body=body("/v1/pulls"),
            )
        },
        "/api/pull": {
            "post": operation(
                "/api/pull",
                "Ollama pull: the same, as Ollama's progress lines.",
                {
                    200: {
                        JSON: {"schema": _OLLAMA_PROGRESS},
                        NDJSON: {"description": "Ollama progress lines unless stream is false"},
                    }
                },
                PULL_ERRORS,
                body=body("/api/pull"),
            )
        },
        "/v1/downloads": {
            "get": operation(
                "/v1/downloads",
                "The State's downloads and every node's model transfers (bytes, rate, ETA).",
                {200: _json(shape({"downloads": _ARRAY, "transfers": _ARRAY}))},
            )
        },
        "/v1/store": {
            "get": operation(
                "/v1/store",
                "This node's model store, every node's store readings and the State's holders.",
                {
                    200: _json(
                        shape(
                            {
                                "node": STR,
                                "store": {"anyOf": [_STORE, {"type": "null"}]},
                                "nodes": {"type": "array"},
                                "models": {"type": "array"},
                            }
                        )
                    )
                },
            )
        },
        "/v1/store/{model}": {
            "delete": operation(
                "/v1/store/{model}",
                "Remove a model from this node's store (refused while an instance uses it).",
                {200: _json(shape({"node": STR, "removed": _ANY}))},
                (404, 409),
                parameters=[path_param("model", "A name the store knows, or its sha256.")],
            )
        },
    }
    return paths


def pull_bodies(
    fields: Mapping[str, Schema], ollama_fields: Mapping[str, Schema]
) -> dict[str, tuple[dict[str, Schema], tuple[str, ...]]]:
    """The pull routes' properties and required fields (for ``request_bodies``)."""
    return {"/v1/pulls": (dict(fields), ("model",)), "/api/pull": (dict(ollama_fields), ())}

"""Embeddings: OpenAI ``POST /v1/embeddings``, Ollama ``POST /api/embed`` and the older
``POST /api/embeddings``.

Each body is checked here into inputs for :meth:`skulk.routing.Router.embed` (texts, or token
ids for OpenAI), routed to an instance anywhere in the cluster like a generation, and its
vectors rendered back in the format's shape. The vectors are the model's final hidden states,
mean-pooled over the input's tokens and L2-normalised (:mod:`skulk.engine._embed`); their
length is the model's hidden size.

Strictness as for the other formats: a field we cannot honour is a 400 naming it. OpenAI's
``dimensions`` is refused (our models give their hidden size only); ``encoding_format``
``float`` or ``base64`` (little-endian float32, what the official client asks for by
default); ``user`` is accepted. Ollama's ``dimensions`` is refused likewise, ``truncate``
(default true) cuts an input to the model's context instead of failing, ``options`` are
checked as for ``/api/chat`` (they change nothing here), ``keep_alive`` is accepted.
"""

from __future__ import annotations

import base64
import struct
import time
from collections.abc import Awaitable, Callable, Mapping

from quart import Response
from quart_trio import QuartTrio

from skulk.api._errors import ApiError
from skulk.api._fields import check_type, model_name
from skulk.api._http_errors import json_response
from skulk.api._ollama_parse import COMMON_HONOURED, keep_alive, parse_options
from skulk.api._schema import INFORMATIONAL, Schema, honoured, typed
from skulk.api._serving import routed
from skulk.api._stream import ROUTING_ERRORS, SERVING_ERRORS, routing_error, serving_error_for
from skulk.routing import Router, Served
from skulk.wire.runner import EmbedInput, TextPrompt, TokenIds
from skulk.worker import Embedding

#: Most inputs one request may carry (OpenAI's own limit is 2048; the runner also bounds
#: inputs times hidden size, see :data:`skulk.engine._embed.MAX_EMBED_FLOATS`).
MAX_INPUTS = 256
#: Largest token id accepted in a token-array input (the runner checks the model's vocabulary).
MAX_TOKEN_ID = 2**31 - 1

_TEXT: Schema = {"type": "string", "minLength": 1}
_TOKENS: Schema = {
    "type": "array",
    "minItems": 1,
    "items": {"type": "integer", "minimum": 0, "maximum": MAX_TOKEN_ID},
}
_DIMENSIONS: Schema = {
    "type": "null",
    "description": "Refused (400 naming it) when set: the vectors have the model's hidden size.",
}
#: The fields of each body, with the JSON Schema of what each accepts (the OpenAPI document's).
OPENAI_FIELDS: dict[str, Schema] = {
    "model": honoured("The model (an id the cluster serves).", type="string", minLength=1),
    "input": honoured(
        f"A string, an array of strings, a token array or an array of token arrays (at most "
        f"{MAX_INPUTS} inputs); each within the model's context.",
        anyOf=[
            _TEXT,
            _TOKENS,
            {"type": "array", "minItems": 1, "maxItems": MAX_INPUTS, "items": _TEXT},
            {"type": "array", "minItems": 1, "maxItems": MAX_INPUTS, "items": _TOKENS},
        ],
    ),
    "encoding_format": honoured(
        "float (the default) or base64 (little-endian float32).", enum=["float", "base64", None]
    ),
    "dimensions": _DIMENSIONS,
    "user": typed([str], INFORMATIONAL),
}
OLLAMA_FIELDS: dict[str, Schema] = {
    "model": COMMON_HONOURED["model"],
    "input": honoured(
        f"A string or an array of strings (at most {MAX_INPUTS}).",
        anyOf=[_TEXT, {"type": "array", "minItems": 1, "maxItems": MAX_INPUTS, "items": _TEXT}],
    ),
    "truncate": honoured(
        "Cut an input longer than the context to it (the default) instead of a 400.",
        type=["boolean", "null"],
    ),
    "options": COMMON_HONOURED["options"],
    "keep_alive": COMMON_HONOURED["keep_alive"],
    "dimensions": _DIMENSIONS,
}
OLLAMA_LEGACY_FIELDS: dict[str, Schema] = {
    "model": COMMON_HONOURED["model"],
    "prompt": honoured("The text to embed.", **_TEXT),
    "options": COMMON_HONOURED["options"],
    "keep_alive": COMMON_HONOURED["keep_alive"],
}
_OPENAI_FIELDS = frozenset(OPENAI_FIELDS)
_OLLAMA_FIELDS = frozenset(OLLAMA_FIELDS)
_OLLAMA_LEGACY_FIELDS = frozenset(OLLAMA_LEGACY_FIELDS)

Body = Callable[[], Awaitable[object]]


def _object(body: object, fields: frozenset[str]) -> Mapping[str, object]:
    if not isinstance(body, dict):
        raise ApiError.bad_body()
    for key in body:
        if key not in fields:
            raise ApiError.unknown_parameter(key)
    return body


def _text(value: object, param: str) -> TextPrompt:
    if not isinstance(value, str):
        raise ApiError.invalid_type(param, "a string", value)
    if not value:
        raise ApiError.invalid(param, f"'{param}' must not be an empty string.")
    return TextPrompt(value)


def _tokens(value: list[object], param: str) -> TokenIds:
    if not value:
        raise ApiError.invalid(param, f"'{param}' must not be an empty array.")
    for i, t in enumerate(value):
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t <= MAX_TOKEN_ID:
            raise ApiError.invalid_type(f"{param}[{i}]", "a token id (an integer >= 0)", t)
    return TokenIds(tuple(value))  # type: ignore[arg-type]  # every item checked above


def _bounded(inputs: list[EmbedInput]) -> tuple[EmbedInput, ...]:
    if not inputs:
        raise ApiError.invalid("input", "'input' must not be an empty array.")
    if len(inputs) > MAX_INPUTS:
        raise ApiError.invalid(
            "input", f"At most {MAX_INPUTS} inputs are allowed per request, got {len(inputs)}."
        )
    return tuple(inputs)


def openai_inputs(value: object) -> tuple[EmbedInput, ...]:
    """OpenAI's ``input``: a string, an array of strings, an array of token ids, or an array
    of token arrays."""
    if value is None:
        raise ApiError.missing("input")
    if isinstance(value, str):
        return (_text(value, "input"),)
    if not isinstance(value, list):
        raise ApiError.invalid_type("input", "a string or an array", value)
    if value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return (_tokens(value, "input"),)  # one token array
    inputs: list[EmbedInput] = []
    for i, item in enumerate(value):
        param = f"input[{i}]"
        if isinstance(item, list):
            inputs.append(_tokens(item, param))
        else:
            inputs.append(_text(item, param))
    return _bounded(inputs)


def parse_openai(body: object) -> tuple[str, tuple[EmbedInput, ...], bool]:
    """A ``POST /v1/embeddings`` body: the model, the inputs, and whether to answer base64."""
    obj = _object(body, _OPENAI_FIELDS)
    model = obj.get("model")
    if model is None:
        raise ApiError.missing("model")
    if not isinstance(model, str) or not model:
        raise ApiError.invalid_type("model", "a non-empty string", model)
    inputs = openai_inputs(obj.get("input"))
    fmt = obj.get("encoding_format")
    fmt = "float" if fmt is None else fmt  # null: the default
    if fmt not in ("float", "base64"):
        raise ApiError.unsupported("encoding_format", fmt, supported="'float' or 'base64'")
    if obj.get("dimensions") is not None:
        raise ApiError.unsupported("dimensions", obj["dimensions"])
    user = obj.get("user")
    if user is not None and not isinstance(user, str):
        raise ApiError.invalid_type("user", "a string", user)
    return model, inputs, fmt == "base64"


def parse_ollama(body: object) -> tuple[str, tuple[EmbedInput, ...], bool]:
    """A ``POST /api/embed`` body: the model, the inputs and ``truncate``."""
    obj = _object(body, _OLLAMA_FIELDS)
    model = model_name(obj)
    raw = obj.get("input")
    if raw is None:
        raise ApiError.missing("input")
    if isinstance(raw, str):
        inputs: tuple[EmbedInput, ...] = (_text(raw, "input"),)
    else:
        check_type("input", raw, "array")
        assert isinstance(raw, list)
        inputs = _bounded([_text(item, f"input[{i}]") for i, item in enumerate(raw)])
    truncate = obj.get("truncate")
    if truncate is None:
        truncate = True
    check_type("truncate", truncate, "boolean")
    parse_options(obj.get("options"))  # checked as everywhere; nothing here samples
    keep_alive(obj.get("keep_alive"))
    if obj.get("dimensions") is not None:
        raise ApiError.unsupported("dimensions", obj["dimensions"])
    return model, inputs, bool(truncate)


def parse_ollama_legacy(body: object) -> tuple[str, TextPrompt]:
    """A ``POST /api/embeddings`` body (Ollama's older route): the model and its ``prompt``."""
    obj = _object(body, _OLLAMA_LEGACY_FIELDS)
    model = model_name(obj)
    raw = obj.get("prompt")
    if raw is None:
        raise ApiError.missing("prompt")
    parse_options(obj.get("options"))
    keep_alive(obj.get("keep_alive"))
    return model, _text(raw, "prompt")


def base64_vector(vector: tuple[float, ...]) -> str:
    """``vector`` as base64 of little-endian float32 (OpenAI's ``encoding_format: base64``)."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def openai_response(model: str, done: Embedding, as_base64: bool) -> dict[str, object]:
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": base64_vector(v) if as_base64 else list(v),
        }
        for i, v in enumerate(done.vectors)
    ]
    usage = {"prompt_tokens": done.prompt_tokens, "total_tokens": done.prompt_tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}


def install_embedding_routes(app: QuartTrio, router: Router, body: Body) -> None:
    """Add ``/v1/embeddings``, ``/api/embed`` and ``/api/embeddings`` to ``app`` (errors in
    each path's envelope, as every route's)."""

    async def embed(
        model: str, inputs: tuple[EmbedInput, ...], truncate: bool, param: str
    ) -> tuple[Served, Embedding]:
        try:
            served = Served(router.route(model))
        except ROUTING_ERRORS as exc:
            raise routing_error(exc) from None
        try:
            return served, await router.embed(served.route, inputs, truncate, served)
        except SERVING_ERRORS as exc:
            raise serving_error_for(exc, param) from exc

    @app.post("/v1/embeddings")
    async def openai_embeddings() -> Response:
        model, inputs, as_base64 = parse_openai(await body())
        route, done = await embed(model, inputs, False, "input")
        return routed(json_response(openai_response(model, done, as_base64), 200), route)

    @app.post("/api/embed")
    async def ollama_embed() -> Response:
        start = time.monotonic_ns()
        model, inputs, truncate = parse_ollama(await body())
        route, done = await embed(model, inputs, truncate, "input")
        answer = {
            "model": model,
            "embeddings": [list(v) for v in done.vectors],
            "total_duration": time.monotonic_ns() - start,
            "load_duration": 0,
            "prompt_eval_count": done.prompt_tokens,
        }
        return routed(json_response(answer, 200), route)

    @app.post("/api/embeddings")
    async def ollama_embeddings() -> Response:
        model, prompt = parse_ollama_legacy(await body())
        route, done = await embed(model, (prompt,), True, "prompt")
        return routed(json_response({"embedding": list(done.vectors[0])}, 200), route)

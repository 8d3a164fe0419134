"""The answers of the HTTP API as JSON Schema, for the OpenAPI document (:mod:`skulk.api._openapi`).

The main success shapes of every route (the fields an answer always has; answers may carry
more), each format's error envelope (chosen by path as :mod:`skulk.api._error_formats` chooses
it) and the schema of one event of each server-sent event stream (OpenAPI 3.1: a
``text/event-stream`` schema describes each event, ``{"event", "data"}``, with ``data`` JSON
per ``contentSchema``). The request side is not here: it comes from the parsers' own tables.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from skulk.api._error_formats import ANTHROPIC_PREFIX, OLLAMA_PREFIX
from skulk.api._schema import Schema, ref

JSON = "application/json"
SSE = "text/event-stream"
NDJSON = "application/x-ndjson"

STR: Schema = {"type": "string"}
INT: Schema = {"type": "integer"}
NULL_STR: Schema = {"type": ["string", "null"]}


def shape(required: Mapping[str, Schema], **optional: Schema) -> Schema:
    """An answer: ``required`` fields always present; answers may carry more fields."""
    return {
        "type": "object",
        "required": list(required),
        "properties": {**required, **optional},
    }


def list_of(name: str) -> Schema:
    return {"type": "array", "items": ref(name)}


_USAGE = shape({"prompt_tokens": INT, "completion_tokens": INT, "total_tokens": INT})
_FINISH: Schema = {"type": ["string", "null"]}


def _openai_answer(object_: str, choice: Schema, *, chunk: bool = False) -> Schema:
    """An OpenAI completion or stream chunk: ``choices`` of ``choice``; ``usage`` always in a
    whole answer, null or absent in a chunk but the last."""
    envelope: dict[str, Schema] = {
        "id": STR,
        "object": {"const": object_},
        "created": INT,
        "model": STR,
        "choices": {"type": "array", "items": choice},
    }
    if chunk:
        return shape(envelope, usage={"anyOf": [_USAGE, {"type": "null"}]})
    return shape({**envelope, "usage": _USAGE})


ANSWERS: dict[str, Schema] = {
    # errors, one envelope per format (skulk.api._error_formats)
    "OpenAIError": shape(
        {
            "error": shape(
                {"message": STR},
                type=NULL_STR,
                param=NULL_STR,
                code=NULL_STR,
            )
        }
    ),
    "AnthropicError": shape(
        {"type": {"const": "error"}, "error": shape({"type": STR, "message": STR})}
    ),
    "OllamaError": shape({"error": STR}),
    # OpenAI
    "ChatCompletion": _openai_answer(
        "chat.completion",
        shape(
            {
                "index": INT,
                "message": shape({"role": {"const": "assistant"}}, content=NULL_STR),
                "finish_reason": _FINISH,
            }
        ),
    ),
    "Completion": _openai_answer(
        "text_completion", shape({"index": INT, "text": STR, "finish_reason": _FINISH})
    ),
    "Response": shape(
        {
            "id": STR,
            "object": {"const": "response"},
            "status": {"enum": ["completed", "incomplete", "in_progress", "failed"]},
            "model": STR,
            "output": {"type": "array", "items": {"type": "object"}},
            "usage": {
                "anyOf": [
                    shape({"input_tokens": INT, "output_tokens": INT, "total_tokens": INT}),
                    {"type": "null"},
                ]
            },
        }
    ),
    "ModelList": shape({"object": {"const": "list"}, "data": list_of("Model")}),
    "Model": shape(
        {"id": STR, "object": {"const": "model"}, "status": STR, "instances": {"type": "array"}},
        failure=STR,
    ),
    # Anthropic
    "AnthropicMessage": shape(
        {
            "id": STR,
            "type": {"const": "message"},
            "role": {"const": "assistant"},
            "content": {"type": "array", "items": shape({"type": STR})},
            "model": STR,
            "stop_reason": {"enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use", None]},
            "stop_sequence": NULL_STR,
            "usage": shape({"input_tokens": INT, "output_tokens": INT}),
        }
    ),
    "TokenCount": shape({"input_tokens": INT}),
    "Embeddings": shape(
        {
            "object": {"const": "list"},
            "data": {
                "type": "array",
                "items": shape(
                    {
                        "object": {"const": "embedding"},
                        "index": INT,
                        "embedding": {
                            "anyOf": [{"type": "array", "items": {"type": "number"}}, STR]
                        },
                    }
                ),
            },
            "model": STR,
            "usage": shape({"prompt_tokens": INT, "total_tokens": INT}),
        }
    ),
    "OllamaEmbed": shape(
        {
            "model": STR,
            "embeddings": {
                "type": "array",
                "items": {"type": "array", "items": {"type": "number"}},
            },
        },
        prompt_eval_count=INT,
        total_duration=INT,
    ),
    "OllamaEmbedding": shape({"embedding": {"type": "array", "items": {"type": "number"}}}),
    "ChatCompletionChunk": _openai_answer(
        "chat.completion.chunk",
        shape({"index": INT, "delta": {"type": "object"}}, finish_reason=_FINISH),
        chunk=True,
    ),
    "CompletionChunk": _openai_answer(
        "text_completion", shape({"index": INT, "text": STR}, finish_reason=_FINISH), chunk=True
    ),
    # Ollama
    "OllamaAnswer": shape(
        {"model": STR, "created_at": STR, "done": {"type": "boolean"}},
        message=shape({"role": STR, "content": STR}),
        response=STR,
        done_reason=STR,
        prompt_eval_count=INT,
        eval_count=INT,
        total_duration=INT,
        load_duration=INT,
        prompt_eval_duration=INT,
        eval_duration=INT,
    ),
    "OllamaModels": shape(
        {
            "models": {
                "type": "array",
                "items": shape(
                    {"name": STR, "model": STR, "size": INT, "digest": STR},
                    details={"type": "object"},
                ),
            }
        }
    ),
    "OllamaShow": shape(
        {
            "details": {"type": "object"},
            "model_info": {"type": "object"},
            "capabilities": {"type": "array", "items": STR},
        }
    ),
    "OllamaVersion": shape({"version": STR}),
    # the node and the cluster
    "Health": shape({"status": STR, "instances": {"type": "object"}}),
    "Instance": shape(
        {
            "id": STR,
            "model": STR,
            "sharding": {"enum": ["single", "pipeline", "tensor"]},
            "status": STR,
            "shards": {"type": "array", "items": {"type": "object"}},
        }
    ),
}


def error_schema(path: str) -> str:
    """The envelope a path answers errors in (as :func:`~skulk.api._error_formats.render_error`
    chooses it)."""
    if path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/"):
        return "AnthropicError"
    if path.startswith(OLLAMA_PREFIX):
        return "OllamaError"
    return "OpenAIError"


def _json_data(schema: Schema) -> Schema:
    """An SSE event's ``data``: JSON matching ``schema``."""
    return {"type": "string", "contentMediaType": JSON, "contentSchema": schema}


def _named_events(names: Iterable[str], data: Schema) -> Schema:
    return {
        "type": "object",
        "required": ["event", "data"],
        "properties": {"event": {"enum": list(names)}, "data": _json_data(data)},
    }


def _openai_events(chunk: str) -> Schema:
    """OpenAI's unnamed events: a chunk (or, after a failure, the error envelope), then
    ``[DONE]``."""
    data: Schema = {"anyOf": [ref(chunk), ref("OpenAIError")]}
    return {
        "type": "object",
        "required": ["data"],
        "properties": {
            "event": {"const": "message"},
            "data": {"type": "string", "if": {"const": "[DONE]"}, "else": _json_data(data)},
        },
    }


_RESPONSES_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
    "response.incomplete",
    "response.failed",
    "error",
]
_ANTHROPIC_EVENTS = [
    "message_start",
    "content_block_start",
    "ping",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
    "error",
]
#: The schema of one event of each SSE route's stream (OpenAPI 3.1: a text/event-stream
#: ``schema`` describes each event, ``{"event", "data"}``).
EVENTS: dict[str, Schema] = {
    "/v1/chat/completions": _openai_events("ChatCompletionChunk"),
    "/v1/completions": _openai_events("CompletionChunk"),
    "/v1/responses": _named_events(
        _RESPONSES_EVENTS, shape({"type": {"enum": _RESPONSES_EVENTS}, "sequence_number": INT})
    ),
    "/v1/messages": _named_events(_ANTHROPIC_EVENTS, shape({"type": {"enum": _ANTHROPIC_EVENTS}})),
}

"""The Ollama API format's answers, sans-IO (its requests: :mod:`skulk.api._ollama_parse`).

Ollama's response objects: one NDJSON line per streamed delta (:func:`delta`), a final line
with ``done: true`` (:func:`final`), the statistics (token counts, durations in nanoseconds,
timed by a :class:`Clock`), and the model listings (``/api/tags``, ``/api/ps``, ``/api/show``).
:class:`OllamaFormat` is the format-neutral driver's :class:`~skulk.api._request.Format`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Literal

import attrs

from skulk.api._error_formats import ollama_envelope
from skulk.api._errors import ApiError
from skulk.api._ollama_tools import ToolsRenderer
from skulk.api._request import Event
from skulk.clock import wall
from skulk.wire.cluster import ModelCard
from skulk.wire.runner import GenerationEnd

Kind = Literal["chat", "generate"]


# ---- responses -------------------------------------------------------------------------------


def timestamp(ns: int | None = None) -> str:
    """An RFC 3339 UTC time as Ollama writes it (``2026-11-24T22:45:01.123456Z``)."""
    seconds = wall() if ns is None else ns / 1e9
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@attrs.define
class Clock:
    """When a request started and when its first item (text or the end) arrived
    (``time.monotonic_ns``): the driver marks the first item, the renderer reads both."""

    started: int = attrs.field(factory=time.monotonic_ns)
    first: int | None = None

    def mark(self) -> None:
        """The first item is here (later calls change nothing)."""
        if self.first is None:
            self.first = time.monotonic_ns()

    def durations(self) -> dict[str, int]:
        """Ollama's duration fields (nanoseconds), the request ending now. Prompt evaluation
        lasts until the first item; nothing is loaded per request (``load_duration`` 0)."""
        ended = time.monotonic_ns()
        first = ended if self.first is None else self.first
        return {
            "total_duration": ended - self.started,
            "load_duration": 0,
            "prompt_eval_duration": first - self.started,
            "eval_duration": ended - first,
        }


def delta(kind: Kind, model: str, text: str) -> dict[str, object]:
    """One streamed line (``done: false``) carrying ``text``."""
    body: dict[str, object] = {"model": model, "created_at": timestamp()}
    if kind == "chat":
        body["message"] = {"role": "assistant", "content": text}
    else:
        body["response"] = text
    body["done"] = False
    return body


def final(
    kind: Kind, model: str, end: GenerationEnd, durations: Mapping[str, int], text: str = ""
) -> dict[str, object]:
    """The last line of a stream (``text`` empty), or the whole answer (all of ``text``):
    ``done_reason`` (``stop`` or ``length``), token counts and durations."""
    body = delta(kind, model, text)
    reason = "length" if end.finish_reason == "length" else "stop"
    body.update(done=True, done_reason=reason, **durations)
    body["prompt_eval_count"] = end.usage.prompt_tokens
    body["eval_count"] = end.usage.completion_tokens
    return body


def loaded(kind: Kind, model: str) -> dict[str, object]:
    """The answer to a request with no prompt: the model is (already) loaded."""
    return {**delta(kind, model, ""), "done": True, "done_reason": "load"}


@attrs.frozen
class OllamaFormat:
    """How to answer an ``/api/chat`` or ``/api/generate`` request
    (:class:`~skulk.api._request.Format`)."""

    kind: Kind
    clock: Clock
    tools: bool = False

    @property
    def prompt_param(self) -> str:
        return "messages" if self.kind == "chat" else "prompt"

    def renderer(self, model: str) -> OllamaRenderer | ToolsRenderer:
        if self.tools:
            return ToolsRenderer(
                lambda text: delta(self.kind, model, text),
                lambda end, text: final(self.kind, model, end, self.clock.durations(), text),
                ollama_envelope,
            )
        return OllamaRenderer(self.kind, model, self.clock)


@attrs.frozen
class OllamaRenderer:
    """One request's NDJSON lines (:class:`~skulk.api._request.Renderer`): a line per delta,
    a last line with ``done: true`` and the statistics; a failed stream's last line is
    ``{"error": "…"}`` (what the ollama client raises as ``ResponseError``)."""

    kind: Kind
    model: str
    clock: Clock

    def opening(self) -> list[Event]:
        return []

    def delta(self, text: str) -> list[Event]:
        return [Event(delta(self.kind, self.model, text))]

    def closing(self, end: GenerationEnd) -> list[Event]:
        return [Event(final(self.kind, self.model, end, self.clock.durations()))]

    def failure(self, err: ApiError) -> list[Event]:
        return [Event(ollama_envelope(err))]

    def whole(self, text: str, end: GenerationEnd) -> dict[str, object]:
        return final(self.kind, self.model, end, self.clock.durations(), text)


#: Placed models have no modification time here: the epoch, as the OpenAI model cards say 0.
_NO_TIME = "1970-01-01T00:00:00Z"
#: ``/api/ps``'s ``expires_at`` for instances that stay until deleted (Ollama's keep_alive -1).
_NEVER = "9999-12-31T23:59:59Z"


def details(card: ModelCard | None) -> dict[str, object]:
    """Ollama's ``details`` object of a model (format, family; sizes we do not know are "")."""
    family = card.architecture.family if card is not None else ""
    return {
        "parent_model": "",
        "format": "safetensors",
        "family": family,
        "families": [family] if family else [],
        "parameter_size": "",
        "quantization_level": "",
    }


def _listing(model: str, card: ModelCard | None) -> dict[str, object]:
    return {
        "name": model,
        "model": model,
        "size": card.weight_bytes if card is not None else 0,
        "digest": (card.manifest_sha256 or "") if card is not None else "",
        "details": details(card),
    }


def tags(models: Mapping[str, ModelCard | None]) -> dict[str, object]:
    """``GET /api/tags``: every model with an instance in the cluster."""
    return {
        "models": [
            {**_listing(m, card), "modified_at": _NO_TIME} for m, card in sorted(models.items())
        ]
    }


def running(models: Mapping[str, ModelCard | None]) -> dict[str, object]:
    """``GET /api/ps``: the models with a ready instance. Skulk does not report which memory
    holds the weights: ``size_vram`` is 0."""
    rows = []
    for model, card in sorted(models.items()):
        row = {**_listing(model, card), "expires_at": _NEVER, "size_vram": 0}
        if card is not None:
            row["context_length"] = card.context_length
        rows.append(row)
    return {"models": rows}


def show(card: ModelCard) -> dict[str, object]:
    """``POST /api/show``: what the cluster knows of the model. There is no Modelfile: the chat
    template is the model's own tokenizer's, applied by the runner."""
    arch = card.architecture
    family = arch.family
    return {
        "modelfile": "",
        "parameters": "",
        "template": "",
        "details": details(card),
        "model_info": {
            "general.architecture": family,
            f"{family}.context_length": card.context_length,
            f"{family}.block_count": arch.layers,
            f"{family}.embedding_length": arch.hidden_size,
            f"{family}.attention.head_count": arch.heads,
            f"{family}.attention.head_count_kv": arch.kv_heads,
            f"{family}.vocab_size": arch.vocab,
        },
        "capabilities": ["completion"],
        "modified_at": _NO_TIME,
    }

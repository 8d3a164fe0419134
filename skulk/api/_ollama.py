"""The Ollama API format, sans-IO: request validation and response rendering.

:func:`parse_chat` (``POST /api/chat``), :func:`parse_generate` (``POST /api/generate``) and
:func:`parse_show` (``POST /api/show``) take whatever ``json.loads`` gave and return a frozen
request, or raise :class:`ApiError` (400) naming the offending field — answered in Ollama's
``{"error": "…"}`` envelope by the app (:mod:`skulk.api._error_formats`). The render functions
build Ollama's response objects: one NDJSON line per streamed delta, a final line with
``done: true``, the statistics (token counts, durations in nanoseconds), model listings.

Strictness is the same as for the other formats: every field is honoured, accepted only with
the value that changes nothing (its *no-op*), informational, or refused — never silently
ignored. ``options`` follow the same rule, each option named ``options.<name>`` in errors.

Two deliberate differences from a local Ollama, both documented in ``docs/api.md``:

* the sampling defaults are Ollama's (temperature 0.8, top_k 40, top_p 0.9), so a client that
  sends no options gets what it would get from Ollama, not the OpenAI routes' defaults;
* ``keep_alive`` is accepted and has no effect: instances are placed by the cluster and stay
  until deleted, and an empty prompt (Ollama's "load the model") answers ``done_reason:
  "load"`` at once without generating.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Literal

import attrs

from skulk.api._error_formats import ollama_envelope
from skulk.api._errors import ApiError
from skulk.api._ollama_tools import ToolsRenderer, parse_calls_field
from skulk.api._openai_tools import parse_tools
from skulk.api._request import Event, GenerateRequest
from skulk.api._schema import INFORMATIONAL, Schema, honoured, no_op, obj, ref
from skulk.api._structured import ollama_format
from skulk.api._tool_calls import tools_json
from skulk.wire.cluster import ModelCard
from skulk.wire.runner import ChatMessage, ChatPrompt, SamplingParams, TextPrompt
from skulk.worker import Generation

#: Ollama's own defaults for the options it samples with (``api/types.go`` DefaultOptions).
DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_K = 40
DEFAULT_TOP_P = 0.9
#: At most this many ``options.stop`` strings, each at most :data:`MAX_STOP_LENGTH` characters:
#: the runner checks every stop string against the text it holds back after every token.
MAX_STOPS = 16
MAX_STOP_LENGTH = 1024
#: The Ollama API level these routes follow (``GET /api/version``): clients gate features on it.
OLLAMA_API_VERSION = "0.6.0"

_INT64 = (-(2**63), 2**63 - 1)

Kind = Literal["chat", "generate"]


@attrs.frozen
class OllamaRequest:
    """A validated ``/api/chat`` or ``/api/generate`` body.

    ``prompt`` is ``None`` for a request with nothing to generate from (no messages, an empty
    prompt): Ollama's way to load a model, answered with ``done_reason: "load"``.
    """

    kind: Kind
    model: str
    prompt: ChatPrompt | TextPrompt | None
    params: SamplingParams
    stream: bool
    tools: bool = False  # tools offered: the answer may call them

    def generate_request(self, clock: Clock) -> GenerateRequest:
        """The format-neutral request the router and the stream driver take; ``clock`` times
        it for the answer's duration fields. Only for a request with a prompt."""
        if self.prompt is None:
            raise ValueError("a request without a prompt generates nothing")
        fmt = OllamaFormat(self.kind, clock, self.tools)
        return GenerateRequest(self.model, self.prompt, self.params, self.stream, fmt)


# ---- typed readers ---------------------------------------------------------------------------


def _check_type(param: str, value: object, kind: str) -> None:
    """400 unless ``value`` has the JSON type ``kind`` (``"integer"``, ``"number"``,
    ``"string"``, ``"boolean"``, ``"array"``, ``"object"``); JSON booleans are never numbers."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    ok = {
        "integer": number and isinstance(value, int),
        "number": number,
        "string": isinstance(value, str),
        "boolean": isinstance(value, bool),
        "array": isinstance(value, list),
        "object": isinstance(value, dict),
        "any": True,
    }[kind]
    if not ok:
        article = "an" if kind[0] in "aeiou" else "a"
        raise ApiError.invalid_type(param, f"{article} {kind}", value)


def _range_error(param: str, value: object, bound: str) -> ApiError:
    return ApiError.invalid(param, f"Invalid value for '{param}': {value!r}; must be {bound}.")


@attrs.frozen
class _Field:
    """How one field (top level, in a message, or in ``options``) is treated.

    ``kind`` is its JSON type; a value of another type is 400 ``invalid_type``. ``noop`` are the
    values accepted for a field we cannot honour (``null`` always is); ``informational`` fields
    accept any value of their type.
    """

    kind: str
    noop: tuple[object, ...] = ()
    informational: bool = False

    def check(self, param: str, value: object) -> None:
        if value is None:
            return
        _check_type(param, value, self.kind)
        if self.informational or any(_same(value, v) for v in self.noop):
            return
        raise ApiError.unsupported(param, value, supported=self._supported)

    @property
    def _supported(self) -> str:
        return " or ".join([json.dumps(v) for v in self.noop] + ["null"])

    @property
    def schema(self) -> Schema:
        """The JSON Schema of what :meth:`check` accepts (the OpenAPI document's)."""
        types = [] if self.kind == "any" else [self.kind, "null"]
        if self.informational:
            return {"description": INFORMATIONAL, **({"type": types} if types else {})}
        return no_op(self.noop, self._supported)


def _same(value: object, noop: object) -> bool:
    """``value`` is ``noop`` as JSON sees it: 1 is 1.0, but ``false`` is not 0."""
    return value == noop and isinstance(value, bool) == isinstance(noop, bool)


def _refuse(kind: str, *noop: object) -> _Field:
    return _Field(kind, noop)


def _info(kind: str) -> _Field:
    return _Field(kind, informational=True)


#: Options we sample with; everything else in ``options`` is in :data:`_OPTION_NOOPS`.
_HONOURED_OPTIONS: dict[str, Schema] = {
    "temperature": honoured(
        f"At least 0; 0 is greedy (default {DEFAULT_TEMPERATURE}).",
        type=["number", "null"],
        minimum=0,
    ),
    "top_p": honoured(
        f"In (0, 1] (default {DEFAULT_TOP_P}).",
        type=["number", "null"],
        exclusiveMinimum=0,
        maximum=1,
    ),
    "top_k": honoured(
        f"At least 0; 0 is off (default {DEFAULT_TOP_K}).",
        type=["integer", "null"],
        minimum=0,
        maximum=_INT64[1],
    ),
    "seed": honoured(
        "-1 or absent: random.", type=["integer", "null"], minimum=_INT64[0], maximum=_INT64[1]
    ),
    "num_predict": honoured(
        "The most tokens to generate; -1 or -2: up to the context (0 is refused).",
        anyOf=[
            {"type": "integer", "minimum": 1, "maximum": _INT64[1]},
            {"enum": [-1, -2, None]},
        ],
    ),
    "stop": honoured(
        f"Up to {MAX_STOPS} strings of 1 to {MAX_STOP_LENGTH} characters (one string: one "
        "stop); generation ends before one, which is not emitted.",
        anyOf=[
            {"type": "string", "minLength": 1, "maxLength": MAX_STOP_LENGTH},
            {
                "type": "array",
                "maxItems": MAX_STOPS,
                "items": {"type": "string", "minLength": 1, "maxLength": MAX_STOP_LENGTH},
            },
            {"type": "null"},
        ],
    ),
}
#: Ollama options we do not implement, each accepted only with the value that changes nothing
#: here: Ollama's default for the knobs of its own engine (threads, batch size, GPU layers,
#: memory mapping), the value that turns the feature off for the sampling ones.
_OPTION_NOOPS: dict[str, _Field] = {
    "numa": _refuse("boolean", False),
    "num_batch": _refuse("integer", 512),
    "num_gpu": _refuse("integer", -1),
    "main_gpu": _refuse("integer", 0),
    "low_vram": _refuse("boolean", False),
    "f16_kv": _refuse("boolean", True),
    "logits_all": _refuse("boolean", False),
    "vocab_only": _refuse("boolean", False),
    "use_mmap": _refuse("boolean", True),
    "use_mlock": _refuse("boolean", False),
    "embedding_only": _refuse("boolean", False),
    "num_thread": _refuse("integer", 0),
    # The context is the model's own (``/api/show``'s ``model_info``): it cannot be resized.
    "num_ctx": _refuse("integer"),
    "num_keep": _refuse("integer", 4),
    "repeat_last_n": _refuse("integer", 64),
    "repeat_penalty": _refuse("number", 1.0),
    "presence_penalty": _refuse("number", 0),
    "frequency_penalty": _refuse("number", 0),
    "min_p": _refuse("number", 0),
    "typical_p": _refuse("number", 1.0),
    "tfs_z": _refuse("number", 1.0),
    "mirostat": _refuse("integer", 0),
    "mirostat_tau": _refuse("number", 5.0),
    "mirostat_eta": _refuse("number", 0.1),
    "penalize_newline": _refuse("boolean", True),
}

#: Fields of both ``/api/chat`` and ``/api/generate`` besides model, options and stream.
_COMMON_FIELDS: dict[str, _Field] = {
    "think": _refuse("any", False),  # true or a level ("high"): no thinking models yet
    "logprobs": _refuse("boolean", False),
    "top_logprobs": _refuse("integer", 0),
}
_CHAT_FIELDS: dict[str, _Field] = {**_COMMON_FIELDS}
_GENERATE_FIELDS: dict[str, _Field] = {
    **_COMMON_FIELDS,
    "suffix": _refuse("string", ""),
    "template": _refuse("string", ""),
    "context": _refuse("array", []),
    "images": _refuse("array", []),
    "width": _refuse("integer"),
    "height": _refuse("integer"),
    "steps": _refuse("integer"),
}
_MODEL = honoured("The model (a name the cluster serves).", type="string", minLength=1)
#: Fields of both routes besides the no-op ones, with the JSON Schema of what each accepts.
_COMMON_HONOURED: dict[str, Schema] = {
    "model": _MODEL,
    "options": honoured(
        "Sampling options; absent ones take Ollama's defaults.",
        anyOf=[ref("OllamaOptions"), {"type": "null"}],
    ),
    "stream": honoured(
        "NDJSON (application/x-ndjson) unless false (the default is to stream).",
        type=["boolean", "null"],
    ),
    # Checked for its type only: instances are placed by the cluster and stay until deleted,
    # so there is nothing to keep alive (or to unload).
    "keep_alive": {
        "type": ["number", "string", "null"],
        "description": "Accepted, no effect: instances stay until deleted.",
    },
    "format": honoured(
        'Structured output: "json" (a JSON object) or a JSON schema, enforced by constrained '
        "decoding; a schema feature it cannot enforce is a 400 naming it.",
        anyOf=[{"enum": ["", "json"]}, {"type": "object"}, {"type": "null"}],
    ),
}
_CHAT_HONOURED: dict[str, Schema] = {
    **_COMMON_HONOURED,
    "messages": honoured(
        "The conversation (none: load the model, answered done_reason load).",
        type=["array", "null"],
        items=ref("OllamaMessage"),
    ),
    "tools": honoured(
        "Function tools (OpenAI's shape), rendered through the model's chat template (or the "
        "documented fallback system turn); calls come back in message.tool_calls.",
        type=["array", "null"],
        items={"type": "object"},
    ),
}
_GENERATE_HONOURED: dict[str, Schema] = {
    **_COMMON_HONOURED,
    "prompt": honoured(
        "The prompt (empty: load the model, answered done_reason load).", type=["string", "null"]
    ),
    "system": honoured("A system turn before the prompt.", type=["string", "null"]),
    "raw": honoured(
        "true: the prompt is tokenized as is (system is then refused).", type=["boolean", "null"]
    ),
}
_CHAT_KEYS = frozenset({*_CHAT_HONOURED, *_CHAT_FIELDS})
_GENERATE_KEYS = frozenset({*_GENERATE_HONOURED, *_GENERATE_FIELDS})
_MESSAGE_FIELDS: dict[str, _Field] = {
    "images": _refuse("array", []),
    "thinking": _refuse("string", ""),
}
_ROLES = ("system", "user", "assistant", "tool")
_MESSAGE_HONOURED: dict[str, Schema] = {
    "role": honoured("A tool turn is a tool's result.", enum=list(_ROLES)),
    "content": honoured("The turn's text (absent: empty).", type=["string", "null"]),
    "tool_calls": honoured(
        'An assistant turn\'s calls: [{"function": {"name", "arguments"}}].',
        type=["array", "null"],
    ),
    "tool_name": honoured("A tool turn's tool.", type=["string", "null"]),
}
_MESSAGE_KEYS = frozenset({*_MESSAGE_HONOURED, *_MESSAGE_FIELDS})
#: What the parsers enforce across fields, as JSON Schema (the OpenAPI document's): raw mode
#: has no place for a system prompt; ``/api/show`` needs ``model`` or the older ``name``.
RAW_HAS_NO_SYSTEM: Schema = {
    "if": {"required": ["raw"], "properties": {"raw": {"const": True}}},
    "then": {"properties": {"system": {"enum": ["", None]}}},
}
SHOW_NEEDS_A_MODEL: Schema = {
    "anyOf": [
        {"required": ["model"], "properties": {"model": {"type": "string"}}},
        {"required": ["name"], "properties": {"name": {"type": "string"}}},
    ]
}
_SHOW_FIELDS: dict[str, Schema] = {
    "model": honoured("The model.", type=["string", "null"], minLength=1),
    "name": honoured("The older name of model.", type=["string", "null"], minLength=1),
    "verbose": _info("boolean").schema,
}
#: Shared schemas of the bodies above (``components.schemas`` of the OpenAPI document).
SCHEMAS: dict[str, Schema] = {
    "OllamaMessage": obj(
        {**_MESSAGE_HONOURED, **{k: f.schema for k, f in _MESSAGE_FIELDS.items()}},
        required=("role",),
    ),
    "OllamaOptions": obj(
        {**_HONOURED_OPTIONS, **{k: f.schema for k, f in _OPTION_NOOPS.items()}},
        description="Options we do not implement are accepted only with the value that "
        "changes nothing here (else 400 naming options.<name>).",
    ),
}


def _object(value: object, param: str | None) -> dict[str, object]:
    if not isinstance(value, dict):
        if param is None:
            raise ApiError.bad_body()
        raise ApiError.invalid_type(param, "an object", value)
    return value


def _known(obj: Mapping[str, object], keys: frozenset[str], prefix: str = "") -> None:
    for key in obj:
        if key not in keys:
            raise ApiError.unknown_parameter(prefix + key)


def _checked(obj: Mapping[str, object], fields: Mapping[str, _Field], prefix: str = "") -> None:
    for name, field in fields.items():
        field.check(prefix + name, obj.get(name))


def _keep_alive(value: object) -> None:
    """``keep_alive`` is a duration: a number of seconds or a string like ``"5m"``."""
    if value is not None and not isinstance(value, str):
        _check_type("keep_alive", value, "number")


def _model(obj: Mapping[str, object]) -> str:
    model = obj.get("model")
    if model is None:
        raise ApiError.missing("model")
    _check_type("model", model, "string")
    assert isinstance(model, str)
    if not model:
        raise ApiError.invalid("model", "Invalid value for 'model': must not be empty.")
    return model


def _stream(obj: Mapping[str, object]) -> bool:
    value = obj.get("stream")
    if value is None:
        return True  # Ollama streams unless told not to
    _check_type("stream", value, "boolean")
    return bool(value)


def _string(obj: Mapping[str, object], name: str, param: str) -> str:
    value = obj.get(name)
    if value is None:
        return ""
    _check_type(param, value, "string")
    assert isinstance(value, str)
    return value


# ---- options ---------------------------------------------------------------------------------


def _option_number(
    options: Mapping[str, object], name: str, ok: Callable[[float], bool], bound: str
) -> float | None:
    value = options.get(name)
    if value is None:
        return None
    param = f"options.{name}"
    _check_type(param, value, "number")
    assert isinstance(value, int | float)
    if not ok(value):  # compared before float(): a huge integer would overflow it
        raise _range_error(param, value, bound)
    return float(value)


def _option_int(options: Mapping[str, object], name: str, lo: int, hi: int) -> int | None:
    value = options.get(name)
    if value is None:
        return None
    param = f"options.{name}"
    _check_type(param, value, "integer")
    assert isinstance(value, int)
    if not lo <= value <= hi:
        raise _range_error(param, value, f"an integer from {lo} to {hi}")
    return value


def _option_stop(options: Mapping[str, object]) -> tuple[str, ...]:
    value = options.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):  # Ollama's Modelfile PARAMETER form; JSON clients send a list
        value = [value]
    _check_type("options.stop", value, "array")
    assert isinstance(value, list)
    if len(value) > MAX_STOPS:
        raise ApiError.invalid(
            "options.stop", f"At most {MAX_STOPS} stop strings are allowed, got {len(value)}."
        )
    stops = []
    for i, item in enumerate(value):
        param = f"options.stop[{i}]"
        _check_type(param, item, "string")
        assert isinstance(item, str)
        if not item or len(item) > MAX_STOP_LENGTH:
            raise _range_error(param, item[:20], f"1 to {MAX_STOP_LENGTH} characters")
        stops.append(item)
    return tuple(stops)


def parse_options(raw: object) -> SamplingParams:
    """``options`` as our sampling parameters (Ollama's defaults for what is absent)."""
    options = {} if raw is None else _object(raw, "options")
    _known(options, frozenset({*_HONOURED_OPTIONS, *_OPTION_NOOPS}), "options.")
    _checked(options, _OPTION_NOOPS, "options.")
    temperature = _option_number(
        options, "temperature", lambda v: v >= 0, "a number >= 0 (0 is greedy)"
    )
    top_p = _option_number(options, "top_p", lambda v: 0 < v <= 1, "in (0, 1]")
    top_k = _option_int(options, "top_k", 0, _INT64[1])
    seed = _option_int(options, "seed", *_INT64)
    num_predict = _option_int(options, "num_predict", -2, _INT64[1])
    if num_predict == 0:
        raise _range_error("options.num_predict", 0, "at least 1, or -1/-2 for no limit")
    return SamplingParams(
        temperature=DEFAULT_TEMPERATURE if temperature is None else temperature,
        top_p=DEFAULT_TOP_P if top_p is None else top_p,
        top_k=DEFAULT_TOP_K if top_k is None else top_k,
        seed=None if seed is None or seed == -1 else seed,  # Ollama's -1: random
        max_tokens=None if num_predict is None or num_predict < 0 else num_predict,
        stop=_option_stop(options),
    )


# ---- requests --------------------------------------------------------------------------------


def _message(raw: object, param: str) -> ChatMessage:
    message = _object(raw, param)
    _known(message, _MESSAGE_KEYS, f"{param}.")
    role = message.get("role")
    if role is None:
        raise ApiError.missing(f"{param}.role")
    _check_type(f"{param}.role", role, "string")
    if role not in _ROLES:
        expected = "expected system, user, assistant or tool"
        raise ApiError.invalid(
            f"{param}.role", f"Invalid value for '{param}.role': {role!r}; {expected}."
        )
    _checked(message, _MESSAGE_FIELDS, f"{param}.")
    calls = parse_calls_field(message.get("tool_calls"), f"{param}.tool_calls")
    tool_name = _string(message, "tool_name", f"{param}.tool_name")
    # The ollama client drops empty values, so an empty turn arrives without ``content``.
    content = _string(message, "content", f"{param}.content")
    call_id = (tool_name or "tool") if role == "tool" else None
    return ChatMessage(str(role), content, tool_calls=calls, tool_call_id=call_id)


def _with_format(params: SamplingParams, obj: Mapping[str, object]) -> SamplingParams:
    """``params`` with the structured output ``format`` asks for."""
    schema = ollama_format(obj.get("format"))
    return params if schema is None else attrs.evolve(params, json_schema=schema)


def parse_chat(body: object) -> OllamaRequest:
    """Validate a ``POST /api/chat`` body; :class:`ApiError` (400) names the first bad field."""
    obj = _object(body, None)
    _known(obj, _CHAT_KEYS)
    model = _model(obj)
    raw = obj.get("messages")
    if raw is not None:
        _check_type("messages", raw, "array")
    assert raw is None or isinstance(raw, list)
    messages = tuple(_message(m, f"messages[{i}]") for i, m in enumerate(raw or ()))
    _keep_alive(obj.get("keep_alive"))
    _checked(obj, _CHAT_FIELDS)
    params = _with_format(parse_options(obj.get("options")), obj)
    tools = parse_tools(obj.get("tools"))
    prompt = ChatPrompt(messages, tools_json(tools)) if messages else None
    return OllamaRequest("chat", model, prompt, params, _stream(obj), tools=bool(tools))


def parse_generate(body: object) -> OllamaRequest:
    """Validate a ``POST /api/generate`` body (see :func:`parse_chat`).

    Without ``raw`` the prompt (after ``system``, if given) goes through the model's chat
    template as a user turn, as Ollama's template would put it; with ``raw: true`` it is
    tokenized as is, and ``system`` — which raw mode has no place for — is refused.
    """
    obj = _object(body, None)
    _known(obj, _GENERATE_KEYS)
    model = _model(obj)
    text = _string(obj, "prompt", "prompt")
    system = _string(obj, "system", "system")
    raw_value = obj.get("raw")
    if raw_value is not None:
        _check_type("raw", raw_value, "boolean")
    _keep_alive(obj.get("keep_alive"))
    _checked(obj, _GENERATE_FIELDS)
    params = _with_format(parse_options(obj.get("options")), obj)
    prompt: ChatPrompt | TextPrompt | None = None
    if raw_value:
        if system:
            raise ApiError.unsupported("system", system, supported='"" when raw is true')
        prompt = TextPrompt(text) if text else None
    elif text:
        turns = [ChatMessage("system", system)] if system else []
        prompt = ChatPrompt((*turns, ChatMessage("user", text)))
    return OllamaRequest("generate", model, prompt, params, _stream(obj))


def parse_show(body: object) -> str:
    """The model a ``POST /api/show`` body asks about (``model``, or the older ``name``)."""
    obj = _object(body, None)
    _known(obj, frozenset(_SHOW_FIELDS))
    _info("boolean").check("verbose", obj.get("verbose"))  # we have no more to show
    if obj.get("model") is None and obj.get("name") is not None:
        return _model({"model": obj["name"]})
    return _model(obj)


# ---- responses -------------------------------------------------------------------------------


def timestamp(ns: int | None = None) -> str:
    """An RFC 3339 UTC time as Ollama writes it (``2026-11-24T22:45:01.123456Z``)."""
    seconds = (time.time_ns() if ns is None else ns) / 1e9
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
    kind: Kind, model: str, end: Generation, durations: Mapping[str, int], text: str = ""
) -> dict[str, object]:
    """The last line of a stream (``text`` empty), or the whole answer (all of ``text``):
    ``done_reason`` (``stop`` or ``length``), token counts and durations."""
    body = delta(kind, model, text)
    reason = "length" if end.finish_reason == "length" else "stop"
    body.update(done=True, done_reason=reason, **durations)
    body["prompt_eval_count"] = end.usage.prompt_tokens
    body["eval_count"] = end.usage.completion_tokens
    return body


def loaded(request: OllamaRequest) -> dict[str, object]:
    """The answer to a request with no prompt: the model is (already) loaded."""
    return {**delta(request.kind, request.model, ""), "done": True, "done_reason": "load"}


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

    def closing(self, end: Generation) -> list[Event]:
        return [Event(final(self.kind, self.model, end, self.clock.durations()))]

    def failure(self, err: ApiError) -> list[Event]:
        return [Event(ollama_envelope(err))]

    def whole(self, text: str, end: Generation) -> dict[str, object]:
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

"""The Ollama API format's requests, sans-IO (its answers: :mod:`skulk.api._ollama_format`).

:func:`parse_chat` (``POST /api/chat``), :func:`parse_generate` (``POST /api/generate``) and
:func:`parse_show` (``POST /api/show``) take whatever ``json.loads`` gave and return a frozen
request, or raise :class:`ApiError` (400) naming the offending field — answered in Ollama's
``{"error": "…"}`` envelope by the app (:mod:`skulk.api._error_formats`).

Strictness is the same as for the other formats, with the same kit (:mod:`skulk.api._fields`):
every field is honoured, accepted only with the value that changes nothing (its *no-op*),
informational, or refused — never silently ignored. ``options`` follow the same rule, each
option named ``options.<name>`` in errors.

Two deliberate differences from a local Ollama, both documented in ``docs/api.md``:

* the sampling defaults are Ollama's (temperature 0.8, top_k 40, top_p 0.9), so a client that
  sends no options gets what it would get from Ollama, not the OpenAI routes' defaults;
* ``keep_alive`` is accepted and has no effect: instances are placed by the cluster and stay
  until deleted, and an empty prompt (Ollama's "load the model") answers ``done_reason:
  "load"`` at once without generating.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs

from skulk.api._errors import ApiError
from skulk.api._fields import (
    INT64_MAX,
    INT64_MIN,
    MAX_STOP_LENGTH,
    MODEL,
    Check,
    as_object,
    check_type,
    checked_body,
    info,
    model_name,
    only,
    opt_str,
    reject_unknown,
    run_checks,
)
from skulk.api._ollama_format import Clock, Kind, OllamaFormat
from skulk.api._ollama_tools import parse_calls_field
from skulk.api._openai_tools import parse_tools
from skulk.api._request import GenerateRequest
from skulk.api._schema import Schema, honoured, obj, ref
from skulk.api._structured import ollama_format
from skulk.api._tool_calls import tools_json
from skulk.wire.runner import ChatMessage, ChatPrompt, SamplingParams, TextPrompt

#: Ollama's own defaults for the options it samples with (``api/types.go`` DefaultOptions).
DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_K = 40
DEFAULT_TOP_P = 0.9
#: At most this many ``options.stop`` strings, each at most
#: :data:`~skulk.api._fields.MAX_STOP_LENGTH` characters:
#: the runner checks every stop string against the text it holds back after every token.
MAX_STOPS = 16
#: The Ollama API level these routes follow (``GET /api/version``): clients gate features on it.
OLLAMA_API_VERSION = "0.6.0"

_INT64 = (INT64_MIN, INT64_MAX)


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


def _range_error(param: str, value: object, bound: str) -> ApiError:
    return ApiError.invalid(param, f"Invalid value for '{param}': {value!r}; must be {bound}.")


def _refuse(kind: str, *noop: object) -> Check:
    """A field we cannot honour, accepted only with one of ``noop`` (or null)."""
    return only(*noop, kind=kind)


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
_OPTION_NOOPS: dict[str, Check] = {
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
_COMMON_FIELDS: dict[str, Check] = {
    "think": _refuse("any", False),  # true or a level ("high"): no thinking models yet
    "logprobs": _refuse("boolean", False),
    "top_logprobs": _refuse("integer", 0),
}
_CHAT_FIELDS: dict[str, Check] = {**_COMMON_FIELDS}
_GENERATE_FIELDS: dict[str, Check] = {
    **_COMMON_FIELDS,
    "suffix": _refuse("string", ""),
    "template": _refuse("string", ""),
    "context": _refuse("array", []),
    "images": _refuse("array", []),
    "width": _refuse("integer"),
    "height": _refuse("integer"),
    "steps": _refuse("integer"),
}
#: Fields of both routes besides the no-op ones, with the JSON Schema of what each accepts.
COMMON_HONOURED: dict[str, Schema] = {
    "model": MODEL,
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
    **COMMON_HONOURED,
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
    **COMMON_HONOURED,
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
_MESSAGE_FIELDS: dict[str, Check] = {
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
    "verbose": info("boolean").schema,
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


def keep_alive(value: object) -> None:
    """``keep_alive`` is a duration: a number of seconds or a string like ``"5m"``."""
    if value is not None and not isinstance(value, str):
        check_type("keep_alive", value, "number")


def _stream(obj: Mapping[str, object]) -> bool:
    value = obj.get("stream")
    if value is None:
        return True  # Ollama streams unless told not to
    check_type("stream", value, "boolean")
    return bool(value)


def _string(obj: Mapping[str, object], name: str, param: str) -> str:
    return opt_str(obj, name, param) or ""


# ---- options ---------------------------------------------------------------------------------


def _option_number(
    options: Mapping[str, object], name: str, ok: Callable[[float], bool], bound: str
) -> float | None:
    value = options.get(name)
    if value is None:
        return None
    param = f"options.{name}"
    check_type(param, value, "number")
    assert isinstance(value, int | float)
    if not ok(value):  # compared before float(): a huge integer would overflow it
        raise _range_error(param, value, bound)
    return float(value)


def _option_int(options: Mapping[str, object], name: str, lo: int, hi: int) -> int | None:
    value = options.get(name)
    if value is None:
        return None
    param = f"options.{name}"
    check_type(param, value, "integer")
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
    check_type("options.stop", value, "array")
    assert isinstance(value, list)
    if len(value) > MAX_STOPS:
        raise ApiError.invalid(
            "options.stop", f"At most {MAX_STOPS} stop strings are allowed, got {len(value)}."
        )
    stops = []
    for i, item in enumerate(value):
        param = f"options.stop[{i}]"
        check_type(param, item, "string")
        assert isinstance(item, str)
        if not item or len(item) > MAX_STOP_LENGTH:
            raise _range_error(param, item[:20], f"1 to {MAX_STOP_LENGTH} characters")
        stops.append(item)
    return tuple(stops)


def parse_options(raw: object) -> SamplingParams:
    """``options`` as our sampling parameters (Ollama's defaults for what is absent)."""
    options = {} if raw is None else as_object(raw, "options")
    reject_unknown(options, frozenset({*_HONOURED_OPTIONS, *_OPTION_NOOPS}), "options.")
    run_checks(options, _OPTION_NOOPS, "options.")
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
    message = as_object(raw, param)
    reject_unknown(message, _MESSAGE_KEYS, f"{param}.")
    role = message.get("role")
    if role is None:
        raise ApiError.missing(f"{param}.role")
    check_type(f"{param}.role", role, "string")
    if role not in _ROLES:
        expected = "expected system, user, assistant or tool"
        raise ApiError.invalid(
            f"{param}.role", f"Invalid value for '{param}.role': {role!r}; {expected}."
        )
    run_checks(message, _MESSAGE_FIELDS, f"{param}.")
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
    obj = checked_body(body, _CHAT_KEYS)
    model = model_name(obj)
    raw = obj.get("messages")
    if raw is not None:
        check_type("messages", raw, "array")
    assert raw is None or isinstance(raw, list)
    messages = tuple(_message(m, f"messages[{i}]") for i, m in enumerate(raw or ()))
    keep_alive(obj.get("keep_alive"))
    run_checks(obj, _CHAT_FIELDS)
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
    obj = checked_body(body, _GENERATE_KEYS)
    model = model_name(obj)
    text = _string(obj, "prompt", "prompt")
    system = _string(obj, "system", "system")
    raw_value = obj.get("raw")
    if raw_value is not None:
        check_type("raw", raw_value, "boolean")
    keep_alive(obj.get("keep_alive"))
    run_checks(obj, _GENERATE_FIELDS)
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
    obj = checked_body(body, _SHOW_FIELDS)
    info("boolean").check("verbose", obj.get("verbose"))  # we have no more to show
    if obj.get("model") is None and obj.get("name") is not None:
        return model_name({"model": obj["name"]})
    return model_name(obj)

"""Tool calling, format-neutral (sans-IO): the tools a request offers, how it forces a call, and
reading the calls out of the model's text.

Each format's adapter reads its own shapes (OpenAI ``tools``/``tool_choice``, Anthropic
``tools``/``tool_choice``/``tool_use``, Ollama ``tools``) into :class:`Tool` and a
:data:`Choice`, and renders :class:`Call` values back in its own shapes; what is common lives
here.

* **Prompt**: the tools go to the runner as :attr:`~skulk.wire.runner.ChatPrompt.tools`
  (:func:`tools_json`), rendered by the model's chat template (or our documented fallback,
  :mod:`skulk.engine._tools`).
* **Forcing**: ``required`` / a named function (Anthropic ``any`` / ``tool``) constrain the
  output to one call (:func:`forced_params`): ``{"name": …, "arguments": …}`` valid for the
  tool's ``parameters`` — the shape mlx-lm's ``json_tools`` parser reads — wrapped in the
  model's tool-call markers when its tokenizer has them.
* **Reading the calls** (:func:`answer_calls`, the one place that decides, for every format)
  once the whole text is in: an answer cut short (``length``) has none; else the calls the
  runner read with the model's own mlx-lm tool parser (``tool_calls`` of its
  :class:`~skulk.wire.runner.GenerationEnd`; any family mlx-lm knows — ``json_tools``, ``pythonic``,
  ``mistral``, ``gemma4``, ``kimi_k2``, ``qwen3_coder``, …; see
  :mod:`skulk.engine._tool_parse`) when it read any; else our own parse of the text
  (:func:`parse_calls`): ``<tool_call>…</tool_call>`` blocks holding JSON (the Hermes/Qwen
  convention, and what the forced path produces for such models), else a whole answer that is
  exactly one JSON call (what the forced path and the fallback prompt produce on a model
  without a parser). Rendering stays per format (OpenAI ``tool_calls``, Anthropic
  ``tool_use`` blocks, Ollama ``message.tool_calls``).

Streaming: a request that may call a tool has its text held back until the end (a call is only
known once it is complete), then sent as text or as the format's tool-call deltas.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Collection, Iterator, Sequence
from typing import Final, Literal

import attrs

from skulk.api._errors import ApiError
from skulk.api._structured import CHECK_HERE_BYTES, refused
from skulk.grammar import SchemaRefused, check_schema, schema_text, tool_call_schema
from skulk.wire.runner import GenerationEnd, SamplingParams

#: No tools offered or ``none``: plain text; ``auto``: the model may call; ``required``: it must
#: call one of them; a tool's name: it must call that one.
Choice = Literal["none", "auto", "required"] | str
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
MAX_TOOLS: Final = 128


@attrs.frozen
class Tool:
    """One function the model may call: ``parameters`` is its JSON schema (``None``: none)."""

    name: str
    description: str | None
    parameters: dict[str, object] | None


@attrs.frozen
class Call:
    """One call read from the model's text: ``arguments`` is compact JSON text of an object."""

    id: str
    name: str
    arguments: str

    @property
    def input(self) -> dict[str, object]:
        value = json.loads(self.arguments)
        assert isinstance(value, dict)
        return value


def checked_object(
    value: object, where: str, keys: Collection[str] | None = None
) -> dict[str, object]:
    """``value`` if it is a JSON object with no key beyond ``keys`` (when given), else the
    400 naming ``where`` (or the unknown key under it)."""
    if not isinstance(value, dict):
        raise ApiError.invalid_type(where, "an object", value)
    if keys is not None:
        for key in value:
            if key not in keys:
                raise ApiError.unknown_parameter(f"{where}.{key}")
    return value


def objects(
    value: object, param: str, keys: Collection[str] | None = None
) -> Iterator[tuple[str, dict[str, object]]]:
    """The items of an optional array of objects at ``param`` (null or absent: none), as
    ``(where, item)`` with ``where`` the item's path, each checked by :func:`checked_object`."""
    if value is None:
        return
    if not isinstance(value, list):
        raise ApiError.invalid_type(param, "an array", value)
    for i, item in enumerate(value):
        where = f"{param}[{i}]"
        yield where, checked_object(item, where, keys)


def new_call_id(prefix: str = "call_") -> str:
    return prefix + secrets.token_hex(12)


def check_tools(tools: Sequence[Tool], param: str) -> None:
    """No more than :data:`MAX_TOOLS`, and no name twice."""
    if len(tools) > MAX_TOOLS:
        raise ApiError.invalid(param, f"Invalid value for '{param}': at most {MAX_TOOLS} tools.")
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if tool.name in seen:
            raise ApiError.invalid(
                f"{param}[{i}]", f"Invalid value for '{param}[{i}]': tool {tool.name!r} twice."
            )
        seen.add(tool.name)


def tools_json(tools: Sequence[Tool]) -> str | None:
    """The prompt's tools as chat templates take them (OpenAI's function tool shape)."""
    if not tools:
        return None
    listing = []
    for t in tools:
        function: dict[str, object] = {"name": t.name}
        if t.description is not None:
            function["description"] = t.description
        function["parameters"] = t.parameters if t.parameters is not None else _NO_PARAMETERS
        listing.append({"type": "function", "function": function})
    return json.dumps(listing, ensure_ascii=False)


_NO_PARAMETERS: Final[dict[str, object]] = {"type": "object", "properties": {}}


def forced_params(
    params: SamplingParams, tools: Sequence[Tool], choice: Choice, param: str
) -> SamplingParams:
    """``params`` for ``choice``: unchanged unless it forces a call (``required`` or a name);
    then constrained to one call of the allowed tools, whose schemas (at ``param[i].…``) are
    checked here — a feature the grammar cannot enforce is a 400 naming it."""
    if choice in ("none", "auto"):
        return params
    chosen = [(i, t) for i, t in enumerate(tools) if choice == "required" or t.name == choice]
    allowed: dict[str, object] = {}
    for i, tool in chosen:
        schema = tool.parameters if tool.parameters is not None else _NO_PARAMETERS
        where = f"{param}[{i}].parameters"
        try:
            if len(schema_text(schema, where)) <= CHECK_HERE_BYTES:  # larger: the runner's
                check_schema(schema, where)  # preparing thread checks them (module docstring)
        except SchemaRefused as exc:
            raise refused(exc) from None
        allowed[tool.name] = schema
    try:
        text = schema_text(tool_call_schema(allowed), param)
    except SchemaRefused as exc:
        raise refused(exc) from None
    return attrs.evolve(params, json_schema=text, tool_call=True)


def answer_calls(
    text: str, end: GenerationEnd, *, id_prefix: str = "call_"
) -> tuple[str, list[Call]]:
    """The text left and the calls of a whole answer ``text`` that ended as ``end`` (see the
    module docstring); a call without the model's own id gets a fresh one in ``id_prefix``."""
    if end.finish_reason != "stop":
        return text, []  # cut short: whatever call it began is incomplete
    if end.tool_calls:
        calls = [Call(c.id or new_call_id(id_prefix), c.name, c.arguments) for c in end.tool_calls]
        return end.content or "", calls
    return parse_calls(text, id_prefix=id_prefix)


def parse_calls(text: str, *, id_prefix: str = "call_") -> tuple[str, list[Call]]:
    """The text left and the calls read from a whole answer (see the module docstring); an
    answer with no well-formed call is all text."""
    calls: list[Call] = []
    blocks = list(_BLOCK.finditer(text))
    if blocks:
        for block in blocks:
            call = _call(block.group(1), id_prefix)
            if call is None:
                return text, []  # a malformed block: leave the whole answer as text
            calls.append(call)
        return _BLOCK.sub("", text).strip(), calls
    call = _call(text.strip(), id_prefix)
    return ("", [call]) if call is not None else (text, [])


def _call(text: str, id_prefix: str) -> Call | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or set(value) != {"name", "arguments"}:
        return None
    name, arguments = value["name"], value["arguments"]
    if isinstance(arguments, str):  # some models send the arguments as JSON text
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(name, str) or not isinstance(arguments, dict):
        return None
    compact = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    return Call(new_call_id(id_prefix), name, compact)

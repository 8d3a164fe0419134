"""Reading a finished answer's tool calls with the model's own mlx-lm tool parser.

mlx-lm picks a tool parser per model (``tool_parser_type`` in ``tokenizer_config.json``, else
inferred from the chat template or the vocabulary: ``json_tools``, ``pythonic``, ``mistral``,
``gemma4``, ``kimi_k2``, ``qwen3_coder``, …) and exposes it on the
:class:`~mlx_lm.tokenizer_utils.TokenizerWrapper` as ``tool_parser`` with its
``tool_call_start`` / ``tool_call_end`` markers. Only the runner holds the tokenizer, so the
runner reads the calls — the API cannot know each family's syntax — and reports them on
:class:`~skulk.wire.runner.GenerationEnd` (``tool_calls`` and ``content``, the text without the
call blocks). The API still decides what a format shows (:mod:`skulk.api._tool_calls`): the
runner's calls when there are any, else its own parse of the text.

Only a request that offered tools (``ChatPrompt.tools``) on a model whose tokenizer has a
parser is read, and only when it ended by ``stop`` (an answer cut short holds at best an
incomplete call). The text is split on the markers, each block goes to the parser (which
returns one ``{"name", "arguments"[, "id"]}`` or a list of them), as mlx-lm's own server does;
anything unexpected — a parser exception, a block never closed, a shape other than that —
leaves no calls and the text as it is: parsing never fails the request.

Pure (no mlx): called on the runner's main thread once a request finishes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import attrs

from skulk.wire.runner import ChatPrompt, GenerationEnd, Prompt, ToolCall

log = logging.getLogger("skulk.engine")

#: mlx-lm's ``parse_tool_call(text, tools)``: a call dict or a list of them; raises on bad text.
Parser = Callable[[str, Any], Any]


@attrs.define(eq=False)
class ToolText:
    """The text of one request that offered tools, collected as it is emitted, and the
    model's parser with its markers (see the module docstring)."""

    parser: Parser
    start: str
    end: str
    tools: list[Any] | None
    pieces: list[str] = attrs.Factory(list)

    @classmethod
    def open(cls, tokenizer: Any, prompt: Prompt) -> ToolText | None:
        """The collector for a request with ``prompt`` on a model with ``tokenizer`` (an mlx-lm
        ``TokenizerWrapper``); ``None`` when no tools were offered or the model has no parser."""
        if not isinstance(prompt, ChatPrompt) or prompt.tools is None:
            return None
        parser = getattr(tokenizer, "tool_parser", None)
        start = getattr(tokenizer, "tool_call_start", None)
        end = getattr(tokenizer, "tool_call_end", None)
        if parser is None or not isinstance(start, str) or not start or not isinstance(end, str):
            return None
        try:
            tools = json.loads(prompt.tools)
        except ValueError:
            tools = None
        return cls(parser, start, end, tools if isinstance(tools, list) else None)

    def add(self, text: str) -> None:
        if text:
            self.pieces.append(text)

    def finish(self, end: GenerationEnd) -> GenerationEnd:
        """``end`` with the calls read from the collected text (unchanged without any)."""
        if end.finish_reason != "stop":
            return end
        parsed = parse_tool_text(
            "".join(self.pieces), self.parser, self.start, self.end, self.tools
        )
        if parsed is None:
            return end
        content, calls = parsed
        return attrs.evolve(end, tool_calls=calls, content=content)


def parse_tool_text(
    text: str, parser: Parser, start: str, end: str, tools: list[Any] | None
) -> tuple[str, tuple[ToolCall, ...]] | None:
    """The text left and the calls in ``text``, each block between ``start`` and ``end`` (to
    the end of the text when ``end`` is empty: Mistral's ``[TOOL_CALLS]`` has no closing
    marker) read by ``parser``; ``None`` when there is no call or anything went wrong."""
    kept: list[str] = []
    calls: list[ToolCall] = []
    pos = 0
    while (at := text.find(start, pos)) != -1:
        kept.append(text[pos:at])
        body_at = at + len(start)
        if end:
            stop = text.find(end, body_at)
            if stop == -1:
                return None  # a block never closed: the call is incomplete
            segment, pos = text[body_at:stop], stop + len(end)
        else:
            segment, pos = text[body_at:], len(text)
        try:
            parsed = parser(segment, tools)
        except Exception as exc:  # a parser bug or bad text alike: leave the text as it is
            log.warning("runner: could not parse a tool call (%s: %s)", type(exc).__name__, exc)
            return None
        for value in parsed if isinstance(parsed, list) else [parsed]:
            call = _call(value)
            if call is None:
                log.warning("runner: the tool parser returned %r, not a call", value)
                return None
            calls.append(call)
    if not calls:
        return None
    kept.append(text[pos:])
    return "".join(kept).strip(), tuple(calls)


def _call(value: object) -> ToolCall | None:
    """A parser's ``{"name", "arguments"[, "id"]}`` as a :class:`ToolCall` (``id`` empty when
    the model gave none: the API makes one in its format's style)."""
    if not isinstance(value, dict):
        return None
    name, arguments, call_id = value.get("name"), value.get("arguments", {}), value.get("id")
    if isinstance(arguments, str):  # some parsers keep the arguments as JSON text
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return None
    try:
        compact = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError):  # a value JSON cannot hold (a Python set, bytes, …)
        return None
    return ToolCall(call_id if isinstance(call_id, str) else "", name, compact)

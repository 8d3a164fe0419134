"""Rendering a chat prompt with tools through the model's chat template.

A :class:`~skulk.wire.runner.ChatPrompt` may carry ``tools`` (JSON text of OpenAI-style
function tools), assistant turns with ``tool_calls`` and ``tool`` turns with results. A chat
template that knows tools (it reads the ``tools`` variable: Qwen, Hermes, Llama 3.1, Mistral,
…) gets them as Hugging Face's ``apply_chat_template(messages, tools=…)`` expects: the tools
list, ``tool_calls`` as ``{"id", "type": "function", "function": {"name", "arguments"}}`` with
the arguments decoded, and ``tool`` turns with their ``tool_call_id``.

A template that does not (the demo model's) gets the **fallback**, documented in
``docs/api.md``: a system turn (:data:`FALLBACK_PROMPT` then the tools as JSON, one per line)
before the conversation, merged into the conversation's own system turn when it starts with
one; each call an assistant made becomes a line of JSON ``{"name": …, "arguments": …}`` in its
content (the shape a forced call is produced in, see :func:`skulk.grammar.tool_call_schema`);
a ``tool`` turn keeps its role when the template names it and becomes a ``user`` turn starting
``Tool result:`` otherwise.

Pure (no mlx): called from the prompt-preparing thread through
:meth:`~skulk.engine._engine.Engine.tokenize`.
"""

from __future__ import annotations

import json
from typing import Any, Final

from skulk.wire.runner import ChatMessage, ChatPrompt

#: The fallback system text before the tools, for templates that cannot render tools.
FALLBACK_PROMPT: Final = (
    "You can call these tools. To call one, answer with only a JSON object "
    '{"name": <tool name>, "arguments": <an object valid for its parameters>}.\nTools:'
)


def has_tools(prompt: ChatPrompt) -> bool:
    """Whether ``prompt`` needs tool rendering at all."""
    return prompt.tools is not None or any(
        m.tool_calls or m.tool_call_id is not None for m in prompt.messages
    )


def template_knows_tools(template: object) -> bool:
    """Whether a chat template reads the ``tools`` variable (a heuristic on its source: a
    template that does is given them natively)."""
    if isinstance(template, dict):  # several named templates: the default one is used
        template = template.get("default", next(iter(template.values()), ""))
    return isinstance(template, str) and "tools" in template


def chat_inputs(prompt: ChatPrompt, template: object) -> tuple[list[dict[str, Any]], Any]:
    """The ``messages`` and ``tools`` to hand to ``apply_chat_template`` for ``prompt`` and
    the tokenizer's ``template`` (``tools`` is ``None`` when there are none, or when the
    fallback put them in the messages)."""
    if not has_tools(prompt):
        return [{"role": m.role, "content": m.content} for m in prompt.messages], None
    tools = json.loads(prompt.tools) if prompt.tools is not None else None
    if template_knows_tools(template):
        return [_native(m) for m in prompt.messages], tools
    return _fallback(prompt.messages, tools, template), None


def _native(m: ChatMessage) -> dict[str, Any]:
    message: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        message["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": json.loads(c.arguments)},
            }
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        message["tool_call_id"] = m.tool_call_id
    return message


def _fallback(
    messages: tuple[ChatMessage, ...], tools: list[Any] | None, template: object
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        content = m.content
        role = m.role
        if m.tool_calls:
            calls = [
                json.dumps({"name": c.name, "arguments": json.loads(c.arguments)})
                for c in m.tool_calls
            ]
            content = "\n".join([content, *calls] if content else calls)
        if role == "tool" and not (isinstance(template, str) and "'tool'" in template):
            role, content = "user", f"Tool result: {content}"
        out.append({"role": role, "content": content})
    if tools:
        listing = "\n".join([FALLBACK_PROMPT, *(json.dumps(t) for t in tools)])
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{listing}"
        else:
            out.insert(0, {"role": "system", "content": listing})
    return out

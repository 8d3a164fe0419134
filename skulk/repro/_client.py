"""The HTTP side of a repro: requests with a deadline on every wait, outcomes as values.

Nothing here raises on a transport problem or a timeout: a refused connection, a reset, a
read timeout or the caller's deadline all come back as part of the outcome, so a scenario
records them as failed checks instead of hanging or crashing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping

import attrs
import httpx

MODEL = "skulk-demo"
#: Connecting to a loopback node is instant unless it is gone; do not wait long for that.
CONNECT_TIMEOUT = 5.0
PROMPT = "Tell me about foxes."


def chat_body(max_tokens: int, *, stream: bool, prompt: str = PROMPT) -> dict[str, object]:
    """A greedy chat request: the demo model never emits EOS greedily, so it generates exactly
    ``max_tokens`` tokens."""
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }


def _timeout(budget: float) -> httpx.Timeout:
    return httpx.Timeout(max(budget, 0.1), connect=min(CONNECT_TIMEOUT, max(budget, 0.1)))


@attrs.frozen
class Reply:
    """A whole HTTP response, or why there was none (``status`` is then ``None``)."""

    status: int | None
    body: object = None
    problem: str | None = None
    #: The node that served it (the ``x-skulk-node`` header), if it says.
    node: str | None = None

    def field(self, *path: str) -> object:
        """``body[path[0]][path[1]]…``, or ``None`` where that is missing."""
        value = self.body
        for key in path:
            if not isinstance(value, dict):
                return None
            value = value.get(key)
        return value

    def describe(self) -> str:
        if self.status is None:
            return f"no response ({self.problem})"
        return f"{self.status} {json.dumps(self.body)[:300]}"


def request(
    method: str,
    url: str,
    *,
    budget: float,
    body: object = None,
    headers: Mapping[str, str] | None = None,
) -> Reply:
    """One request with at most ``budget`` seconds per phase (connect, each read)."""
    try:
        r = httpx.request(method, url, json=body, headers=headers, timeout=_timeout(budget))
    except httpx.HTTPError as exc:
        return Reply(None, problem=f"{type(exc).__name__}: {exc}")
    try:
        parsed: object = r.json()
    except ValueError:
        parsed = r.text
    return Reply(r.status_code, parsed, node=r.headers.get("x-skulk-node"))


@attrs.frozen
class StreamOutcome:
    """How one streamed chat completion went. Times are ``time.monotonic()`` values."""

    status: int | None
    #: Content deltas received (one per token with ``--stream-interval 0``).
    tokens: int
    started: float
    ended: float
    last_token: float | None
    finish_reason: str | None = None
    #: The ``error`` object of an SSE error event.
    error: dict[str, object] | None = None
    #: Whether ``data: [DONE]`` closed the stream.
    done: bool = False
    #: What ended it otherwise: transport error, read timeout, the caller's deadline.
    problem: str | None = None

    @property
    def error_code(self) -> object:
        return None if self.error is None else self.error.get("code")

    @property
    def stalled_s(self) -> float:
        """Seconds from the last token (or the request, if none came) to the end."""
        return self.ended - (self.last_token if self.last_token is not None else self.started)

    def describe(self) -> str:
        if self.status is not None and self.status != 200:
            end = f"HTTP {self.status}"
            if self.error is not None:
                end += f" {json.dumps(self.error)[:200]}"
        elif self.error is not None:
            end = f"error event {json.dumps(self.error)[:200]}"
        elif self.finish_reason is not None:
            end = f"finished ({self.finish_reason})"
        else:
            end = self.problem or "ended without a finish or an error"
        return f"{self.tokens} tokens, then {end}"


def _error_object(text: str) -> dict[str, object] | None:
    """The ``error`` object of an error response's JSON body, if it has one."""
    try:
        body = json.loads(text)
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, dict) else None


def _content(chunk: dict[str, object]) -> tuple[str, str | None]:
    choices = chunk.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return "", None
    delta = choices[0].get("delta")
    text = delta.get("content") if isinstance(delta, dict) else None
    finish = choices[0].get("finish_reason")
    return (
        text if isinstance(text, str) else "",
        finish if isinstance(finish, str) else None,
    )


def stream_chat(
    url: str,
    *,
    max_tokens: int,
    budget: float,
    on_token: Callable[[int], None] | None = None,
    prompt: str = PROMPT,
) -> StreamOutcome:
    """Stream a chat completion from ``url`` for at most ``budget`` seconds.

    ``on_token(n)`` is called after the n-th content delta (to act mid-stream, e.g. kill
    the node). A read that blocks is cut by the read timeout (``budget``), and the budget
    is checked between events, so the call returns within about twice ``budget``. A failure
    before the first token is an HTTP error, not a stream: its ``error`` object is kept too.
    """
    started = time.monotonic()
    end_by = started + budget
    tokens, last_token = 0, None
    finish: str | None = None
    error: dict[str, object] | None = None
    done = False
    problem: str | None = None
    status: int | None = None
    try:
        with httpx.stream(
            "POST",
            url + "/v1/chat/completions",
            json=chat_body(max_tokens, stream=True, prompt=prompt),
            timeout=_timeout(budget),
        ) as r:
            status = r.status_code
            if status != 200:
                r.read()
                return StreamOutcome(
                    status,
                    0,
                    started,
                    time.monotonic(),
                    None,
                    error=_error_object(r.text),
                    problem=r.text[:300],
                )
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line.removeprefix("data: ")
                if data == "[DONE]":
                    done = True
                    break
                event = json.loads(data)
                if not isinstance(event, dict):
                    continue
                if isinstance(err := event.get("error"), dict):
                    error = err
                    continue
                text, reason = _content(event)
                finish = reason or finish
                if text:
                    tokens += 1
                    last_token = time.monotonic()
                    if on_token is not None:
                        on_token(tokens)
                if time.monotonic() > end_by:
                    problem = f"client deadline: still streaming after {budget:.1f}s"
                    break
    except httpx.TimeoutException as exc:
        problem = f"client deadline: {type(exc).__name__} after {budget:.1f}s without an event"
    except httpx.HTTPError as exc:
        problem = f"connection ended: {type(exc).__name__}: {exc}"
    except ValueError as exc:
        problem = f"malformed event: {exc}"
    return StreamOutcome(
        status, tokens, started, time.monotonic(), last_token, finish, error, done, problem
    )

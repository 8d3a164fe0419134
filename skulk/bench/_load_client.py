"""The client side of ``bench load``: one streamed OpenAI chat request, timed as the client
sees it (:func:`stream`), and a burst of them at once (:func:`burst`)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import attrs
import httpx
import trio

from skulk.bench._load_servers import Server

REQUEST_TIMEOUT = 600.0
CONNECT_TRIES = 10


@attrs.frozen
class Stream:
    """One streamed request as the client saw it (times from ``time.perf_counter``)."""

    sent: float
    first: float  # first non-empty content delta (0.0: none)
    end: float  # the stream closed
    tokens: int  # usage.completion_tokens
    prompt_tokens: int
    cached_tokens: int | None
    finish_reason: str
    text: str
    retries: int  # connections reset before the response started (see _open)
    chunks: tuple[float, ...] = ()  # when each non-empty content delta arrived
    instance: str = ""  # the x-skulk-instance response header (a Skulk node's choice)

    @property
    def ttft_s(self) -> float:
        return (self.first or self.end) - self.sent

    @property
    def tokens_per_s(self) -> float:
        """Completion tokens ÷ request sent → stream closed. Not the rate after the first
        token: the node sends a delta per ``--stream-interval`` (20 ms), which quantizes a
        short first → last span too coarsely."""
        return self.tokens / (self.end - self.sent)


def chat_body(
    server: Server,
    messages: list[dict[str, str]],
    max_tokens: int,
    temperature: float = 0.0,
    seed: int | None = None,
) -> dict[str, object]:
    body: dict[str, object] = {
        "model": server.model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if seed is not None:
        body["seed"] = seed
    return body


async def stream(client: httpx.AsyncClient, url: str, body: dict[str, object]) -> Stream:
    """Send one streamed chat request and time it (from the first attempt: see
    :func:`_open`)."""
    sent = time.perf_counter()
    first = 0.0
    usage: dict[str, Any] = {}
    reason = ""
    parts: list[str] = []
    chunks: list[float] = []
    retries, response = await _open(client, url, body)
    instance = response.headers.get("x-skulk-instance", "")
    try:
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"{url}: stream failed: {chunk['error']}")
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or ():
                if text := (choice.get("delta") or {}).get("content"):
                    chunks.append(time.perf_counter())
                    first = first or chunks[-1]
                    parts.append(text)
                reason = choice.get("finish_reason") or reason
    finally:
        await response.aclose()
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens")
    return Stream(
        sent=sent,
        first=first,
        end=time.perf_counter(),
        tokens=int(usage.get("completion_tokens", 0)),
        prompt_tokens=int(usage.get("prompt_tokens", 0)),
        cached_tokens=int(cached) if isinstance(cached, int) else None,
        finish_reason=reason,
        text="".join(parts),
        retries=retries,
        chunks=tuple(chunks),
        instance=instance,
    )


async def _open(
    client: httpx.AsyncClient, url: str, body: dict[str, object]
) -> tuple[int, httpx.Response]:
    """Send the request until a response starts: (connections reset first, the response).

    ``mlx_lm.server`` is an ``http.server`` with a listen backlog of 5 and no keep-alive: of
    16 connections opened at once, some are reset before it reads them. A client would try
    again, so the benchmark does (at most ``CONNECT_TRIES`` times), counts it in ``retries``
    and keeps timing from the first attempt."""
    request = client.build_request("POST", url + "/v1/chat/completions", json=body)
    for retries in range(CONNECT_TRIES):
        try:
            response = await client.send(request, stream=True)
        except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
            if retries == CONNECT_TRIES - 1:
                raise
            await trio.sleep(0.01 * (retries + 1))
            continue
        if response.is_error:
            text = (await response.aread()).decode(errors="replace")
            await response.aclose()
            raise RuntimeError(f"{url}: HTTP {response.status_code}: {text[:500]}")
        return retries, response
    raise AssertionError("unreachable")


async def burst(
    client: httpx.AsyncClient, url: str, bodies: Sequence[dict[str, object]]
) -> tuple[float, list[Stream]]:
    """All ``bodies`` at once; (wall seconds from the first sent to the last ended, streams)."""
    results: list[Stream | None] = [None] * len(bodies)

    async def one(i: int) -> None:
        results[i] = await stream(client, url, bodies[i])

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(len(bodies)):
            nursery.start_soon(one, i)
    done = [r for r in results if r is not None]
    return time.perf_counter() - start, done


def http_client(concurrency: int) -> httpx.AsyncClient:
    n = concurrency + 4
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    return httpx.AsyncClient(timeout=REQUEST_TIMEOUT, limits=limits)

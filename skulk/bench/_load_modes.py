"""The modes of ``bench load`` (see :mod:`skulk.bench._load`): each drives its servers in
turns, round by round, and reports the ratio of the first to the others. :func:`rounds`,
:func:`side` and :func:`ratios` are the throughput measurement, shared with ``blas``
(``_load_blas``)."""

from __future__ import annotations

import json
import math
import random
import statistics
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Literal, TypeVar

import attrs
import httpx
import trio

from skulk.bench._load_client import Stream, burst, chat_body, http_client, stream
from skulk.bench._load_servers import Server

Servers = TypeVar("Servers", bound=tuple[Server, ...])
Mode = Literal["throughput", "prefix", "speculative", "sharegpt", "blas", "routing"]
MODES: tuple[Mode, ...] = ("throughput", "prefix", "speculative", "sharegpt", "blas", "routing")
#: The modes run when ``--modes`` is not given (``sharegpt`` is a long sweep of its own,
#: ``blas`` wants ``--model large``, ``routing`` starts two three-node clusters of its own).
DEFAULT_MODES: tuple[Mode, ...] = ("throughput", "prefix", "speculative")
PREFIX_ANSWER_TOKENS = 16
PREFIX_GOAL = 0.3
FOLLOW_UP = {"role": "user", "content": "Tell me more about that, please."}
COPY_GOAL = 1.0
FREE_GOAL = 0.95
STORY = "Tell me a long story about a fox who builds a cluster of machines, in great detail."
COPY_TEXT = (
    "The river turns twice below the old mill before it reaches the sea, and the people who "
    "live along its banks have names for every bend, every stone and every season of the water. "
    "In spring the water runs high and brown; in summer it slows and clears; in autumn the "
    "leaves gather in the bends; in winter the edges freeze and the mill wheel stops."
)
#: Plain words (about one token each with the demo tokenizer) prompts are made of.
WORDS = (
    "the cluster node model token stream fox river machine memory cache request answer "
    "question story water mill stone season light night morning winter summer engine queue "
    "batch prompt history turn window agent tool result careful quick slow bright quiet "
    "build run wait send read write learn find keep share move hold open close"
).split()


def default_levels(modes: Sequence[str]) -> tuple[int, ...]:
    """The concurrency levels when ``--levels`` is not given: 8 streams for ``blas`` alone
    (the issue's fixed-concurrency figure), else 1, 8 and 16."""
    return (8,) if tuple(modes) == ("blas",) else (1, 8, 16)


def throughput_goal(level: int) -> float:
    return 1.0 if level <= 1 else 1.2


@attrs.frozen
class Settings:
    model: Literal["demo", "large"] = "demo"
    levels: tuple[int, ...] = (1, 8, 16)
    rounds: int = 5
    max_tokens: int = 128
    modes: tuple[Mode, ...] = DEFAULT_MODES
    chat_chars: int = 4000
    rates: tuple[float, ...] = (2.0, 4.0, 8.0)
    requests: int = 32
    home: Path | None = None
    conversations: int = 8  # routing: conversations at once


def _prompt(round_: int, i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Round {round_}, stream {i}. {STORY}"}]


async def throughput(servers: tuple[Server, Server], settings: Settings) -> dict[str, object]:
    """Skulk (``servers[0]``) vs mlx_lm.server (``servers[1]``), level by level (module doc)."""
    figures: dict[str, object] = {}
    async with http_client(max(settings.levels)) as client:
        await warm_up(client, servers, max(settings.levels))
        for level in settings.levels:
            rates, streams = await rounds(client, servers, level, settings)
            figures[str(level)] = _level(level, servers, rates, streams, settings.max_tokens)
            print(f"load: {level} streams: {json.dumps(figures[str(level)])}", file=sys.stderr)
    return figures


async def warm_up(client: httpx.AsyncClient, servers: Sequence[Server], top: int) -> None:
    """A burst of ``top`` short streams on each server, then one stream."""
    for server in servers:
        bodies = [chat_body(server, _prompt(-1, i), 8) for i in range(top)]
        await burst(client, server.url, bodies)
        await stream(client, server.url, chat_body(server, _prompt(-2, 0), 8))


def turns(servers: Sequence[Server], round_: int) -> list[Server]:
    """The order the servers take their turns in within a round: rotated by one each round
    (two servers: alternating)."""
    k = round_ % len(servers)
    return [*servers[k:], *servers[:k]]


async def rounds(
    client: httpx.AsyncClient, servers: Sequence[Server], level: int, settings: Settings
) -> tuple[dict[str, list[float]], dict[str, list[Stream]]]:
    """``settings.rounds`` rounds of a ``level``-stream burst on each server in turn: each
    server's aggregate rate per round (completion tokens ÷ wall), and every stream."""
    rates: dict[str, list[float]] = {s.name: [] for s in servers}
    streams: dict[str, list[Stream]] = {s.name: [] for s in servers}
    for r in range(settings.rounds):
        for server in turns(servers, r):
            bodies = [chat_body(server, _prompt(r, i), settings.max_tokens) for i in range(level)]
            wall, done = await burst(client, server.url, bodies)
            rates[server.name].append(sum(s.tokens for s in done) / wall)
            streams[server.name].extend(done)
    return rates, streams


def ratios(rates: dict[str, list[float]], a: str, b: str) -> dict[str, object]:
    """``a`` ÷ ``b``: the median of the per-round ratios, and those ratios."""
    by_round = [round(x / y, 3) for x, y in zip(rates[a], rates[b], strict=True)]
    return {"ratio": round(statistics.median(by_round), 3), "ratio_by_round": by_round}


def side(rates: list[float], streams: list[Stream]) -> dict[str, object]:
    """One server's figures at one level: median tokens/s, TTFT p50/p99 over every stream."""
    ttfts = [s.ttft_s * 1000 for s in streams]
    return {
        "tokens_per_s": round(statistics.median(rates), 1),
        "ttft_p50_ms": round(statistics.median(ttfts), 1),
        "ttft_p99_ms": round(_nearest_rank(ttfts, 0.99), 1),
        "tokens": sorted({s.tokens for s in streams}),
        "retries": sum(s.retries for s in streams),
    }


def _level(
    level: int,
    servers: tuple[Server, Server],
    rates: dict[str, list[float]],
    streams: dict[str, list[Stream]],
    max_tokens: int,
) -> dict[str, object]:
    ours, theirs = (s.name for s in servers)
    vs = ratios(rates, ours, theirs)
    out: dict[str, object] = {
        "ratio": vs["ratio"],
        "goal": throughput_goal(level),
        "ratio_by_round": vs["ratio_by_round"],
    }
    for name in (ours, theirs):
        out[name] = side(rates[name], streams[name])
    out["full_length"] = all(
        s.tokens == max_tokens for name in (ours, theirs) for s in streams[name]
    )
    return out


def _nearest_rank(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _conversation(seed: int, chars: int) -> list[dict[str, str]]:
    """A made-up chat of about ``chars`` characters: a system prompt, then user/assistant turns,
    ending with a user question."""
    rng = random.Random(seed)

    def text(n: int) -> str:
        words: list[str] = []
        while sum(len(w) + 1 for w in words) < n:
            words.append(rng.choice(WORDS))
        return " ".join(words).capitalize() + "."

    messages = [{"role": "system", "content": f"Conversation {seed}. " + text(chars // 8)}]
    while sum(len(m["content"]) for m in messages) < chars:
        messages.append({"role": "user", "content": text(chars // 12)})
        messages.append({"role": "assistant", "content": text(chars // 12)})
    messages.append({"role": "user", "content": "What should we do next? " + text(80)})
    return messages


async def prefix(servers: tuple[Server, Server], settings: Settings) -> dict[str, object]:
    """Second-turn TTFT with the prefix cache (``servers[0]``) ÷ without (``servers[1]``)."""
    turns: dict[str, list[tuple[Stream, Stream]]] = {s.name: [] for s in servers}
    async with http_client(1) as client:
        for r in range(-1, settings.rounds):  # round -1: warm-up, not recorded
            chat = _conversation(1000 + r, settings.chat_chars)
            for server in servers if r % 2 == 0 else servers[::-1]:
                one = await stream(
                    client, server.url, chat_body(server, chat, PREFIX_ANSWER_TOKENS)
                )
                follow = [*chat, {"role": "assistant", "content": one.text}, FOLLOW_UP]
                two = await stream(
                    client, server.url, chat_body(server, follow, PREFIX_ANSWER_TOKENS)
                )
                if r >= 0:
                    turns[server.name].append((one, two))
    cached, plain = (turns[s.name] for s in servers)
    by_round = [round(c[1].ttft_s / p[1].ttft_s, 3) for c, p in zip(cached, plain, strict=True)]
    med = statistics.median

    def ms(pairs: list[tuple[Stream, Stream]]) -> list[float]:
        return [round(med(t.ttft_s for t in turn) * 1000, 1) for turn in zip(*pairs, strict=True)]

    cached_tokens = [t.cached_tokens for _, t in cached if t.cached_tokens is not None]
    return {
        "available": True,
        "ratio": round(med(by_round), 3),
        "goal": PREFIX_GOAL,
        "ratio_by_round": by_round,
        "prompt_tokens": [cached[0][0].prompt_tokens, cached[0][1].prompt_tokens],
        "cached_ttft_ms": ms(cached),
        "uncached_ttft_ms": ms(plain),
        "cached_tokens": round(med(cached_tokens)) if cached_tokens else None,
    }


async def speculative(servers: tuple[Server, Server], settings: Settings) -> dict[str, object]:
    """Decode tokens/s with speculation (``servers[0]``) ÷ without (``servers[1]``)."""
    copy = [{"role": "user", "content": f"Repeat this text exactly: {COPY_TEXT}"}]
    kinds = {"copy": (copy, 0.0), "free": ([{"role": "user", "content": STORY}], 1.0)}
    rates: dict[str, dict[str, list[float]]] = {k: {s.name: [] for s in servers} for k in kinds}
    tokens: dict[str, dict[str, set[int]]] = {k: {s.name: set() for s in servers} for k in kinds}
    async with http_client(1) as client:
        for r in range(-1, settings.rounds):
            for kind, (messages, temperature) in kinds.items():
                for server in servers if r % 2 == 0 else servers[::-1]:
                    body = chat_body(
                        server, messages, settings.max_tokens, temperature, seed=1000 + r
                    )
                    done = await stream(client, server.url, body)
                    if r >= 0:
                        rates[kind][server.name].append(done.tokens_per_s)
                        tokens[kind][server.name].add(done.tokens)
    out: dict[str, object] = {"available": True}
    goals = {"copy": COPY_GOAL, "free": FREE_GOAL}
    for kind in kinds:
        on, off = (rates[kind][s.name] for s in servers)
        by_round = [round(a / b, 3) if b else 0.0 for a, b in zip(on, off, strict=True)]
        out[kind] = {
            "ratio": round(statistics.median(by_round), 3),
            "goal": goals[kind],
            "ratio_by_round": by_round,
            "tokens_per_s": round(statistics.median(on), 1),
            "plain_tokens_per_s": round(statistics.median(off), 1),
            "tokens": [sorted(tokens[kind][s.name]) for s in servers],
        }
    return out


def measured(
    mode: Callable[[Servers, Settings], Awaitable[dict[str, object]]],
    servers: Servers,
    settings: Settings,
) -> dict[str, object]:
    """Run one mode; a failure (a server's error, a dropped stream) is that mode's result, so
    the other modes still run and report."""
    try:
        return trio.run(mode, servers, settings)
    except Exception as exc:  # any failure is reported, not raised
        print(f"load: {mode.__name__} failed: {exc!r}", file=sys.stderr)
        return {"error": repr(exc)[:1000]}

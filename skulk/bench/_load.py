"""``python -m skulk.bench load``: Skulk under concurrent load against ``mlx_lm.server``.

The benchmark starts its own servers on loopback, on the same model directory: a
``python -m skulk serve`` node (:class:`~skulk.harness.NodeProcess`) and ``python -m mlx_lm
server`` (mlx-lm 0.32.2, which batches concurrent requests with ``BatchGenerator``; run with its
default ``--decode-concurrency 32 --prompt-concurrency 8``, passed explicitly). Both are driven
the same way: OpenAI chat completions, streamed (SSE) with ``httpx``, greedy, a fixed
``max_tokens``, ``stream_options.include_usage`` on.

* **throughput** — at each concurrency level (``--levels``, default 1, 8, 16) ``c`` streams are
  started together; the aggregate rate is the completion tokens of all ``c`` streams ÷ the wall
  time from the first request sent to the last stream's end. Tokens are counted the same way for
  both servers: the ``usage.completion_tokens`` of each stream's final chunk. Every stream's
  prompt is unique (its round and stream number open it), so no prompt cache serves one round
  from an earlier one on either side. TTFT is request sent → first non-empty content delta;
  p50/p99 pool every stream of every round at that level (nearest rank). The two servers stay
  up and take turns within each round (the order alternates by round); ``ratio`` is the median
  of the per-round ratios Skulk ÷ mlx_lm.server. Goals: ≥ 1.0 at one stream, ≥ 1.2 above.
  ``ignore_eos`` is not in the OpenAI API (and Skulk takes no ``logit_bias``), so the prompts
  and models are ones that run to ``max_tokens`` (the demo model loops greedily whatever the
  prompt; the large model's end-of-sequence logit is zeroed so greedy decoding never picks
  it); ``full_length`` says whether every stream of both servers did; ``retries``: connections
  mlx_lm.server reset before answering, tried again (see :func:`_open`).
* **prefix** — the second turn of a long multi-turn chat (``--chat-chars`` characters of
  history): TTFT on a node with the prefix cache (the default) ÷ on a node started with
  ``--prefix-cache-memory 0``; each round a fresh conversation, turn one (history + question,
  ``PREFIX_ANSWER_TOKENS`` answered) then turn two (+ that answer + a new question), alternating
  which node goes first. Goal ≤ 0.3. Reports the turn-two ``cached_tokens`` if the node sends
  ``usage.prompt_tokens_details``.
* **speculative** — tokens/s of one stream (completion tokens ÷ request → end) on the default
  node ÷ a node started with ``--speculative-tokens 0``, on a copy prompt ("repeat this text: …",
  greedy) and on free generation (a story, temperature 1, a fixed seed per round). Goals: > 1 on
  copy, ≥ 0.95 on free. ``tokens``: the completion lengths seen, speculating node first
  (sampled text may end early, and speculation keeps the distribution, not the exact tokens).
  The demo model's greedy output is a short loop whatever the prompt, so there even "free"
  greedy text is a copy; ``--model large`` is the fairer test.

The prefix and speculative modes need node flags that may not exist in this build: each mode
checks ``python -m skulk serve --help`` first and, without its flag, reports
``{"available": false, "reason": …}`` instead of figures.

``--model large`` generates the distributed benchmark's default llama (12 layers, hidden 512,
float32: compute-bound on a small CPU) instead of the built-in demo model.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import httpx
import trio

from skulk.harness import NodeProcess

Mode = Literal["throughput", "prefix", "speculative"]
MODES: tuple[Mode, ...] = ("throughput", "prefix", "speculative")
#: mlx_lm.server's own defaults (0.32.2), passed explicitly so the record says what ran.
MLX_DECODE_CONCURRENCY = 32
MLX_PROMPT_CONCURRENCY = 8
START_DEADLINE = 180.0
REQUEST_TIMEOUT = 600.0
CONNECT_TRIES = 10
PREFIX_ANSWER_TOKENS = 16
PREFIX_GOAL = 0.3
FOLLOW_UP = {"role": "user", "content": "Tell me more about that, please."}
COPY_GOAL = 1.0
FREE_GOAL = 0.95
PREFIX_FLAG = "--prefix-cache-memory"
SPECULATIVE_FLAG = "--speculative-tokens"
STORY = "Tell me a long story about a fox who builds a cluster of machines, in great detail."
COPY_TEXT = (
    "The river turns twice below the old mill before it reaches the sea, and the people who "
    "live along its banks have names for every bend, every stone and every season of the water. "
    "In spring the water runs high and brown; in summer it slows and clears; in autumn the "
    "leaves gather in the bends; in winter the edges freeze and the mill wheel stops."
)
_WORDS = (
    "the cluster node model token stream fox river machine memory cache request answer "
    "question story water mill stone season light night morning winter summer engine queue "
    "batch prompt history turn window agent tool result careful quick slow bright quiet "
    "build run wait send read write learn find keep share move hold open close"
).split()


def throughput_goal(level: int) -> float:
    return 1.0 if level <= 1 else 1.2


@attrs.frozen
class Settings:
    model: Literal["demo", "large"] = "demo"
    levels: tuple[int, ...] = (1, 8, 16)
    rounds: int = 5
    max_tokens: int = 128
    modes: tuple[Mode, ...] = MODES
    chat_chars: int = 4000
    home: Path | None = None


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

    @property
    def ttft_s(self) -> float:
        return (self.first or self.end) - self.sent

    @property
    def tokens_per_s(self) -> float:
        """Completion tokens ÷ request sent → stream closed. Not the rate after the first
        token: the node sends a delta per ``--stream-interval`` (20 ms), which quantizes a
        short first → last span too coarsely."""
        return self.tokens / (self.end - self.sent)


@attrs.frozen
class Server:
    """Where to send requests: a base URL and the ``model`` field it expects."""

    name: str
    url: str
    model: str


# ---- processes ------------------------------------------------------------------------------


class MlxLmServer:
    """``python -m mlx_lm server`` on a free loopback port, output drained into a tail; stopped
    with SIGTERM, then SIGKILL of its process group."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.output: deque[str] = deque(maxlen=200)

    def __enter__(self) -> MlxLmServer:
        port = _free_port()
        cmd = [sys.executable, "-m", "mlx_lm", "server", "--model", str(self.model_dir),
               "--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING",
               "--decode-concurrency", str(MLX_DECODE_CONCURRENCY),
               "--prompt-concurrency", str(MLX_PROMPT_CONCURRENCY)]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
        threading.Thread(target=self._pump, daemon=True).start()
        self.url = f"http://127.0.0.1:{port}"
        end = time.monotonic() + START_DEADLINE
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError("mlx_lm.server exited:\n" + "\n".join(self.output))
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            time.sleep(0.1)
        self.__exit__()
        raise RuntimeError("mlx_lm.server never answered /health:\n" + "\n".join(self.output))

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line.rstrip())

    def __exit__(self, *exc: object) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def node_flags() -> str:
    """``python -m skulk serve --help``: which optional flags this build has."""
    done = subprocess.run(
        [sys.executable, "-m", "skulk", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout


@contextlib.contextmanager
def _node(root: Path, models: Path, name: str, model: str, *args: str) -> Iterator[Server]:
    """A node of its own (its own home and cluster) serving ``model`` from the shared models."""
    home = root / name
    home.mkdir()
    (home / "models").symlink_to(models)
    with NodeProcess(home, "--log-level", "warning", "--model", model, *args) as node:
        server = Server(name, node.url, Path(model).name)
        _wait_serving(server)
        yield server


def _wait_serving(server: Server) -> None:
    """Until one tiny request is answered (the node's runner may still be loading)."""
    body = {"model": server.model, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1}  # fmt: skip
    end = time.monotonic() + START_DEADLINE
    while time.monotonic() < end:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).is_success:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{server.name} never answered a request")


# ---- requests -------------------------------------------------------------------------------


def _body(
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
    retries, response = await _open(client, url, body)
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
                    first = first or time.perf_counter()
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


def _client(concurrency: int) -> httpx.AsyncClient:
    n = concurrency + 4
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    return httpx.AsyncClient(timeout=REQUEST_TIMEOUT, limits=limits)


# ---- the modes ------------------------------------------------------------------------------


def _prompt(round_: int, i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Round {round_}, stream {i}. {STORY}"}]


async def throughput(servers: tuple[Server, Server], settings: Settings) -> dict[str, object]:
    """Skulk (``servers[0]``) vs mlx_lm.server (``servers[1]``), level by level (module doc)."""
    top = max(settings.levels)
    figures: dict[str, object] = {}
    async with _client(top) as client:
        for server in servers:  # warm-up: a burst at the highest level, then one stream
            bodies = [_body(server, _prompt(-1, i), 8) for i in range(top)]
            await burst(client, server.url, bodies)
            await stream(client, server.url, _body(server, _prompt(-2, 0), 8))
        for level in settings.levels:
            rates: dict[str, list[float]] = {s.name: [] for s in servers}
            streams: dict[str, list[Stream]] = {s.name: [] for s in servers}
            for r in range(settings.rounds):
                for server in servers if r % 2 == 0 else servers[::-1]:
                    bodies = [
                        _body(server, _prompt(r, i), settings.max_tokens) for i in range(level)
                    ]
                    wall, done = await burst(client, server.url, bodies)
                    rates[server.name].append(sum(s.tokens for s in done) / wall)
                    streams[server.name].extend(done)
            figures[str(level)] = _level(level, servers, rates, streams, settings.max_tokens)
            print(f"load: {level} streams: {json.dumps(figures[str(level)])}", file=sys.stderr)
    return figures


def _level(
    level: int,
    servers: tuple[Server, Server],
    rates: dict[str, list[float]],
    streams: dict[str, list[Stream]],
    max_tokens: int,
) -> dict[str, object]:
    ours, theirs = (s.name for s in servers)
    by_round = [round(a / b, 3) for a, b in zip(rates[ours], rates[theirs], strict=True)]
    out: dict[str, object] = {
        "ratio": round(statistics.median(by_round), 3),
        "goal": throughput_goal(level),
        "ratio_by_round": by_round,
    }
    for name in (ours, theirs):
        ttfts = [s.ttft_s * 1000 for s in streams[name]]
        out[name] = {
            "tokens_per_s": round(statistics.median(rates[name]), 1),
            "ttft_p50_ms": round(statistics.median(ttfts), 1),
            "ttft_p99_ms": round(_nearest_rank(ttfts, 0.99), 1),
            "tokens": sorted({s.tokens for s in streams[name]}),
            "retries": sum(s.retries for s in streams[name]),
        }
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
            words.append(rng.choice(_WORDS))
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
    async with _client(1) as client:
        for r in range(-1, settings.rounds):  # round -1: warm-up, not recorded
            chat = _conversation(1000 + r, settings.chat_chars)
            for server in servers if r % 2 == 0 else servers[::-1]:
                one = await stream(client, server.url, _body(server, chat, PREFIX_ANSWER_TOKENS))
                follow = [*chat, {"role": "assistant", "content": one.text}, FOLLOW_UP]
                two = await stream(client, server.url, _body(server, follow, PREFIX_ANSWER_TOKENS))
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
    async with _client(1) as client:
        for r in range(-1, settings.rounds):
            for kind, (messages, temperature) in kinds.items():
                for server in servers if r % 2 == 0 else servers[::-1]:
                    body = _body(server, messages, settings.max_tokens, temperature, seed=1000 + r)
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


# ---- the run --------------------------------------------------------------------------------


def _models(root: Path, settings: Settings) -> tuple[Path, str]:
    """The models directory shared by every node, and the ``--model`` to serve from it."""
    from skulk.models import ensure_demo_model

    demo = ensure_demo_model(root / "shared")
    if settings.model == "demo":
        return demo.parent, "skulk-demo"
    from skulk.bench._distributed import DEFAULT_SHAPE
    from skulk.models._generated import write_generated_model

    large = write_generated_model(demo.parent / "load-large", DEFAULT_SHAPE, demo, seed=1)
    _never_end(large)
    return demo.parent, str(large)


def _never_end(model: Path) -> None:
    """Zero the output-projection row of the end-of-sequence token: its logit is 0 while the
    greedy winner's is well above, so greedy decoding always runs to ``max_tokens``."""
    import mlx.core as mx

    eos = int(json.loads((model / "config.json").read_text())["eos_token_id"])
    path = model / "model.safetensors"
    weights = mx.load(str(path))
    assert isinstance(weights, dict)
    head = weights["lm_head.weight"]
    rows = mx.arange(head.shape[0])[:, None]
    weights["lm_head.weight"] = mx.where(rows == eos, mx.zeros_like(head), head)
    mx.save_safetensors(str(path), weights, metadata={"format": "mlx"})


def run(settings: Settings) -> dict[str, object]:
    flags = node_flags() if set(settings.modes) - {"throughput"} else ""
    load_before = os.getloadavg()[0]
    result: dict[str, object] = {
        "benchmark": "load",
        "model": settings.model,
        "max_tokens": settings.max_tokens,
        "rounds": settings.rounds,
        "levels": list(settings.levels),
        "mlx_lm_server": {"decode_concurrency": MLX_DECODE_CONCURRENCY,
                          "prompt_concurrency": MLX_PROMPT_CONCURRENCY},
    }  # fmt: skip
    with contextlib.ExitStack() as stack:
        if settings.home is not None:
            root = settings.home
            root.mkdir(parents=True, exist_ok=True)
        else:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="skulk-load-")))
        models, model = _models(root, settings)
        if settings.model == "large":
            from skulk.bench._distributed import DEFAULT_SHAPE

            result["model_shape"] = attrs.asdict(DEFAULT_SHAPE)
        skulk = stack.enter_context(_node(root, models, "skulk", model))
        if "throughput" in settings.modes:
            model_dir = models / Path(model).name
            with MlxLmServer(model_dir) as mlx:
                theirs = Server("mlx_lm_server", mlx.url, "default_model")
                result["throughput"] = _measured(throughput, (skulk, theirs), settings)
        for mode, flag, fn in (("prefix", PREFIX_FLAG, prefix),
                               ("speculative", SPECULATIVE_FLAG, speculative)):  # fmt: skip
            if mode not in settings.modes:
                continue
            if flag not in flags:
                result[mode] = {"available": False,
                                "reason": f"this build's node has no {flag} flag"}  # fmt: skip
                continue
            with _node(root, models, f"skulk-no-{mode}", model, flag, "0") as plain:
                result[mode] = _measured(fn, (skulk, plain), settings)
    result["load_average"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    return result


def _measured(
    mode: Callable[[tuple[Server, Server], Settings], Awaitable[dict[str, object]]],
    servers: tuple[Server, Server],
    settings: Settings,
) -> dict[str, object]:
    """Run one mode; a failure (a server's error, a dropped stream) is that mode's result, so
    the other modes still run and report."""
    try:
        return trio.run(mode, servers, settings)
    except Exception as exc:  # any failure is reported, not raised
        print(f"load: {mode.__name__} failed: {exc!r}", file=sys.stderr)
        return {"error": repr(exc)[:1000]}


def table(result: dict[str, object]) -> str:
    lines = [f"model {result['model']}, max_tokens {result['max_tokens']}, "
             f"{result['rounds']} rounds"]  # fmt: skip
    levels = result.get("throughput")
    if isinstance(levels, dict) and "error" not in levels:
        lines.append(
            f"{'streams':>7} {'skulk tok/s':>12} {'mlx tok/s':>10} {'ratio':>6} {'goal':>5} "
            f"{'skulk TTFT p50/p99':>19} {'mlx TTFT p50/p99':>17} full"
        )
        for level, f in levels.items():
            ours, theirs = f["skulk"], f["mlx_lm_server"]
            lines.append(
                f"{level:>7} {ours['tokens_per_s']:>12} {theirs['tokens_per_s']:>10} "
                f"{f['ratio']:>6} {f['goal']:>5} "
                f"{ours['ttft_p50_ms']:>9}/{ours['ttft_p99_ms']:<9} "
                f"{theirs['ttft_p50_ms']:>8}/{theirs['ttft_p99_ms']:<8} {f['full_length']}"
            )
    for mode in MODES:  # the modes not tabled above
        if mode in result and (mode != "throughput" or "error" in result[mode]):  # type: ignore[operator]
            lines.append(f"{mode}: {json.dumps(result[mode])}")
    return "\n".join(lines)

"""``bench load --modes routing``: a conversation's second turn with prefix-aware routing ÷ with
least-loaded routing, on two instances of a model in a three-node cluster.

Two clusters run on loopback for the whole benchmark, identical but for the routing policy: in
each, node ``a`` founds the cluster with no model, ``b`` and ``c`` join, and the model is placed
once on ``b`` and once on ``c`` (``POST /v1/placements``); one cluster's nodes run the default
``--route-policy prefix``, the other's ``--route-policy least-loaded``. Each round (one warm-up
round first, not recorded) both clusters get the same workload, one after the other (the order
alternates by round): ``--conversations`` conversations at once, each a fresh seeded chat of
``--chat-chars`` characters (no two share a head, so each hashes on its own), turn one through a
node drawn at random, then turn two (the history, turn one's actual answer and a follow-up
question) through a different node drawn at random. Both turns answer ``PREFIX_ANSWER_TOKENS``
tokens, sampled at temperature 0.7 with a seed per request: sampled, not greedy, because that
is the workload real users send (the demo model's greedy output is a loop) and the seeds keep
both clusters' workloads alike. Turn two's TTFT is request sent → first content delta, and both
turns' ``x-skulk-instance`` headers say which instance served them.

Reported per policy: turn-two TTFT p50/p99 (nearest rank, pooled over the rounds), the share of
second turns served by their first turn's instance, each instance's share of the conversations
(by its first turn; instances named by their node, ``b`` or ``c``), and the median turn-two
prompt and cached tokens (``usage.prompt_tokens_details``). ``ratio_p50`` is prefix ÷
least-loaded of the pooled p50s, ``ratio_p50_by_round`` the per-round p50 ratios and
``ratio_p50_median`` their median. Goal ≤ 0.3.
"""

from __future__ import annotations

import contextlib
import math
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from skulk.bench._load_client import chat_body, http_client, stream
from skulk.bench._load_modes import FOLLOW_UP, PREFIX_ANSWER_TOKENS, Settings, _conversation
from skulk.bench._load_servers import Server
from skulk.harness import NodeProcess

ROUTE_FLAG = "--route-policy"
ROUTING_GOAL = 0.3
POLICIES = ("prefix", "least-loaded")
NODES = ("a", "b", "c")
SERVING = ("b", "c")  # the nodes holding an instance
TEMPERATURE = 0.7
READY_DEADLINE = 300.0
POLL = 0.1
#: One cluster secret per policy, so the two clusters can never link to each other.
SECRETS = {"prefix": "5a" * 32, "least-loaded": "5b" * 32}


@attrs.frozen
class Cluster:
    """One running three-node cluster: its policy, each node's API and the model to ask for."""

    policy: str
    urls: tuple[str, ...]  # a, b, c
    model: str
    instances: Mapping[str, str]  # instance id -> the node serving it


@attrs.frozen
class Conversation:
    """One two-turn conversation's outcome."""

    round: int
    first: str  # turn one's x-skulk-instance
    second: str  # turn two's
    ttft_s: float  # turn two's
    prompt_tokens: int  # turn two's
    cached_tokens: int | None  # turn two's, if usage reported them


def measure(root: Path, models: Path, model: str, settings: Settings) -> dict[str, object]:
    """Start both clusters, run the rounds, stop them; a failure is the mode's result."""
    try:
        with _cluster(root, models, model, "prefix") as prefix:
            with _cluster(root, models, model, "least-loaded") as least:
                return trio.run(routing, (prefix, least), settings)
    except Exception as exc:  # any failure is reported, not raised
        print(f"load: routing failed: {exc!r}", file=sys.stderr)
        return {"error": repr(exc)[:1000]}


@contextlib.contextmanager
def _cluster(root: Path, models: Path, model: str, policy: str) -> Iterator[Cluster]:
    """Nodes a (no model), b and c (joined); ``model`` placed on b and on c, both ready in
    every node's State."""
    flags = () if policy == "prefix" else (ROUTE_FLAG, policy)
    env = {"SKULK_CLUSTER_SECRET": SECRETS[policy]}
    nodes: list[NodeProcess] = []
    try:
        for name in NODES:
            home = root / f"routing-{policy}-{name}"
            home.mkdir()
            (home / "models").symlink_to(models)
            join = ("--join", nodes[0].ws_url) if nodes else ()
            args = ("--log-level", "warning", "--model", "none", *join, *flags)
            nodes.append(NodeProcess(home, *args, env=env).start(wait_ready=False))
        _until(lambda: all(_up(n) == len(NODES) for n in nodes), "every node up everywhere")
        instances: dict[str, str] = {}
        served = ""
        for node, name in zip(nodes[1:], SERVING, strict=True):
            placed = nodes[0].post("/v1/placements", json={"model": model, "nodes": [node.node_id]})
            if placed.status_code != 201:
                raise RuntimeError(f"placing {model} on {name}: {placed.text[:500]}")
            body = placed.json()["instance"]
            instances[body["id"]] = name
            served = body.get("model") or served
        _until(lambda: all(_ready(n) >= set(instances) for n in nodes), "both instances ready")
        yield Cluster(policy, tuple(n.url for n in nodes), served or model, instances)
    finally:
        for node in reversed(nodes):
            node.stop()


def _until(predicate: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + READY_DEADLINE
    while time.monotonic() < end:
        with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
            if predicate():
                return
        time.sleep(POLL)
    raise RuntimeError(f"routing: not {what} within {READY_DEADLINE} s")


def _up(node: NodeProcess) -> int:
    return sum(n["status"] == "up" for n in node.get("/v1/cluster/nodes").json()["nodes"])


def _ready(node: NodeProcess) -> set[str]:
    """The ids of the instances ``node``'s State shows ready."""
    listed = node.get("/v1/instances").json()["instances"]
    return {i["id"] for i in listed if i["shards"][0]["runner"]["phase"] == "ready"}


async def routing(clusters: tuple[Cluster, Cluster], settings: Settings) -> dict[str, object]:
    """Prefix routing (``clusters[0]``) vs least-loaded (``clusters[1]``), round by round."""
    done: dict[str, list[Conversation]] = {c.policy: [] for c in clusters}
    async with http_client(settings.conversations) as client:
        for r in range(-1, settings.rounds):  # round -1: warm-up, not recorded
            for cluster in clusters if r % 2 == 0 else clusters[::-1]:
                got = await _round(client, cluster, r, settings)
                if r >= 0:
                    done[cluster.policy].extend(got)
    prefix, least = (done[c.policy] for c in clusters)
    pooled, by_round = ratios(prefix, least)
    return {
        "available": True,
        "ratio_p50": pooled,
        "ratio_p50_median": round(statistics.median(by_round), 3),
        "ratio_p50_by_round": by_round,
        "goal": ROUTING_GOAL,
        "conversations": settings.conversations,
        "chat_chars": settings.chat_chars,
        "temperature": TEMPERATURE,
        "answer_tokens": PREFIX_ANSWER_TOKENS,
        **{c.policy: policy_figures(done[c.policy], c.instances) for c in clusters},
    }


async def _round(
    client: httpx.AsyncClient, cluster: Cluster, r: int, settings: Settings
) -> list[Conversation]:
    """``settings.conversations`` two-turn conversations at once; the same chats, nodes and
    seeds for every cluster in round ``r``."""
    n = settings.conversations
    draw = random.Random(7919 * (r + 2))
    plans = []
    for i in range(n):
        one = draw.randrange(len(cluster.urls))
        two = draw.choice([k for k in range(len(cluster.urls)) if k != one])
        plans.append((100_000 + (r + 1) * n + i, one, two))
    results: list[Conversation | None] = [None] * n

    async def converse(i: int) -> None:
        seed, one, two = plans[i]
        server = Server(cluster.policy, cluster.urls[one], cluster.model)
        chat = _conversation(seed, settings.chat_chars)
        body = chat_body(server, chat, PREFIX_ANSWER_TOKENS, TEMPERATURE, seed=seed)
        first = await stream(client, cluster.urls[one], body)
        follow = [*chat, {"role": "assistant", "content": first.text}, FOLLOW_UP]
        body = chat_body(server, follow, PREFIX_ANSWER_TOKENS, TEMPERATURE, seed=seed + 1)
        second = await stream(client, cluster.urls[two], body)
        results[i] = Conversation(
            r, first.instance, second.instance, second.ttft_s, second.prompt_tokens,
            second.cached_tokens,
        )  # fmt: skip

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(converse, i)
    return [c for c in results if c is not None]


def _nearest_rank(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def policy_figures(done: Sequence[Conversation], nodes: Mapping[str, str]) -> dict[str, object]:
    """One policy's figures (module doc); ``nodes``: instance id -> the node serving it."""
    ttfts = [c.ttft_s * 1000 for c in done]
    firsts = Counter(nodes.get(c.first, c.first or "?") for c in done)
    cached = [c.cached_tokens for c in done if c.cached_tokens is not None]
    med = statistics.median
    return {
        "ttft_p50_ms": round(med(ttfts), 1),
        "ttft_p99_ms": round(_nearest_rank(ttfts, 0.99), 1),
        "same_instance_share": round(sum(c.first == c.second != "" for c in done) / len(done), 3),
        "instance_shares": {k: round(v / len(done), 3) for k, v in sorted(firsts.items())},
        "prompt_tokens": round(med(c.prompt_tokens for c in done)),
        "cached_tokens": round(med(cached)) if cached else None,
        "conversations": len(done),
    }


def ratios(
    prefix: Sequence[Conversation], least: Sequence[Conversation]
) -> tuple[float, list[float]]:
    """(pooled turn-two TTFT p50 prefix ÷ least-loaded, the same ratio round by round)."""
    med = statistics.median
    pooled = round(med(c.ttft_s for c in prefix) / med(c.ttft_s for c in least), 3)
    rounds = sorted({c.round for c in prefix} & {c.round for c in least})
    by_round = [
        round(
            med(c.ttft_s for c in prefix if c.round == r)
            / med(c.ttft_s for c in least if c.round == r),
            3,
        )
        for r in rounds
    ]
    return pooled, by_round


def table_line(figures: Mapping[str, Any]) -> str:
    """The routing mode's line in ``bench load``'s table."""
    if not figures.get("available") or "error" in figures:
        return f"routing: {figures}"
    sides = []
    for policy in POLICIES:
        f = figures[policy]
        shares = "/".join(f"{k} {v}" for k, v in f["instance_shares"].items())
        sides.append(
            f"{policy} TTFT p50/p99 {f['ttft_p50_ms']}/{f['ttft_p99_ms']} ms, same instance "
            f"{f['same_instance_share']}, shares {shares}, cached {f['cached_tokens']}"
        )
    return (
        f"routing (turn 2, {figures['conversations']} conversations at once): "
        f"ratio p50 {figures['ratio_p50']} (median of rounds {figures['ratio_p50_median']}, "
        f"goal {figures['goal']}); " + "; ".join(sides)
    )

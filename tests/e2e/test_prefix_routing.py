"""Two instances of a model, three real nodes: a conversation's turns, asked through any node,
land on the same instance (whose prefix cache then serves the earlier turns), conversations
spread over both instances, and a request the preferred instance refuses (its admission bound)
is served by the other one instead of answering 429.

A founds the cluster with no model, B and C join with ``--max-queue 1``; the demo model is
placed once on B and once on C. B's runner decodes slowly (a fault hook), so one stream holds
its only admission place for seconds.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat import ChatCompletionMessageParam

from skulk.api._openai import parse_chat_completions
from skulk.harness import NodeProcess
from skulk.routing import prefix_key, rank

from .test_cluster_serving import Cluster, client, instances, scrape, summed

MODEL = "skulk-demo"
SYSTEM: ChatCompletionMessageParam = {"role": "system", "content": "You answer briefly."}
CONVERSATIONS = 20


@pytest.fixture(scope="module")
def cluster(skulk_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("prefix-routing"), skulk_home)
    try:
        a = c.start("a", "--model", "none")
        bounded = ("--model", "none", "--max-queue", "1")
        c.start("b", "--join", a.ws_url, *bounded, "--runner-faults", "slow@decode:0.25")
        c.start("c", "--join", a.ws_url, *bounded)
        a.wait_for(
            lambda: all(
                sum(n["status"] == "up" for n in x.get("/v1/cluster/nodes").json()["nodes"]) == 3
                for x in c.live()
            ),
            90,
            "every node up in every node's State",
        )
        for name in "bc":
            placed = a.post(
                "/v1/placements", json={"model": MODEL, "nodes": [c.nodes[name].node_id]}
            )
            assert placed.status_code == 201, placed.text

        def both_ready_everywhere() -> bool:
            for x in c.live():
                ready = [
                    i
                    for i in instances(x)
                    if i["model"] == MODEL and i["shards"][0]["runner"]["phase"] == "ready"
                ]
                if len(ready) != 2:
                    return False
            return True

        a.wait_for(both_ready_everywhere, 180, "both instances ready in every node's State")
        yield c
    finally:
        for node in c.nodes.values():
            node.stop()


def chat(
    node: NodeProcess, messages: list[ChatCompletionMessageParam], max_tokens: int = 4
) -> tuple[str, str, int, int]:
    """One chat completion through ``node``: (text, instance header, prompt tokens, cached)."""
    raw = client(node).chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0
    )
    reply = raw.parse()
    assert reply.usage is not None
    details = reply.usage.prompt_tokens_details
    cached = details.cached_tokens or 0 if details is not None else 0
    text = reply.choices[0].message.content or ""
    return text, raw.headers["x-skulk-instance"], reply.usage.prompt_tokens, cached


def opening(i: int) -> list[ChatCompletionMessageParam]:
    return [SYSTEM, {"role": "user", "content": f"Conversation {i}: tell me about topic {i}."}]


def preferred(messages: list[ChatCompletionMessageParam], ids: list[str]) -> str:
    """The instance the routing policy ranks first for a chat's prefix, among ``ids``."""
    body = {"model": MODEL, "messages": messages, "max_tokens": 4, "temperature": 0}
    key = prefix_key(parse_chat_completions(body).generate_request().prompt)
    assert key is not None
    return rank(key, ids)[0]


def test_twenty_two_turn_conversations_through_three_nodes(cluster: Cluster) -> None:
    """At least 90 % of second turns land where their first did, and of first turns on the
    instance the policy ranks first for their prefix; a second turn on its first's instance
    reuses the first turn's prompt from the prefix cache. (Instance ids are drawn afresh each
    run, so how 20 conversations split between two instances here is chance — under 30 % for
    one of them in about 4 % of runs; that the policy spreads conversations, at least 30 %
    each, is tested on fixed ids in ``tests/unit/test_routing_policy.py``.)"""
    nodes = [cluster.nodes[n] for n in "abc"]
    ids = [i["id"] for i in instances(nodes[0]) if i["model"] == MODEL]
    draw = random.Random(24)
    firsts: list[str] = []
    same = reused = placed = 0
    for i in range(CONVERSATIONS):
        first_turn = opening(i)
        answer, first, first_prompt, _ = chat(draw.choice(nodes), first_turn)
        placed += first == preferred(first_turn, ids)
        second_turn: list[ChatCompletionMessageParam] = [
            *first_turn,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "And then?"},
        ]
        _, second, _, cached = chat(draw.choice(nodes), second_turn)
        firsts.append(first)
        if first == second:
            same += 1
            reused += cached >= first_prompt
    assert same >= 0.9 * CONVERSATIONS, (same, firsts)
    assert placed >= 0.9 * CONVERSATIONS, (placed, firsts, ids)
    assert len(ids) == 2 and set(Counter(firsts)) <= set(ids), (firsts, ids)
    assert reused >= 0.9 * same, (reused, same)
    # Every node counted its choices as affinity; the serving nodes' prefix caches were hit.
    choices = sum(summed(scrape(n), "skulk:route_choices_total", choice="affinity") for n in nodes)
    assert choices >= 2 * CONVERSATIONS
    hits = sum(summed(scrape(n), "skulk:prefix_cache_hits_total") for n in nodes)
    assert hits > 0


def test_a_request_its_instance_refuses_is_served_by_the_other(cluster: Cluster) -> None:
    """B's instance holds one request (``--max-queue 1``, decoding slowly); the next turn of
    the conversation it prefers is refused there and moves to C's instance: 200, not 429."""
    a, b, c = (cluster.nodes[n] for n in "abc")
    on_b = next(i["id"] for i in instances(a) if i["shards"][0]["node"] == b.node_id)
    on_c = next(i["id"] for i in instances(a) if i["shards"][0]["node"] == c.node_id)
    # A conversation B's instance is preferred for (the policy is the same on every node).
    i = next(k for k in range(100, 200) if chat(a, opening(k), max_tokens=1)[1] == on_b)
    before = scrape(a)
    with client(a).chat.completions.with_streaming_response.create(
        model=MODEL, messages=opening(i), max_tokens=400, temperature=0, stream=True
    ) as held:
        assert held.headers["x-skulk-instance"] == on_b
        stream: Iterator[Any] = iter(held.parse())
        next(stream)  # admitted on B and generating: B's only place is taken
        _, served, _, _ = chat(a, opening(i), max_tokens=2)
        still_running = next(stream, None) is not None
    assert still_running, "the held stream ended before the second request was answered"
    assert served == on_c
    after = scrape(a)
    moved = summed(after, "skulk:route_moves_total", instance=on_b, reason="overloaded")
    assert (
        moved - summed(before, "skulk:route_moves_total", instance=on_b, reason="overloaded") == 1
    )
    # Nothing was refused to the client.
    assert summed(after, "skulk:request_errors_total", reason="overloaded") == summed(
        before, "skulk:request_errors_total", reason="overloaded"
    )

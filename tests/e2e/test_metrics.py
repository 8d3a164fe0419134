"""``GET /metrics`` of a real node after real requests (the official ``openai`` client): the
scrape parses with ``prometheus_client``'s own parser and its counts match what was sent and
answered — tokens, successes by finish reason, a 429 counted by its reason — beside the engine,
Raft and process metrics.

The node admits one request at a time (``--max-queue 1``) and decodes slowly
(``slow@decode``), so a stream holds its instance's only place while a second request comes.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from skulk.harness import NodeProcess

MODEL = "skulk-demo"

Sample = tuple[str, dict[str, str], float]


@pytest.fixture(scope="module")
def node(skulk_home: Path) -> Iterator[NodeProcess]:
    with NodeProcess(skulk_home, "--max-queue", "1", "--runner-faults", "slow@decode:0.05") as srv:
        yield srv


def scrape(node: NodeProcess) -> list[Sample]:
    response = httpx.get(node.url + "/metrics", timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return [
        (s.name, s.labels, s.value)
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    ]


def total(samples: list[Sample], name: str, **labels: str) -> float | None:
    """The sum of ``name``'s samples whose labels include ``labels`` (None: no sample)."""
    values = [v for n, ls, v in samples if n == name and labels.items() <= ls.items()]
    return sum(values) if values else None


def wait_for(node: NodeProcess, check: Callable[[list[Sample]], bool], what: str) -> list[Sample]:
    """Scrape until ``check`` holds (engine stats come with the runner's heartbeats): a
    polling deadline, not a sleep as synchronisation."""
    deadline = time.monotonic() + 15
    while True:
        samples = scrape(node)
        if check(samples):
            return samples
        if time.monotonic() > deadline:
            raise AssertionError(f"not within 15 s: {what}")
        time.sleep(0.1)


def test_counts_match_what_was_sent(node: NodeProcess) -> None:
    client = openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0)
    before = scrape(node)
    assert total(before, "skulk:request_success_total") is None  # nothing served yet
    prompt = generated = 0
    finished: Counter[str] = Counter()
    for i in range(3):
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Tell me about the number {i}"}],
            max_tokens=4,
        )
        assert reply.usage is not None
        prompt += reply.usage.prompt_tokens
        generated += reply.usage.completion_tokens
        finished[reply.choices[0].finish_reason] += 1
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Write a long story"}],
        max_tokens=40,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = iter(stream)
    next(chunks)  # the stream is committed: it holds the instance's only place
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Me too"}], max_tokens=2
        )
    assert refused.value.status_code == 429
    for chunk in chunks:
        if chunk.choices and chunk.choices[0].finish_reason:
            finished[chunk.choices[0].finish_reason] += 1
        if chunk.usage is not None:
            prompt += chunk.usage.prompt_tokens
            generated += chunk.usage.completion_tokens
    assert sum(finished.values()) == 4

    got = wait_for(
        node,
        lambda s: total(s, "skulk:kv_cache_usage_perc", model=MODEL) is not None,
        "the engine's stats",
    )
    local = {"model": MODEL, "route": "local"}
    assert total(got, "skulk:prompt_tokens_total", **local) == prompt
    assert total(got, "skulk:generation_tokens_total", **local) == generated
    for reason, count in finished.items():
        assert total(got, "skulk:request_success_total", **local, finish_reason=reason) == count
    assert total(got, "skulk:request_success_total") == 4
    assert total(got, "skulk:request_errors_total", **local, reason="overloaded") == 1
    assert total(got, "skulk:request_errors_total") == 1
    assert total(got, "skulk:admission_refused_total") == 1
    assert total(got, "skulk:time_to_first_token_seconds_count", model=MODEL) == 4
    assert total(got, "skulk:e2e_request_latency_seconds_count", model=MODEL) == 4
    assert total(got, "skulk:request_queue_time_seconds_count", model=MODEL) == 4
    assert total(got, "skulk:inter_token_latency_seconds_count", model=MODEL) == generated - 4
    # The same requests, as the serving node's prefix cache saw them.
    assert total(got, "skulk:prefix_cache_queries_total", model=MODEL) == prompt
    assert total(got, "skulk:runner_starts_total", model=MODEL) == 1
    assert total(got, "skulk:num_requests_running", model=MODEL) is not None
    assert total(got, "skulk:raft_role", role="leader") == 1  # the one node founded it
    assert (total(got, "skulk:raft_term") or 0) >= 1
    assert (total(got, "skulk:raft_leader_changes_total") or 0) >= 1
    assert total(got, "skulk:cluster_nodes", status="up") == 1
    assert (total(got, "process_resident_memory_bytes") or 0) > 0

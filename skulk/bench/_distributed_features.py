"""``bench distributed``'s figures of what the one scheduler gives a sharded instance:
``pipeline-2``'s prefix cache and n-gram speculation, each against the same instance without
it, in the same run.

* ``prefix``: a chat's second turn. Each round writes a new history (seeded words, about
  :data:`HISTORY_WORDS` of them), asks a first turn (:data:`FIRST_TURN_TOKENS` tokens), then
  times the second turn's first token — the whole conversation so far as its prompt, which the
  prefix cache holds but for the answer's last tokens and the new question — against the same
  turn of another, never seen conversation of the same size (cold). ``ttft_ratio`` = cached ÷
  cold (medians over rounds; the goal is ≤ 0.3), with the tokens the cached turn reused.
* ``speculation``: with ÷ without on a copy-heavy prompt, on two models that write the demo
  model's language (see :mod:`skulk.bench._distributed_speculation`).
"""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import attrs
import trio

from skulk.bench._distributed_measure import Timed, timed_request
from skulk.bench._distributed_setup import CONFIG, Settings
from skulk.bench._distributed_speculation import Speculation, measure_speculation, words
from skulk.runner import loopback_hosts, open_local_group, shard_specs
from skulk.wire.runner import ChatMessage, ChatPrompt, SamplingParams

HISTORY_WORDS = 250
FIRST_TURN_TOKENS = 16


@attrs.frozen
class Features:
    prefix_cached_ttft_s: list[float]
    prefix_cold_ttft_s: list[float]
    prefix_reused_tokens: list[int]
    prefix_prompt_tokens: int
    speculation: dict[str, Speculation]
    """By model: ``demo`` and ``shape`` (see :mod:`skulk.bench._distributed_speculation`)."""

    def as_dict(self) -> dict[str, object]:
        med = statistics.median
        prefix = zip(self.prefix_cached_ttft_s, self.prefix_cold_ttft_s, strict=True)
        return {
            "instance": "pipeline-2",
            "prefix": {
                "ttft_ratio": round(med(c / w for c, w in prefix), 3),
                "cached_ttft_ms": round(med(self.prefix_cached_ttft_s) * 1000, 1),
                "cold_ttft_ms": round(med(self.prefix_cold_ttft_s) * 1000, 1),
                "prompt_tokens": self.prefix_prompt_tokens,
                "reused_tokens": self.prefix_reused_tokens,
            },
            "speculation": {name: run.as_dict() for name, run in self.speculation.items()},
        }


def _second_turn(history: str, answer: str) -> ChatPrompt:
    return ChatPrompt(
        (
            ChatMessage("user", f"{history}. What happened next?"),
            ChatMessage("assistant", answer),
            ChatMessage("user", "Go on."),
        )
    )


async def measure_prefix(settings: Settings, model: Path) -> tuple[list[Timed], list[Timed]]:
    """The second turns' timings: cached and cold (see the module doc)."""
    greedy = SamplingParams(temperature=0.0, max_tokens=FIRST_TURN_TOKENS)
    cached: list[Timed] = []
    cold: list[Timed] = []
    specs = shard_specs("pipeline", loopback_hosts(2), settings.shape.layers)
    async with open_local_group("bench", str(model), specs, CONFIG) as group:
        runner = group.runners[0]
        for r in range(settings.rounds):
            rng = random.Random(f"{settings.seed}-{r}")
            history = words(rng, HISTORY_WORDS)
            first = ChatPrompt((ChatMessage("user", f"{history}. What happened next?"),))
            answer = (await timed_request(runner, f"turn1-{r}", first, greedy)).text
            cached.append(
                await timed_request(runner, f"turn2-{r}", _second_turn(history, answer), greedy)
            )
            other = words(rng, HISTORY_WORDS)
            cold.append(
                await timed_request(runner, f"cold-{r}", _second_turn(other, answer), greedy)
            )
    return cached, cold


def measure_features(settings: Settings, model: Path, demo: Path, speaking: Path) -> Features:
    """The prefix figure on the benchmark's ``model``, speculation's on the ``demo`` model and
    on ``speaking`` (the benchmark's shape writing the demo's language)."""
    cached, cold = trio.run(measure_prefix, settings, model)
    speculation = {
        "demo": trio.run(measure_speculation, settings, demo),
        "shape": trio.run(measure_speculation, settings, speaking),
    }
    return Features(
        [t.ttft_s for t in cached],
        [t.ttft_s for t in cold],
        [t.cached_tokens for t in cached],
        cached[0].prompt_tokens,
        speculation,
    )

"""``bench distributed``'s figures of what the one scheduler gives a sharded instance:
``pipeline-2``'s prefix cache and n-gram speculation, each against the same instance without
it, in the same run.

* ``prefix``: a chat's second turn. Each round writes a new history (seeded words, about
  :data:`HISTORY_WORDS` of them), asks a first turn (:data:`FIRST_TURN_TOKENS` tokens), then
  times the second turn's first token — the whole conversation so far as its prompt, which the
  prefix cache holds but for the answer's last tokens and the new question — against the same
  turn of another, never seen conversation of the same size (cold). ``ttft_ratio`` = cached ÷
  cold (medians over rounds; the goal is ≤ 0.3), with the tokens the cached turn reused.
* ``speculation``: a copy-heavy prompt (a passage written out three times, then "copy it
  again"), greedy, on two ``pipeline-2`` groups open side by side: one with speculation (the
  default), one started with ``speculative_tokens = 0``; rounds alternate which goes first.
  ``tokens_per_s_ratio`` = with ÷ without (medians; the goal is > 1), with the drafts' acceptance
  rate. A copy-heavy prompt is the workload speculation is for: it says nothing of free text.
"""

from __future__ import annotations

import random
import statistics

import attrs
import trio

from skulk.bench._distributed_measure import Timed, timed_request
from skulk.bench._distributed_setup import CONFIG, Settings
from skulk.runner import Runner, loopback_hosts, open_local_group, shard_specs
from skulk.wire.runner import ChatMessage, ChatPrompt, SamplingParams, TextPrompt

HISTORY_WORDS = 250
FIRST_TURN_TOKENS = 16
COPY_WORDS = 40
_WORDS = (
    "river stone bend season water mill valley people name bank light field road winter "
    "summer harbour bridge garden window market morning evening candle letter story song"
).split()


@attrs.frozen
class Features:
    prefix_cached_ttft_s: list[float]
    prefix_cold_ttft_s: list[float]
    prefix_reused_tokens: list[int]
    prefix_prompt_tokens: int
    speculation_ms_per_token: list[float]
    plain_ms_per_token: list[float]
    acceptance_rate: float

    def as_dict(self) -> dict[str, object]:
        med = statistics.median
        prefix = zip(self.prefix_cached_ttft_s, self.prefix_cold_ttft_s, strict=True)
        speculation = zip(self.speculation_ms_per_token, self.plain_ms_per_token, strict=True)
        return {
            "instance": "pipeline-2",
            "prefix": {
                "ttft_ratio": round(med(c / w for c, w in prefix), 3),
                "cached_ttft_ms": round(med(self.prefix_cached_ttft_s) * 1000, 1),
                "cold_ttft_ms": round(med(self.prefix_cold_ttft_s) * 1000, 1),
                "prompt_tokens": self.prefix_prompt_tokens,
                "reused_tokens": self.prefix_reused_tokens,
            },
            "speculation": {
                "tokens_per_s_ratio": round(med(p / s for s, p in speculation), 3),
                "ms_per_token": round(med(self.speculation_ms_per_token), 2),
                "plain_ms_per_token": round(med(self.plain_ms_per_token), 2),
                "acceptance_rate": round(self.acceptance_rate, 3),
            },
        }


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def _second_turn(history: str, answer: str) -> ChatPrompt:
    return ChatPrompt(
        (
            ChatMessage("user", f"{history}. What happened next?"),
            ChatMessage("assistant", answer),
            ChatMessage("user", "Go on."),
        )
    )


async def measure_features(settings: Settings, model: str) -> Features:
    layers = settings.shape.layers
    greedy = SamplingParams(temperature=0.0, max_tokens=FIRST_TURN_TOKENS)
    cached: list[Timed] = []
    cold: list[Timed] = []
    fast: list[float] = []
    plain: list[float] = []
    on_specs = shard_specs("pipeline", loopback_hosts(2), layers)
    off_specs = shard_specs("pipeline", loopback_hosts(2), layers)
    off = attrs.evolve(CONFIG, speculative_tokens=0)
    async with (
        open_local_group("bench", model, on_specs, CONFIG) as on_group,
        open_local_group("bench", model, off_specs, off) as off_group,
    ):
        speculating, without = on_group.runners[0], off_group.runners[0]
        for r in range(settings.rounds):
            rng = random.Random(f"{settings.seed}-{r}")
            history = _words(rng, HISTORY_WORDS)
            first = ChatPrompt((ChatMessage("user", f"{history}. What happened next?"),))
            answer = (await timed_request(speculating, f"turn1-{r}", first, greedy)).text
            cached.append(
                await timed_request(
                    speculating, f"turn2-{r}", _second_turn(history, answer), greedy
                )
            )
            other = _words(rng, HISTORY_WORDS)
            cold.append(
                await timed_request(speculating, f"cold-{r}", _second_turn(other, answer), greedy)
            )
            passage = _words(rng, COPY_WORDS)
            copy = TextPrompt(f"{passage}\n{passage}\n{passage}\nCopy it again:\n")
            params = SamplingParams(temperature=0.0, max_tokens=settings.max_tokens)
            order: list[tuple[Runner, list[float]]] = [(speculating, fast), (without, plain)]
            for runner, into in order if r % 2 == 0 else order[::-1]:
                timed = await timed_request(runner, f"copy-{r}", copy, params)
                into.append(timed.ms_per_token)
        await trio.sleep(3 * CONFIG.heartbeat_interval)  # stats come with a heartbeat
        stats = speculating.engine_statistics()
    return Features(
        [t.ttft_s for t in cached],
        [t.ttft_s for t in cold],
        [t.cached_tokens for t in cached],
        cached[0].prompt_tokens,
        fast,
        plain,
        (stats.acceptance_rate if stats is not None else None) or 0.0,
    )

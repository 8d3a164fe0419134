"""``bench distributed``'s speculation figure: n-gram speculation on ``pipeline-2``, with ÷
without, beside the same on one process, on two models.

A copy-heavy workload needs a model that copies: the benchmark's random-weight model does not
(its greedy output is noise, and drafts are rarely kept), so speculation is measured on models
that write the demo model's language, whose greedy output falls into loops the n-gram
proposer drafts (:func:`~skulk.models.write_generated_model` with ``language="demo"``):

* ``demo``: the demo model itself (2 layers, hidden 128), ``pipeline-2`` over its two layers.
  A decode step costs about a millisecond, mostly per pass (the scheduler's turn, the ring's
  messages and hops) rather than per token: the regime of memory-bound decoding (a GPU, Apple
  silicon), where a verify pass of k + 1 tokens costs about what one token does. This is the
  goal's figure (with ÷ without > 1).
* ``shape``: the benchmark's shape (default 38M parameters) writing the demo's language. On a
  Linux CPU whose mlx links the reference BLAS a pass is compute-bound, so a verify pass of
  k + 1 tokens costs about k + 1 plain steps and speculation cannot pay here, on one process or
  a pipeline alike (the controller stops it drafting when it does not pay); the single ratio
  beside it says how much of the figure is the CPU rather than the pipeline.

Each model runs four instances, all open side by side: one runner with speculation (the
default) and one started with ``speculative_tokens = 0``, a ``pipeline-2`` group of each. Every
round writes a new passage (seeded words) three times, then "Copy it again:" (a text prompt,
greedy, ``max_tokens`` tokens), and times it on each instance, in an order reversed every
round. Ratios are the medians over rounds of without ÷ with ms/token (tokens/s with ÷
without); greedy speculation is lossless, so both sides write the same tokens.
"""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio

from skulk.bench._distributed_measure import timed_request
from skulk.bench._distributed_setup import CONFIG, Settings
from skulk.runner import Runner, RunnerConfig, loopback_hosts, open_local_group, shard_specs
from skulk.wire.runner import SamplingParams, TextPrompt

COPY_WORDS = 40
WORDS = (
    "river stone bend season water mill valley people name bank light field road winter "
    "summer harbour bridge garden window market morning evening candle letter story song"
).split()
INSTANCES = ("pipeline-2", "pipeline-2-off", "single", "single-off")


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


@attrs.frozen
class Speculation:
    """One model's runs: ms/token by instance (one per round) and the drafts' acceptance
    rate on each speculating instance."""

    ms_per_token: dict[str, list[float]]
    tokens: list[int]
    acceptance_rate: dict[str, float]

    def ratio(self, on: str) -> float:
        """tokens/s with ÷ without: the median over rounds."""
        pairs = zip(self.ms_per_token[on], self.ms_per_token[f"{on}-off"], strict=True)
        return round(statistics.median(off / with_ for with_, off in pairs), 3)

    def as_dict(self) -> dict[str, object]:
        return {
            "tokens_per_s_ratio": self.ratio("pipeline-2"),
            "single_tokens_per_s_ratio": self.ratio("single"),
            "ms_per_token": {
                name: round(statistics.median(runs), 3) for name, runs in self.ms_per_token.items()
            },
            "tokens": self.tokens,
            "acceptance_rate": {k: round(v, 3) for k, v in self.acceptance_rate.items()},
        }


@asynccontextmanager
async def _instances(model: Path) -> AsyncIterator[dict[str, Runner]]:
    """The four instances of the module doc, by name (a group by its rank 0)."""
    layers = int(json.loads((model / "config.json").read_text())["num_hidden_layers"])
    off = attrs.evolve(CONFIG, speculative_tokens=0)
    configs: dict[str, RunnerConfig] = {"": CONFIG, "-off": off}
    async with trio.open_nursery() as nursery:
        runners: dict[str, Runner] = {}
        for suffix, config in configs.items():
            runner = Runner("bench", str(model), config)
            await nursery.start(runner.run)
            runners[f"single{suffix}"] = runner
        specs = [shard_specs("pipeline", loopback_hosts(2), layers) for _ in configs]
        async with (
            open_local_group("bench", str(model), specs[0], CONFIG) as on,
            open_local_group("bench", str(model), specs[1], off) as without,
        ):
            runners["pipeline-2"], runners["pipeline-2-off"] = on.runners[0], without.runners[0]
            yield runners
        nursery.cancel_scope.cancel()


async def measure_speculation(settings: Settings, model: Path) -> Speculation:
    """Speculation with ÷ without on ``model`` (see the module doc)."""
    ms: dict[str, list[float]] = {name: [] for name in INSTANCES}
    tokens: list[int] = []
    params = SamplingParams(temperature=0.0, max_tokens=settings.max_tokens)
    async with _instances(model) as runners:
        passage = words(random.Random(f"{settings.seed}-warm"), COPY_WORDS)
        warm = TextPrompt(f"{passage}\nCopy it again:\n")
        short = attrs.evolve(params, max_tokens=8)
        for name in INSTANCES:
            await timed_request(runners[name], f"warm-{name}", warm, short)
        for r in range(settings.rounds):
            passage = words(random.Random(f"{settings.seed}-copy-{r}"), COPY_WORDS)
            copy = TextPrompt(f"{passage}\n{passage}\n{passage}\nCopy it again:\n")
            for name in INSTANCES if r % 2 == 0 else INSTANCES[::-1]:
                timed = await timed_request(runners[name], f"copy-{name}-{r}", copy, params)
                ms[name].append(timed.ms_per_token)
                tokens.append(timed.tokens)
        await trio.sleep(3 * CONFIG.heartbeat_interval)  # stats come with a heartbeat
        acceptance: dict[str, float] = {}
        for name in ("pipeline-2", "single"):
            stats = runners[name].engine_statistics()
            acceptance[name] = (stats.acceptance_rate if stats is not None else None) or 0.0
    return Speculation(ms, sorted(set(tokens)), acceptance)

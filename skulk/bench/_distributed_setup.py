"""What ``bench distributed`` runs: the model shapes, the request, the runners' settings, and
the instances compared (:data:`SINGLE` against :data:`SUBJECTS`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import attrs

from skulk.models import ModelShape
from skulk.runner import RunnerConfig
from skulk.wire.runner import TextPrompt

#: The default model: single-node decode about 35 ms/token on the 2-core VM of
#: docs/benchmarks.md (38M parameters, 153 MB of float32 weights).
DEFAULT_SHAPE = ModelShape(
    family="llama", layers=12, hidden_size=512, heads=8, kv_heads=4, intermediate_size=1536
)
#: ``--tiny``: the shape the tests use (every sharding divides it).
TINY_SHAPE = ModelShape(
    family="llama", layers=4, hidden_size=64, heads=4, kv_heads=2, intermediate_size=128
)
PROMPT = TextPrompt(
    "In the valley below the old mill the river turns twice before it reaches the sea, and "
    "the people who live along its banks have names for every bend, every stone and every "
    "season of the water."
)
HEARTBEAT = 0.25
WARM_UP_TOKENS = 8
#: Requests timed per instance of the tiny model (its figures are the medians).
TINY_REPEATS = 5
CONFIG = RunnerConfig(
    hello_timeout=120, load_timeout=600, warmup_timeout=300, progress_timeout=120,
    cancel_timeout=30, shutdown_grace=5, heartbeat_interval=HEARTBEAT,
)  # fmt: skip
#: A decode span shorter than this means the chunks reached us together (see ``ms_per_token``).
COALESCED = 0.001


@attrs.frozen
class Instance:
    """What serves: one runner (``sharding`` None) or a sharded group of ``world`` ranks."""

    sharding: Literal["pipeline", "tensor"] | None
    world: int

    @property
    def name(self) -> str:
        return "single" if self.sharding is None else f"{self.sharding}-{self.world}"


SINGLE = Instance(None, 1)
SUBJECTS = (Instance("pipeline", 2), Instance("pipeline", 3), Instance("tensor", 2))


@attrs.frozen
class Settings:
    shape: ModelShape = DEFAULT_SHAPE
    max_tokens: int = 128
    rounds: int = 3
    files: int = 4
    seed: int = 1
    transfer_mib: int = 256
    transfer_rounds: int = 3
    concurrency: tuple[int, ...] = ()


def settings_from(
    *,
    tiny: bool,
    layers: int | None,
    hidden_size: int | None,
    heads: int | None,
    kv_heads: int | None,
    intermediate_size: int | None,
    max_tokens: int,
    rounds: int,
    transfer_mib: int,
    transfer_rounds: int,
    concurrency: Iterable[int] = (),
) -> Settings:
    """Settings from the command line: ``tiny`` starts from :data:`TINY_SHAPE`, any shape
    option given overrides."""
    base = TINY_SHAPE if tiny else DEFAULT_SHAPE
    shape = ModelShape(
        family=base.family,
        layers=base.layers if layers is None else layers,
        hidden_size=base.hidden_size if hidden_size is None else hidden_size,
        heads=base.heads if heads is None else heads,
        kv_heads=base.kv_heads if kv_heads is None else kv_heads,
        intermediate_size=base.intermediate_size
        if intermediate_size is None
        else intermediate_size,
    )
    return Settings(
        shape=shape,
        max_tokens=max_tokens,
        rounds=rounds,
        transfer_mib=transfer_mib,
        transfer_rounds=transfer_rounds,
        concurrency=tuple(concurrency),
    )

"""Which tensors of a checkpoint one rank of a sharded instance needs (pure).

One rule, used both by the runner that loads a shard (it reads only these tensors) and by the
node that fetches a shard's weights from a peer (it transfers only these), so the two cannot
disagree.

* ``single`` and ``tensor`` ranks need every tensor (a tensor rank holds a slice of each).
* A ``pipeline`` rank holding layers ``[start, end)`` of ``layers`` needs those layers'
  tensors (``….layers.<i>.…``); the first rank also the token embedding, the final norm and
  the output head (the logits of a pipeline come out on its first rank, where the scheduler
  samples; a head tied to the embedding, as when the checkpoint has no head tensor, needs
  nothing more there). Any other
  tensor outside the layers (rare: rotary tables, extra norms) goes to every rank.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import attrs

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_EMBED = re.compile(r"(?:^|\.)(embed_tokens|wte|tok_embeddings)\.")
_HEAD = re.compile(r"^(lm_head|output)\.")
_NORM = re.compile(r"^(model\.)?(norm|final_layernorm|ln_f)\.")


@attrs.frozen
class ShardSlice:
    """What one rank runs: ``sharding`` (``single``, ``pipeline``, ``tensor``) and its layer
    range ``[start, end)`` out of ``layers``."""

    sharding: str
    start: int
    end: int
    layers: int

    @property
    def first(self) -> bool:
        return self.start == 0

    @property
    def last(self) -> bool:
        return self.end == self.layers


def layer_of(name: str) -> int | None:
    """The layer index a tensor name belongs to (``model.layers.3.mlp…`` → 3), if any."""
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None


def _needed(name: str, shard: ShardSlice) -> bool:
    """Whether the rank running ``shard`` needs tensor ``name``."""
    if shard.sharding != "pipeline":
        return True
    layer = layer_of(name)
    if layer is not None:
        return shard.start <= layer < shard.end
    if _EMBED.search(name) or _HEAD.match(name) or _NORM.match(name):
        return shard.first
    return True


def needed_tensors(names: Iterable[str], shard: ShardSlice) -> list[str]:
    """The names among ``names`` (every tensor of the checkpoint) the rank running ``shard``
    needs, in their order."""
    return [n for n in names if _needed(n, shard)]

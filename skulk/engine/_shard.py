"""One rank's share of a sharded model: which tensors it loads, and what it computes.

**Loading.** ``mx.load`` of safetensors is lazy, so :func:`open_model` builds the whole model
(``mlx_lm.utils.load_model(path, lazy=True)``, single-file or indexed multi-file checkpoints
alike) without reading a weight. A pipeline rank then keeps only what
:func:`skulk.models.needed_tensors` says it needs (the rule the node also fetches
weights by) and evaluates just those tensors; the others are
dropped unread, so a rank's memory holds its share of the weights. A tensor rank slices every
weight with mlx-lm's ``model.shard(group)`` before evaluating.

**Pipeline** (:class:`PipelineShard`). Our own generic slicing of ``model.model.layers`` (mlx-lm
has ``pipeline()`` only for some families, not llama): rank ``r`` keeps layers ``[start, end)``
and a KV cache for those alone. On a rank after the first the token embedding is replaced by
:class:`_Receive` (the hidden state arrives from rank ``r - 1``); on a rank before the last the
final norm is replaced by :class:`_Send` (the hidden state goes to rank ``r + 1``) and the head
is dropped. The model's own ``__call__`` runs unchanged around them (masks, caches and any
family quirks included), which is why a pipeline instance computes exactly what one process
computes. The last rank computes the logits and samples; the tokens (one per row of the decode
batch) go back to rank 0 (its right neighbour in the ring) for the next step. Embedding and
head are computed only where they are needed. Verified for llama and qwen2 (tests compare
logits and tokens with one process); a family whose model call transforms the embedding's
output itself (gemma scales it) would apply that again on later ranks and needs checking
before it is offered.

**Tensor** (:class:`TensorShard`). ``model.shard(group)``: every rank runs every layer on its
slice of the heads and of the MLP, with an ``all_sum`` after each attention and MLP block. Rank
0 alone computes the head and samples; the other ranks stop at the final norm (they need the
same collectives, not the logits).

Every evaluation here that contains a distributed operation is returned to the caller, which
runs it under the collective watchdog; nothing here waits on a peer by itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

from skulk.engine._rows import sample_rows
from skulk.engine._sampling import Sampler
from skulk.models import ShardSlice, needed_tensors
from skulk.wire.runner import SamplingParams, ShardSpec

_async_eval = cast(Callable[..., None], mx.async_eval)  # untyped in mlx's stubs
_Module: Any = nn.Module  # type: ignore[attr-defined]  # mlx.nn: no type information


class ShardingUnsupported(Exception):
    """This model cannot be sharded as asked; the message names the family or the
    arithmetic. Reported as ``RunnerFailed(reason="unsupported_sharding")``."""


def open_model(path: Path) -> tuple[Any, dict[str, Any]]:
    """The model at ``path`` with every weight still lazy (nothing read yet), and its config."""
    model, config = load_model(path, lazy=True)
    return model, config


def check_sharding(model: Any, config: dict[str, Any], spec: ShardSpec) -> None:
    """Refuse (:class:`ShardingUnsupported`) a sharding this model or spec cannot do."""
    world, family = spec.world, config.get("model_type", type(model).__name__)
    if world < 2:
        raise ShardingUnsupported(f"a sharded instance needs at least 2 ranks, not {world}")
    if not 0 <= spec.rank < world:
        raise ShardingUnsupported(f"rank {spec.rank} is not in a group of {world}")
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, list) or not all(hasattr(inner, a) for a in ("embed_tokens", "norm")):
        raise ShardingUnsupported(
            f"the {family} family has no model.model.{{embed_tokens, layers, norm}} to shard"
        )
    count = len(layers)
    if spec.sharding == "pipeline":
        if not 0 <= spec.start < spec.end <= count:
            raise ShardingUnsupported(
                f"pipeline layers [{spec.start}, {spec.end}) are not a slice of the {count} "
                f"layers of this {family} model"
            )
        return
    if not hasattr(model, "shard"):
        raise ShardingUnsupported(f"tensor sharding: mlx-lm's {family} model has no shard()")
    if (spec.start, spec.end) != (0, count):
        raise ShardingUnsupported(
            f"a tensor rank runs every layer: [0, {count}), not [{spec.start}, {spec.end})"
        )
    heads = int(config.get("num_attention_heads", 0))
    kv_heads = int(config.get("num_key_value_heads") or heads)
    inter = int(config.get("intermediate_size", 0))
    if heads % world or kv_heads % world or inter % world:
        raise ShardingUnsupported(
            f"tensor sharding over {world} ranks needs the attention heads, key/value heads "
            f"and MLP width divisible by {world}; this {family} model has {heads} heads, "
            f"{kv_heads} key/value heads and MLP width {inter}"
        )


def shard_slice(config: dict[str, Any], spec: ShardSpec, layers: int) -> ShardSlice:
    tied = bool(config.get("tie_word_embeddings", False))
    return ShardSlice(spec.sharding, spec.start, spec.end, layers, tied)


class _Receive(_Module):  # type: ignore[misc]
    """Stands in for the token embedding on a pipeline rank after the first: the hidden state
    for these positions comes from the previous rank. Keeps the real embedding only for a
    head tied to it (``as_linear``)."""

    def __init__(self, src: int, hidden: int, dtype: mx.Dtype, group: Any, tied: Any) -> None:
        super().__init__()
        self._src, self._hidden, self._dtype, self._group = src, hidden, dtype, group
        if tied is not None:
            self.embedding = tied

    def __call__(self, inputs: mx.array) -> mx.array:
        shape = (*inputs.shape, self._hidden)
        return mx.distributed.recv(shape, self._dtype, self._src, group=self._group)

    def as_linear(self, x: mx.array) -> mx.array:
        embedding = cast(Any, self).get("embedding")
        if embedding is None:
            raise RuntimeError("this pipeline rank holds no embedding for a tied head")
        return cast(mx.array, embedding.as_linear(x))


class _Send(_Module):  # type: ignore[misc]
    """Stands in for the final norm on a pipeline rank before the last: hands the hidden
    state to the next rank."""

    def __init__(self, dst: int, group: Any) -> None:
        super().__init__()
        self._dst, self._group = dst, group

    def __call__(self, h: mx.array) -> mx.array:
        return mx.distributed.send(h, self._dst, group=self._group)


class _Absent(_Module):  # type: ignore[misc]
    """Stands in for a part of the model this rank does not hold (the head before the last
    pipeline rank); calling it is a bug."""

    def __call__(self, *args: object) -> mx.array:
        raise RuntimeError("this pipeline rank does not hold this part of the model")


class Shard:
    """What one rank computes. ``sampling`` says whether this rank samples the tokens;
    ``prefill``/``decode`` return the arrays to evaluate (under the watchdog) and, for
    ``decode`` on the rank that learns the token (rank 0), the token array."""

    sampling: bool
    vocab_size: int

    def __init__(self, model: Any, spec: ShardSpec, group: Any) -> None:
        self.model = model
        self.spec = spec
        self.group = group
        self.vocab_size = int(model.args.vocab_size)

    def new_cache(self) -> list[Any]:
        cache: list[Any] = make_prompt_cache(self.model)
        return cache

    def sampler(self, params: SamplingParams) -> Sampler | None:
        return Sampler(params, self.vocab_size) if self.sampling else None

    def prefill(self, tokens: mx.array, cache: list[Any]) -> list[Any]:
        raise NotImplementedError

    def decode(
        self, tokens: mx.array, cache: list[Any], samplers: Sequence[Sampler] | None
    ) -> tuple[list[Any], mx.array | None]:
        """One decode step of a batch: ``tokens`` ``(rows, 1)``, ``cache`` the batch's caches
        (:mod:`skulk.engine._rows`), ``samplers`` one per row on the sampling rank. Rank 0
        gets back the sampled ``(rows,)`` tokens."""
        raise NotImplementedError


def _states(cache: list[Any]) -> list[Any]:
    return [c.state for c in cache]


def _flat(tree: Any) -> list[tuple[str, Any]]:
    return cast(list[tuple[str, Any]], tree_flatten(tree))


class PipelineShard(Shard):
    """Layers ``[start, end)`` of the model; see the module doc."""

    def __init__(self, model: Any, spec: ShardSpec, group: Any) -> None:
        super().__init__(model, spec, group)
        self.first = spec.rank == 0
        self.last = spec.rank == spec.world - 1
        self.sampling = self.last

    def prefill(self, tokens: mx.array, cache: list[Any]) -> list[Any]:
        out = self.model.model(tokens, cache=cache)
        return [out, *_states(cache)]

    def decode(
        self, tokens: mx.array, cache: list[Any], samplers: Sequence[Sampler] | None
    ) -> tuple[list[Any], mx.array | None]:
        if self.last:
            assert samplers is not None
            logits = self.model(tokens, cache=cache)[:, -1, :]
            sampled = sample_rows(logits, samplers).astype(mx.int32).reshape(-1)
            sent = mx.distributed.send(sampled, 0, group=self.group)
            return [sent, *_states(cache)], None
        out = self.model.model(tokens, cache=cache)
        work = [out, *_states(cache)]
        if not self.first:
            return work, None
        _async_eval(work)  # before the receive: one stream, so the send goes out first
        rows = tokens.shape[0]
        back = mx.distributed.recv((rows,), mx.int32, self.spec.world - 1, group=self.group)
        return [back], back


class TensorShard(Shard):
    """Every layer, on this rank's slice of the heads and of the MLP."""

    def __init__(self, model: Any, spec: ShardSpec, group: Any) -> None:
        super().__init__(model, spec, group)
        self.sampling = spec.rank == 0

    def prefill(self, tokens: mx.array, cache: list[Any]) -> list[Any]:
        out = self.model.model(tokens, cache=cache)
        return [out, *_states(cache)]

    def decode(
        self, tokens: mx.array, cache: list[Any], samplers: Sequence[Sampler] | None
    ) -> tuple[list[Any], mx.array | None]:
        if samplers is None:
            out = self.model.model(tokens, cache=cache)
            return [out, *_states(cache)], None
        logits = self.model(tokens, cache=cache)[:, -1, :]
        sampled = sample_rows(logits, samplers).astype(mx.int32).reshape(-1)
        return [sampled, *_states(cache)], sampled


def load_shard(
    model: Any,
    config: dict[str, Any],
    spec: ShardSpec,
    group: Any,
    progress: Callable[[int, int], None],
) -> Shard:
    """Cut ``model`` (from :func:`open_model`, checked by :func:`check_sharding`) down to this
    rank's shard and evaluate its weights, reporting ``progress(loaded, total)``."""
    if spec.sharding == "tensor":
        model.shard(group)
        _evaluate(model, progress)
        return TensorShard(model, spec, group)
    inner = model.model
    part = shard_slice(config, spec, len(inner.layers))
    params = _flat(model.parameters())
    wanted = set(needed_tensors([n for n, _ in params], part))
    keep = {id(v) for n, v in params if n in wanted}
    embed = inner.embed_tokens
    hidden = int(getattr(model.args, "hidden_size", 0) or config["hidden_size"])
    dtype = embed.scales.dtype if hasattr(embed, "scales") else embed.weight.dtype
    inner.layers = inner.layers[spec.start : spec.end]
    _relocate_layer_indices(inner)
    if not part.first:
        # The last rank keeps the embedding when the head is tied to it (the rule says so).
        tied = any(id(v) in keep for _, v in _flat(embed.parameters()))
        inner.embed_tokens = _Receive(spec.rank - 1, hidden, dtype, group, embed if tied else None)
    if not part.last:
        inner.norm = _Send(spec.rank + 1, group)
        if "lm_head" in model:
            model.lm_head = _Absent()
    stray = [n for n, v in _flat(model.parameters()) if id(v) not in keep]
    if stray:
        raise ShardingUnsupported(
            f"pipeline rank {spec.rank} would hold tensors outside its shard: {stray[:3]}"
        )
    _evaluate(model, progress)
    return PipelineShard(model, spec, group)


def _relocate_layer_indices(inner: Any) -> None:
    """Some families index their layer list at call time with positions computed at build
    time (llama: ``fa_idx``/``swa_idx``, the first full/sliding-attention layer, for masks);
    point them into the sliced list."""
    if hasattr(inner, "fa_idx"):
        kinds = [bool(getattr(layer, "use_sliding", False)) for layer in inner.layers]
        inner.fa_idx = kinds.index(False) if False in kinds else 0
        if hasattr(inner, "swa_idx"):
            inner.swa_idx = kinds.index(True) if True in kinds else None


def _evaluate(model: Any, progress: Callable[[int, int], None]) -> None:
    """Read the weights the model still holds, layer by layer, reporting progress."""
    layers = list(getattr(model, "layers", []))
    total = len(layers) + 1
    progress(0, total)
    for i, layer in enumerate(layers):
        mx.eval(layer.parameters())
        progress(i + 1, total)
    mx.eval(model.parameters())
    progress(total, total)

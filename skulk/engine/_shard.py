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
:class:`_Receive` (the hidden state arrives from rank ``r - 1``) and the final norm by
:class:`_Send` (the hidden state goes to rank ``r + 1``; from the last rank, back to rank 0),
and the head is dropped. Rank 0 keeps the embedding, the final norm and the head: its norm is
wrapped in :class:`_RoundTrip`, which sends its layers' output along the ring and norms what
comes back. So the logits come out on rank 0, where the scheduler samples, masks and
speculates exactly as one process does; the model's own ``__call__`` runs unchanged around
these stand-ins (masks, caches and any family quirks included), which is why a pipeline
instance computes exactly what one process computes. What comes back is one hidden state per
position (``hidden`` values), not the logits (``vocab`` values). Verified for llama and qwen2
(tests compare tokens with one process); a family whose model call transforms the
embedding's output itself (gemma scales it) would apply that again on later ranks and needs
checking before it is offered.

**Tensor** (:class:`TensorShard`). ``model.shard(group)``: every rank runs every layer on its
slice of the heads and of the MLP, with an ``all_sum`` after each attention and MLP block. Rank
0 alone computes the head; the other ranks stop at the final norm (they need the same
collectives, not the logits).

Rank 0's passes stay lazy for the scheduler to evaluate; the other ranks evaluate theirs in
:meth:`Shard.follow`. The caller runs both under the collective watchdog.

**Waiting asleep.** With the group's doorbell (:mod:`skulk.engine._doorbell`, every rank
has one unless a benchmark turned it off) a pipeline rank computes its layers' output,
rings the next rank and only then sends the hidden state; the receiving rank waits for the
ring, blocked in the kernel, before it posts mlx's receive (which would otherwise poll, a
whole core, for as long as the other rank computes). On rank 0 that makes a pass that needs
the logits synchronous up to the last rank's answer: :class:`_RoundTrip` evaluates rank 0's
layers and waits for the ring inside the model call; only the norm, the head and what the
scheduler builds on them stay lazy.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import attrs
import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

from skulk.engine._doorbell import Doorbell
from skulk.engine._forward import states
from skulk.models import ShardSlice, needed_tensors
from skulk.wire.runner import ShardSpec

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


def shard_slice(spec: ShardSpec, layers: int) -> ShardSlice:
    return ShardSlice(spec.sharding, spec.start, spec.end, layers)


class _Receive(_Module):  # type: ignore[misc]
    """Stands in for the token embedding on a pipeline rank after the first: the hidden state
    for these positions comes from the previous rank."""

    def __init__(
        self, src: int, hidden: int, dtype: mx.Dtype, group: Any, bell: Doorbell | None
    ) -> None:
        super().__init__()
        self._src, self._hidden, self._dtype, self._group = src, hidden, dtype, group
        self._bell = bell

    def __call__(self, inputs: mx.array) -> mx.array:
        if self._bell is not None:
            self._bell.wait()  # asleep until the previous rank is about to send
        shape = (*inputs.shape, self._hidden)
        return mx.distributed.recv(shape, self._dtype, self._src, group=self._group)


class _Send(_Module):  # type: ignore[misc]
    """Stands in for the final norm on a pipeline rank after the first: hands the hidden
    state to the next rank (the last rank: back to rank 0, when rank 0 needs it: ``enabled``)."""

    def __init__(self, dst: int, group: Any, bell: Doorbell | None) -> None:
        super().__init__()
        self._dst, self._group, self._bell = dst, group, bell
        self.enabled = True

    def __call__(self, h: mx.array) -> mx.array:
        if not self.enabled:
            return h
        _ring_before_send(self._bell, h)
        return mx.distributed.send(h, self._dst, group=self._group)


@attrs.frozen
class _Sent:
    shape: tuple[int, ...]
    dtype: mx.Dtype


class _RoundTrip(_Module):  # type: ignore[misc]
    """Wraps the final norm on a pipeline's rank 0: the hidden state goes to rank 1, through
    every later rank's layers and back from the last one, and only then is normed here (rank
    0 holds the norm and the head, so the logits are where the scheduler samples). With
    ``back`` false (a prefill chunk) it is only sent. The send is queued before the receive
    is built: one stream, so it goes out first. With a doorbell the receive is built only
    once the last rank rang (its answer is on the way), so this rank sleeps meanwhile: the
    call returns after the later ranks' part of the pass, not before."""

    def __init__(self, norm: Any, world: int, group: Any, bell: Doorbell | None) -> None:
        super().__init__()
        self.norm = norm
        self._world, self._group, self._bell = world, group, bell
        self.back = True
        self.sent = _Sent((), mx.float32)  # the last hidden state sent (not a tuple: a Module
        # keeps tuples as children)

    def __call__(self, h: mx.array) -> mx.array:
        _ring_before_send(self._bell, h)
        self.sent = _Sent(tuple(h.shape), h.dtype)
        sent = mx.distributed.send(h, 1, group=self._group)
        if not self.back:
            return sent
        _async_eval(sent)
        if self._bell is not None:
            self._bell.wait()  # asleep until the last rank is about to send its answer
        got = mx.distributed.recv(h.shape, h.dtype, self._world - 1, group=self._group)
        return cast(mx.array, self.norm(got))

    def receive(self, shape: tuple[int, ...], dtype: mx.Dtype) -> mx.array:
        """The last rank's answer to a pass sent earlier (:meth:`PipelineShard.start`), normed;
        received now (after its ring), so answers are taken in the order they come."""
        if self._bell is not None:
            self._bell.wait()
        got = mx.distributed.recv(shape, dtype, self._world - 1, group=self._group)
        mx.eval(got)
        return cast(mx.array, self.norm(got))


def _ring_before_send(bell: Doorbell | None, h: mx.array) -> None:
    """Compute ``h`` (this rank's layers), then ring the next rank: it wakes as the hidden
    state goes out, not while this rank still computes it."""
    if bell is not None:
        mx.eval(h)
        bell.ring()


class _Absent(_Module):  # type: ignore[misc]
    """Stands in for a part of the model this rank does not hold (the head after a
    pipeline's rank 0); calling it is a bug."""

    def __call__(self, *args: object) -> mx.array:
        raise RuntimeError("this pipeline rank does not hold this part of the model")


class Shard:
    """What one rank computes. Rank 0 (:meth:`logits`, :meth:`hidden`, :meth:`fill`) runs the
    scheduler's passes, the logits and hidden states coming out on rank 0; every other rank
    runs its part of the same pass with :meth:`follow`. Nothing is evaluated here but by
    :meth:`fill` and :meth:`follow` (under the caller's watchdog)."""

    def __init__(
        self, model: Any, spec: ShardSpec, group: Any, doorbell: Doorbell | None = None
    ) -> None:
        self.model = model
        self.spec = spec
        self.group = group
        self.doorbell = doorbell

    def new_cache(self) -> list[Any]:
        cache: list[Any] = make_prompt_cache(self.model)
        return cache

    def tokens(self, tokens: mx.array) -> mx.array:
        """What rank 0 embeds: ``tokens`` (a tensor group shares them, see :class:`TensorShard`)."""
        return tokens

    def logits(self, tokens: mx.array, cache: list[Any] | None) -> mx.array:
        out: mx.array = self.model(self.tokens(tokens), cache=cache)
        return out

    def hidden(self, tokens: mx.array, cache: list[Any] | None) -> mx.array:
        out: mx.array = self.model.model(self.tokens(tokens), cache=cache)
        return out

    def fill(self, tokens: mx.array, cache: list[Any]) -> None:
        raise NotImplementedError

    def follow(self, rows: int, length: int, cache: list[Any] | None, back: bool) -> None:
        """Run this rank's part of rank 0's pass over ``rows`` x ``length`` tokens."""
        raise NotImplementedError


def _flat(tree: Any) -> list[tuple[str, Any]]:
    return cast(list[tuple[str, Any]], tree_flatten(tree))


class PipelineShard(Shard):
    """Layers ``[start, end)`` of the model; see the module doc."""

    def __init__(
        self, model: Any, spec: ShardSpec, group: Any, doorbell: Doorbell | None = None
    ) -> None:
        super().__init__(model, spec, group, doorbell)
        self._norm = model.model.norm  # rank 0: the round trip; later ranks: the send

    def fill(self, tokens: mx.array, cache: list[Any]) -> None:
        self._norm.back = False
        try:
            mx.eval([self.model.model(tokens, cache=cache), *states(cache)])
        finally:
            self._norm.back = True

    def start(self, tokens: mx.array, cache: list[Any]) -> Callable[[], mx.array]:
        """Rank 0: this rank's layers of a pass whose logits are wanted later, evaluated and
        sent on; the function returned receives the last rank's answer and computes the
        logits (lazy). Call those functions in the order the passes were started."""
        self.fill(tokens, cache)
        round_trip = self.model.model.norm
        shape, dtype = round_trip.sent.shape, round_trip.sent.dtype
        model = self.model

        def finish() -> mx.array:
            out = round_trip.receive(shape, dtype)
            if "lm_head" in model:
                return cast(mx.array, model.lm_head(out))
            return cast(mx.array, model.model.embed_tokens.as_linear(out))  # tied embeddings

        return finish

    def follow(self, rows: int, length: int, cache: list[Any] | None, back: bool) -> None:
        last = self.spec.rank == self.spec.world - 1
        self._norm.enabled = back or not last
        try:
            shape = mx.zeros((rows, length), dtype=mx.int32)  # only the shape matters here
            mx.eval([self.model.model(shape, cache=cache), *states(cache)])
        finally:
            self._norm.enabled = True


class TensorShard(Shard):
    """Every layer, on this rank's slice of the heads and of the MLP; rank 0 alone computes
    the head. Every rank embeds, so rank 0's tokens reach the others inside the pass (an
    ``all_sum`` of rank 0's tokens and everyone else's zeros)."""

    def tokens(self, tokens: mx.array) -> mx.array:
        return mx.distributed.all_sum(tokens.astype(mx.int32), group=self.group)

    def fill(self, tokens: mx.array, cache: list[Any]) -> None:
        mx.eval([self.model.model(self.tokens(tokens), cache=cache), *states(cache)])

    def follow(self, rows: int, length: int, cache: list[Any] | None, back: bool) -> None:
        zeros = mx.zeros((rows, length), dtype=mx.int32)
        mx.eval([self.hidden(zeros, cache), *states(cache)])


def load_shard(
    model: Any,
    config: dict[str, Any],
    spec: ShardSpec,
    group: Any,
    progress: Callable[[int, int], None],
    doorbell: Doorbell | None = None,
) -> Shard:
    """Cut ``model`` (from :func:`open_model`, checked by :func:`check_sharding`) down to this
    rank's shard and evaluate its weights, reporting ``progress(loaded, total)``. With a
    ``doorbell`` (:mod:`skulk.engine._doorbell`; every rank or none) a pipeline rank waits
    for a hidden state asleep."""
    if spec.sharding == "tensor":
        model.shard(group)
        _evaluate(model, progress)
        return TensorShard(model, spec, group, doorbell)
    inner = model.model
    part = shard_slice(spec, len(inner.layers))
    params = _flat(model.parameters())
    wanted = set(needed_tensors([n for n, _ in params], part))
    keep = {id(v) for n, v in params if n in wanted}
    embed = inner.embed_tokens
    hidden = int(getattr(model.args, "hidden_size", 0) or config["hidden_size"])
    dtype = embed.scales.dtype if hasattr(embed, "scales") else embed.weight.dtype
    inner.layers = inner.layers[spec.start : spec.end]
    _relocate_layer_indices(inner)
    if part.first:
        inner.norm = _RoundTrip(inner.norm, spec.world, group, doorbell)
    else:
        inner.embed_tokens = _Receive(spec.rank - 1, hidden, dtype, group, doorbell)
        inner.norm = _Send((spec.rank + 1) % spec.world, group, doorbell)
        if "lm_head" in model:
            model.lm_head = _Absent()
    stray = [n for n, v in _flat(model.parameters()) if id(v) not in keep]
    if stray:
        raise ShardingUnsupported(
            f"pipeline rank {spec.rank} would hold tensors outside its shard: {stray[:3]}"
        )
    _evaluate(model, progress)
    return PipelineShard(model, spec, group, doorbell)


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

"""Weights for the demo model: a bigram language model dressed as a Llama.

The token-to-token (bigram) distribution counted on the shipped corpus is fitted, by a short
full-batch Adam run (16 steps, well under a second), as a rank ``hidden_size - 1`` softmax
factorisation ``softmax(left[t] @ right.T)``. The embedding row of token ``t`` holds
``left[t]``, the LM head holds ``right``, so ``lm_head(norm(embed(t)))`` gives the bigram
logits for ``t``. Embedding rows are padded to one common norm through a spare "filler"
dimension, which turns the final RMSNorm into the same rescale for every token; the filler is
also what lets the head push never-to-be-emitted tokens (role markers, padding) far down in
every context.

Attention and MLP weights are small seeded random values: every layer is a real, working Llama
layer that nudges the residual stream without erasing the token identity it carries.

Determinism: randomness comes from ``numpy.random.Generator(PCG64(seed))`` via ``random()``
(built from integer bits, identical on every platform); matrix products are computed exactly on
a fixed-point grid (:func:`exact_matmul`), so BLAS threading and kernels cannot change a bit;
the remaining float64 elementwise steps (``exp``, sums, Adam) are repeatable on any one
machine. Across different CPUs ``exp`` or a sum may differ in the last ulp; the fixed-point
grid and the final rounding to bfloat16-representable values absorb such differences with
high probability, and the manifest's content hash tells when they did not.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]

#: Logits are divided by this, so sampling at temperature 1 reads like temperature 0.8.
_BAKED_TEMPERATURE = 0.8
#: Probability of ending a reply is at most this fraction of the likeliest other token, so
#: greedy decoding never picks the end token and runs to ``max_tokens``.
_END_CAP = 0.9
#: Each attention / MLP block moves the unit-norm residual by about this much.
_LAYER_NUDGE = 0.05
_FIT_STEPS = 16
_FIT_LR = 0.05


@attrs.frozen
class LlamaShape:
    """Architecture numbers written into ``config.json``."""

    vocab_size: int
    hidden_size: int = 128
    num_hidden_layers: int = 2
    intermediate_size: int = 256
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@attrs.frozen
class BigramTable:
    """Token transition counts, the end token, and tokens the model must never emit."""

    counts: npt.NDArray[np.int64]  # [context, next]
    end: int
    banned: tuple[int, ...]


def count_bigrams(
    sequences: Sequence[Sequence[int]],
    vocab_size: int,
    end: int,
    extra: Sequence[tuple[int, int]] = (),
    banned: Sequence[int] = (),
) -> BigramTable:
    """Count adjacent token pairs in ``sequences`` (plus ``extra`` pairs, once each)."""
    counts = np.zeros((vocab_size, vocab_size), dtype=np.int64)
    for seq in sequences:
        ids = np.asarray(seq, dtype=np.int64)
        np.add.at(counts, (ids[:-1], ids[1:]), 1)
    for a, b in extra:
        counts[a, b] += 1
    return BigramTable(counts=counts, end=end, banned=tuple(banned))


@attrs.frozen
class BigramTarget:
    """What the fit reproduces: P(next | context) over the tokens that occur in the corpus.

    Row ``i`` is the context ``contexts[i]``; the last row is a catch-all context (the unigram
    distribution) used for every token the corpus never shows as a context. Column ``j`` is
    the next token ``outputs[j]``; tokens that are not columns are never emitted.
    """

    probs: F64  # [len(contexts) + 1, len(outputs)]
    row_weights: F64  # [len(contexts) + 1]
    contexts: npt.NDArray[np.int64]
    outputs: npt.NDArray[np.int64]


def bigram_target(table: BigramTable, smoothing: float = 0.1) -> BigramTarget:
    """Counts interpolated with the unigram, restricted to tokens seen in the corpus; the end
    token is capped below the likeliest other next token (see ``_END_CAP``)."""
    counts = table.counts
    emitted = counts.sum(axis=0) > 0
    emitted[list(table.banned)] = False
    outputs = np.flatnonzero(emitted)
    contexts = np.flatnonzero(counts.sum(axis=1) > 0)
    sub = counts[np.ix_(contexts, outputs)].astype(np.float64)
    unigram = sub.sum(axis=0) + 0.05
    unigram /= unigram.sum()
    probs = (sub + smoothing * unigram) / (sub.sum(axis=1, keepdims=True) + smoothing)
    probs = np.concatenate([probs, unigram[None, :]], axis=0)
    end = int(np.searchsorted(outputs, table.end))
    if outputs[end] != table.end:
        raise ValueError("the end token never occurs in the corpus")
    others = probs.copy()
    others[:, end] = 0.0
    probs[:, end] = np.minimum(probs[:, end], _END_CAP * others.max(axis=1))
    probs /= probs.sum(axis=1, keepdims=True)
    row_weights = np.append(sub.sum(axis=1), 0.0) + 1.0
    return BigramTarget(probs=probs, row_weights=row_weights, contexts=contexts, outputs=outputs)


def fit_factors(probs: F64, weights: F64, rank: int, rng: np.random.Generator) -> tuple[F64, F64]:
    """Fit ``softmax(left @ right.T)`` rows to ``probs`` (rows weighted by ``weights``).

    Full-batch Adam on the weighted cross-entropy from a seeded uniform start. Every matrix
    product goes through :func:`exact_matmul`, so the result does not depend on how BLAS
    splits or orders its sums (thread count, CPU kernels).
    """
    rows, cols = probs.shape
    row_w = (weights / weights.sum())[:, None]
    target = probs * row_w
    left = _uniform(rng, (rows, rank), 0.06)
    right = _uniform(rng, (cols, rank), 0.06)
    params = (left, right)
    moments = [np.zeros_like(p) for p in params]
    squares = [np.zeros_like(p) for p in params]
    for step in range(1, _FIT_STEPS + 1):
        # Softmax without max-subtraction: |logits| stays far below float64's exp overflow
        # (each Adam step moves an entry by at most ~lr).
        probs_now = np.exp(exact_matmul(left, right.T))
        probs_now *= row_w / probs_now.sum(axis=1, keepdims=True)
        probs_now -= target  # now d(loss)/d(logits)
        # One quantisation of the gradient serves both products (inner size <= max(rows, cols)).
        bits_g, bits_p = _split_bits(max(rows, cols))
        grad_q, grad_scale = _fixed_point(probs_now, bits_g)
        grads = (
            _fixed_matmul(grad_q, grad_scale, right, bits_p),
            _fixed_matmul(grad_q.T, grad_scale, left, bits_p),
        )
        lr = _FIT_LR * np.sqrt(1 - 0.999**step) / (1 - 0.9**step)
        for p, g, m, v in zip(params, grads, moments, squares, strict=True):
            m *= 0.9
            m += 0.1 * g
            v *= 0.999
            v += 0.001 * g * g
            p -= lr * m / (np.sqrt(v) + 1e-8)
    if not (np.isfinite(left).all() and np.isfinite(right).all()):
        raise ArithmeticError("demo-model fit diverged")
    return left, right


def exact_matmul(a: F64, b: F64) -> F64:
    """``a @ b`` computed exactly on a fixed-point grid, hence bit-reproducible.

    Both operands are rounded to integers (after a power-of-two scale) small enough that every
    product and partial sum of the float64 matrix product is an integer below 2**52, so each
    BLAS operation is exact whatever its order, blocking, threading or FMA use. The grid keeps
    about 21 significant bits of each operand's largest entry, plenty for this fit.
    """
    bits_a, bits_b = _split_bits(a.shape[1])
    qa, sa = _fixed_point(a, bits_a)
    return _fixed_matmul(qa, sa, b, bits_b)


def _split_bits(inner: int) -> tuple[int, int]:
    budget = 52 - max(1, (inner - 1).bit_length())
    return budget // 2, budget - budget // 2


def _fixed_matmul(qa: F64, sa: float, b: F64, bits_b: int) -> F64:
    qb, sb = _fixed_point(b, bits_b)
    out: F64 = qa @ qb
    out *= sa * sb
    return out


def _fixed_point(x: F64, bits: int) -> tuple[F64, float]:
    """``x ≈ q * scale`` with integer ``q``, ``|q| <= 2**bits`` and ``scale`` a power of two."""
    peak = max(float(x.max()), -float(x.min()))
    exponent = int(np.frexp(peak)[1]) if peak > 0 else 0  # peak <= 2**exponent
    q: F64 = x * float(np.ldexp(1.0, bits - exponent))
    np.rint(q, out=q)
    return q, float(np.ldexp(1.0, exponent - bits))


def build_weights(shape: LlamaShape, table: BigramTable, seed: int) -> dict[str, F32]:
    """All tensors of the model, keyed by mlx-lm's Llama parameter names."""
    rng = np.random.Generator(np.random.PCG64(seed))
    dim = shape.hidden_size
    target = bigram_target(table)
    fitted_left, fitted_right = fit_factors(target.probs, target.row_weights, dim - 1, rng)
    vocab = shape.vocab_size
    left = np.repeat(fitted_left[-1:], vocab, axis=0)  # catch-all context by default
    left[target.contexts] = fitted_left[:-1]
    right = np.zeros((vocab, dim - 1))
    right[target.outputs] = fitted_right / _BAKED_TEMPERATURE
    never = np.ones(vocab, dtype=bool)
    never[target.outputs] = False

    # Pad every embedding row to the same norm through the filler dimension, then scale to 1.
    norms = np.sqrt((left * left).sum(axis=1))
    radius = float(norms.max()) * 1.05
    filler = np.sqrt(radius * radius - norms * norms)  # >= 0.3 * radius for every token
    embed = np.concatenate([left, filler[:, None]], axis=1) / radius
    # With |h| = 1, RMSNorm multiplies by sqrt(dim): undo that (and the 1/radius) in the head.
    head = np.concatenate([right, np.zeros((vocab, 1))], axis=1)
    head[never, -1] = -40.0 / (0.3 * radius)  # banned / unseen: logit <= -40 in every context
    head *= radius / np.sqrt(dim)

    weights: dict[str, F32] = {
        "model.embed_tokens.weight": _bf16_grid(embed),
        "lm_head.weight": _bf16_grid(head),
        "model.norm.weight": np.ones(dim, dtype=np.float32),
    }
    kv_dim = shape.num_key_value_heads * shape.head_dim
    inner = shape.intermediate_size
    nudge = _LAYER_NUDGE
    for i in range(shape.num_hidden_layers):
        p = f"model.layers.{i}."
        weights[p + "input_layernorm.weight"] = np.ones(dim, dtype=np.float32)
        weights[p + "post_attention_layernorm.weight"] = np.ones(dim, dtype=np.float32)
        weights[p + "self_attn.q_proj.weight"] = _uniform32(rng, (dim, dim), dim**-0.5)
        weights[p + "self_attn.k_proj.weight"] = _uniform32(rng, (kv_dim, dim), dim**-0.5)
        weights[p + "self_attn.v_proj.weight"] = _uniform32(rng, (kv_dim, dim), dim**-0.5)
        weights[p + "self_attn.o_proj.weight"] = _uniform32(rng, (dim, dim), nudge / dim)
        weights[p + "mlp.gate_proj.weight"] = _uniform32(rng, (inner, dim), dim**-0.5)
        weights[p + "mlp.up_proj.weight"] = _uniform32(rng, (inner, dim), dim**-0.5)
        weights[p + "mlp.down_proj.weight"] = _uniform32(
            rng, (dim, inner), 2 * nudge / np.sqrt(inner * dim)
        )
    return weights


def _uniform(rng: np.random.Generator, shape: tuple[int, int], std: float) -> F64:
    # random() is built from integer bits, so it is identical on every platform
    # (standard_normal's ziggurat calls libm for tail draws).
    out: F64 = (rng.random(shape) * 2.0 - 1.0) * (std * np.sqrt(3.0))
    return out


def _uniform32(rng: np.random.Generator, shape: tuple[int, int], std: float) -> F32:
    return _uniform(rng, shape, std).astype(np.float32)


def _bf16_grid(values: F64) -> F32:
    """Round to the nearest bfloat16-representable value, kept as float32."""
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    out: F32 = rounded.astype(np.uint32).view(np.float32)
    return out

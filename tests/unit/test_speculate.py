"""Speculative decoding's parts without a real model: the n-gram proposer, the sampler's
look-ahead, the verify step on a stub model, the controller."""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Any, cast

import mlx.core as mx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mlx_lm.models import cache as mlx_cache

from skulk.engine._sampling import Sampler
from skulk.engine._speculate import (
    NGramProposer,
    SpeculationUnsupported,
    can_speculate,
    speculative_step,
)
from skulk.engine._speculation_control import SpeculationController
from skulk.wire.runner import SamplingParams

# mlx-lm's cache classes are untyped
ArraysCache: Any = mlx_cache.ArraysCache
KVCache: Any = mlx_cache.KVCache
RotatingKVCache: Any = mlx_cache.RotatingKVCache


def item(a: mx.array) -> int:
    return int(cast(int, a.item()))


# -- proposer ------------------------------------------------------------------------------


def test_no_earlier_occurrence_proposes_nothing() -> None:
    assert NGramProposer().propose(4) == []
    assert NGramProposer([1, 2, 3, 4]).propose(4) == []
    assert NGramProposer([1, 2, 1]).propose(0) == []


def test_copies_what_followed_the_most_recent_occurrence() -> None:
    proposer = NGramProposer([1, 2, 3, 9, 1, 2, 3, 7, 1, 2], max_ngram=3)
    assert proposer.propose(3) == [3, 7, 1]  # (1, 2) last seen at 4..5, followed by 3, 7, 1
    assert proposer.propose(1) == [3]


def test_a_longer_match_wins_over_a_more_recent_shorter_one() -> None:
    # (1, 2) → 8 at the start; the unigram (2,) was seen later, followed by 9
    tokens = [5, 1, 2, 8, 6, 2, 9, 5, 1, 2]
    assert NGramProposer(tokens, min_ngram=1, max_ngram=2).propose(1) == [8]
    assert NGramProposer(tokens, min_ngram=1, max_ngram=1).propose(1) == [9]


def test_min_ngram_refuses_shorter_matches() -> None:
    assert NGramProposer([4, 7, 5, 4], min_ngram=2).propose(2) == []
    assert NGramProposer([4, 7, 5, 4], min_ngram=1).propose(2) == [7, 5]


def test_a_loop_is_drafted_past_the_present() -> None:
    # the match runs into the tokens being drafted: copy on from the draft itself
    assert NGramProposer([1, 2, 1, 2]).propose(5) == [1, 2, 1, 2, 1]
    assert NGramProposer([7, 7]).propose(3) == [7, 7, 7]


def test_appending_updates_the_index() -> None:
    proposer = NGramProposer([1, 2, 3])
    assert proposer.propose(2) == []
    proposer.extend([4, 2])
    assert proposer.propose(2) == [3, 4]
    proposer.append(3)
    assert proposer.propose(2) == [4, 2]
    assert list(proposer.tokens) == [1, 2, 3, 4, 2, 3] and len(proposer) == 6


@pytest.mark.parametrize(("low", "high"), [(0, 2), (3, 2), (-1, 1)])
def test_ngram_bounds_are_checked(low: int, high: int) -> None:
    with pytest.raises(ValueError, match="min_ngram"):
        NGramProposer(min_ngram=low, max_ngram=high)


def reference_proposal(tokens: list[int], k: int, low: int, high: int) -> list[int]:
    """The proposal by brute force: scan the whole history for the last earlier occurrence."""
    size = len(tokens)
    for n in range(min(high, size), low - 1, -1):
        suffix = tokens[size - n :]
        for start in range(size - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                extended = list(tokens)
                for j in range(k):
                    extended.append(extended[start + n + j])
                return extended[size:]
    return []


@given(
    st.lists(st.integers(0, 3), max_size=40),
    st.integers(0, 6),
    st.integers(1, 3),
    st.integers(0, 2),
)
def test_the_index_proposes_what_a_full_scan_finds(
    tokens: list[int], k: int, low: int, extra: int
) -> None:
    high = low + extra
    proposer = NGramProposer(min_ngram=low, max_ngram=high)
    for i, token in enumerate(tokens):  # checked after every append, not only at the end
        proposer.append(token)
        assert proposer.propose(k) == reference_proposal(tokens[: i + 1], k, low, high)


# -- sampler look-ahead --------------------------------------------------------------------


PARAMS = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=1.0, seed=4),
    SamplingParams(temperature=0.7, top_p=0.8, top_k=20, seed=5),
]


def block(rows: int, vocab: int = 64, seed: int = 0) -> mx.array:
    return mx.random.normal((rows, vocab), key=mx.random.key(seed)) * 2


@pytest.mark.parametrize("params", PARAMS, ids=["greedy", "sampled", "filtered"])
def test_sample_ahead_gives_what_successive_calls_give(params: SamplingParams) -> None:
    logits = block(5)
    one_by_one = Sampler(params, 64)
    expected = [item(one_by_one(logits[i : i + 1])) for i in range(5)]
    ahead = Sampler(params, 64)
    assert ahead.sample_ahead(logits).tolist() == expected
    ahead.commit(2)
    # the key advanced exactly twice: the next call samples as the third one did
    again = Sampler(params, 64)
    again(logits[0:1])
    again(logits[1:2])
    assert ahead(logits[2:3]).item() == again(logits[2:3]).item()


def test_a_sampler_differs_by_row_key() -> None:
    # the look-ahead really uses a new subkey per row (not one key for the whole block)
    same_rows = mx.repeat(block(1, vocab=512), 8, axis=0)
    samples = Sampler(SamplingParams(temperature=1.0, seed=1), 512).sample_ahead(same_rows)
    assert len(set(cast(list[int], samples.tolist()))) > 1


def test_commit_needs_a_fresh_sample_ahead() -> None:
    sampler = Sampler(SamplingParams(temperature=1.0, seed=1), 64)
    with pytest.raises(RuntimeError):
        sampler.commit(1)
    sampler.sample_ahead(block(3))
    with pytest.raises(ValueError):
        sampler.commit(0)
    with pytest.raises(ValueError):
        sampler.commit(4)
    sampler(block(1))  # the key moved: the look-ahead is stale
    with pytest.raises(RuntimeError):
        sampler.commit(1)
    sampler.sample_ahead(block(3))
    sampler.commit(3)
    with pytest.raises(RuntimeError):  # committed once only
        sampler.commit(1)


# -- the verify step on a stub model -------------------------------------------------------


class Bigram:
    """A stub model: the logits after token ``t`` are row ``t`` of a fixed table; it writes one
    dummy key/value per position into a real KVCache so trimming is what a model sees."""

    def __init__(self, table: mx.array) -> None:
        self.table = table
        self.calls = 0

    def __call__(self, tokens: mx.array, cache: list[Any]) -> mx.array:
        self.calls += 1
        kv = mx.zeros((1, 1, tokens.shape[1], 1))
        for layer in cache:
            layer.update_and_fetch(kv, kv)
        return self.table[tokens]


def table(vocab: int, seed: int = 0) -> mx.array:
    return mx.random.normal((vocab, vocab), key=mx.random.key(seed))


def test_a_step_keeps_the_matching_drafts_and_trims_the_rest() -> None:
    logits = mx.full((4, 4), -10.0)
    follows = {0: 1, 1: 2, 2: 3, 3: 0}  # greedy: 0 → 1 → 2 → 3 → 0
    for a, b in follows.items():
        logits[a, b] = 10.0
    model, cache = Bigram(logits), [KVCache()]
    model(mx.array([[0, 1]]), cache)  # the context: 0, 1; pending 2
    greedy = Sampler(SamplingParams(temperature=0.0), 4)
    accepted, nxt = speculative_step(model, cache, greedy, 2, [3, 0, 2, 1])
    assert (accepted, nxt) == ([3, 0], 1)  # 2 → 3 ✓, 3 → 0 ✓, 0 → 2 ✗ (1)
    assert cache[0].offset == 2 + 1 + 2  # context, pending, accepted; not the rejected tail
    accepted, nxt = speculative_step(model, cache, greedy, nxt, [2, 3])
    assert (accepted, nxt) == ([2, 3], 0)  # all kept: the bonus token follows
    assert cache[0].offset == 5 + 1 + 2


def test_a_cache_that_cannot_trim_is_refused_before_the_model_runs() -> None:
    model = Bigram(table(4))
    sampler = Sampler(SamplingParams(temperature=0.0), 4)
    with pytest.raises(SpeculationUnsupported):
        speculative_step(model, [ArraysCache(1)], sampler, 0, [1])
    with pytest.raises(ValueError, match="empty draft"):
        speculative_step(model, [KVCache()], sampler, 0, [])
    assert model.calls == 0


def test_a_sliding_window_speculates_only_while_the_block_fits() -> None:
    window = RotatingKVCache(max_size=8)
    Bigram(table(4))(mx.array([[0, 1, 2, 3, 0]]), [window])
    assert can_speculate([window], 3)  # 5 + 3 = 8 fits
    assert not can_speculate([window], 4)  # would overwrite what a trim needs back
    assert not can_speculate([], 1)


# -- controller ----------------------------------------------------------------------------


def drafting_pattern(
    controller: SpeculationController, steps: int, verify: float, accept: int
) -> str:
    """Drive ``controller`` with plain steps of 1 s and verify steps of ``verify`` s keeping
    ``accept`` of the drafted tokens; returns "v"/"p" per step."""
    pattern = ""
    for _ in range(steps):
        k = controller.draft_length()
        if k:
            kept = min(accept, k)
            controller.record_step(kept + 1, verify, speculative=True)
            controller.record_verify(k, kept)
            pattern += "v"
        else:
            controller.record_step(1, 1.0, speculative=False)
            pattern += "p"
    return pattern


def test_drafting_stops_and_backs_off_when_it_does_not_pay() -> None:
    controller = SpeculationController(6, min_backoff=4, growth=2, max_backoff=16)
    controller.record_step(1, 1.0, speculative=False)
    pattern = drafting_pattern(controller, 60, verify=1.5, accept=0)
    # each losing probe is followed by a longer pause: 4, 8, 16, 16, …
    assert pattern.startswith("v" + "p" * 4 + "v" + "p" * 8 + "v" + "p" * 16 + "v" + "p" * 16)
    stats = controller.statistics()
    assert stats.accepted == 0 and stats.verify_steps == pattern.count("v")


def test_a_pass_that_keeps_nothing_never_pays_even_when_it_looks_cheap() -> None:
    controller = SpeculationController(6, min_backoff=4)
    controller.record_step(1, 1.0, speculative=False)
    assert drafting_pattern(controller, 6, verify=0.5, accept=0) == "v" + "p" * 4 + "v"


def test_drafting_goes_on_while_it_pays() -> None:
    controller = SpeculationController(6, refresh=10, probe=2)
    controller.record_step(1, 1.0, speculative=False)
    pattern = drafting_pattern(controller, 44, verify=1.5, accept=6)
    assert pattern == ("v" * 10 + "p") * 4  # one plain step in ``refresh`` keeps it measured
    assert controller.draft_length() == 6
    stats = controller.statistics()
    assert stats.acceptance_rate == 1.0 and stats.drafted == 2 + 39 * 6
    assert stats.tokens == 5 + 40 + stats.accepted  # plain steps, verify steps, kept drafts
    assert stats.speculative_seconds_per_token == pytest.approx(1.5 / 7)
    assert stats.plain_seconds_per_token == 1.0


def test_slow_verify_passes_stop_drafting_even_when_they_keep_drafts() -> None:
    controller = SpeculationController(6, min_backoff=4, growth=2)
    controller.record_step(1, 1.0, speculative=False)
    pattern = drafting_pattern(controller, 20, verify=4.0, accept=2)  # 3 tokens in 4 s
    assert pattern.startswith("v" + "p" * 4 + "v" + "p" * 8 + "v")


def test_one_stall_does_not_decide() -> None:
    controller = SpeculationController(6, min_backoff=4)
    for _ in range(8):
        controller.record_step(1, 1.0, speculative=False)
    controller.record_step(3, 2.0, speculative=True)
    controller.record_step(3, 2.0, speculative=True)
    controller.record_step(3, 2.0, speculative=True)
    controller.record_step(3, 50.0, speculative=True)  # the machine stalled once
    controller.record_verify(2, 2)
    assert controller.draft_length() > 0


def test_the_first_draft_is_a_short_probe_and_grows_when_accepted() -> None:
    controller = SpeculationController(8, probe=1)
    assert controller.draft_length() == 1
    controller.record_step(2, 1.0, speculative=True)
    controller.record_verify(1, 1)
    assert controller.draft_length() == 8


def test_the_draft_shortens_when_late_positions_are_rarely_kept() -> None:
    controller = SpeculationController(8, min_reach=0.25)
    controller.record_step(1, 1.0, speculative=False)
    for _ in range(20):  # one draft token in two is kept given the one before: alpha = 1/2
        controller.record_step(2, 1.3, speculative=True)
        controller.record_verify(4, 1)
    assert controller.draft_length() == 2  # 0.5**2 >= 0.25 > 0.5**3
    assert controller.statistics().acceptance_rate == 0.25


def test_zero_speculative_tokens_is_off() -> None:
    controller = SpeculationController(0)
    assert controller.draft_length() == 0
    with pytest.raises(ValueError):
        SpeculationController(-1)
    with pytest.raises(ValueError):
        controller.record_verify(2, 3)


# -- the output distribution at temperature > 0 ---------------------------------------------

VOCAB, TEMPERATURE, TOP_K, SEEDS = 8, 0.8, 6, range(2000)
BIGRAM = table(VOCAB, seed=7) * 1.5
STATS_PARAMS = dict(temperature=TEMPERATURE, top_k=TOP_K)


def target(prev: int) -> list[float]:
    """The sampler's distribution after ``prev``: the top-k logits at 1/temperature, normalised."""
    logits = cast(list[float], BIGRAM[prev].tolist())
    kept = sorted(range(VOCAB), key=lambda t: -logits[t])[:TOP_K]
    weights = [math.exp(logits[t] / TEMPERATURE) if t in kept else 0.0 for t in range(VOCAB)]
    return [w / sum(weights) for w in weights]


PENDING = 0
# a first draft token of middling probability (often accepted, often not), then the likeliest
# token after it
D1 = min(range(VOCAB), key=lambda t: abs(target(PENDING)[t] - 0.35))
D2 = max(range(VOCAB), key=lambda t: target(D1)[t])


def first_two(seed: int) -> tuple[int, int]:
    """The two tokens after ``PENDING`` when the draft ``[D1, D2]`` is verified (plus a plain
    step if only one came out)."""
    model, cache = Bigram(BIGRAM), [KVCache()]
    model(mx.array([[3]]), cache)
    sampler = Sampler(SamplingParams(seed=seed, **STATS_PARAMS), VOCAB)  # type: ignore[arg-type]
    accepted, nxt = speculative_step(model, cache, sampler, PENDING, [D1, D2])
    out = [*accepted, nxt]
    if len(out) < 2:
        out.append(item(sampler(model(mx.array([[nxt]]), cache)[:, -1, :])))
    return out[0], out[1]


def chi_square(counts: Counter[Any], expected: dict[Any, float]) -> tuple[float, float]:
    """Pearson's statistic over the cells expected at least 5 times (the rest pooled), and its
    critical value at p = 0.001 (Wilson-Hilferty). A cell expected 0 times but seen fails."""
    n = sum(counts.values())
    assert all(expected.get(cell, 0.0) > 0 for cell in counts), "an impossible token came out"
    big = [cell for cell, p in expected.items() if p * n >= 5]
    observed = [counts[c] for c in big] + [n - sum(counts[c] for c in big)]
    wanted = [expected[c] * n for c in big] + [n * (1 - sum(expected[c] for c in big))]
    if wanted[-1] < 1e-9:
        observed, wanted = observed[:-1], wanted[:-1]
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, wanted, strict=True))
    df = len(wanted) - 1
    z = 3.09  # one-sided p = 0.001
    return stat, df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def joint_target() -> dict[tuple[int, int], float]:
    first = target(PENDING)
    return {
        (a, b): first[a] * p
        for a in range(VOCAB)
        for b, p in enumerate(target(a))
        if first[a] * p > 0
    }


def test_speculation_preserves_the_distribution() -> None:
    pairs = Counter(first_two(seed) for seed in SEEDS)
    stat, critical = chi_square(pairs, joint_target())
    assert stat < critical, (stat, critical)
    # the draft was accepted and rejected, both often
    accepted = sum(n for (a, _), n in pairs.items() if a == D1)
    assert 0.2 * len(SEEDS) < accepted < 0.6 * len(SEEDS)


def test_the_distribution_test_catches_a_wrong_acceptance_rule() -> None:
    """The same test has the power to catch a broken rule: always accepting the draft, or
    accepting it with probability p(d) but then resampling from p without excluding d."""
    stat, critical = chi_square(Counter((D1, D2) for _ in SEEDS), joint_target())
    assert stat > critical, (stat, critical)
    rng = random.Random(0)
    first, tokens = target(PENDING), list(range(VOCAB))
    naive: Counter[tuple[int, int]] = Counter()
    for _ in SEEDS:
        a = D1 if rng.random() < first[D1] else rng.choices(tokens, first)[0]
        naive[a, rng.choices(tokens, target(a))[0]] += 1
    stat, critical = chi_square(naive, joint_target())
    assert stat > critical, (stat, critical)
    # and the honest version of that simulation passes: the statistic is not biased against it
    honest: Counter[tuple[int, int]] = Counter()
    for _ in SEEDS:
        a = rng.choices(tokens, first)[0]
        honest[a, rng.choices(tokens, target(a))[0]] += 1
    stat, critical = chi_square(honest, joint_target())
    assert stat < critical, (stat, critical)


def test_the_distribution_test_catches_one_key_for_all_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plausible bug in the real code path: the look-ahead samples every row with the same
    subkey. Each row alone is still distributed right, but the tokens are no longer independent
    given their context; the joint test sees it."""

    def one_key(self: Sampler, logits: mx.array) -> mx.array:
        self._ahead_from = self._key
        key, sub = mx.random.split(self._key)
        self._ahead = [key] * int(logits.shape[0])
        rows = [self._filtered(logits[i : i + 1]) for i in range(int(logits.shape[0]))]
        return mx.concatenate([mx.random.categorical(row * self._scale, key=sub) for row in rows])

    monkeypatch.setattr(Sampler, "sample_ahead", one_key)
    stat, critical = chi_square(Counter(first_two(seed) for seed in SEEDS), joint_target())
    assert stat > critical, (stat, critical)

"""When n-gram speculation pays, measured (sans-IO): :class:`SpeculationController` decides,
step by step, how many tokens a lone request drafts, from the wall time and tokens of the
steps the caller reports; :class:`SpeculationStatistics` are its counters for diagnostics.
The decoding itself is :mod:`skulk.engine._speculate`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

import attrs

#: Default for the node flag ``--speculative-tokens N`` (the most tokens drafted per step;
#: ``0`` turns speculation off). On the demo model (``python -m skulk.bench spec
#: --speculative-tokens K``, copy prompt) tokens/s rose from k = 2 (1.3 to 1.5 times plain)
#: through 4 and 6 (1.6 to 1.8) to 8 (1.9 to 2.4), with no clear gain beyond; the controller
#: shortens drafts that are rarely kept to the end, so a long maximum costs little elsewhere.
DEFAULT_SPECULATIVE_TOKENS = 8


@attrs.frozen
class SpeculationStatistics:
    """Counters of one request's speculation, for diagnostics."""

    verify_steps: int
    """Forward passes that checked a draft."""
    plain_steps: int
    """Forward passes of one token."""
    drafted: int
    """Draft tokens checked."""
    accepted: int
    """Draft tokens kept."""
    plain_seconds_per_token: float | None
    """Recent wall time per token of plain steps, once measured."""
    speculative_seconds_per_token: float | None
    """Recent wall time per token of speculative steps, once measured."""

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens(self) -> int:
        """Tokens produced by those steps."""
        return self.plain_steps + self.verify_steps + self.accepted


class SpeculationController:
    """Decides, step by step, how many tokens to draft (``0``: a plain step), from what it
    measures: sans-IO, the caller reports each step's wall time and tokens.

    Time is kept per *step* (from one return of tokens to the next, the caller's own work
    included): a plain step yields one token; a speculative step — one that queued or finished
    a verify pass — yields one or more. With plain decoding's overlap of host and device a
    verify pass's cost lands partly in the step that queued it and partly in the step that
    waits for it, so the controller compares throughput, not passes: seconds per token over
    the last ``window`` steps of each kind (the slowest step of each window left out, so one
    stall on a shared machine does not decide). Speculation pays when its seconds per token are
    no more than plain decoding's and its verify passes keep drafts (at least ``min_gain``
    tokens each on average: a pass that keeps nothing never pays, however noisy clocks compare).

    When it does not pay, drafting stops for ``backoff`` steps, ``growth`` times longer each
    time it still does not pay (up to ``max_backoff``), and starts again from ``min_backoff``
    once it does (each losing probe costs about one plain step on the demo model, so on free
    text they must be few: 8, 32, 128, 256, … steps apart by default);
    while drafting, one plain step in ``refresh`` keeps plain decoding's time current (the
    context, so both costs, grow). The first draft is a short ``probe``; then the draft is as
    long as its last position is likely to be reached and kept: with ``alpha`` the measured
    chance a draft token is accepted given the one before it was, the longest ``i`` with
    ``alpha**i >= min_reach``.
    """

    def __init__(
        self,
        max_draft: int = DEFAULT_SPECULATIVE_TOKENS,
        *,
        smoothing: float = 0.2,
        window: int = 32,
        min_gain: float = 0.1,
        min_reach: float = 0.25,
        min_backoff: int = 8,
        growth: int = 4,
        max_backoff: int = 256,
        refresh: int = 64,
        probe: int = 1,
    ) -> None:
        if max_draft < 0:
            raise ValueError(f"max_draft must be >= 0, not {max_draft}")
        self.max_draft = max_draft
        self._smoothing, self._min_gain, self._min_reach = smoothing, min_gain, min_reach
        self._min_backoff, self._growth, self._max_backoff = min_backoff, growth, max_backoff
        self._refresh, self._probe = refresh, probe
        self._backoff = min_backoff
        self._cooldown = 0
        self._since_plain = 0
        # (tokens, seconds) of recent steps of each kind
        self._plain: deque[tuple[int, float]] = deque(maxlen=window)
        self._spec: deque[tuple[int, float]] = deque(maxlen=window)
        self._gain: float | None = None  # smoothed accepted drafts per verify pass
        self._hits = 0.0  # decayed counts of accepted draft tokens and of rejections
        self._misses = 0.0
        self._verify_steps = self._plain_steps = self._drafted = self._accepted = 0

    def draft_length(self) -> int:
        """The most tokens to draft for the next step; ``0`` means a plain step."""
        if self.max_draft == 0 or self._cooldown > 0:
            return 0
        if self._plain and self._since_plain >= self._refresh:
            return 0
        seen = self._hits + self._misses
        if seen == 0:  # nothing known yet: a short probe costs little if the drafts are wrong
            return min(self.max_draft, self._probe)
        alpha = self._hits / seen
        if alpha >= 1:
            return self.max_draft
        if alpha <= 0:
            return 1
        reach = math.log(self._min_reach) / math.log(alpha)  # alpha**reach == min_reach
        return max(1, min(self.max_draft, int(reach)))

    @staticmethod
    def seconds_per_token(steps: Iterable[tuple[int, float]]) -> float | None:
        """Total seconds over total tokens, the slowest step left out (when there are 4+)."""
        steps = list(steps)
        if not steps:
            return None
        if len(steps) >= 4:
            steps.remove(max(steps, key=lambda step: step[1]))
        return sum(seconds for _, seconds in steps) / max(sum(n for n, _ in steps), 1)

    def record_step(self, tokens: int, seconds: float, *, speculative: bool) -> None:
        """A step returned ``tokens`` tokens ``seconds`` after the previous one; ``speculative``
        if it queued or finished a verify pass."""
        if speculative:
            self._spec.append((tokens, seconds))
            return
        self._plain_steps += 1
        self._since_plain = 0
        self._cooldown = max(self._cooldown - 1, 0)
        self._plain.append((tokens, seconds))

    def record_verify(self, drafted: int, accepted: int) -> None:
        """A verify pass of ``drafted`` tokens kept ``accepted`` of them (after the
        :meth:`record_step` of the step that finished it): decides whether to go on."""
        if not 0 <= accepted <= drafted:
            raise ValueError(f"accepted {accepted} of {drafted} drafted")
        self._verify_steps += 1
        self._since_plain += 1
        self._drafted += drafted
        self._accepted += accepted
        decay = 1 - self._smoothing
        self._hits = self._hits * decay + accepted
        self._misses = self._misses * decay + (1 if accepted < drafted else 0)
        old = self._gain
        self._gain = accepted if old is None else old + self._smoothing * (accepted - old)
        plain = self.seconds_per_token(self._plain)
        spec = self.seconds_per_token(self._spec)
        if plain is None or spec is None:
            return
        if self._gain >= self._min_gain and spec <= plain:
            self._backoff = self._min_backoff
        else:
            self._cooldown = self._backoff
            self._backoff = min(self._growth * self._backoff, self._max_backoff)

    def statistics(self) -> SpeculationStatistics:
        return SpeculationStatistics(
            verify_steps=self._verify_steps,
            plain_steps=self._plain_steps,
            drafted=self._drafted,
            accepted=self._accepted,
            plain_seconds_per_token=self.seconds_per_token(self._plain),
            speculative_seconds_per_token=self.seconds_per_token(self._spec),
        )

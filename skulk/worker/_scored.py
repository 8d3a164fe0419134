"""Text deltas that carry the log-probabilities of the tokens behind them."""

from __future__ import annotations

from collections.abc import Iterable

from skulk.wire.runner import TokenLogprob


class ScoredText(str):
    """A text delta (a ``str``) with ``logprobs``: one entry per token that produced it, for a
    request that asked for them (``SamplingParams.logprobs``).

    A ``str`` subclass on purpose: every consumer that treats a generation's deltas as text
    (the stream driver, formats without log-probabilities, WebSocket, Anthropic, Ollama) keeps
    working unchanged, and those that render log-probabilities read ``logprobs``. Slicing or
    joining gives a plain ``str``: code that merges or splits deltas uses :func:`join_scored`
    and keeps the entries on the first piece.
    """

    logprobs: tuple[TokenLogprob, ...]

    def __new__(cls, text: str, logprobs: Iterable[TokenLogprob] = ()) -> ScoredText:
        self = super().__new__(cls, text)
        self.logprobs = tuple(logprobs)
        return self


def logprobs_of(text: str) -> tuple[TokenLogprob, ...]:
    """The entries ``text`` carries (none for a plain ``str``)."""
    return text.logprobs if isinstance(text, ScoredText) else ()


def join_scored(parts: Iterable[str]) -> str:
    """``"".join(parts)``, keeping every part's entries in order: a :class:`ScoredText` when
    any part carries some, else a plain ``str``."""
    texts: list[str] = []
    entries: list[TokenLogprob] = []
    for part in parts:
        texts.append(str(part))
        entries.extend(logprobs_of(part))
    joined = "".join(texts)
    return ScoredText(joined, entries) if entries else joined

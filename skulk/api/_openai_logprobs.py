"""OpenAI's ``logprobs`` objects, from the entries a generation's deltas carry (sans-IO).

Chat Completions (``logprobs: true``, ``top_logprobs`` 0 to 20) answer, per choice,
``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}],
"refusal": null}``; legacy Completions (``logprobs`` 0 to 5) answer ``{"tokens",
"token_logprobs", "top_logprobs", "text_offset"}``, whose ``top_logprobs`` maps the likeliest
tokens *and* the sampled one to their logprobs (so up to ``logprobs + 1`` entries, as OpenAI
documents). In a stream each chunk carries the entries of the tokens behind its text; an entry
may come with empty text (a token whose text was held back, or cut by a stop string).

A token is spelled by its bytes (a token may hold part of a UTF-8 character): ``bytes`` lists
them, and ``token`` is their UTF-8 decoding with any incomplete character as ``\\xNN`` escapes.
``text_offset`` counts characters of those spellings from the start of the completion.
"""

from __future__ import annotations

from skulk.wire.runner import TokenLogprob, TopLogprob
from skulk.worker import logprobs_of


def token_text(token: bytes) -> str:
    """How ``token`` (its bytes) is spelled in ``token`` fields."""
    return token.decode("utf-8", "backslashreplace")


def _chat_entry(entry: TokenLogprob | TopLogprob) -> dict[str, object]:
    return {"token": token_text(entry.token), "logprob": entry.logprob, "bytes": list(entry.token)}


def chat_logprobs(text: str) -> dict[str, object]:
    """A chat choice's (or chunk's) ``logprobs`` for the entries ``text`` carries."""
    content = [
        {**_chat_entry(e), "top_logprobs": [_chat_entry(t) for t in e.top]}
        for e in logprobs_of(text)
    ]
    return {"content": content, "refusal": None}


def completion_logprobs(text: str, offset: int = 0) -> tuple[dict[str, object], int]:
    """A completion choice's (or chunk's) ``logprobs`` for the entries ``text`` carries, the
    first token at character ``offset`` of the completion; and the offset after the last."""
    tokens: list[str] = []
    values: list[float] = []
    tops: list[dict[str, float]] = []
    offsets: list[int] = []
    for entry in logprobs_of(text):
        spelled = token_text(entry.token)
        tokens.append(spelled)
        values.append(entry.logprob)
        top = {token_text(t.token): t.logprob for t in entry.top}
        top.setdefault(spelled, entry.logprob)
        tops.append(top)
        offsets.append(offset)
        offset += len(spelled)
    body: dict[str, object] = {
        "tokens": tokens,
        "token_logprobs": values,
        "top_logprobs": tops,
        "text_offset": offsets,
    }
    return body, offset

"""Which ready instance a request goes to, and which failures move it to the next one (sans-IO).

**Prefix affinity.** Each instance of a model keeps its own prefix cache, so a conversation's
later turns are fast only on the instance that served its earlier ones. :func:`prefix_key`
reduces a prompt to the part every turn of its conversation starts with — for a chat, the
tools and the messages up to and including the first ``user`` message (the head of the
rendered prompt: the system prompt and the opening question); for raw text, its first
:data:`TEXT_KEY_CHARS` characters. :func:`rank` orders the candidate instances by rendezvous
(highest-random-weight) hashing of that key with each instance id: a pure function of the key
and the set of instances, so every node ranks them the same, a conversation asked through any
node lands on the same instance, and conversations spread evenly over the instances (an
instance leaving moves only its own conversations).

**The balance bound.** :func:`choose` takes the first instance in that order unless it has more
than ``slack`` (:data:`AFFINITY_SLACK`) more requests in flight from this node than the least
loaded candidate; then load overrides affinity and the least loaded one serves (fewest in
flight, a local one, the lower gossiped load, the id). A prompt with no key (token counting,
embeddings) always goes to the least loaded instance, local first.

**Moving a refused request.** :func:`retry_reason` says whether a failure that came *before
any output* may be retried on the next instance of the order: the instance refused or could
not take it (``overloaded``, ``kv_cache_full``, ``not_ready`` — a runner loading or
restarting —, ``node_unreachable``, ``runner_stopped``). A failure the request itself may
cause (``runner_crashed``, a bad prompt) is never retried: it could take down every instance.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence

import attrs

from skulk.wire.runner import ChatPrompt, Prompt, TextPrompt
from skulk.worker import ModelUnavailable, RequestFailure

from ._errors import Overloaded, RemoteUnavailable

#: How many more of this node's requests the preferred instance may have in flight than the
#: least loaded candidate before load overrides prefix affinity.
AFFINITY_SLACK = 4
#: How much of a raw-text prompt is its key: a text conversation whose first prompt is shorter
#: keys its later turns differently (chat prompts have no such limit).
TEXT_KEY_CHARS = 256
#: A request is moved to another instance only this long after it arrived (seconds).
RETRY_WITHIN = 15.0

#: Runner and routing failure reasons that mean "this instance did not take the request".
RETRY_REASONS = frozenset({"node_unreachable", "kv_cache_full", "runner_stopped"})

#: How an instance was chosen: ``affinity`` (first in its prefix order), ``override`` (load
#: overrode affinity), ``least_loaded`` (no prefix key), ``only`` (one candidate).
CHOICES = ("affinity", "override", "least_loaded", "only")


def prefix_key(prompt: Prompt | None) -> bytes | None:
    """The bytes every turn of ``prompt``'s conversation starts with (see the module doc);
    ``None`` for no prompt."""
    if isinstance(prompt, ChatPrompt):
        head = []
        for message in prompt.messages:
            head.append(
                [
                    message.role,
                    message.content,
                    [[c.id, c.name, c.arguments] for c in message.tool_calls],
                    message.tool_call_id,
                ]
            )
            if message.role == "user":
                break
        return json.dumps(["chat", prompt.tools, head], ensure_ascii=False).encode()
    if isinstance(prompt, TextPrompt):
        return json.dumps(["text", prompt.text[:TEXT_KEY_CHARS]], ensure_ascii=False).encode()
    return None


def weight(key: bytes, instance: str) -> int:
    """``instance``'s rendezvous weight for ``key``: the same on every node and Python."""
    digest = hashlib.blake2b(key, digest_size=8, person=b"skulk-route")
    digest.update(b"\0" + instance.encode())
    return int.from_bytes(digest.digest(), "big")


def rank(key: bytes, instances: Sequence[str]) -> list[str]:
    """``instances`` by descending rendezvous weight for ``key`` (ties: by id)."""
    return sorted(instances, key=lambda i: (-weight(key, i), i))


@attrs.frozen
class Choice:
    """The instances to try, in order (the first serves; the rest, if it refuses), and how
    the first was chosen (one of :data:`CHOICES`)."""

    order: tuple[str, ...]
    how: str


def choose(
    key: bytes | None,
    candidates: Sequence[str],
    in_flight: Callable[[str], int],
    tie_break: Callable[[str], tuple[bool, float]],
    slack: int = AFFINITY_SLACK,
) -> Choice:
    """Order the ready ``candidates`` for a request with prefix ``key`` (see the module doc).
    ``in_flight(i)``: this node's requests in flight to ``i``; ``tie_break(i)``: ``(not
    local, gossiped load)`` of its node, lower is better."""
    if not candidates:
        raise ValueError("no candidates")

    def loaded(i: str) -> tuple[int, bool, float, str]:
        return (in_flight(i), *tie_break(i), i)

    if key is None:
        order = sorted(candidates, key=loaded)
        return Choice(tuple(order), "only" if len(order) == 1 else "least_loaded")
    order = rank(key, candidates)
    if len(order) == 1:
        return Choice(tuple(order), "only")
    least = min(order, key=loaded)
    if in_flight(order[0]) > in_flight(least) + slack:
        order.remove(least)
        return Choice((least, *order), "override")
    return Choice(tuple(order), "affinity")


def retry_reason(exc: BaseException) -> str | None:
    """Why ``exc``, raised before any output, lets the request move to the next instance
    (the reason the metrics count), or ``None`` when it must not move."""
    if isinstance(exc, Overloaded):
        return "overloaded"
    if isinstance(exc, ModelUnavailable | RemoteUnavailable):
        return "not_ready"
    if isinstance(exc, RequestFailure) and exc.reason in RETRY_REASONS:
        return exc.reason
    return None

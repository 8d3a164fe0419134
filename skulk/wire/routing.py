"""Any-node routing on the data plane: a request admitted over rpc, its answer on a data stream.

The API node calls rpc ``route.generate`` on the node running the instance's rank 0; the rpc
body is one :class:`RouteRequest` (encoded on its own, tagged ``"t": "RouteRequest"``). The
calling node is the link's authenticated peer, so the request does not name it. Once admitted
(the rpc answers), the serving node opens a data stream back to the caller and sends
:data:`RouteItem` chunks, one item per chunk:

1. one :class:`RouteHeader` naming the request (a stream whose first chunk is anything else
   is stopped at once);
2. :class:`RouteDelta` texts, with a :class:`RouteKeepalive` whenever nothing else was sent
   for the keepalive interval (so the caller can bound its wait for the next chunk);
3. exactly one of :class:`RouteEnd`, :class:`RouteFailed` or :class:`RouteNotReady`, sent as
   the stream's end chunk.

The caller stops the stream (data-stream stop) to cancel the generation.

Requests with one answer and no stream — counting a prompt's tokens (:class:`RouteTokenize`),
embedding inputs (:class:`RouteEmbed`) — go in rpc ``route.ask``, whose answer is one
:data:`RouteAnswer` (the serving node's admission bound applies as for a generation; the
rpc's deadline bounds the whole request).
"""

from __future__ import annotations

import attrs

from . import runner as _runner  # not its names: the wire spec test reads this namespace


@attrs.frozen
class RouteRequest:
    """Serve ``prompt`` on ``instance`` (whose rank 0 runs on the called node) and stream the
    answer back to the calling node under ``request_id`` (unique per calling node).
    ``trace_id``: the id of the API request this serves (its ``x-request-id``, not unique),
    which the serving node's log lines and flight recorder carry; ``None`` when there is none
    (an older sender)."""

    request_id: str
    instance: str
    prompt: _runner.Prompt
    params: _runner.SamplingParams
    trace_id: str | None = None


@attrs.frozen
class RouteHeader:
    """The first chunk of a route stream: which request it answers."""

    request_id: str


@attrs.frozen
class RouteDelta:
    """Generated text, in order (one or more of the runner's deltas, merged); ``logprobs``:
    the log-probabilities of the tokens that produced it, when the request asked for them."""

    text: str
    logprobs: tuple[_runner.TokenLogprob, ...] = ()


@attrs.frozen
class RouteKeepalive:
    """Nothing to say yet (a long prefill): the serving node is still working on it."""


@attrs.frozen
class RouteEnd:
    """The generation finished as ``end`` says (the runner's record, as is): the end of the
    stream."""

    end: _runner.GenerationEnd


@attrs.frozen
class RouteFailed:
    """The request failed on the serving node after it was admitted (``reason`` as a runner's:
    ``prompt_too_long``, ``runner_crashed``, ``runner_stopped``, …): the end of the stream."""

    reason: str
    message: str


@attrs.frozen
class RouteNotReady:
    """The instance stopped being ready between admission and the start of the generation:
    the end of the stream (nothing was generated)."""

    message: str


RouteItem = RouteHeader | RouteDelta | RouteKeepalive | RouteEnd | RouteFailed | RouteNotReady


# ---- one-answer requests: rpc route.ask ------------------------------------------------------


@attrs.frozen
class RouteTokenize:
    """Count ``prompt``'s tokens on ``instance`` (rpc ``route.ask``, answered in the rpc)."""

    request_id: str
    instance: str
    prompt: _runner.Prompt


@attrs.frozen
class RouteEmbed:
    """Embed ``inputs`` on ``instance`` (rpc ``route.ask``, answered in the rpc)."""

    request_id: str
    instance: str
    inputs: tuple[_runner.EmbedInput, ...]
    truncate: bool = False


@attrs.frozen
class RouteCounted:
    """The answer to :class:`RouteTokenize`."""

    prompt_tokens: int


@attrs.frozen
class RouteEmbedded:
    """The answer to :class:`RouteEmbed`: one vector per input, in order."""

    vectors: tuple[tuple[float, ...], ...]
    prompt_tokens: int


RouteAsk = RouteTokenize | RouteEmbed
RouteAnswer = RouteCounted | RouteEmbedded | RouteFailed | RouteNotReady

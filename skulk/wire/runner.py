"""Frames spoken between a node and its runner subprocess over a socketpair.

Parent → runner: :class:`Load`, :class:`Generate`, :class:`Tokenize`, :class:`Embed`,
:class:`Cancel`, :class:`Shutdown`.
Runner → parent: :class:`Hello`, :class:`LoadProgress`, :class:`Loaded`, :class:`WarmedUp`,
:class:`TokenChunk`, :class:`Finished`, :class:`Tokenized`, :class:`Embedded`,
:class:`RequestFailed`, :class:`RunnerFailed`, :class:`Heartbeat`, :class:`EngineStats`,
and for one rank of a sharded instance :class:`GroupJoining`,
:class:`GroupJoined`, :class:`CollectiveTrace`, :class:`CollectiveTimeout`.

A conversation: the runner starts and sends ``Hello``; the parent checks the protocol version and
sends ``Load``; the runner answers ``LoadProgress`` frames then ``Loaded`` (or ``RunnerFailed``),
runs a warm-up generation and sends ``WarmedUp``.
After that the parent sends ``Generate`` frames (several may be active at once, keyed by
``request_id``); each active request ends with exactly one ``Finished`` or ``RequestFailed``.
``Tokenize`` and ``Embed`` are requests too (same ids, same ``Cancel`` rule) whose one answer
is ``Tokenized`` / ``Embedded`` instead of ``Finished`` (or ``RequestFailed``).
Every ``Cancel`` is answered with exactly one ``Finished`` ending ``"cancelled"``: the
end of an active request, or, for an id the runner does not know (the request ended while the
Cancel was on its way), an acknowledgement with zero usage; the parent clears its cancel
deadline on that answer only. ``Shutdown`` asks the runner to exit cleanly. The runner sends
``Heartbeat`` every heartbeat interval from its main loop (idle, or between decode/prefill
steps), so silence means it is wedged, not merely busy; with a heartbeat it sends
``EngineStats`` when its engine counters changed (an older runner never does).

A rank of a sharded instance (``Load.shard`` set) first forms the instance's compute group: it
sends ``GroupJoining`` right before it starts joining and ``GroupJoined`` once every rank is in,
then loads (only the tensors its shard needs), and the warm-up runs on all ranks together.
Only rank 0 takes ``Generate`` / ``Cancel``; every rank heartbeats. While serving, each rank
sends at most one ``CollectiveTrace`` per heartbeat interval: its compute-group operations since
the last one, stamped with wall-clock time. A collective that outlives its deadline makes the
rank send ``CollectiveTimeout`` and exit; a collective that fails (a peer's connection lost) is
``RunnerFailed(reason="collective_failed")``.
"""

from __future__ import annotations

from typing import Literal

import attrs

PROTOCOL_VERSION = 6

FinishReason = Literal["stop", "length", "cancelled"]


@attrs.frozen
class SamplingParams:
    """How to pick tokens. ``seed=None`` means random; ``max_tokens=None`` means up to the
    context limit; ``top_k=0`` and ``top_p=1.0`` disable those filters; ``temperature=0`` is
    greedy. ``stop`` strings end generation and are never emitted.

    ``json_schema`` (compact JSON text, at most 64 KiB, see :func:`skulk.grammar.schema_text`)
    constrains the output to one JSON document valid for that schema (structured output);
    with ``tool_call`` the document is a tool call (:func:`skulk.grammar.tool_call_schema`),
    wrapped in the model's tool-call markers when its tokenizer has them. A runner that cannot
    enforce it refuses the request (``invalid_request`` for a schema it refuses,
    ``unsupported`` otherwise)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    #: ``None``: no log-probabilities; ``0`` to :data:`MAX_TOP_LOGPROBS`: each emitted token's
    #: log-probability and that many most likely alternatives (:class:`TokenLogprob`).
    logprobs: int | None = None
    json_schema: str | None = None
    tool_call: bool = False


@attrs.frozen
class ToolCall:
    """One call of a tool an assistant turn made: ``arguments`` is JSON text (an object)."""

    id: str
    name: str
    arguments: str


@attrs.frozen
class ChatMessage:
    """One turn. An ``assistant`` turn may carry the ``tool_calls`` it made; a ``tool`` turn
    is the result (``content``) of the call ``tool_call_id``."""

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None


@attrs.frozen
class ChatPrompt:
    """Messages rendered by the model's chat template, with the generation prompt added.
    ``tools``: the tools the model may call, as JSON text of an array of OpenAI-style
    ``{"type": "function", "function": {"name", "description", "parameters"}}`` (what chat
    templates take as ``tools``); ``None``: no tools."""

    messages: tuple[ChatMessage, ...]
    tools: str | None = None


@attrs.frozen
class TextPrompt:
    """Raw text, tokenized as is (legacy completions)."""

    text: str


Prompt = ChatPrompt | TextPrompt


@attrs.frozen
class Usage:
    """Tokens of one request; ``cached_tokens``: prompt tokens whose KV state the runner reused
    from its prefix cache instead of computing them (included in ``prompt_tokens``)."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


# ---- parent → runner -------------------------------------------------------------------------


@attrs.frozen
class ShardSpec:
    """One rank's part of a sharded instance.

    ``hosts`` are the ``host:port`` compute-group (``mlx.distributed`` ring) endpoints of every
    rank, by rank (the world size is ``len(hosts)``); this rank listens on ``hosts[rank]``.
    ``[start, end)`` are the layers this rank runs (``tensor``: every layer, ``0..layers``).
    ``connect_timeout`` bounds forming the group (every rank must start joining within it),
    ``collective_timeout`` any one distributed evaluation once formed (seconds): it must exceed
    the longest step, a prefill chunk of 512 tokens through the whole model.
    """

    sharding: Literal["pipeline", "tensor"]
    rank: int
    hosts: tuple[str, ...]
    start: int
    end: int
    connect_timeout: float
    collective_timeout: float

    @property
    def world(self) -> int:
        return len(self.hosts)


@attrs.frozen
class Load:
    """Load ``model_path``; ``shard`` set: as one rank of a sharded instance.

    ``kv_cache_bytes``: the KV memory the runner may give to running requests (``None``: its
    default, see ``skulk.engine._batch``); a request is admitted only while the KV bytes of
    every admitted request (prompt plus its most new tokens) fit, others wait in a FIFO of at
    most ``kv_waiting`` requests, beyond which a request fails ``kv_cache_full``.
    ``prefix_cache_bytes``: the memory for KV state of token prefixes kept for reuse (``0``
    disables the prefix cache; ``None``: the runner's default). ``speculative_tokens``: the
    most tokens drafted per step by n-gram speculative decoding while one request runs alone
    (``0`` disables it; ``None``: the runner's default).
    """

    model_path: str
    model_id: str
    shard: ShardSpec | None = None
    kv_cache_bytes: int | None = None
    prefix_cache_bytes: int | None = None
    kv_waiting: int = 64
    speculative_tokens: int | None = None


@attrs.frozen
class Generate:
    request_id: str
    prompt: Prompt
    params: SamplingParams


@attrs.frozen
class Tokenize:
    """Count ``prompt``'s tokens: the runner renders and tokenizes it (on its preparation
    thread, as for a ``Generate``) and answers one :class:`Tokenized` or ``RequestFailed``;
    nothing is decoded and no KV memory is taken."""

    request_id: str
    prompt: Prompt


@attrs.frozen
class TokenIds:
    """Text given as its token ids (an embedding input), used as they are."""

    tokens: tuple[int, ...]


EmbedInput = TextPrompt | TokenIds
"""One text to embed: text (tokenized as is, like a completion prompt) or its token ids."""


@attrs.frozen
class Embed:
    """Embed each of ``inputs``: answered by one :class:`Embedded` (a vector per input, in
    order) or ``RequestFailed``. ``truncate``: an input longer than the context is cut to it
    instead of failing ``prompt_too_long``. A sharded instance's rank 0 answers it."""

    request_id: str
    inputs: tuple[EmbedInput, ...]
    truncate: bool = False


@attrs.frozen
class Cancel:
    request_id: str


@attrs.frozen
class Shutdown:
    pass


# ---- runner → parent -------------------------------------------------------------------------


@attrs.frozen
class Hello:
    protocol_version: int
    pid: int
    skulk_version: str


@attrs.frozen
class LoadProgress:
    loaded: int
    total: int


@attrs.frozen
class Loaded:
    model_id: str
    context_length: int


@attrs.frozen
class WarmedUp:
    """The warm-up generation ran; the runner takes ``Generate`` frames from now on."""


#: The most alternatives per token ``SamplingParams.logprobs`` may ask for (OpenAI's limit).
MAX_TOP_LOGPROBS = 20


@attrs.frozen
class TopLogprob:
    """One candidate token: its id, its bytes (a token may hold part of a UTF-8 character)
    and its log-probability (see :class:`TokenLogprob`)."""

    token_id: int
    token: bytes
    logprob: float


@attrs.frozen
class TokenLogprob:
    """An emitted token's log-probability and the ``SamplingParams.logprobs`` most likely
    alternatives at its position, most likely first. Values are the log-softmax of the logits
    the sampler was given (after any structured-output mask, before temperature, top-p and
    top-k), floored at ``-9999.0`` so they stay finite."""

    token_id: int
    token: bytes
    logprob: float
    top: tuple[TopLogprob, ...] = ()


@attrs.frozen
class TokenChunk:
    """One decode step's output: the token ids and the text they add (may be empty while a
    multi-byte character or a possible stop string is held back); ``logprobs``, when the
    request asked for them, one entry per id in ``token_ids``."""

    request_id: str
    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@attrs.frozen
class GenerationEnd:
    """How a generation ended: the one end-of-generation record, made by the runner and
    carried as is to the API (in :class:`Finished`, then
    :class:`~skulk.wire.routing.RouteEnd` across nodes, then out of
    ``skulk.worker.ModelService.generate``). The text itself went out before it, in deltas
    (with their log-probabilities, when asked for); this says how it ended.

    ``stop_sequence``: the stop string that ended it, when one did (``finish_reason`` is then
    ``stop``). ``tool_calls``: the calls the model's own mlx-lm tool parser read from the
    answer of a request that offered tools (an ``id`` empty when the model gave none), with
    ``content`` the text without the call blocks; none (and ``content`` ``None``) when nothing
    was read — see :mod:`skulk.engine._tool_parse`. ``queue_seconds``: how long the request
    waited, tokenized, for room in the runner's KV budget before it was admitted (the
    ``skulk:request_queue_time_seconds`` metric)."""

    finish_reason: FinishReason
    usage: Usage
    stop_sequence: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    content: str | None = None
    queue_seconds: float = 0.0


@attrs.frozen
class PrefillProgress:
    """Request ``request_id``'s prompt is being computed: ``done`` of its ``total`` tokens are
    in its KV cache. Sent once when the request is admitted to the KV budget (``done``: the
    tokens a prefix-cache hit reused, often 0) and after each prefill chunk (the last with
    ``done == total``). It only marks the request's timeline; nothing waits for it."""

    request_id: str
    done: int
    total: int


@attrs.frozen
class Finished:
    """Request ``request_id`` ended, as ``end`` says."""

    request_id: str
    end: GenerationEnd


@attrs.frozen
class Tokenized:
    """The answer to :class:`Tokenize`: the prompt is ``prompt_tokens`` tokens long."""

    request_id: str
    prompt_tokens: int


@attrs.frozen
class Embedded:
    """The answer to :class:`Embed`: one vector per input, in order (each of the model's
    hidden size, L2-normalised; see :mod:`skulk.engine._embed`), and the tokens embedded."""

    request_id: str
    vectors: tuple[tuple[float, ...], ...]
    prompt_tokens: int


@attrs.frozen
class RequestFailed:
    """A request the runner could not serve; ``reason`` is a stable snake_case name
    (e.g. ``prompt_too_long``, ``engine_error``)."""

    request_id: str
    reason: str
    message: str


@attrs.frozen
class RunnerFailed:
    """The runner cannot go on (e.g. ``model_not_found``, ``load_error``); it exits after this."""

    reason: str
    message: str


@attrs.frozen
class Heartbeat:
    """Proof of life from the runner's main loop, with its memory readings."""

    seq: int
    rss_bytes: int
    mlx_active_bytes: int


@attrs.frozen
class EngineStats:
    """A serving runner's engine counters, sent with a heartbeat when any changed since the
    last one (at most one per heartbeat interval; rank 0 of a sharded instance sends its KV
    budget and requests, with zero speculation and prefix counters, the other ranks none).

    Cumulative since the runner started: ``speculation_*`` (n-gram speculative decoding, every
    request's, those still running included): forward passes that checked a draft
    (``verify_steps``) or fed one token (``plain_steps``) while a request ran alone, draft
    tokens checked (``drafted``) and kept (``accepted``); ``prefix_hits`` prompts that reused
    kept KV state, ``prefix_reused_tokens`` prompt tokens not computed thanks to it.
    Current: ``prefix_bytes`` / ``prefix_entries`` the prefix cache holds; ``kv_capacity_bytes``
    the KV budget and ``kv_reserved_bytes`` what admitted requests reserve of it; ``running``
    requests admitted (prefilling or decoding), ``queued`` waiting for KV room."""

    speculation_verify_steps: int
    speculation_plain_steps: int
    speculation_drafted: int
    speculation_accepted: int
    prefix_hits: int
    prefix_reused_tokens: int
    prefix_bytes: int
    prefix_entries: int
    kv_capacity_bytes: int
    kv_reserved_bytes: int
    running: int
    queued: int

    @property
    def acceptance_rate(self) -> float | None:
        """Draft tokens kept per draft token checked; ``None`` while nothing was drafted."""
        if self.speculation_drafted == 0:
            return None
        return self.speculation_accepted / self.speculation_drafted


@attrs.frozen
class GroupJoining:
    """Sent right before the rank starts joining its compute group."""


@attrs.frozen
class GroupJoined:
    """Every rank of the compute group is connected; ``world`` ranks in all."""

    world: int


@attrs.frozen
class CollectiveEntry:
    """One compute-group operation of a rank: ``collective`` (``barrier(loaded)``,
    ``broadcast(control)``, ``forward(prefill)``, ``forward(decode)``) at lockstep ``step``,
    started at wall-clock time ``at`` (seconds since the epoch, the rank's clock), lasting
    ``seconds``; ``detail`` says what the step carried (e.g. ``open 2``, ``free 1``), often
    empty."""

    at: float
    collective: str
    step: int
    seconds: float
    detail: str = ""


@attrs.frozen
class CollectiveTrace:
    """A rank's compute-group operations since its previous trace (at most one per heartbeat
    interval); ``dropped`` routine entries were left out to keep the frame small."""

    entries: tuple[CollectiveEntry, ...]
    dropped: int = 0


@attrs.frozen
class CollectiveTimeout:
    """``collective`` at lockstep ``step`` did not complete within ``seconds``: a peer is stuck
    or gone. ``recent`` are the rank's last operations before it. The rank exits after this."""

    collective: str
    step: int
    seconds: float
    recent: tuple[CollectiveEntry, ...] = ()


ToRunner = Load | Generate | Tokenize | Embed | Cancel | Shutdown
FromRunner = (
    Hello
    | LoadProgress
    | Loaded
    | WarmedUp
    | TokenChunk
    | PrefillProgress
    | Finished
    | Tokenized
    | Embedded
    | RequestFailed
    | RunnerFailed
    | Heartbeat
    | EngineStats
    | GroupJoining
    | GroupJoined
    | CollectiveTrace
    | CollectiveTimeout
)

"""One model (or one rank of a sharded model) served on this node by one runner.

:class:`ModelService` resolves the model (generating the built-in demo model on first use, or
fetching the weights from a peer), starts a :class:`~skulk.runner.Runner`, and relaunches it
with exponential backoff when it fails for a reason relaunching could fix. A rank of a pipeline
or tensor instance (``shard``) is different: once its weights are here it waits until every
rank's are (``group_ready``), and it is never relaunched alone — one rank cannot rejoin a
compute group whose other ranks are gone — so its failure is final for this instance and the
leader re-places the whole instance. :meth:`ModelService.generate` is what the API calls: it
yields text deltas and ends with the runner's :class:`~skulk.wire.runner.GenerationEnd`, or
raises a typed :class:`RequestFailure` — it never waits on a runner that is gone.
"""

from __future__ import annotations

import logging
import math
import random
import uuid
from collections import Counter, deque
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from pathlib import Path
from typing import Literal

import attrs
import trio

from skulk.actors import Cooldown, CooldownPolicy, HalfOpenBreaker, RestartPolicy
from skulk.runner import Runner, RunnerConfig, RunnerCrashed, RunnerError
from skulk.wire.runner import (
    Embed,
    Embedded,
    EmbedInput,
    GenerationEnd,
    Prompt,
    RequestFailed,
    SamplingParams,
    ShardSpec,
    Tokenize,
    Tokenized,
)
from skulk.worker._coalesce import coalesce

log = logging.getLogger("skulk.worker")

State = Literal[
    "resolving",
    "staged",
    "connecting",
    "loading",
    "warming",
    "ready",
    "restarting",
    "failed",
    "stopped",
]
"""``resolving``: getting the weights here (generating, or fetching from a peer); ``staged``: a
rank whose weights are here, waiting for the other ranks'; ``connecting``: its runner is
joining the compute group."""

#: Runners (the current one and the ones before it) whose flight recorders are kept.
KEPT_RUNNERS = 4


@attrs.frozen
class ModelStatus:
    model_id: str
    state: State
    loaded: int = 0
    total: int = 0
    restarts: int = 0
    failure_reason: str | None = None
    failure_message: str | None = None
    breaker: str = "closed"
    """The crash-loop breaker: ``closed``, ``open`` (cooling down), ``half_open`` (one try)."""
    crash_loop_trips: int = 0
    """Crash loops in a row; each doubles the cool-down."""
    retry_in: float | None = None
    """Seconds until a failed model is tried again by itself (None: no retry scheduled)."""

    @property
    def ready(self) -> bool:
        return self.state == "ready"


@attrs.frozen
class ServiceStatistics:
    """A snapshot of a :class:`ModelService`'s counters since it was made: runners started,
    runner exits by failure reason, and the prompt tokens of the generations it finished,
    with those its runners' prefix caches supplied (``Usage.cached_tokens``)."""

    starts: int
    exits: dict[str, int]
    prompt_tokens: int
    cached_tokens: int


@attrs.frozen
class Embedding:
    """The vectors for a request's inputs, in order, and the tokens they took."""

    vectors: tuple[tuple[float, ...], ...]
    prompt_tokens: int


class ModelUnavailable(Exception):
    """No runner can take the request now (loading, restarting or failed)."""

    def __init__(self, status: ModelStatus) -> None:
        super().__init__(f"model {status.model_id} is {status.state}")
        self.status = status


class RequestFailure(Exception):
    """A request ended without finishing; ``reason`` is a typed name (``prompt_too_long``,
    ``runner_crashed``, ``runner_stopped``, ...)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


#: Relaunch a failed runner after 0.5 s, 1 s, 2 s … (at most 30 s); more than 5 failures within
#: 5 minutes is a crash loop: the model is marked failed instead of burning memory forever.
RUNNER_RESTARTS = RestartPolicy(
    initial_backoff=0.5, max_backoff=30.0, multiplier=2.0, jitter=0.1, max_restarts=5, window=300.0
)
#: A crash-looping model is tried once more after 30 s, then 60 s, 120 s … (at most 10 min)
#: while each single try fails; a try that comes up closes the breaker again.
CRASH_LOOP_COOLDOWN = CooldownPolicy(initial=30.0, maximum=600.0, multiplier=2.0)


class ModelService:
    def __init__(
        self,
        model_id: str,
        resolve: Callable[[], Awaitable[Path]],
        runner_config: RunnerConfig | None = None,
        policy: RestartPolicy = RUNNER_RESTARTS,
        cooldown: CooldownPolicy = CRASH_LOOP_COOLDOWN,
        rng: random.Random | None = None,
        stream_interval: float = 0.0,
        *,
        shard: ShardSpec | None = None,
        group_ready: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.model_id = model_id
        self.shard = shard
        self._resolve = resolve
        self._group_ready = group_ready
        self._runner_config = runner_config or RunnerConfig()
        self._breaker = HalfOpenBreaker(policy, cooldown, rng or random.Random())
        self._stream_interval = stream_interval
        self._status = ModelStatus(model_id, "resolving")
        self._runner: Runner | None = None
        self._recent: deque[Runner] = deque(maxlen=KEPT_RUNNERS)
        self._incarnation = 0
        self._retry: trio.Event | None = None  # set while failed: an operator's retry sets it
        self._retry_at: float | None = None  # when a cool-down ends (trio clock)
        self._exits: Counter[str] = Counter()
        self._prompt_tokens = self._cached_tokens = 0

    def status(self) -> ModelStatus:
        if self._retry_at is None:
            return self._status
        return attrs.evolve(self._status, retry_in=max(0.0, self._retry_at - trio.current_time()))

    def statistics(self) -> ServiceStatistics:
        return ServiceStatistics(
            self._incarnation, dict(self._exits), self._prompt_tokens, self._cached_tokens
        )

    def recent_runners(self) -> tuple[Runner, ...]:
        """The last few runners, oldest first (the newest may be the current one)."""
        return tuple(self._recent)

    def retry_now(self) -> bool:
        """An operator's "try again": end a failed model's cool-down (or its wait for an
        operator, after a failure relaunching cannot fix) at once. Returns False, changing
        nothing, unless the model is failed — a working runner is never restarted — or this is
        a rank of a sharded instance (only re-placing the whole instance brings it back)."""
        if self._status.state != "failed" or self._retry is None or self.shard is not None:
            return False
        log.warning("model %s: retry requested by an operator", self.model_id)
        self._retry.set()
        return True

    async def run(self) -> None:
        """Keep a runner up until cancelled. A model that failed is tried again after its
        cool-down (a crash loop) or when an operator asks (:meth:`retry_now`)."""
        try:
            while True:
                cooldown = await self._keep_up()
                await self._wait_for_retry(cooldown)
        finally:
            self._runner = None
            self._retry = None
            self._set(state="stopped", retry_in=None)

    async def _keep_up(self) -> float | None:
        """Run runners until the model fails; return the cool-down before the next try
        (``None``: wait for an operator)."""
        self._set(state="resolving")
        try:
            path = await self._resolve()
        except Exception as exc:
            reason = getattr(exc, "reason", None)
            if not isinstance(reason, str):
                reason = "model_not_found" if isinstance(exc, LookupError) else "model_unavailable"
            self._set(state="failed", failure_reason=reason, failure_message=str(exc))
            log.error("model %s: %s", self.model_id, exc)
            return None
        if self._group_ready is not None:
            self._set(state="staged")
            await self._group_ready()
        while True:
            self._incarnation += 1
            runner = Runner(
                self.model_id,
                str(path),
                self._runner_config,
                incarnation=self._incarnation,
                on_phase=self._follow,
                shard=self.shard,
            )
            self._recent.append(runner)
            self._set(state="connecting" if self.shard else "loading", loaded=0, total=0)
            started = trio.current_time()
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(runner.run)
                    self._runner = runner
                    self._breaker.succeeded()
                    self._set(
                        state="ready",
                        failure_reason=None,
                        failure_message=None,
                        breaker=self._breaker.state,
                    )
            except* RunnerError:
                pass  # recorded as runner.failure
            self._runner = None
            failure = runner.failure or RunnerCrashed("runner stopped unexpectedly")
            self._exits[failure.reason] += 1
            self._set(failure_reason=failure.reason, failure_message=failure.message)
            if not failure.retryable or self.shard is not None:
                self._set(state="failed")
                log.error(
                    "model %s failed: %s (%s)",
                    self.model_id,
                    failure,
                    "the leader re-places the instance"
                    if self.shard is not None
                    else "retry: POST /v1/diagnostics/node/retry",
                )
                return None
            decision = self._breaker.record_crash(
                trio.current_time(), trio.current_time() - started
            )
            if isinstance(decision, Cooldown):
                self._set(
                    state="failed",
                    failure_reason="crash_loop",
                    failure_message=f"{decision.crashes} runner failure(s) within "
                    f"{decision.window:g}s, last: {failure}",
                    breaker=self._breaker.state,
                    crash_loop_trips=decision.trips,
                )
                log.error(
                    "model %s: crash loop (%s); trying once more in %.0fs",
                    self.model_id,
                    failure,
                    decision.delay,
                )
                return decision.delay
            self._set(state="restarting", restarts=self._status.restarts + 1)
            log.warning(
                "model %s: %s; relaunching in %.1fs", self.model_id, failure, decision.delay
            )
            await trio.sleep(decision.delay)

    async def _wait_for_retry(self, cooldown: float | None) -> None:
        """Wait out the cool-down (forever when ``None``) unless an operator retries first;
        then allow one half-open attempt."""
        self._retry = trio.Event()
        deadline = math.inf if cooldown is None else trio.current_time() + cooldown
        self._retry_at = deadline if cooldown is not None else None
        with trio.move_on_at(deadline):
            await self._retry.wait()
        self._retry = None
        self._retry_at = None
        self._breaker.half_open()
        self._set(breaker=self._breaker.state)
        log.info("model %s: trying again after its failure", self.model_id)

    async def generate(
        self, prompt: Prompt, params: SamplingParams
    ) -> AsyncGenerator[str | GenerationEnd, None]:
        """Yield text deltas, then the runner's :class:`~skulk.wire.runner.GenerationEnd`.
        Raises :class:`ModelUnavailable` before any output if no runner is ready,
        :class:`RequestFailure` if it fails."""
        runner = self._runner
        if runner is None or not self._status.ready:
            raise ModelUnavailable(self._status)
        request_id = uuid.uuid4().hex
        try:
            async with (
                runner.open_request(request_id, prompt, params) as events,
                aclosing(coalesce(events, self._stream_interval)) as deltas,
            ):
                async for delta in deltas:
                    if isinstance(delta, str):
                        yield delta
                    elif isinstance(delta, RequestFailed):
                        raise RequestFailure(delta.reason, delta.message)
                    elif delta.end.finish_reason == "cancelled":  # cancelled by someone else
                        raise RequestFailure("cancelled", "the request was cancelled")
                    else:
                        self._prompt_tokens += delta.end.usage.prompt_tokens
                        self._cached_tokens += delta.end.usage.cached_tokens
                        yield delta.end
                        return
        except RunnerError as exc:
            raise RequestFailure(exc.reason, exc.message) from exc
        # The channel closed without a terminal event: the runner is gone.
        failure = runner.failure
        if failure is not None:
            raise RequestFailure(failure.reason, failure.message)
        raise RequestFailure("runner_stopped", "the runner was stopped")

    async def count_tokens(self, prompt: Prompt) -> int:
        """How many tokens ``prompt`` is for this model (rendered and tokenized on the runner,
        nothing decoded). Raises as :meth:`generate` does."""
        answer = await self._ask(Tokenize(uuid.uuid4().hex, prompt))
        assert isinstance(answer, Tokenized)
        return answer.prompt_tokens

    async def embed(self, inputs: tuple[EmbedInput, ...], truncate: bool = False) -> Embedding:
        """One vector per input (see :mod:`skulk.engine._embed`). Raises as :meth:`generate`
        does."""
        answer = await self._ask(Embed(uuid.uuid4().hex, inputs, truncate))
        assert isinstance(answer, Embedded)
        return Embedding(answer.vectors, answer.prompt_tokens)

    async def _ask(self, frame: Tokenize | Embed) -> Tokenized | Embedded:
        runner = self._runner
        if runner is None or not self._status.ready:
            raise ModelUnavailable(self._status)
        try:
            answer = await runner.ask(frame)
        except RunnerError as exc:
            raise RequestFailure(exc.reason, exc.message) from exc
        if isinstance(answer, RequestFailed):
            raise RequestFailure(answer.reason, answer.message)
        if answer is None:
            failure = runner.failure
            if failure is not None:
                raise RequestFailure(failure.reason, failure.message)
            raise RequestFailure("runner_stopped", "the runner was stopped")
        return answer

    def _follow(self, runner: Runner) -> None:
        """Mirror a starting runner's progress in the model's status."""
        loaded, total = runner.progress
        if runner.phase in ("connecting", "loading", "warming"):
            self._set(state=runner.phase, loaded=loaded, total=total)

    def _set(self, **changes: object) -> None:
        self._status = attrs.evolve(self._status, **changes)  # type: ignore[arg-type]

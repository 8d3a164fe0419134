"""Request metrics, observed once per request where it ends (vLLM's names, ``skulk:``).

:meth:`RequestMetrics.start` gives a :class:`RequestObserver` for one generation; the
serving path calls :meth:`RequestObserver.item` with each item it passes on (a text delta or
the :class:`~skulk.wire.runner.GenerationEnd`) and :meth:`RequestObserver.failed` when the
generation raises. The per-delta cost is one ``None`` check (the first delta takes the time of
the first token); everything else happens once, at the end. Token counts come from the
runner's :class:`~skulk.wire.runner.Usage`, the queue time from its
:class:`~skulk.wire.runner.GenerationEnd`.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram

from skulk.wire.runner import GenerationEnd

from ._histogram import WeightedHistogram

#: Where a request counted on this node was served: on this node (``local``) or routed to
#: the node running its instance (``remote``).
Route = str

#: vLLM's buckets for TTFT, extended below 1 ms (small models on one machine are that fast).
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
    0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


class RequestMetrics:
    """The request instruments of one node, on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        per_instance = ("model", "instance")
        self.ttft = Histogram(
            "skulk:time_to_first_token_seconds",
            "Seconds from a request's arrival at this node to its first token (or its end).",
            per_instance,
            registry=registry,
            buckets=TTFT_BUCKETS,
        )
        self.e2e = Histogram(
            "skulk:e2e_request_latency_seconds",
            "Seconds from a request's arrival at this node to its end.",
            per_instance,
            registry=registry,
            buckets=E2E_BUCKETS,
        )
        self.queue = Histogram(
            "skulk:request_queue_time_seconds",
            "Seconds a request waited, tokenized, for room in its runner's KV budget.",
            per_instance,
            registry=registry,
            buckets=TTFT_BUCKETS,
        )
        self.itl = WeightedHistogram(
            "skulk:inter_token_latency_seconds",
            "Seconds between a request's tokens after the first (each request's n-1 intervals "
            "observed at its mean interval).",
            per_instance,
            ITL_BUCKETS,
        )
        registry.register(self.itl)
        self.prompt_tokens = Counter(
            "skulk:prompt_tokens",
            "Prompt tokens of the requests that finished.",
            (*per_instance, "route"),
            registry=registry,
        )
        self.generation_tokens = Counter(
            "skulk:generation_tokens",
            "Tokens generated for the requests that finished.",
            (*per_instance, "route"),
            registry=registry,
        )
        self.success = Counter(
            "skulk:request_success",
            "Requests that finished, by how (stop: the model ended or a stop string; length: "
            "max_tokens or the context).",
            (*per_instance, "route", "finish_reason"),
            registry=registry,
        )
        self.errors = Counter(
            "skulk:request_errors",
            "Requests that failed, by typed reason (overloaded and kv_cache_full are 429s).",
            (*per_instance, "route", "reason"),
            registry=registry,
        )
        self.choices = Counter(
            "skulk:route_choices",
            "Generations routed from this node, by how their instance was chosen (affinity: "
            "the prompt's prefix order; override: load overrode affinity; least_loaded: no "
            "prompt to key; only: one ready instance).",
            (*per_instance, "choice"),
            registry=registry,
        )
        self.moves = Counter(
            "skulk:route_moves",
            "Requests moved to the next ready instance because this one refused them before "
            "any output, by reason (overloaded, kv_cache_full, not_ready, node_unreachable, "
            "runner_stopped).",
            (*per_instance, "reason"),
            registry=registry,
        )

    def start(self, model: str, instance: str, route: Route) -> RequestObserver:
        """Observe one generation that starts now."""
        return RequestObserver(self, model, instance, route)

    def chosen(self, model: str, instance: str, how: str) -> None:
        """Count a generation routed to ``instance``, chosen ``how``."""
        self.choices.labels(model, instance, how).inc()

    def moved(self, model: str, instance: str, reason: str) -> None:
        """Count a generation ``instance`` refused before any output, moved elsewhere."""
        self.moves.labels(model, instance, reason).inc()

    def refused(self, model: str, instance: str, route: Route, reason: str) -> None:
        """Count a request that failed before any generation started (no instance, none
        ready, over capacity)."""
        self.errors.labels(model, instance, route, reason).inc()


class RequestObserver:
    """One generation's observations (see the module doc). Ends once: the first of
    :meth:`item` with the ``GenerationEnd``, :meth:`failed` or :meth:`abandoned` counts."""

    __slots__ = ("_first", "_metrics", "_start", "done", "instance", "model", "route")

    def __init__(self, metrics: RequestMetrics, model: str, instance: str, route: Route) -> None:
        self._metrics = metrics
        self.model = model
        self.instance = instance
        self.route = route
        self._start = time.perf_counter()
        self._first: float | None = None
        self.done = False

    def item(self, item: str | GenerationEnd) -> None:
        """An item the generation yielded: the first one times the first token; the
        ``GenerationEnd`` ends the request."""
        if self._first is None:
            self._first = time.perf_counter()
        if isinstance(item, GenerationEnd):
            self._finished(item)

    def failed(self, reason: str) -> None:
        """The generation failed with a typed ``reason`` (a runner's failure reason,
        ``overloaded``, ``not_ready``, ...)."""
        if not self.done:
            self.done = True
            self._metrics.errors.labels(self.model, self.instance, self.route, reason).inc()

    def _finished(self, end: GenerationEnd) -> None:
        if self.done:
            return
        self.done = True
        m, labels = self._metrics, (self.model, self.instance)
        now = time.perf_counter()
        first = self._first if self._first is not None else now
        m.ttft.labels(*labels).observe(first - self._start)
        m.e2e.labels(*labels).observe(now - self._start)
        m.queue.labels(*labels).observe(end.queue_seconds)
        generated = end.usage.completion_tokens
        if generated > 1:
            m.itl.observe(labels, (now - first) / (generated - 1), generated - 1)
        counted = (*labels, self.route)
        m.prompt_tokens.labels(*counted).inc(end.usage.prompt_tokens)
        m.generation_tokens.labels(*counted).inc(generated)
        m.success.labels(*counted, end.finish_reason).inc()

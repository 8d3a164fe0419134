"""What this node serves, for its telemetry readings (:attr:`NodeReadings.serving`).

Each telemetry round (once a second) :meth:`ServingSampler.sample` turns the runners this node
hosts into :class:`~skulk.wire.telemetry.RunnerReading` rows: phase, the engine's last
counters (running, waiting, KV use), tokens/s over the last :data:`RATE_WINDOW` seconds and the
median time to first token of the runner's recent requests. Nothing is counted per token here:
the rate is the difference of the runner's own ``tokens_out`` counter between samples, and the
times to first token are kept by the runner's request table, one per request.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping

from skulk.wire.telemetry import MAX_SERVING, RunnerReading
from skulk.worker._model_service import ModelService
from skulk.worker._reconciler import Assignment, phase_of

#: Seconds of ``tokens_out`` history a tokens/s figure covers.
RATE_WINDOW = 10.0


class ServingSampler:
    """Rows for this node's runners (at most :data:`MAX_SERVING`), with tokens/s remembered
    across samples. Single-threaded (the node's Trio loop); never blocks."""

    def __init__(self, window: float = RATE_WINDOW) -> None:
        self._window = window
        # (instance, rank) -> the runner incarnation counted, and its (time, tokens_out) samples
        self._history: dict[tuple[str, int], tuple[int, deque[tuple[float, int]]]] = {}

    def sample(
        self,
        assignments: Mapping[str, Assignment],
        services: Mapping[str, ModelService],
        now: float,
    ) -> tuple[RunnerReading, ...]:
        """The rows for the ``services`` this node runs (by instance id; ``assignments`` give
        their ranks), ordered by instance id, at local monotonic time ``now``."""
        rows: list[RunnerReading] = []
        seen: set[tuple[str, int]] = set()
        for instance in sorted(services)[:MAX_SERVING]:
            service = services[instance]
            a = assignments.get(instance)
            rank = a.rank if a is not None else 0
            seen.add((instance, rank))
            rows.append(self._row(instance, rank, service, now))
        for gone in set(self._history) - seen:
            del self._history[gone]
        return tuple(rows)

    def _row(self, instance: str, rank: int, service: ModelService, now: float) -> RunnerReading:
        status = service.status()
        phase, failure = phase_of(status)
        runners = service.recent_runners()
        runner = runners[-1] if runners else None
        engine = runner.engine_statistics() if runner is not None and status.ready else None
        rate = 0.0
        ttft: float | None = None
        if runner is not None:
            tokens = runner.statistics().tokens_out
            rate = self._rate((instance, rank), runner.incarnation, tokens, now)
            ttfts = runner.recent_ttfts()
            ttft = statistics.median(ttfts) if ttfts else None
        return RunnerReading(
            instance=instance,
            model=service.model_id,
            rank=rank,
            phase=phase,
            running=engine.running if engine is not None else 0,
            waiting=engine.queued if engine is not None else 0,
            kv_used_bytes=engine.kv_reserved_bytes if engine is not None else 0,
            kv_capacity_bytes=engine.kv_capacity_bytes if engine is not None else 0,
            tokens_per_s=rate,
            ttft_p50_s=ttft,
            failure=failure,
            retry_in_s=status.retry_in,
        )

    def _rate(self, key: tuple[str, int], incarnation: int, tokens: int, now: float) -> float:
        """Tokens per second over the window, from the samples of this runner incarnation."""
        known = self._history.get(key)
        if known is None or known[0] != incarnation:
            known = (incarnation, deque())
            self._history[key] = known
        samples = known[1]
        samples.append((now, tokens))
        while len(samples) > 1 and samples[1][0] <= now - self._window:
            samples.popleft()
        first_at, first_tokens = samples[0]
        if now <= first_at:
            return 0.0
        return max(0, tokens - first_tokens) / (now - first_at)

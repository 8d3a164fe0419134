"""``place --wait``: following one instance's runners to ``ready``. The core is pure.

:class:`Follower` turns each answer of ``GET /v1/instances/{id}`` (or its absence: the node
answered ``unknown_instance``) into a :class:`WaitView`: done, failed with a reason, or on
its way with a fraction for the progress bar and a one-line summary. :func:`follow` is the
loop around it (poll, report, sleep) with the clock, the sleep and the reporter injected, so
that tests drive it without a network or time passing.

The bar counts, per rank, the phases a runner goes through: ``pending`` 0, ``fetching``
from 5% to 65% as its weights arrive, ``connecting`` 70%, ``loading`` 80%, ``ready`` 100%;
the instance's fraction is the mean over its ranks.

The instance has failed when it is ``failed`` or one of its runners is ``failed`` or
``stopped``: the leader then re-places it under a new id (see ``skulk ps``) or gives up, and
this id will never be ready. An instance that was seen and then is gone was deleted or
re-placed. One never seen yet may not have reached the State of the node asked: it is
waited for like a pending one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs

from skulk.cli._http import ApiClient, ApiRefused, ClientError, quote_segment
from skulk.cli._tables import NONE, JsonObject, runner_phase, shards_of, text

#: The share of the bar a rank has reached in each phase (fetching: the start of its span).
PHASE_FRACTION = {
    "pending": 0.0,
    "fetching": 0.05,
    "connecting": 0.70,
    "loading": 0.80,
    "ready": 1.0,
}
#: The span of the bar a fetch covers, from its start, as its bytes arrive.
FETCH_SPAN = 0.60
#: Runner phases after which this instance id will never be ready.
FAILED_PHASES = ("failed", "stopped")
#: Seconds between two polls.
POLL_INTERVAL = 0.5


@attrs.frozen
class WaitView:
    """What one poll shows: ``ready``; or ``failure`` (why it never will be); else on its
    way, ``fraction`` of the bar done (0..1) and ``summary`` (the phase of each rank)."""

    ready: bool
    failure: str | None
    fraction: float
    summary: str


@attrs.define(eq=False)
class PlacementFailed(ClientError):
    """Instance ``instance`` will never be ready: ``reason`` says why."""

    instance: str
    reason: str

    def describe(self) -> str:
        return f"placement_failed: {self.instance}: {self.reason}"


@attrs.define(eq=False)
class WaitTimedOut(ClientError):
    """Instance ``instance`` was not ready within ``timeout`` seconds (``last`` is where it
    was). It may still get there: ``skulk ps`` tells."""

    exit_status = 3

    instance: str
    timeout: float
    last: str

    def describe(self) -> str:
        return (
            f"wait_timeout: {self.instance} not ready within {self.timeout:g}s "
            f"(last seen: {self.last}); it may still get there: see `skulk ps`"
        )


def rank_fraction(shard: JsonObject) -> float:
    """How far one rank's runner is, 0..1 (see the module docstring)."""
    runner = shard.get("runner")
    phase = runner.get("phase") if isinstance(runner, Mapping) else None
    if not isinstance(phase, str) or phase not in PHASE_FRACTION:
        return 0.0
    fraction = PHASE_FRACTION[phase]
    if phase == "fetching" and isinstance(runner, Mapping):
        done, total = runner.get("bytes_done"), runner.get("bytes_total")
        if isinstance(done, int) and isinstance(total, int) and total > 0:
            fraction += FETCH_SPAN * min(1.0, max(0.0, done / total))
    return fraction


def instance_view(instance: JsonObject) -> WaitView:
    """One answer of ``GET /v1/instances/{id}`` as a :class:`WaitView`."""
    shards = shards_of(instance)
    phases = [runner_phase(s) for s in shards]
    ranks = zip(shards, phases, strict=True)
    summary = ", ".join(f"rank {text(s.get('rank'))} {p}" for s, p in ranks)
    for shard in shards:
        runner = shard.get("runner")
        phase = runner.get("phase") if isinstance(runner, Mapping) else None
        if phase in FAILED_PHASES:
            failure = runner.get("failure") if isinstance(runner, Mapping) else None
            why = f": {failure}" if isinstance(failure, str) and failure else ""
            return WaitView(
                False,
                f"rank {text(shard.get('rank'))} on {text(shard.get('node'))} {phase}{why}",
                0.0,
                summary,
            )
    if instance.get("status") == "failed":
        return WaitView(False, "the instance failed (no nodes left to place it on)", 0.0, summary)
    if not shards:
        return WaitView(False, None, 0.0, "no shards yet")
    fraction = sum(rank_fraction(s) for s in shards) / len(shards)
    ready = instance.get("status") == "placed" and all(p == "ready" for p in phases)
    return WaitView(ready, None, 1.0 if ready else min(fraction, 0.99), summary or NONE)


class Follower:
    """The views of successive polls of one instance (remembers whether it was ever seen)."""

    def __init__(self, instance: str) -> None:
        self.instance = instance
        self.seen = False

    def observe(self, answer: JsonObject | None) -> WaitView:
        """The view of one poll: ``answer`` is the instance, or ``None`` when the node did not
        know it (``unknown_instance``)."""
        if answer is None:
            if self.seen:
                return WaitView(
                    False,
                    "the instance is gone: deleted, or re-placed under a new id after a failure "
                    "(see `skulk ps`)",
                    0.0,
                    "gone",
                )
            return WaitView(False, None, 0.0, "not yet in this node's State")
        self.seen = True
        return instance_view(answer)


def poll_instance(client: ApiClient, instance: str) -> JsonObject | None:
    """``GET /v1/instances/{instance}``: the instance, or ``None`` for ``unknown_instance``."""
    try:
        return client.get(f"/v1/instances/{quote_segment(instance)}")
    except ApiRefused as exc:
        if exc.status == 404 and exc.code == "unknown_instance":
            return None
        raise


def follow(
    poll: Callable[[], JsonObject | None],
    instance: str,
    *,
    timeout: float,
    report: Callable[[WaitView], None],
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    interval: float = POLL_INTERVAL,
) -> WaitView:
    """Poll until ``instance`` is ready (its last view is returned) or will never be
    (:class:`PlacementFailed`), or ``timeout`` seconds pass (:class:`WaitTimedOut`).
    ``report`` gets every view, the last one included."""
    follower = Follower(instance)
    deadline = clock() + timeout
    while True:
        view = follower.observe(poll())
        report(view)
        if view.ready:
            return view
        if view.failure is not None:
            raise PlacementFailed(instance, view.failure)
        left = deadline - clock()
        if left <= 0:
            raise WaitTimedOut(instance, timeout, view.summary)
        sleep(min(interval, left))

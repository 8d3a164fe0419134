"""Steps several scenarios share: a stream the fault breaks, the failed runner's flight
recorder, recovery."""

from __future__ import annotations

from collections.abc import Sequence

from skulk.repro._client import StreamOutcome, chat_body, request, stream_chat
from skulk.repro._session import MARGIN, Node, Session
from skulk.repro._timeline import RunnerView, runner_label

#: Long enough that the stream is still going when a fault at token 3 strikes; short enough
#: that a fault which never fires ends the stream quickly (as a failed check).
FAULTED_MAX_TOKENS = 200


def stream_broken_by_fault(
    s: Session, node: Node, *, reason: str, deadline_flag: str | None
) -> StreamOutcome:
    """Stream a request the fault interrupts; require that it ends with the typed error
    ``reason`` and check that this came within the deadline (``deadline_flag``'s value, or
    none for failures noticed at once, such as a crash) plus :data:`MARGIN` of the last
    token, closed by ``[DONE]``."""
    deadline = s.setting(deadline_flag) if deadline_flag else 0.0
    limit = deadline + MARGIN
    # A few seconds more than the limit, so a late error is measured rather than cut off.
    out = stream_chat(node.url, max_tokens=FAULTED_MAX_TOKENS, budget=s.budget(limit + 5))
    s.require(
        "the request streamed tokens before the fault",
        out.status == 200 and out.tokens > 0,
        f"{out.tokens} tokens" if out.status == 200 else out.describe(),
    )
    s.require(
        f"the stream ended with the typed error {reason}",
        out.error_code == reason,
        (out.describe()),
    )
    allowed = f"--{deadline_flag} {deadline:g}s + {MARGIN:g}s" if deadline_flag else f"{MARGIN:g}s"
    s.check(
        "the error came within its deadline",
        out.stalled_s <= limit,
        f"{out.stalled_s:.1f}s after the last token (allowed {allowed})",
    )
    s.check(
        "the stream was closed by data: [DONE]",
        out.done,
        "[DONE] after the error event" if out.done else (out.problem or "no [DONE]"),
    )
    return out


def expect_runner_failed(
    s: Session,
    node: Node,
    incarnation: int,
    reason: str,
    *,
    events: Sequence[str],
) -> RunnerView | None:
    """Wait for the flight recorder to show runner ``incarnation`` failed with ``reason``,
    and check its timeline has the ``events`` kinds that explain it."""
    label = runner_label(node.index, incarnation)

    def failed() -> bool:
        # Both the verdict and the reaped exit, so the timeline is complete.
        view = node.recorder.runner(incarnation)
        return view is not None and view.failure is not None and view.exit_code is not None

    s.wait_until(failed, MARGIN)
    view = node.recorder.runner(incarnation)
    got = view.failure.reason if view is not None and view.failure is not None else None
    s.check(
        f"runner {label} failed with {reason}",
        got == reason,
        f"failure: {view.failure.reason}: {view.failure.message}"
        if view is not None and view.failure is not None
        else ("never seen in diagnostics" if view is None else f"phase {view.phase}, no failure"),
    )
    kinds = [e.kind for e in view.events] if view is not None else []
    missing = [k for k in events if k not in kinds]
    s.check(
        f"the flight recorder of runner {label} shows {', '.join(events)}",
        view is not None and not missing,
        f"missing {missing}" if missing else f"{len(kinds)} events",
    )
    return view


def deadline_event_within(s: Session, view: RunnerView | None, flag: str) -> None:
    """Check that ``view``'s ``deadline`` event came within ``flag``'s value (counted from
    the spawn, the most it can be for the start-up deadlines) plus the margin."""
    event = view.first("deadline") if view is not None else None
    limit = s.setting(flag) + MARGIN
    s.check(
        f"the {flag.removesuffix('-timeout')} deadline fired in time",
        event is not None and event.since_spawn <= limit,
        f"'{event.detail}' {event.since_spawn:.1f}s after spawn (allowed {limit:g}s)"
        if event is not None
        else "no deadline event",
    )


def expect_recovery(s: Session, node: Node, *, after: int) -> None:
    """Require ``/health`` 200 again and a fresh request served by a runner newer than
    incarnation ``after``."""
    limit = s.setting("hello-timeout") + s.setting("load-timeout") + MARGIN
    took = s.wait_until(lambda: node.get("/health").status == 200, limit)
    s.require(
        "the node recovered: /health 200",
        took is not None,
        f"after {took:.1f}s" if took is not None else node.get("/health").describe(),
    )
    fresh_request(s, node)
    node.recorder.poll()
    current = node.recorder.current()
    s.check(
        "it is served by a relaunched runner",
        current is not None and current.incarnation > after,
        f"runner {runner_label(node.index, current.incarnation)} ({current.phase}, pid "
        f"{current.pid})"
        if current is not None
        else "no runner in diagnostics",
    )


def fresh_request(s: Session, node: Node, what: str = "a fresh request succeeds") -> None:
    reply = request(
        "POST",
        node.url + "/v1/chat/completions",
        budget=s.budget(MARGIN * 3),
        body=chat_body(8, stream=False),
    )
    tokens = reply.field("usage", "completion_tokens")
    s.require(
        what,
        reply.status == 200 and tokens == 8,
        f"200, {tokens} tokens" if reply.status == 200 else reply.describe(),
    )

"""The typed ways serving a request through routing fails (beyond the runner's own).

* :class:`Overloaded`: the instance's serving node holds ``max_in_flight`` requests for it
  already (or its link to us cannot take another stream); the API answers 429 with
  ``Retry-After``.
* :class:`RemoteUnavailable`: the serving node says the instance is not ready, or no longer
  runs there (the caller's view of the cluster was stale); the API answers 503.
* :class:`NodeUnreachable`: the serving node was lost (no link, the link closed, no answer in
  time, a stream that ended without its end); a :class:`~skulk.worker.RequestFailure` with
  reason ``node_unreachable`` (the API answers 502), so code that handles runner failures
  handles it too.

The runner's own failures cross the hop unchanged, as ``RequestFailure(reason, message)``.
"""

from __future__ import annotations

from skulk.worker import RequestFailure

#: What a refused client is told to wait before it tries again (seconds).
RETRY_AFTER = 1.0


class Overloaded(Exception):
    """``instance`` takes no more requests now; try again in ``retry_after`` seconds."""

    def __init__(self, instance: str, retry_after: float = RETRY_AFTER, why: str = "") -> None:
        why = why or "has as many requests in flight as it takes"
        super().__init__(f"instance {instance} {why}")
        self.instance = instance
        self.retry_after = retry_after


class RemoteUnavailable(Exception):
    """``instance`` cannot take the request on ``node`` now: not ready (loading, restarting,
    failed) or not running there; ``message`` is the serving node's word for it."""

    def __init__(self, node: str, instance: str, message: str) -> None:
        super().__init__(f"instance {instance} on node {node}: {message}")
        self.node = node
        self.instance = instance
        self.message = message


class NodeUnreachable(RequestFailure):
    """The node serving the request was lost; ``reason`` is ``node_unreachable``."""

    REASON = "node_unreachable"

    def __init__(self, node: str, detail: str) -> None:
        super().__init__(self.REASON, f"node {node} serving the request was lost: {detail}")
        self.node = node
        self.detail = detail

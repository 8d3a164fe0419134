"""Which request (and which node, which instance) the running code works for.

Two :class:`~contextvars.ContextVar`\\ s carry it, so nothing has to be passed down: Trio
copies the spawning task's context into each new task, so a value set while a request is
handled is seen by everything that request starts (the routing hop, the runner's request
table, log lines), and a node's value set at the top of ``serve`` by every task of that node
(several nodes may run in one process: tests do).

* :func:`node_scope` (once per node, in ``serve``): the node's id and its
  :class:`RequestJournal`, the bounded record of what happened to requests on this node.
* :func:`request_scope` (per request: the API's request guard, the serving end of a routed
  request): the request's :class:`RequestTrace` (its id, then the instance serving it).
* :func:`note` records an event about the current request in the current node's journal.

Request ids (:func:`check_request_id`, :func:`new_request_id`): 1 to :data:`MAX_REQUEST_ID`
characters of ``A-Z a-z 0-9 . _ : - + = / @``; anything else (control characters, spaces,
quotes, non-ASCII) is refused, so an id is safe in a header, a log line and a URL path.
"""

from __future__ import annotations

import re
import uuid
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import attrs

from skulk.clock import wall

REQUEST_ID_HEADER = "x-request-id"
MAX_REQUEST_ID = 128
_REQUEST_ID = re.compile(rf"[A-Za-z0-9._:+=/@-]{{1,{MAX_REQUEST_ID}}}")
#: Events a node keeps about requests (the oldest are dropped first).
JOURNAL_CAPACITY = 4096


def check_request_id(raw: str) -> str:
    """``raw`` if it is a valid request id, else :class:`ValueError` saying why."""
    if len(raw) > MAX_REQUEST_ID:
        raise ValueError(f"a request id is at most {MAX_REQUEST_ID} characters, not {len(raw)}")
    if not _REQUEST_ID.fullmatch(raw):
        raise ValueError("a request id is 1 or more of the characters A-Z a-z 0-9 . _ : - + = / @")
    return raw


def new_request_id() -> str:
    """A fresh request id: ``req-`` and 32 hex digits."""
    return f"req-{uuid.uuid4().hex}"


@attrs.define
class RequestTrace:
    """The request being handled: ``request_id``, and once routed the ``instance`` (and its
    ``model``) serving it. ``received``: when (wall clock) and what (``METHOD /path``) the API
    node received, journaled as ``request.received`` just before the request's first event,
    so that requests nothing is noted about (health checks, polls) leave no trace."""

    request_id: str
    instance: str | None = None
    model: str | None = None
    received: tuple[float, str] | None = None


@attrs.frozen
class JournalEvent:
    """One thing that happened to request ``request_id`` on this node, at wall-clock ``at``."""

    at: float
    request_id: str
    kind: str
    detail: str
    instance: str
    model: str


class RequestJournal:
    """The last ``capacity`` request events of one node."""

    def __init__(self, capacity: int = JOURNAL_CAPACITY) -> None:
        self._events: deque[JournalEvent] = deque(maxlen=capacity)

    def record(self, trace: RequestTrace, kind: str, detail: str = "") -> None:
        if trace.received is not None:
            (at, what), trace.received = trace.received, None
            self._append(at, trace, "request.received", what)
        self._append(wall(), trace, kind, detail)

    def _append(self, at: float, trace: RequestTrace, kind: str, detail: str) -> None:
        instance, model = trace.instance or "", trace.model or ""
        self._events.append(JournalEvent(at, trace.request_id, kind, detail, instance, model))

    def events(self, request_id: str | None = None) -> list[JournalEvent]:
        """Every event kept (oldest first), or only ``request_id``'s."""
        return [e for e in self._events if request_id is None or e.request_id == request_id]


@attrs.frozen
class NodeTrace:
    node_id: str
    journal: RequestJournal


_NODE: ContextVar[NodeTrace | None] = ContextVar("skulk_node", default=None)
_REQUEST: ContextVar[RequestTrace | None] = ContextVar("skulk_request", default=None)


def enter_node(node_id: str, journal: RequestJournal) -> NodeTrace:
    """From now on, the calling task (and the tasks it starts) runs for node ``node_id``: for
    a task that is the node (``serve``), whose context ends with it."""
    node = NodeTrace(node_id, journal)
    _NODE.set(node)
    return node


@contextmanager
def node_scope(node_id: str, journal: RequestJournal) -> Iterator[NodeTrace]:
    """Within: the code runs for node ``node_id`` (and the tasks it starts)."""
    node = NodeTrace(node_id, journal)
    token = _NODE.set(node)
    try:
        yield node
    finally:
        _NODE.reset(token)


@contextmanager
def request_scope(
    request_id: str,
    *,
    instance: str | None = None,
    model: str | None = None,
    received: str | None = None,
) -> Iterator[RequestTrace]:
    """Within: the code works for request ``request_id`` (and the tasks it starts);
    ``received``: what the API node received (``METHOD /path``), noted with its first event."""
    arrival = None if received is None else (wall(), received)
    trace = RequestTrace(request_id, instance, model, arrival)
    token = _REQUEST.set(trace)
    try:
        yield trace
    finally:
        _REQUEST.reset(token)


def current_node() -> NodeTrace | None:
    return _NODE.get()


def current_request() -> RequestTrace | None:
    return _REQUEST.get()


def current_request_id() -> str | None:
    trace = _REQUEST.get()
    return None if trace is None else trace.request_id


def serving(instance: str, model: str | None = None) -> None:
    """The current request (if any) is served by ``instance``: later log lines and events say
    so. (It changes the request's trace in place: no context variable is set, so it is safe
    inside an async generator.)"""
    trace = _REQUEST.get()
    if trace is not None:
        trace.instance = instance
        if model is not None:
            trace.model = model


def note(kind: str, detail: str = "") -> None:
    """Record ``kind`` (``detail``) about the current request in this node's journal; nothing
    outside a request or a node."""
    node, trace = _NODE.get(), _REQUEST.get()
    if node is not None and trace is not None:
        node.journal.record(trace, kind, detail)

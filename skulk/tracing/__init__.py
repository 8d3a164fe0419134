"""Following one request: its id, the node and instance the running code works for, and log
lines that carry them.

    enter_node(node_id, journal)                # serve: once per node (or node_scope)
    with request_scope(request_id):             # per request (API guard; routed arrival)
        serving(instance, model)                # once routed
        note("route.hop", "to node b")          # into this node's RequestJournal
        log.info("...")                         # the line carries node and request id
    configure_logging("info", "json")           # __main__: text or JSON lines

See :mod:`skulk.tracing._context` (ids: ``x-request-id``, at most 128 safe characters) and
:mod:`skulk.tracing._logging` (the formats).
"""

from ._context import (
    MAX_REQUEST_ID,
    REQUEST_ID_HEADER,
    JournalEvent,
    RequestJournal,
    RequestTrace,
    check_request_id,
    current_node,
    current_request,
    current_request_id,
    enter_node,
    new_request_id,
    node_scope,
    note,
    request_scope,
    serving,
)
from ._logging import (
    LOG_FORMATS,
    ContextFilter,
    JsonFormatter,
    LogFormat,
    TextFormatter,
    configure_logging,
    log_handler,
)

__all__ = [
    "LOG_FORMATS",
    "MAX_REQUEST_ID",
    "REQUEST_ID_HEADER",
    "ContextFilter",
    "JournalEvent",
    "JsonFormatter",
    "LogFormat",
    "RequestJournal",
    "RequestTrace",
    "TextFormatter",
    "check_request_id",
    "configure_logging",
    "current_node",
    "current_request",
    "current_request_id",
    "enter_node",
    "log_handler",
    "new_request_id",
    "node_scope",
    "note",
    "request_scope",
    "serving",
]

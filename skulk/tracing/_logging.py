"""Log lines that say which node and which request they are about.

:class:`ContextFilter` (on a handler) adds ``node``, ``request_id`` and ``instance`` to each
record from the running code's context (:mod:`skulk.tracing._context`), so every log line
written while a request is handled carries its id, on every node it touches, without the
code that logs passing it. Two formatters read them:

* :class:`TextFormatter`: ``TIME LEVEL LOGGER [REQUEST_ID]: MESSAGE`` (the bracket only while
  a request is handled);
* :class:`JsonFormatter`: one JSON object per line: ``timestamp`` (UTC, ISO 8601 with
  milliseconds), ``level``, ``logger``, ``node``, ``request_id``, ``instance`` (``null`` when
  not known), ``message`` and, when there is one, ``exception`` (the traceback, as text).

The standard library's ``logging`` does it all in a few lines: no logging library is needed
(structlog or python-json-logger would add a dependency for what one ``json.dumps`` does).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Literal, TextIO

from ._context import current_node, current_request

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")


class ContextFilter(logging.Filter):
    """Adds ``node``, ``request_id`` and ``instance`` (``None`` when unknown) to each record
    that does not have them yet; never drops one."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            trace = current_request()
            record.request_id = None if trace is None else trace.request_id
            record.instance = None if trace is None else trace.instance
        if not hasattr(record, "node"):
            node = current_node()
            record.node = None if node is None else node.node_id
        return True


class TextFormatter(logging.Formatter):
    """``TIME LEVEL LOGGER [REQUEST_ID]: MESSAGE``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s%(request_tag)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        rid = getattr(record, "request_id", None)
        record.request_tag = f" [{rid}]" if rid else ""
        return super().format(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per line (see the module doc)."""

    def format(self, record: logging.LogRecord) -> str:
        at = datetime.fromtimestamp(record.created, UTC)
        line: dict[str, object] = {
            "timestamp": at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "node": getattr(record, "node", None),
            "request_id": getattr(record, "request_id", None),
            "instance": getattr(record, "instance", None),
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def log_handler(log_format: LogFormat, stream: TextIO | None = None) -> logging.Handler:
    """A stream handler (stderr by default) writing ``log_format`` lines, with the context."""
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    return handler


def configure_logging(level: str, log_format: LogFormat, stream: TextIO | None = None) -> None:
    """The process's logging: one handler on the root logger (as ``logging.basicConfig``
    would make, which does nothing when the root already has handlers)."""
    logging.basicConfig(
        level=level.upper(), handlers=[log_handler(log_format, stream)], force=False
    )

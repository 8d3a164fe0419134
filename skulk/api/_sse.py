"""Server-sent events framing (sans-IO), for every format that streams SSE.

:func:`sse_event` frames one ``data:`` payload; :func:`sse_frame` one format-neutral
:class:`~skulk.api._request.Event` (its ``event:`` name line, then its data).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from skulk.api._request import Event

_SSE_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def sse_event(obj: Mapping[str, object] | str) -> bytes:
    """One server-sent event: ``data: <compact JSON>\\n\\n`` (a string is sent as is).

    A string containing line breaks becomes several ``data:`` lines, which SSE clients join
    back with ``\\n``; compact JSON never contains a raw line break. Non-finite floats raise
    :class:`ValueError` rather than emitting JSON that clients cannot parse.
    """
    if isinstance(obj, str):
        return _sse_frame(obj).encode("utf-8", "replace")
    try:
        return _sse_frame(_compact_json(obj, ensure_ascii=False)).encode()
    except UnicodeEncodeError:  # a lone surrogate (e.g. echoed from a request); escape it
        return _sse_frame(_compact_json(obj, ensure_ascii=True)).encode()


def sse_frame(event: Event) -> bytes:
    """One server-sent event: an ``event: name`` line when the event is named, then its
    ``data:`` line(s)."""
    data = sse_event(event.data)
    return data if event.name is None else f"event: {event.name}\n".encode() + data


def _compact_json(obj: Mapping[str, object], *, ensure_ascii: bool) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=ensure_ascii, allow_nan=False)


def _sse_frame(data: str) -> str:
    return "".join(f"data: {line}\n" for line in _SSE_LINE_BREAK.split(data)) + "\n"

"""Reading a JSON request body into plain values we can hand on safely (sans-IO).

:func:`parse_json_body` is the one door between a client's bytes and the format parsers
(``parse_chat_completions`` and friends): it returns what ``json.loads`` gives, or raises
:class:`ApiError` (400) — never anything else. Beyond ``json.loads`` it refuses what JSON
allows Python to produce but nothing downstream can carry:

* **lone UTF-16 surrogates** (``"\\udc00"`` escapes, or the raw bytes ``ED A0 80``, which
  ``json.loads`` decodes with ``surrogatepass``): such a ``str`` cannot be encoded as UTF-8, so
  the CBOR frame to the runner would fail deep inside the node. 400 ``invalid_unicode`` naming
  the field (``messages[0].content``); a bad object key names the object.
* **NaN and ±Infinity** (Python's ``json`` accepts the literals ``NaN``/``Infinity`` and turns
  ``1e400`` into ``inf``): 400 ``invalid_value`` naming the field.

Anything else that is not JSON (invalid UTF-8, bad syntax, nesting deeper than the parser's
recursion limit, integers of more than 4300 digits) is 400 ``invalid_json``.
:func:`check_json_value` applies the same value checks to an already-parsed value (the
WebSocket endpoint parses whole messages, then checks each part with its own path).
"""

from __future__ import annotations

import json
import math

from skulk.api._errors import ApiError

#: The largest request body (or WebSocket message) read, 413 beyond: half the runner frame
#: limit (16 MiB), so any prompt that fits in a body also fits in the frame to the runner.
MAX_BODY = 8 * 1024 * 1024
#: Bodies at least this large are parsed off the event loop (see ``_app``): parsing megabytes
#: takes long enough to stall every other stream on the node.
LARGE_BODY = 256 * 1024


def parse_json_body(raw: bytes | str) -> object:
    """The JSON value of a request body, checked (see the module docstring). Raises
    :class:`ApiError` (400 ``invalid_json`` / ``invalid_unicode`` / ``invalid_value``)."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        detail = str(exc)
        if len(detail) > 200:
            detail = detail[:197] + "..."
        raise ApiError.invalid(
            None, f"request body is not valid JSON: {detail}", code="invalid_json"
        ) from None
    check_json_value(value)
    return value


def check_json_value(value: object, path: str = "") -> None:
    """Raise :class:`ApiError` (400) naming the first string with a lone surrogate or the first
    non-finite number inside ``value``; ``path`` prefixes the names (``"body"`` → ``body.x``).

    Iterative, so a value as deep as ``json.loads`` allows cannot exhaust the stack.
    """
    stack: list[tuple[object, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if not _is_unicode(item):
                raise _bad_unicode(where)
        elif isinstance(item, float):
            if not math.isfinite(item):
                name = where or "body"
                raise ApiError.invalid(
                    where or None,
                    f"Invalid value for '{name}': JSON numbers must be finite "
                    "(NaN, Infinity and numbers beyond the float range are not accepted).",
                )
        elif isinstance(item, dict):
            children: list[tuple[object, str]] = []
            for key, child in item.items():
                if not _is_unicode(key):
                    raise _bad_unicode(where, key=True)
                if isinstance(child, _CHECKED):
                    children.append((child, f"{where}.{key}" if where else key))
            stack.extend(reversed(children))  # report the first bad field in document order
        elif isinstance(item, list):
            stack.extend(
                (child, f"{where}[{i}]")
                for i, child in reversed(list(enumerate(item)))
                if isinstance(child, _CHECKED)
            )


#: The only JSON values that can be bad, or hold bad ones (ints, bools and null cannot).
_CHECKED = (str, float, dict, list)


def _is_unicode(text: str) -> bool:
    """``False`` when ``text`` holds a lone surrogate (it cannot be encoded as UTF-8)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _bad_unicode(path: str, *, key: bool = False) -> ApiError:
    what = f"an object key in '{path}'" if key and path else "an object key" if key else None
    subject = what or (f"'{path}'" if path else "the body")
    return ApiError.invalid(
        path or None,
        f"Invalid value for {subject}: it contains a lone UTF-16 surrogate "
        "(\\ud800-\\udfff without its pair), which is not valid Unicode text.",
        code="invalid_unicode",
    )

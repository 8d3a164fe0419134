"""The answers Hypercorn gives without the app carry the JSON envelope, 4xx for the client's
mistakes, and close the connection."""

from __future__ import annotations

import json

import pytest

from skulk.api._protocol_errors import error_response


@pytest.mark.parametrize(
    ("hint", "what", "status", "code"),
    [
        (400, "http", 400, "invalid_http"),
        (431, "http", 431, "invalid_http"),
        (501, "http", 400, "invalid_http"),  # h11's hint for an unknown Transfer-Encoding
        (505, "http", 400, "invalid_http"),
        (400, "websocket", 400, "invalid_websocket_upgrade"),
        (500, "app", 500, "internal"),
    ],
)
def test_hypercorn_errors_are_envelopes_that_close(
    hint: int, what: str, status: int, code: str
) -> None:
    got, headers, body = error_response(hint, what)
    assert got == status
    head = dict(headers)
    assert head[b"content-type"] == b"application/json"
    assert head[b"connection"] == b"close"
    assert int(head[b"content-length"]) == len(body)
    assert json.loads(body)["error"]["code"] == code

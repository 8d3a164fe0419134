"""``close_on_client_eof``: it wraps Hypercorn's read loop once, stops the keep-alive timer when
the loop ends, and says so when a Hypercorn lacks what it wraps (the e2e tests in
``tests/e2e/test_api_hardening.py`` check the sockets themselves)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
from hypercorn.trio import tcp_server

from skulk.api import close_on_client_eof


class Timer:
    def __init__(self) -> None:
        self.stopped = 0

    async def stop(self) -> None:
        self.stopped += 1


class FakeServer:
    """What the wrapper touches of Hypercorn's ``TCPServer``."""

    def __init__(self) -> None:
        self.idle_task = Timer()
        self.reads = 0

    async def _read_data(self) -> None:
        self.reads += 1
        await trio.lowlevel.checkpoint()


async def test_the_read_loop_is_wrapped_once_and_stops_the_keep_alive_timer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tcp_server, "TCPServer", FakeServer)
    close_on_client_eof()
    wrapped = FakeServer._read_data
    close_on_client_eof()  # idempotent: no second layer
    assert FakeServer._read_data is wrapped
    server: Any = FakeServer()
    await server._read_data()
    assert (server.reads, server.idle_task.stopped) == (1, 1)


def test_a_hypercorn_without_the_read_loop_is_left_alone_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    class Bare:
        pass

    monkeypatch.setattr(tcp_server, "TCPServer", Bare)
    with caplog.at_level(logging.WARNING, logger="skulk.api"):
        close_on_client_eof()
    assert "closed connections linger" in caplog.text
    assert not hasattr(Bare, "_read_data")

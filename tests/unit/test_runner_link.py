"""The runner's side of the node link holds token chunks and merges them (fewer frames per
token for a fast model) without ever reordering a request's frames or delaying its first ones.
Whether a beat writes what is held depends on time only through ``hold``: these tests use a
hold no test run reaches (an hour) or one every iteration exceeds (a nanosecond)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import attrs
import pytest

from skulk.engine._link import EAGER, EOF, Link
from skulk.engine.protocol import FROM_RUNNER
from skulk.wire import FrameReader
from skulk.wire.runner import (
    Finished,
    FromRunner,
    GenerationEnd,
    Heartbeat,
    RequestFailed,
    TokenChunk,
    TokenLogprob,
    Usage,
)

NEVER = 3600.0  # a hold no iteration of a test reaches
ALWAYS = 1e-9  # a hold every iteration exceeds


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    runner_end, node_end = socket.socketpair()
    node_end.setblocking(False)
    yield runner_end, node_end
    runner_end.close()
    node_end.close()


def written(node_end: socket.socket) -> list[FromRunner]:
    """Every frame written so far (the socket is non-blocking on this end)."""
    reader, frames = FrameReader(FROM_RUNNER), list[FromRunner]()
    while True:
        try:
            data = node_end.recv(1 << 16)
        except BlockingIOError:
            return frames
        frames.extend(reader.feed(data))


def chunk(rid: str, token: int) -> TokenChunk:
    return TokenChunk(rid, (token,), f"t{token} ")


def start(link: Link, node_end: socket.socket, rid: str) -> None:
    """Send ``rid``'s first chunks (tokens 1 to EAGER): each is written at once."""
    for token in range(1, EAGER + 1):
        link.send(chunk(rid, token))
    assert written(node_end) == [chunk(rid, t) for t in range(1, EAGER + 1)]


def merged(rid: str, *tokens: int) -> TokenChunk:
    return TokenChunk(rid, tokens, "".join(f"t{t} " for t in tokens))


def test_a_requests_first_chunks_are_written_at_once_and_the_next_ones_merge(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    runner_end, node_end = pair
    link = Link(runner_end, heartbeat_interval=NEVER, hold=NEVER)
    start(link, node_end, "a")
    for token in (7, 8, 9):
        link.send(chunk("a", token))
    link.beat()  # a fast iteration, a write just now: still held
    assert written(node_end) == []
    done = Finished("a", GenerationEnd("length", Usage(3, EAGER + 3)))
    link.send(done)  # the end writes the held tokens first, merged
    assert written(node_end) == [merged("a", 7, 8, 9), done]


def test_held_chunks_stay_per_request_and_precede_any_other_frame(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    runner_end, node_end = pair
    link = Link(runner_end, heartbeat_interval=NEVER, hold=NEVER)
    start(link, node_end, "a")
    link.send(chunk("a", 7))
    link.send(chunk("b", 1))  # b's first chunk: at once, after what a holds
    assert written(node_end) == [chunk("a", 7), chunk("b", 1)]
    for token in range(2, EAGER + 1):
        link.send(chunk("b", token))
    link.send(chunk("a", 8))
    link.send(chunk("b", 7))
    link.send(chunk("a", 9))
    failed = RequestFailed("b", "engine_error", "boom")
    link.send(failed)
    frames = written(node_end)
    assert frames[: EAGER - 1] == [chunk("b", t) for t in range(2, EAGER + 1)]
    assert frames[EAGER - 1 :] == [merged("a", 8, 9), chunk("b", 7), failed]
    link.send(chunk("b", 9))  # a request id used again starts over: its first chunk at once
    assert written(node_end) == [chunk("b", 9)]


def test_a_beat_after_a_slow_iteration_writes_what_is_held(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    runner_end, node_end = pair
    link = Link(runner_end, heartbeat_interval=NEVER, hold=ALWAYS)
    start(link, node_end, "a")
    link.send(chunk("a", 7))
    link.send(chunk("a", 8))
    assert written(node_end) == []
    link.beat()
    assert written(node_end) == [merged("a", 7, 8)]


def test_heartbeats_and_waiting_for_frames_write_what_is_held(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    runner_end, node_end = pair
    link = Link(runner_end, heartbeat_interval=NEVER, hold=NEVER)
    start(link, node_end, "a")
    link.send(chunk("a", 7))
    link.inbox.put(EOF)
    assert link.next_frame(block=True) is EOF
    assert written(node_end) == [chunk("a", 7)]
    link.send(chunk("a", 8))
    link.inbox.put(EOF)
    assert link.wait_frame(NEVER) is EOF
    assert written(node_end) == [chunk("a", 8)]
    link = Link(runner_end, heartbeat_interval=0.0, hold=NEVER)  # a heartbeat at every beat
    start(link, node_end, "c")
    link.send(chunk("c", 7))
    link.beat()
    frames = written(node_end)
    assert frames[0] == chunk("c", 7) and isinstance(frames[1], Heartbeat)


def test_no_hold_writes_every_chunk_at_once(pair: tuple[socket.socket, socket.socket]) -> None:
    runner_end, node_end = pair
    link = Link(runner_end, heartbeat_interval=NEVER, hold=0)
    for token in range(1, EAGER + 4):
        link.send(chunk("a", token))
        assert written(node_end) == [chunk("a", token)]


def test_merged_chunks_keep_every_tokens_logprobs(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    runner_end, node_end = pair
    link = Link(runner_end, heartbeat_interval=NEVER, hold=NEVER)
    start(link, node_end, "a")
    entries = [TokenLogprob(t, f"t{t}".encode(), -0.5 * t) for t in (7, 8)]
    for token, entry in zip((7, 8), entries, strict=True):
        link.send(TokenChunk("a", (token,), f"t{token} ", (entry,)))
    link.flush()
    assert written(node_end) == [TokenChunk("a", (7, 8), "t7 t8 ", tuple(entries))]


def test_merging_knows_every_field_of_a_token_chunk() -> None:
    # Link._take_held rebuilds merged chunks from these fields: a new one must be merged too.
    names = [f.name for f in attrs.fields(TokenChunk)]
    assert names == ["request_id", "token_ids", "text", "logprobs"]

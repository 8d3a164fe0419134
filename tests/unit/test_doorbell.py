"""The doorbell between neighbouring ranks (skulk.engine._doorbell): rings and waits pair up in
order, a wait blocks until its ring, a closed neighbour fails the wait, and the connections form
over the ranks' own addresses (refusing strangers, within a deadline)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from skulk.engine._doorbell import (
    GREETING,
    Doorbell,
    DoorbellError,
    DoorbellStatistics,
    open_doorbell,
)
from skulk.runner import loopback_hosts


def pair() -> tuple[Doorbell, Doorbell]:
    """Two ranks' doorbells wired to each other over socketpairs (a world of two)."""
    a_right, b_left = socket.socketpair()
    b_right, a_left = socket.socketpair()
    return Doorbell(a_right, a_left), Doorbell(b_right, b_left)


def until(predicate: object, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.005)


def test_a_wait_blocks_until_its_ring() -> None:
    a, b = pair()
    done = threading.Event()

    def waiter() -> None:
        b.wait()
        done.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    until(lambda: b.statistics().waiting)
    assert not done.is_set()  # blocked: nothing rang yet
    a.ring()
    thread.join(10)
    assert done.is_set()
    assert a.statistics().rings == 1
    assert b.statistics().waits == 1
    assert not b.statistics().waiting


def test_rings_and_waits_pair_up_in_order() -> None:
    a, b = pair()
    for _ in range(5):
        a.ring()
    for _ in range(5):
        b.wait()  # each returns at once: five rings are queued
    b.ring()
    a.wait()
    assert (a.statistics().rings, b.statistics().waits) == (5, 5)
    assert (b.statistics().rings, a.statistics().waits) == (1, 1)


def test_a_neighbour_that_closed_fails_the_wait_and_the_ring() -> None:
    a, b = pair()
    a.close()
    with pytest.raises(DoorbellError, match="closed"):
        b.wait()
    with pytest.raises(DoorbellError):
        for _ in range(100):  # the first write may still reach a closed socket's buffer
            b.ring()


def form(hosts: tuple[str, ...], seconds: float = 10.0) -> list[Doorbell]:
    """Every rank's doorbell, formed concurrently (one thread per rank, as ranks do)."""
    bells: list[Doorbell | None] = [None] * len(hosts)
    errors: list[BaseException] = []

    def one(rank: int) -> None:
        try:
            bells[rank] = open_doorbell(hosts, rank, seconds)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(r,)) for r in range(len(hosts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 5)
    assert not errors, errors
    assert all(b is not None for b in bells)
    return [b for b in bells if b is not None]


@pytest.mark.parametrize("world", [2, 3])
def test_the_ranks_form_a_ring_of_doorbells_on_their_own_addresses(world: int) -> None:
    bells = form(loopback_hosts(world))
    try:
        for rank, bell in enumerate(bells):
            bell.ring()  # to the right neighbour only
            bells[(rank + 1) % world].wait()
        assert all(b.statistics() == DoorbellStatistics(1, 1, False) for b in bells)
    finally:
        for b in bells:
            b.close()


def test_a_stranger_on_the_port_is_refused_and_the_neighbour_accepted() -> None:
    hosts = loopback_hosts(2)
    host, port = hosts[1].rsplit(":", 1)
    result: list[Doorbell] = []
    thread = threading.Thread(target=lambda: result.append(open_doorbell(hosts, 1, 10)))
    thread.start()
    stranger = None
    deadline = time.monotonic() + 10
    while stranger is None:  # rank 1 listens soon; rank 0 is not there yet
        try:
            stranger = socket.create_connection((host, int(port)), timeout=5)
        except ConnectionRefusedError:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    stranger.sendall(GREETING + (7).to_bytes(4, "big"))  # greets as a rank that is not left
    zero = open_doorbell(hosts, 0, 10)  # rank 1 accepts once it has connected to rank 0
    thread.join(10)
    stranger.settimeout(5)
    assert stranger.recv(1) == b""  # the first connection in rank 1's queue: closed
    (one,) = result
    zero.ring()
    one.wait()
    one.ring()
    zero.wait()
    for b in (zero, one, stranger):
        b.close()


def test_a_neighbour_that_never_comes_fails_within_the_deadline() -> None:
    hosts = loopback_hosts(2)
    with pytest.raises(DoorbellError, match=r"rank 1 could not form|timed out"):
        open_doorbell(hosts, 1, 0.3)

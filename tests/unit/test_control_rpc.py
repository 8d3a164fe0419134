"""The leader-call rpc (``control.call``) on its receiving side: bad bytes are a typed refusal
that touches nothing, and a node that does not lead says so (the asker then retries)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing

from skulk.api._cluster_routes import refusal_error
from skulk.cluster import State
from skulk.control import CONTROL_METHOD, ClusterControl, ControlUnavailable
from skulk.control._rpc import CALL_CODEC, REPLY_CODEC
from skulk.federation import RpcFailed
from skulk.wire.cluster import ControlRefused, Placed, PlacementAsk, RemoveNodeAsk


def control(leader: str | None) -> ClusterControl:
    async def wait_applied(seen: int) -> None:
        await trio.sleep_forever()

    driver = SimpleNamespace(leader=leader, state=State(), applied=0, wait_applied=wait_applied)
    consensus: Any = SimpleNamespace(driver=driver)

    def no_card(name: str) -> Any:
        raise AssertionError("a refused call must not make a card")

    return ClusterControl("me", consensus, None, dict, card_for=no_card)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "body", [b"", b"garbage", b"\xa1at\x00", CALL_CODEC.encode(RemoveNodeAsk("x"))[:-1]]
)
async def test_bytes_that_are_not_a_call_are_a_bad_request(body: bytes) -> None:
    with pytest.raises(RpcFailed) as failure:
        await control("me").handle_rpc(CONTROL_METHOD, body)
    assert failure.value.reason == "bad_request"


async def test_a_node_that_does_not_lead_refuses_with_not_leader() -> None:
    ask = PlacementAsk("m", "single", (), (), 1, None, False, False)
    for call in (ask, RemoveNodeAsk("x")):
        reply = REPLY_CODEC.decode(
            await control("other").handle_rpc(CONTROL_METHOD, CALL_CODEC.encode(call))
        )
        assert isinstance(reply, ControlRefused) and reply.code == "not_leader"


async def test_an_ask_on_the_leader_has_a_deadline_too(autojump_clock: Any) -> None:
    leader = control("me")

    async def endless_duty_round() -> None:
        async with leader._ask_lock:
            await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(endless_duty_round)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(ControlUnavailable) as failure:
            await leader.ask(RemoveNodeAsk("x"))
        nursery.cancel_scope.cancel()
    assert failure.value.code == "no_quorum"


@pytest.mark.parametrize(
    ("code", "status", "retry"),
    [
        ("not_enough_memory", 409, False),
        ("no_candidate_nodes", 409, False),
        ("node_in_use", 409, False),
        ("unknown_model", 404, False),
        ("unknown_node", 404, False),
        ("unsupported_sharding", 400, False),
        ("placement_info_pending", 503, True),
        ("no_quorum", 503, True),
        ("not_leader", 503, True),
        ("unavailable", 503, True),  # the leader's Raft storage failed (its disk is full)
    ],
)
def test_refusals_map_to_their_status(code: str, status: int, retry: bool) -> None:
    err = refusal_error(ControlRefused(code, "why"))
    assert (err.status, err.code) == (status, code)
    assert ("Retry-After" in err.headers) == retry
    # A 503 is the cluster's trouble, not the request's: the client may retry it.
    assert err.type == ("server_error" if status >= 500 else "invalid_request_error")


class _Link:
    """A link to ``peer`` whose control call answers what ``answers[peer]`` says."""

    def __init__(self, peer: str, answers: dict[str, object], asked: list[str]) -> None:
        self.peer, self.answers, self.asked = peer, answers, asked

    async def call(self, method: str, body: bytes, timeout: float) -> bytes:  # noqa: ASYNC109
        assert method == CONTROL_METHOD
        self.asked.append(self.peer)
        return REPLY_CODEC.encode(self.answers[self.peer])  # type: ignore[arg-type]


async def test_a_placement_the_leader_could_not_persist_is_asked_again_of_the_next_leader(
    autojump_clock: Any,
) -> None:
    """A leader whose Raft storage failed (its disk is full) refuses ``unavailable`` and stops
    leading; within its deadline the asker asks the leader elected next, under the same
    idempotency key, instead of answering the client 503 at once."""
    answers: dict[str, object] = {
        "old": ControlRefused("unavailable", "the cluster cannot commit now: disk_full"),
        "new": Placed("i1", existed=False),
    }
    asked: list[str] = []
    driver = SimpleNamespace(leader="old", state=State(), applied=0)

    async def wait_applied(seen: int) -> None:
        driver.leader = "new"  # the others elect a leader meanwhile
        await trio.sleep(0.5)

    driver.wait_applied = wait_applied
    mesh: Any = SimpleNamespace(link=lambda peer: _Link(peer, answers, asked))
    consensus: Any = SimpleNamespace(driver=driver)
    asker = ClusterControl("me", consensus, mesh, dict, card_for=lambda name: None)  # type: ignore[arg-type,return-value]
    ask = PlacementAsk("m", "single", (), (), 1, None, False, False, key="k1")
    reply = await asker.ask(ask)
    assert reply == Placed("i1", existed=False)
    assert asked[0] == "old" and asked[-1] == "new"


async def test_a_removal_the_leader_could_not_persist_is_not_asked_again(
    autojump_clock: Any,
) -> None:
    """Only a keyed placement is safe to ask again: another refusal ``unavailable`` reaches
    the client (a 503 it may retry)."""
    refused = ControlRefused("unavailable", "disk_full")
    asked: list[str] = []
    driver = SimpleNamespace(leader="old", state=State(), applied=0)

    async def wait_applied(seen: int) -> None:
        await trio.sleep(0.5)

    driver.wait_applied = wait_applied
    mesh: Any = SimpleNamespace(link=lambda peer: _Link(peer, {"old": refused}, asked))
    consensus: Any = SimpleNamespace(driver=driver)
    asker = ClusterControl("me", consensus, mesh, dict, card_for=lambda name: None)  # type: ignore[arg-type,return-value]
    assert await asker.ask(RemoveNodeAsk("x")) == refused
    assert asked == ["old"]

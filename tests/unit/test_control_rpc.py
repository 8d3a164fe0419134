"""The leader-call rpc (``control.call``) on its receiving side: bad bytes are a typed refusal
that touches nothing, and a node that does not lead says so (the asker then retries)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from skulk.cluster import State
from skulk.control import CONTROL_METHOD, ClusterControl
from skulk.control._control import CALL_CODEC, REPLY_CODEC
from skulk.federation import RpcFailed
from skulk.wire.cluster import ControlRefused, PlacementAsk, RemoveNodeAsk


def control(leader: str | None) -> ClusterControl:
    driver = SimpleNamespace(leader=leader, state=State(), applied=0)
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

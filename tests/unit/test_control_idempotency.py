"""Idempotent control asks (issue 23): a placement or deletion whose answer was lost after the
leader committed it (the leader's submit timed out, or the rpc's answer never came back) is
retried with the same idempotency key and answers as the first did. The key lives in the
replicated State, so it holds across leader changes; the State keeps the last ``KEYS_KEPT``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from skulk.cluster import KEYS_KEPT, State, apply
from skulk.consensus import SubmitTimeout
from skulk.control import CONTROL_METHOD, ClusterControl
from skulk.federation import LinkError
from skulk.wire.cluster import (
    Applied,
    DeleteInstance,
    Placed,
    PlaceInstance,
    PlacementAsk,
    Rejected,
    Shard,
)

from .test_cluster_routes import app_for
from .test_control_placement import GEMMA, GIB, LLAMA, FakeDriver, cluster, make, readings


class LosingDriver(FakeDriver):
    """A leader whose next ``lose`` submissions commit, then time out (the answer is lost)."""

    def __init__(self, state: State) -> None:
        super().__init__(state)
        self.lose = 0

    async def submit(self, data: bytes, **kw: Any) -> bytes:
        answer = await super().submit(data, **kw)
        if self.lose:
            self.lose -= 1
            raise SubmitTimeout(5.0)  # committed, but the answer did not come back in time
        return answer


@pytest.fixture
async def api() -> AsyncIterator[tuple[Any, LosingDriver]]:
    seen = {n: readings(n, 8 * GIB) for n in "abc"}
    driver = LosingDriver(cluster(LLAMA, GEMMA))
    control = ClusterControl(
        "a",
        SimpleNamespace(driver=driver),  # type: ignore[arg-type]
        SimpleNamespace(links=list, link=lambda peer: None),  # type: ignore[arg-type]
        lambda: seen,
        card_for=lambda name: None,  # type: ignore[arg-type,return-value]
    )
    async with app_for(driver, control, seen).test_app() as test_app:
        yield test_app.test_client(), driver


async def place(client: Any, key: str | None, model: str = "m") -> tuple[int, Any]:
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    response = await client.post("/v1/placements", data=json.dumps({"model": model}),
                                 headers=headers)  # fmt: skip
    return response.status_code, await response.get_json()


async def delete(client: Any, instance: str, key: str | None) -> tuple[int, Any]:
    headers = {"Idempotency-Key": key} if key is not None else {}
    response = await client.delete(f"/v1/instances/{instance}", headers=headers)
    return response.status_code, await response.get_json()


async def test_a_placement_retried_after_a_lost_answer_places_one_instance(api: Any) -> None:
    client, driver = api
    driver.lose = 1
    status, lost = await place(client, "k-1")
    assert status == 503, lost  # committed, but the leader could not say so in time
    assert len(driver.state.instances) == 1
    status, retried = await place(client, "k-1")
    assert status == 201, retried
    (instance,) = driver.state.instances  # still one: the retry placed nothing new
    assert retried["instance"]["id"] == instance.id
    status, again = await place(client, '"k-1"')  # the draft's quoted form is the same key
    assert (status, again["instance"]["id"]) == (201, instance.id)
    # A new key (or none) is a new placement.
    status, other = await place(client, "k-2")
    assert status == 201 and other["instance"]["id"] != instance.id
    assert len(driver.state.instances) == 2


async def test_a_deletion_retried_after_a_lost_answer_answers_as_the_first_did(api: Any) -> None:
    client, driver = api
    status, placed = await place(client, None)
    instance = placed["instance"]["id"]
    driver.lose = 1
    status, lost = await delete(client, instance, "d-1")
    assert status == 503, lost
    assert driver.state.instances == ()
    status, retried = await delete(client, instance, "d-1")
    assert (status, retried) == (200, {"deleted": instance})
    status, plain = await delete(client, instance, None)  # without the key: it is gone
    assert status == 404 and plain["error"]["code"] == "unknown_instance"


async def test_a_key_reused_for_another_request_is_422_and_a_bad_key_is_400(api: Any) -> None:
    client, _ = api
    status, placed = await place(client, "k")
    assert status == 201
    status, other_model = await place(client, "k", model="g")
    assert status == 422 and other_model["error"]["code"] == "key_reused"
    status, as_delete = await delete(client, placed["instance"]["id"], "k")
    assert status == 422 and as_delete["error"]["code"] == "key_reused"
    for bad in ("", "x" * 256, "caf\u00e9", "tab\there"):
        status, body = await place(client, bad)
        assert status == 400 and body["error"]["param"] == "Idempotency-Key", bad
        status, body = await delete(client, placed["instance"]["id"], bad)
        assert status == 400 and body["error"]["param"] == "Idempotency-Key", bad


class LossyLink:
    """The asking node's link to the leader: the leader runs the call, but the first
    ``lose`` answers are lost on the way back."""

    def __init__(self, leader: ClusterControl, lose: int) -> None:
        self.leader, self.lose, self.calls = leader, lose, 0

    async def call(self, method: str, body: bytes, timeout: float) -> bytes:  # noqa: ASYNC109
        self.calls += 1
        answer = await self.leader.handle_rpc(method, body)
        assert method == CONTROL_METHOD
        if self.lose:
            self.lose -= 1
            raise LinkError("the link dropped before the answer arrived")
        return answer


async def test_the_asking_nodes_own_retries_reuse_one_key() -> None:
    seen = {n: readings(n, 8 * GIB) for n in "abc"}
    leader, driver = make(cluster(LLAMA), seen)
    link = LossyLink(leader, lose=2)
    asker, _ = make(cluster(LLAMA), seen)
    follower = SimpleNamespace(leader="a", state=driver.state, applied=0,
                               wait_applied=driver.wait_applied)  # fmt: skip
    asker.node_id = "b"
    asker._driver = follower  # type: ignore[assignment]
    asker._mesh = SimpleNamespace(link=lambda peer: link)  # type: ignore[assignment]
    reply = await asker.ask(PlacementAsk("m", "single", (), (), 1, None, False, False))
    assert link.calls == 3  # two answers lost, then the leader's answer came back
    (instance,) = driver.state.instances
    assert reply == Placed(instance.id, existed=False)


async def test_a_retry_that_raced_its_first_try_answers_the_first_instance() -> None:
    """The first try's entry commits after the retry planned: the retry's own command changes
    nothing, and the answer names the instance the key placed."""
    seen = {n: readings(n, 8 * GIB) for n in "abc"}
    control, driver = make(cluster(LLAMA), seen)
    late = PlaceInstance("first", "m", "single", (Shard(0, "c", 0, 4),), 1, key="k")
    original = driver.submit

    async def first_lands_first(data: bytes, **kw: Any) -> bytes:
        driver.state, _ = apply(driver.state, late)
        return await original(data, **kw)

    driver.submit = first_lands_first  # type: ignore[method-assign]
    reply = await control.ask(PlacementAsk("m", "single", (), (), 1, None, False, False, key="k"))
    assert reply == Placed("first", existed=False)
    assert [i.id for i in driver.state.instances] == ["first"]
    assert control.placements == {}  # the retry's own command placed nothing


def test_apply_remembers_keys_and_forgets_the_oldest_beyond_the_bound() -> None:
    state = cluster(LLAMA)
    shards = (Shard(0, "a", 0, 4),)
    state, result = apply(state, PlaceInstance("i0", "m", "single", shards, 1, key="p"))
    assert result == Applied() and state.keyed("p") is not None
    again, result = apply(state, PlaceInstance("i1", "m", "single", shards, 2, key="p"))
    assert (again, result) == (state, Applied())  # a retry: nothing new
    state, result = apply(state, DeleteInstance("i0", key="d"))
    assert result == Applied() and state.instances == ()
    again, result = apply(state, DeleteInstance("i0", key="d"))
    assert (again, result) == (state, Applied())
    _, reused = apply(state, DeleteInstance("i0", key="p"))
    assert isinstance(reused, Rejected) and reused.reason == "key_reused"
    _, bad = apply(state, DeleteInstance("i0", key=""))
    assert isinstance(bad, Rejected) and bad.reason == "bad_value"
    _, gone = apply(state, DeleteInstance("i0"))  # unkeyed: the instance is unknown
    assert isinstance(gone, Rejected) and gone.reason == "unknown_instance"
    # The bound: KEYS_KEPT keys; the oldest ("p") goes first.
    for n in range(KEYS_KEPT - 1):
        state, result = apply(state, PlaceInstance(f"x{n}", "m", "single", shards, 3, key=f"k{n}"))
        assert result == Applied()
    assert len(state.keys) == KEYS_KEPT and state.keyed("p") is None
    assert state.keyed("d") is not None
    assert [k.key for k in state.keys] == sorted(k.key for k in state.keys)

"""The Raft membership follows the State (issue 23): a node removal whose membership step
fails after ``RemoveNode`` committed is tried again, with back-off, until the node is no
longer a member; a member the State does not hold yet but the leader reaches (a node joining)
is left alone, and the leader never takes itself out."""

from __future__ import annotations

import itertools
import logging
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from skulk.cluster import State, apply
from skulk.consensus import ConfState, ProposalRefused
from skulk.control import ClusterControl
from skulk.federation import LinkView, PeerState
from skulk.wire.cluster import (
    ClusterCommand,
    ClusterConfig,
    ModelCard,
    NodeStatusChanged,
    SetConfig,
    UpsertNode,
)

from .test_control_placement import GIB, FakeDriver, readings


class MemberDriver(FakeDriver):
    """The fake leader's log, with a Raft membership."""

    def __init__(self, state: State, members: tuple[str, ...]) -> None:
        super().__init__(state)
        self.conf = ConfState(members)


class FlakyConsensus:
    """``remove_member`` fails as ``failures`` says, one try each (``timeout``: still a member
    at its deadline; ``refuse``: refused at once), then takes the node out of the membership."""

    def __init__(self, driver: MemberDriver, failures: list[str]) -> None:
        self.driver = driver
        self.failures = failures
        self.tries: list[tuple[str, float]] = []

    async def remove_member(self, node: str, timeout: float = 5.0) -> bool:  # noqa: ASYNC109
        self.tries.append((node, trio.current_time()))
        if self.failures:
            if self.failures.pop(0) == "refuse":
                raise ProposalRefused("conf_change_pending", "another change is in flight")
            await trio.sleep(timeout)
            return False
        voters = tuple(v for v in self.driver.conf.voters if v != node)
        self.driver.conf = ConfState(voters)
        return True


def leader_of(
    state: State, members: tuple[str, ...], reached: str, failures: list[str]
) -> tuple[ClusterControl, MemberDriver, FlakyConsensus]:
    driver = MemberDriver(state, members)
    consensus = FlakyConsensus(driver, failures)
    views = [LinkView(n, f"ws://{n}", PeerState.UP, 1.0, 0, 0, 0, 0, None, True) for n in reached]
    mesh = SimpleNamespace(links=lambda: views, link=lambda peer: None)
    seen = {n: readings(n, 8 * GIB) for n in "a" + reached}

    def no_card(name: str) -> ModelCard:
        raise AssertionError("no cards here")

    control = ClusterControl(
        "a",
        consensus,  # type: ignore[arg-type]
        mesh,  # type: ignore[arg-type]
        lambda: seen,
        card_for=no_card,
    )
    return control, driver, consensus


def three_nodes(*, down: str = "") -> State:
    state = State()
    fast = ClusterConfig(node_down_after_ms=1000, node_remove_after_ms=2000)
    commands: list[ClusterCommand] = [SetConfig(fast)]
    commands += [UpsertNode(n, f"http://{n}", f"ws://{n}", 0) for n in "abc"]
    for command in commands:
        state, _ = apply(state, command)
    if down:
        state, _ = apply(state, NodeStatusChanged(down, "down", 0))
    return state


async def test_a_failed_membership_step_after_remove_node_is_retried_with_back_off(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "skulk.control")
    failures = ["timeout", "refuse", "refuse", "refuse"]  # the first: the duty's own step
    control, driver, consensus = leader_of(three_nodes(down="b"), ("a", "b", "c"), "c", failures)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(control._duties.run)
        await trio.sleep(60)  # the leader's duties run (on the autojump clock)
        nursery.cancel_scope.cancel()
    assert driver.state.node("b") is None  # RemoveNode committed (after 2 s unreachable) ...
    assert driver.conf.members() == ("a", "c")  # ... and b left the membership after all
    assert [node for node, _ in consensus.tries] == ["b"] * 5
    starts = [at for _, at in consensus.tries[1:]]  # the retries, each refused at once
    gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
    assert gaps == sorted(gaps) and gaps[-1] >= 2 * gaps[0]  # back-off between the retries
    assert "still a Raft member" in caplog.text
    assert control._duties.membership.tries == {}  # nothing left to do


async def test_a_joining_member_and_the_leader_are_never_taken_out(autojump_clock: Any) -> None:
    state = three_nodes()
    # d is a member the State does not hold yet (its upsert is not in), but linked: joining.
    control, driver, consensus = leader_of(state, ("a", "b", "c", "d"), "bcd", [])
    driver.state = state
    reconciler = control._duties.membership
    for _ in range(40):
        await reconciler.round(driver.state, 1.0)
        await trio.sleep(0.5)
    assert consensus.tries == [] and driver.conf.members() == ("a", "b", "c", "d")
    # d goes away before its upsert: after the grace it is out (it rejoins as a learner).
    control, driver, consensus = leader_of(state, ("a", "b", "c", "d"), "bc", [])
    reconciler = control._duties.membership
    await reconciler.round(driver.state, 1.0)
    assert consensus.tries == []  # the grace: not yet
    await trio.sleep(1.0)
    await reconciler.round(driver.state, 1.0)
    assert [n for n, _ in consensus.tries] == ["d"] and driver.conf.members() == ("a", "b", "c")

"""The cluster timeline: runners' flight recorders as events, merged across nodes by wall
clock, bounded, and never held up by a node that does not answer."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from skulk.diagnostics import MAX_LIMIT, TIMELINE_METHOD, ClusterTimeline, runner_events
from skulk.diagnostics._timeline import CODEC, MAX_DETAIL, Unanswered, select_events
from skulk.federation import PeerUnreachable, RpcFailed, RpcTimeout
from skulk.runner import FlightEvent
from skulk.wire.diagnostics import TimelineAsk, TimelineEvent, TimelineReply


class FakeRunner:
    def __init__(self, model_id: str, incarnation: int, events: list[FlightEvent]) -> None:
        self.model_id = model_id
        self.incarnation = incarnation
        self._events = tuple(events)

    def flight_events(self) -> tuple[FlightEvent, ...]:
        return self._events


def event(node: str, at: float, kind: str = "phase", instance: str = "i1") -> TimelineEvent:
    return TimelineEvent(at, node, "m", instance, 0, 1, kind, "")


class Peer:
    """A link to another node's timeline, answering through its real rpc handler."""

    def __init__(self, timeline: ClusterTimeline) -> None:
        self.timeline = timeline
        self.asked: list[TimelineAsk] = []

    async def call(self, method: str, body: bytes, timeout: float) -> bytes:  # noqa: ASYNC109
        assert method == TIMELINE_METHOD
        ask = CODEC.decode(body)
        assert isinstance(ask, TimelineAsk)
        self.asked.append(ask)
        return await self.timeline.handle_rpc(method, body)


class Failing:
    def __init__(self, error: Exception | None = None, reply: bytes = b"") -> None:
        self.error = error
        self.reply = reply

    async def call(self, method: str, body: bytes, timeout: float) -> bytes:  # noqa: ASYNC109
        if self.error is not None:
            raise self.error
        return self.reply


class Silent:
    async def call(self, method: str, body: bytes, timeout: float) -> bytes:  # noqa: ASYNC109
        await trio.sleep_forever()
        raise AssertionError("unreachable")


def test_runner_events_tag_every_event_with_where_it_happened() -> None:
    first = FakeRunner("m", 1, [FlightEvent(10.0, 0.0, "phase", "spawning"),
                                FlightEvent(11.0, 1.0, "exit", "x" * 1000, "r1")])  # fmt: skip
    second = FakeRunner("m", 2, [FlightEvent(12.0, 0.0, "phase", "spawning")])
    events = runner_events("n1", "i1", 1, [first, second])
    assert [(e.node, e.instance, e.rank, e.incarnation, e.kind) for e in events] == [
        ("n1", "i1", 1, 1, "phase"), ("n1", "i1", 1, 1, "exit"), ("n1", "i1", 1, 2, "phase")
    ]  # fmt: skip
    assert len(events[1].detail) == MAX_DETAIL and events[1].request_id == "r1"


def test_select_keeps_the_most_recent_matching_events_oldest_first() -> None:
    events = [event("b", 3.0), event("a", 1.0), event("a", 3.0), event("c", 0.5)]
    kept, dropped = select_events(events, since=1.0, limit=2)
    assert [(e.node, e.at) for e in kept] == [("a", 3.0), ("b", 3.0)]  # ties by node
    assert dropped == 1  # c is before since: not counted; a@1.0 is cut by the limit
    assert select_events(events, 0.0, 10) == (
        tuple(sorted(events, key=lambda e: (e.at, e.node))),
        0,
    )


async def test_gather_merges_the_nodes_answers_by_wall_clock() -> None:
    b = ClusterTimeline("b", lambda: [event("b", 2.0), event("b", 4.0)], list, lambda n: None)
    c = ClusterTimeline("c", lambda: [event("c", 3.0)], list, lambda n: None)
    links = {"b": Peer(b), "c": Peer(c)}
    a = ClusterTimeline("a", lambda: [event("a", 1.0), event("a", 5.0)],
                        lambda: ["a", "b", "c"], links.get)  # fmt: skip
    result = await a.gather(since=0.0, limit=10)
    assert [(e.node, e.at) for e in result.events] == [
        ("a", 1.0), ("b", 2.0), ("c", 3.0), ("b", 4.0), ("a", 5.0)
    ]  # fmt: skip
    assert result.answered == ("a", "b", "c") and result.unanswered == ()
    assert links["b"].asked == [TimelineAsk(0.0, 10)]
    limited = await a.gather(since=2.0, limit=2)
    assert [(e.node, e.at) for e in limited.events] == [("b", 4.0), ("a", 5.0)]
    assert limited.dropped == 2  # b@2.0 and c@3.0


async def test_nodes_that_do_not_answer_are_listed_not_waited_for(autojump_clock: Any) -> None:
    wrong_node = CODEC.encode(TimelineReply((event("z", 1.0),), 0))
    links: dict[str, Any] = {
        "silent": Silent(),
        "refusing": Failing(RpcFailed("no_handler", "old node")),
        "timing_out": Failing(RpcTimeout(TIMELINE_METHOD, 1.0)),
        "gone": Failing(PeerUnreachable(None)),
        "garbage": Failing(reply=b"\xff"),
        "liar": Failing(reply=wrong_node),
        "asks_back": Failing(reply=CODEC.encode(TimelineAsk(0.0, 1))),
    }
    peers = [*links, "unlinked"]
    a = ClusterTimeline("a", lambda: [event("a", 1.0)], lambda: peers, links.get, timeout=2.0)
    start = trio.current_time()
    result = await a.gather(0.0, 10)
    assert trio.current_time() - start == pytest.approx(2.0)  # one deadline for all, in parallel
    assert [e.node for e in result.events] == ["a"] and result.answered == ("a",)
    assert result.unanswered == (
        Unanswered("asks_back", "bad_reply"),
        Unanswered("garbage", "bad_reply"),
        Unanswered("gone", "unreachable"),
        Unanswered("liar", "bad_reply"),
        Unanswered("refusing", "no_handler"),
        Unanswered("silent", "timeout"),
        Unanswered("timing_out", "timeout"),
        Unanswered("unlinked", "no_link"),
    )


async def test_a_broken_local_source_costs_only_its_own_events() -> None:
    def broken() -> list[TimelineEvent]:
        raise RuntimeError("a bug")

    result = await ClusterTimeline("a", broken, list, lambda n: None).gather(0.0, 5)
    assert result.events == () and result.answered == ("a",)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"junk",
        CODEC.encode(TimelineAsk(0.0, 0)),
        CODEC.encode(TimelineAsk(0.0, MAX_LIMIT + 1)),
        CODEC.encode(TimelineReply((), 0)),
    ],
)
async def test_the_rpc_refuses_what_is_not_a_bounded_ask(body: bytes) -> None:
    timeline = ClusterTimeline("a", list, list, lambda n: None)
    with pytest.raises(RpcFailed) as failure:
        await timeline.handle_rpc(TIMELINE_METHOD, body)
    assert failure.value.reason == "bad_request"


async def test_the_rpc_answers_at_most_the_limit_with_a_count_of_the_rest() -> None:
    timeline = ClusterTimeline("a", lambda: [event("a", float(t)) for t in range(10)], list,
                               lambda n: None)  # fmt: skip
    reply = CODEC.decode(
        await timeline.handle_rpc(TIMELINE_METHOD, CODEC.encode(TimelineAsk(2.0, 3)))
    )
    assert isinstance(reply, TimelineReply)
    assert [e.at for e in reply.events] == [7.0, 8.0, 9.0] and reply.dropped == 5

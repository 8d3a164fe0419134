"""Chaos schedules: drawn from a seed (same seed, same schedule), sequential faults with a
fault-free warm-up and heal tail, and a file format that round-trips and refuses anything
else naming the field."""

from __future__ import annotations

import json

import pytest

from skulk.chaos import FaultEvent, Schedule, ScheduleError, generate
from skulk.chaos._schedule import HEAL_TAIL_S, WARMUP_S


def test_same_seed_same_schedule_other_seed_other_schedule() -> None:
    assert generate(7, 3, 600) == generate(7, 3, 600)
    assert generate(7, 3, 600).to_json() == generate(7, 3, 600).to_json()
    assert generate(7, 3, 600).events != generate(8, 3, 600).events


def test_faults_are_sequential_within_the_window_and_on_real_nodes() -> None:
    for seed in range(50):
        s = generate(seed, 5, 300)
        assert s.events, seed
        assert s.events[0].at >= WARMUP_S
        for a, b in zip(s.events, s.events[1:], strict=False):
            assert a.heals_at <= b.at  # one fault at a time: a 3-node cluster keeps quorum
        assert s.events[-1].heals_at <= 300 - HEAL_TAIL_S
        assert {e.node for e in s.events} <= set(range(1, 6))
        assert {e.kind for e in s.events} <= {"kill", "pause"}


def test_kinds_can_be_restricted_and_a_short_run_has_no_fault() -> None:
    assert {e.kind for e in generate(3, 3, 600, kinds=("pause",)).events} == {"pause"}
    assert generate(3, 3, WARMUP_S + HEAL_TAIL_S).events == ()


def test_a_schedule_file_round_trips() -> None:
    s = generate(11, 3, 120)
    assert Schedule.from_json(s.to_json()) == s
    hand = Schedule(1, 3, 60.0, (FaultEvent(20.0, "kill", 2, 3.5),))
    assert Schedule.from_json(hand.to_json()) == hand


def _doc(**changes: object) -> str:
    doc: dict[str, object] = json.loads(
        Schedule(1, 3, 60.0, (FaultEvent(20.0, "kill", 2, 3.5),)).to_json()
    )
    doc.update(changes)
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("not json", "not JSON"),
        ("[]", "$:"),
        (_doc(version=2), "$.version"),
        (_doc(seed="x"), "$.seed"),
        (_doc(nodes=0), "$.nodes"),
        (_doc(seconds=-1), "$.seconds"),
        (_doc(events={}), "$.events"),
        (_doc(events=[1]), "$.events[0]"),
        (_doc(events=[{"at": 1, "kind": "melt", "node": 1, "duration": 1}]), "$.events[0].kind"),
        (_doc(events=[{"at": 1, "kind": "kill", "node": 4, "duration": 1}]), "$.events[0].node"),
        (_doc(events=[{"at": -1, "kind": "kill", "node": 1, "duration": 1}]), "$.events[0].at"),
        (_doc(events=[{"at": 1, "kind": "kill", "node": 1}]), "$.events[0].duration"),
    ],
)
def test_a_bad_schedule_file_is_refused_naming_the_field(text: str, field: str) -> None:
    with pytest.raises(ScheduleError, match=field.replace("$", r"\$").replace("[", r"\[")):
        Schedule.from_json(text)


def test_link_faults_name_another_node_and_need_links() -> None:
    s = generate(5, 3, 600, links=True)
    link = [e for e in s.events if e.kind in ("cut", "oneway", "delay", "bandwidth")]
    assert link and s.links
    assert all(1 <= e.peer <= 3 and e.peer != e.node for e in link)
    assert all(e.amount > 0 for e in link if e.kind in ("delay", "bandwidth"))
    assert Schedule.from_json(s.to_json()) == s
    with pytest.raises(ValueError, match="links"):
        generate(5, 3, 600, kinds=("cut",))


@pytest.mark.parametrize(
    ("event", "field"),
    [
        ({"at": 1, "kind": "cut", "node": 1, "duration": 1, "peer": 1}, r"\$.events\[0\].peer"),
        ({"at": 1, "kind": "cut", "node": 1, "duration": 1}, r"\$.events\[0\].peer"),
        ({"at": 1, "kind": "delay", "node": 1, "duration": 1, "peer": 2, "amount": -1},
         r"\$.events\[0\].amount"),
    ],
)  # fmt: skip
def test_a_bad_link_fault_is_refused_naming_the_field(event: dict[str, object], field: str) -> None:
    doc = json.loads(Schedule(1, 3, 60.0, (), links=True).to_json())
    doc["events"] = [event]
    with pytest.raises(ScheduleError, match=field):
        Schedule.from_json(json.dumps(doc))


def test_a_link_fault_in_a_schedule_without_links_is_refused() -> None:
    doc = json.loads(Schedule(1, 3, 60.0, ()).to_json())
    doc["events"] = [{"at": 1, "kind": "cut", "node": 1, "duration": 1, "peer": 2}]
    with pytest.raises(ScheduleError, match=r"\$.events\[0\].kind"):
        Schedule.from_json(json.dumps(doc))


def test_overlapping_faults_never_share_a_node_and_leave_one_node_alone() -> None:
    overlapped = 0
    for seed in range(30):
        s = generate(seed, 3, 300, links=seed % 2 == 0, overlap=True)
        for e in s.events:
            active = [o for o in s.events if o.at <= e.at < o.heals_at]
            held = [n for o in active for n in (o.node, o.peer) if n]
            assert len(held) == len(set(held)), (seed, e)
            assert len(active) <= 2 and len(held) <= 2, (seed, e)
            overlapped += len(active) > 1
        assert s.events[-1].heals_at <= 300 - HEAL_TAIL_S
    assert overlapped > 0


def test_leader_faults_are_node_zero_process_faults_and_round_trip() -> None:
    s = generate(12, 3, 600, links=True, leader=True)
    leaders = [e for e in s.events if e.node == 0]
    assert leaders and all(e.kind in ("kill", "pause") for e in leaders)
    assert Schedule.from_json(s.to_json()) == s
    with pytest.raises(ValueError, match="overlap"):
        generate(12, 3, 600, leader=True, overlap=True)
    doc = json.loads(s.to_json())
    doc["events"] = [{"at": 1, "kind": "cut", "node": 0, "duration": 1, "peer": 2}]
    with pytest.raises(ScheduleError, match=r"\$.events\[0\].node"):
        Schedule.from_json(json.dumps(doc))


def test_clock_and_disk_faults_need_their_flags_and_round_trip() -> None:
    s = generate(3, 3, 600, clock=True, disks=True)
    kinds = {e.kind for e in s.events}
    assert {"clock", "disk"} <= kinds <= {"kill", "pause", "clock", "disk"}
    jumps = [e.amount for e in s.events if e.kind == "clock"]
    assert all(30 <= abs(j) <= 3600 for j in jumps)
    assert any(e.amount < 0 for e in generate(4, 3, 3600, clock=True, kinds=("clock",)).events)
    assert Schedule.from_json(s.to_json()) == s
    assert s.kinds() == ("kill", "pause", "clock", "disk")
    with pytest.raises(ValueError, match="clock=True"):
        generate(3, 3, 600, kinds=("clock",))
    with pytest.raises(ValueError, match="disks=True"):
        generate(3, 3, 600, kinds=("disk",))


def test_a_clock_jump_may_be_negative_but_nothing_else_may() -> None:
    doc = json.loads(generate(3, 3, 600, clock=True, kinds=("clock",)).to_json())
    doc["events"][0]["amount"] = -900
    assert Schedule.from_json(json.dumps(doc)).events[0].amount == -900
    doc["events"][0]["duration"] = -1
    with pytest.raises(ScheduleError, match=r"\$.events\[0\].duration"):
        Schedule.from_json(json.dumps(doc))
    doc = json.loads(generate(3, 3, 600, disks=True, kinds=("disk",)).to_json())
    doc["events"][0]["amount"] = -1
    with pytest.raises(ScheduleError, match=r"\$.events\[0\].amount"):
        Schedule.from_json(json.dumps(doc))
    doc["events"][0]["amount"] = 0
    doc["disks"] = False  # a disk fault in a run without small data dirs
    with pytest.raises(ScheduleError, match=r"\$.events\[0\].kind"):
        Schedule.from_json(json.dumps(doc))
    doc["disks"] = "yes"
    with pytest.raises(ScheduleError, match=r"\$.disks"):
        Schedule.from_json(json.dumps(doc))

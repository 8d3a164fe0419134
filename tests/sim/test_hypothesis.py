"""Hypothesis-generated fault plans: no plan may break an invariant (shrinking gives a minimal
plan when one does). Every plan ends with ``heal_all``, after which liveness is required.
Actions may be triggered (``on``/``after``): timed by a leader's election, first commit or
append rather than by the clock."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skulk.sim import Action, SimConfig, run_seed
from skulk.sim._faults import EVENTS, MESSAGE_TYPES

NODES = ("n1", "n2", "n3", "n4", "n5")
STEPS = 450
HEAL = 300
CONFIG = SimConfig(steps=STEPS, faults=False, liveness=True)

times = st.integers(0, HEAL - 1)
nodes = st.sampled_from(NODES)


@st.composite
def pairs(draw: st.DrawFn) -> tuple[str, str]:
    a = draw(nodes)
    b = draw(nodes.filter(lambda n: n != a))
    return a, b


@st.composite
def partitions(draw: st.DrawFn) -> Action:
    order = draw(st.permutations(NODES))
    cut = draw(st.integers(1, len(NODES) - 1))
    bridge = draw(st.booleans())
    body = order[1:] if bridge else order
    cut = min(cut, len(body) - 1)
    return Action(draw(times), "partition", groups=(tuple(body[:cut]), tuple(body[cut:])))


def node_action(op: str, n: st.SearchStrategy[int] | None = None) -> st.SearchStrategy[Action]:
    if n is None:
        return st.builds(lambda t, node: Action(t, op, node=node), times, nodes)
    return st.builds(lambda t, node, k: Action(t, op, node=node, n=k), times, nodes, n)


@st.composite
def link_action(draw: st.DrawFn) -> Action:
    a, b = draw(pairs())
    op = draw(st.sampled_from(["cut", "flap"]))
    if op == "flap":
        return Action(draw(times), "flap", node=a, peer=b, n=draw(st.integers(1, 12)))
    msg = draw(st.sampled_from(("", *MESSAGE_TYPES)))
    return Action(draw(times), "cut", node=a, peer=b, msg=msg)


plain_actions = st.one_of(
    partitions(),
    link_action(),
    st.builds(lambda t: Action(t, "heal"), times),
    st.builds(lambda t, p: Action(t, "drop", p=p), times, st.sampled_from([0.0, 0.1, 0.3, 0.6])),
    st.builds(lambda t, p: Action(t, "dup", p=p), times, st.sampled_from([0.0, 0.2, 0.5])),
    st.builds(lambda t, hi: Action(t, "delay", lo=1, hi=hi), times, st.integers(1, 15)),
    node_action("isolate"),
    node_action("crash"),
    node_action("restart"),
    node_action("pause"),
    node_action("resume"),
    node_action("rejoin"),
    node_action("disk_full"),
    node_action("disk_ok"),
    node_action("fsync_error"),
    node_action("transfer"),
    node_action("compact"),
    node_action("crash_during_write", st.integers(1, 6)),
    node_action("crash_on_snapshot", st.integers(1, 4)),
)


@st.composite
def triggered(draw: st.DrawFn) -> Action:
    """A fault on whichever node the event is about (or on a node named now)."""
    op = draw(st.sampled_from(["isolate", "rejoin", "crash", "restart", "pause", "resume"]))
    node = draw(st.sampled_from(("@leader", *NODES)))
    on = draw(st.sampled_from(EVENTS))
    return Action(draw(times), op, node=node, on=on, after=draw(st.integers(1, 60)))


actions = st.one_of(plain_actions, triggered())


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(plan=st.lists(actions, max_size=25), seed=st.integers(0, 2**16))
def test_generated_fault_plans_hold_every_invariant(plan: list[Action], seed: int) -> None:
    full = [*sorted(plan, key=lambda a: a.at), Action(HEAL, "heal_all")]
    result = run_seed(seed, CONFIG, plan=full)
    assert result.violation is None, f"{result.violation}\nplan: {full}"
    assert "probe acknowledged" in result.liveness

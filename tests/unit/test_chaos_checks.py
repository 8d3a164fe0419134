"""The chaos checkers on hand-made histories: each passes a clean history and fails the
violation it exists for."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import attrs

from skulk.chaos import (
    FaultRecord,
    Final,
    NodeFinal,
    Op,
    check_all,
    check_control,
    check_converged,
    check_deadlines,
    check_healthy,
    check_produced,
    check_strays,
    check_streams,
    read_produced,
)

DEADLINE = 40.0


def chat(start: float, took: float, outcome: str = "ok", *, node: int = 1, text: str = "abc",
         prompt: int = 0, status: int | None = 200, kind: str = "stream",
         request_id: str | None = None) -> Op:  # fmt: skip
    return Op(kind, node, start, start + took, outcome, status=status, text=text, prompt=prompt,  # type: ignore[arg-type]
              request_id=request_id)  # fmt: skip


def control(kind: str, outcome: str, status: int | None, instance: str | None) -> Op:
    return Op(kind, 1, 0.0, 1.0, outcome, status=status, instance=instance)  # type: ignore[arg-type]


def node(index: int, **kw: object) -> NodeFinal:
    base: dict[str, object] = dict(index=index, running=True, healthy_after=1.0, applied=9,
                                   state_hash="h", runners=1, assigned=1)  # fmt: skip
    base.update(kw)
    return NodeFinal(**base)  # type: ignore[arg-type]


def final(*nodes: NodeFinal, instances: tuple[str, ...] = ("i1",), converged: float | None = 1.0,
          orphans: tuple[int, ...] = (),
          produced: Mapping[str, tuple[str, ...]] | None = None) -> Final:  # fmt: skip
    return Final(nodes or (node(1), node(2), node(3)), converged, instances, orphans,
                 produced or {})  # fmt: skip


def test_a_clean_history_passes_every_check() -> None:
    ops = [chat(0, 1, request_id="r1"), chat(1, 2, kind="chat", request_id="r2"),
           chat(2, 0.5, "error", status=503, text="", request_id="r3"),
           control("place", "ok", 201, "i1")]  # fmt: skip
    produced = {"r1": ("abc",), "r2": ("abc",)}
    results = check_all(ops, [], final(produced=produced), deadline=DEADLINE, converge_bound=30,
                        healthy_bound=60)  # fmt: skip
    assert [r.name for r in results if not r.passed] == []


def test_a_hang_a_truncated_stream_and_a_late_answer_are_deadline_violations() -> None:
    ops = [chat(0, 80, "timeout", status=None), chat(0, 1, "truncated"), chat(0, DEADLINE + 1)]
    r = check_deadlines(ops, [], DEADLINE)
    assert not r.passed and r.violations == 3


def test_time_the_entry_node_was_paused_is_excused_and_nothing_else() -> None:
    pause = FaultRecord("pause", 1, 10.0, 25.0)
    assert check_deadlines([chat(5, DEADLINE + 14)], [pause], DEADLINE).passed
    assert not check_deadlines([chat(5, DEADLINE + 16)], [pause], DEADLINE).passed
    assert not check_deadlines([chat(5, DEADLINE + 14, node=2)], [pause], DEADLINE).passed


def test_a_refused_connection_is_typed_only_while_its_node_was_down() -> None:
    kill = FaultRecord("kill", 2, 10.0, 15.0)
    down = chat(12, 0.01, "unreachable", node=2, status=None, text="")
    assert check_deadlines([down], [kill], DEADLINE).passed
    running = chat(30, 0.01, "unreachable", node=2, status=None, text="")
    assert not check_deadlines([running], [kill], DEADLINE).passed


def test_answers_must_agree_and_partial_ones_must_be_prefixes() -> None:
    good = [chat(0, 1, text="the fox"), chat(0, 1, text="the fox", kind="chat"),
            chat(0, 1, "error", text="the f"), chat(0, 1, text="other", prompt=1)]  # fmt: skip
    assert check_streams(good).passed
    duplicated = chat(0, 1, text="the the fox")
    assert not check_streams([*good, chat(0, 1, text="the fox"), duplicated]).passed
    reordered = chat(0, 1, "error", text="fox the")
    assert not check_streams([*good, reordered]).passed


def test_lost_and_phantom_control_commands_fail_unknown_ones_widen_the_bound() -> None:
    placed = [control("place", "ok", 201, "i1"), control("place", "ok", 201, "i2")]
    assert check_control(placed, final(instances=("i1", "i2"))).passed
    # An acknowledged placement lost (re-placements keep the count; a loss does not).
    assert not check_control(placed, final(instances=("i1",))).passed
    # A refused placement (4xx) that shows up anyway is a phantom.
    refused = control("place", "error", 409, None)
    assert not check_control([*placed, refused], final(instances=("i1", "i2", "i3"))).passed
    # A 503 or a timeout may have committed: one more instance is then allowed.
    unknown = control("place", "error", 503, None)
    assert check_control([*placed, unknown], final(instances=("i1", "i2", "i3"))).passed
    # An acknowledged deletion whose instance is still there.
    deleted = control("delete", "ok", 200, "i2")
    assert not check_control([*placed, control("place", "ok", 201, "i3"), deleted],
                             final(instances=("i1", "i2"))).passed  # fmt: skip
    assert check_control([*placed, deleted], final(instances=("i1",))).passed


def test_divergence_strays_orphans_and_sick_nodes_fail() -> None:
    assert not check_converged(final(converged=None), 30).passed
    assert not check_strays(final(node(1, runners=2, assigned=1))).passed
    assert not check_strays(final(orphans=(4242,))).passed
    assert check_strays(final(node(1, runners=0, assigned=1))).passed
    assert not check_healthy(final(node(1, healthy_after=None)), 60).passed
    assert not check_healthy(final(node(1, running=False)), 60).passed


def test_answers_are_compared_per_length_asked_for() -> None:
    short = chat(0, 1, text="the fox")
    long = attrs.evolve(chat(0, 1, text="the fox ran far"), max_tokens=256)
    assert check_streams([short, long]).passed
    cut = attrs.evolve(chat(0, 1, "error", text="the fox ran"), max_tokens=256)
    assert check_streams([short, long, cut]).passed
    other = attrs.evolve(chat(0, 1, text="the fox sat"), max_tokens=256)
    assert not check_streams([short, long, long, other]).passed


def test_each_text_must_be_what_its_runner_produced_for_that_request_id() -> None:
    produced = {"ok": ("abc",), "cut": ("abcdef",), "two": ("", "xyz"), "short": ("abcd",),
                "foreign": ("abc",), "dup": ("abc",)}  # fmt: skip
    good = [chat(0, 1, text="abc", request_id="ok"),
            chat(0, 1, "error", text="abc", request_id="cut"),  # a prefix: cut mid-stream
            chat(0, 1, text="xyz", request_id="two"),  # retried before output reached it
            chat(0, 1, "error", text="", request_id="none")]  # fmt: skip
    r = check_produced(good, final(produced=produced))
    assert r.passed, r
    bad = [chat(0, 1, text="abc", request_id="short"),  # a success missing the runner's tail
           chat(0, 1, "error", text="abx", request_id="foreign"),  # a token it never made
           chat(0, 1, text="abcabc", request_id="dup"),  # a chunk delivered twice
           chat(0, 1, text="abc", request_id="nobody")]  # text no runner produced for the id
    r = check_produced(bad, final(produced=produced))
    assert not r.passed and r.violations == 4
    assert all(any(rid in e for e in r.examples) for rid in ("short", "foreign", "dup", "nobody"))


def test_the_record_is_read_per_runner_in_write_order(tmp_path: Path) -> None:
    a, b = tmp_path / "node1.jsonl", tmp_path / "node2.jsonl"
    a.write_text('{"id": "r", "runner": 7, "text": "ab"}\n{"id": "q", "runner": 7, "text": "z"}\n'
                 '{"id": "r", "runner": 7, "text": "c"}\n{"id": "r", "runner": 8, "text": "x"}\n'
                 '{"id": "r", "runn')  # a torn last line  # fmt: skip
    b.write_text('{"id": "r", "runner": 7, "text": "y"}\n')  # same pid, another node
    got = read_produced([a, b, tmp_path / "missing.jsonl"])
    assert got == {"r": ("abc", "x", "y"), "q": ("z",)}

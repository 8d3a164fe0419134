"""Jepsen-style checkers over a chaos run's history and final observations. Pure functions.

* **deadlines** — every client operation ended with a success or a typed error (an HTTP
  error body, a stream's error event, or a refused connection to a node that was down at the
  time) within the run's request deadline, plus any time its entry node was stopped
  (SIGSTOP) while it waited: a stopped API node answers nothing, which no deadline of the
  cluster's can cover. A client timeout (a hang), a stream with neither finish nor error, and
  a refused connection to a node that was running all fail it.
* **streams** — every successful completion of a prompt (greedy: ``temperature`` 0) to the
  same ``max_tokens`` has the same text, and every failed one delivered a prefix of it: no
  duplicated, reordered, lost or foreign token, through any node, before or after any fault.
* **produced** — every chat's text is what the runner that served it produced for its request
  id (``x-request-id``; the nodes write each chunk their runners send down, see
  :mod:`skulk.runner._produced`): a success equal to that runner's whole text, a failure a
  prefix of it. A text no runner produced for that id — a token from another request, one
  twice, or out of order — fails it. (A request retried on a second instance before any of its
  output reached the client may have two runners' texts; it must match one of them.)
* **control** — every deletion the API acknowledged is absent from the final State, and the
  number of instances in it is what the acknowledged commands make it: between
  ``placed - deleted - unknown deletions`` and ``placed + unknown placements - deleted``,
  where *unknown* is a command answered with a 5xx, a timeout or a lost connection (it may
  have committed). A 4xx is a definite refusal. (The leader's re-placements replace one
  instance with one, so they keep the count.)
* **converged** — every running node showed the same applied index and the same State within
  the bound after the faults healed.
* **strays** — no node runs more runner processes than the ranks the State assigns it, and no
  runner outlived its node.
* **healthy** — every node answered ``/health`` 200 within the bound after the faults healed.
"""

from __future__ import annotations

from collections import Counter

import attrs

from skulk.chaos._history import FaultRecord, Op
from skulk.chaos._observe import Final

#: Slack around a kill's interval when judging a refused connection (the restart's "listening"
#: line and the first accepted connection are not the same instant).
KILL_SLACK = 1.0
EXAMPLES = 5


@attrs.frozen
class CheckResult:
    name: str
    passed: bool
    #: How many violations (0 when passed).
    violations: int
    detail: str
    examples: tuple[str, ...] = ()


def _overlap(a0: float, a1: float, b0: float, b1: float | None, end: float) -> float:
    return max(0.0, min(a1, end if b1 is None else b1) - max(a0, b0))


def _describe(op: Op) -> str:
    what = f"{op.kind} via node {op.node}: {op.outcome}"
    if op.status is not None or op.code:
        what += f" ({op.status} {op.code or ''})".rstrip()
    return f"{what} after {op.took:.1f}s {op.detail[:120]}".rstrip()


def check_deadlines(ops: list[Op], faults: list[FaultRecord], deadline: float) -> CheckResult:
    bad: list[str] = []
    for op in ops:
        paused = sum(
            _overlap(op.start, op.end, f.start, f.end, op.end)
            for f in faults
            if f.kind == "pause" and f.node == op.node
        )
        if op.outcome in ("timeout", "truncated"):
            bad.append(_describe(op))
        elif op.took > deadline + paused:
            bad.append(_describe(op) + f" (deadline {deadline:g}s + {paused:.1f}s paused)")
        elif op.outcome == "unreachable" and not any(
            f.kind == "kill"
            and f.node == op.node
            and f.start - KILL_SLACK <= op.end
            and (f.end is None or op.start <= f.end + KILL_SLACK)
            for f in faults
        ):
            bad.append(_describe(op) + " (its node was not down)")
    return CheckResult(
        "deadlines",
        not bad,
        len(bad),
        f"{len(ops)} operations, each must end typed within {deadline:g}s (+ its node's pauses)",
        tuple(bad[:EXAMPLES]),
    )


def check_streams(ops: list[Op]) -> CheckResult:
    texts = [op for op in ops if op.kind in ("chat", "stream")]
    bad: list[str] = []
    references: dict[tuple[int, int], str] = {}
    for key in sorted({(op.prompt, op.max_tokens) for op in texts}):
        done = Counter(
            op.text for op in texts if (op.prompt, op.max_tokens) == key and op.outcome == "ok"
        )
        if not done:
            continue
        reference, _ = done.most_common(1)[0]
        references[key] = reference
        for text, n in done.items():
            if text != reference:
                bad.append(f"prompt {key[0]} ({key[1]} tokens): {n} answer(s) {text!r}, "
                           f"most {reference!r}")  # fmt: skip
    for op in texts:
        ref = references.get((op.prompt, op.max_tokens))
        if op.outcome != "ok" and ref is not None and not ref.startswith(op.text):
            bad.append(f"prompt {op.prompt}: {_describe(op)} delivered {op.text!r}, not a "
                       f"prefix of {ref!r}")  # fmt: skip
    return CheckResult(
        "streams",
        not bad,
        len(bad),
        f"{sum(op.outcome == 'ok' for op in texts)} answers of {len(references)} prompts agree; "
        "partial ones are prefixes",
        tuple(bad[:EXAMPLES]),
    )


def check_produced(ops: list[Op], final: Final) -> CheckResult:
    texts = [op for op in ops if op.kind in ("chat", "stream") and op.request_id is not None]
    bad: list[str] = []
    matched = partial = 0
    for op in texts:
        runners = final.produced.get(op.request_id or "", ())
        if op.outcome == "ok":
            good = op.text in runners or (not op.text and not runners)
        else:
            good = not op.text or any(r.startswith(op.text) for r in runners)
        if not good:
            what = " or ".join(repr(r) for r in runners) or "nothing"
            bad.append(f"{op.request_id}: {_describe(op)} delivered {op.text!r}; its runner "
                       f"produced {what}")  # fmt: skip
        elif op.text:
            matched += op.outcome == "ok"
            partial += op.outcome != "ok"
    twice = sum(len(final.produced.get(op.request_id or "", ())) > 1 for op in texts)
    return CheckResult(
        "produced",
        not bad,
        len(bad),
        f"{matched} answers equal their runner's text, {partial} partial ones a prefix of it "
        f"({twice} with text from two runners: retried before any reached the client)",
        tuple(bad[:EXAMPLES]),
    )


def check_control(ops: list[Op], final: Final) -> CheckResult:
    places = [op for op in ops if op.kind == "place"]
    deletes = [op for op in ops if op.kind == "delete"]
    placed = sum(op.outcome == "ok" for op in places)
    maybe_placed = sum(op.outcome != "ok" and not op.definite_failure for op in places)
    deleted = sum(op.outcome == "ok" for op in deletes)
    maybe_deleted = sum(op.outcome != "ok" and not op.definite_failure for op in deletes)
    lo, hi = placed - deleted - maybe_deleted, placed + maybe_placed - deleted
    have = len(final.instances)
    bad = []
    if not lo <= have <= hi:
        bad.append(f"{have} instance(s) in the final State, expected {lo}..{hi}")
    for op in deletes:
        if op.outcome == "ok" and op.instance in final.instances:
            bad.append(f"deleted {op.instance} is in the final State")
    return CheckResult(
        "control",
        not bad,
        len(bad),
        f"placements {placed} ok, {maybe_placed} unknown, "
        f"{sum(op.definite_failure for op in places)} refused; deletions {deleted} ok, "
        f"{maybe_deleted} unknown; final State {have} instance(s)",
        tuple(bad[:EXAMPLES]),
    )


def check_converged(final: Final, bound: float) -> CheckResult:
    views = [f"node {n.index}: applied {n.applied} state {n.state_hash}" for n in final.nodes
             if n.running]  # fmt: skip
    ok = final.converged_after is not None
    detail = (f"same applied index and State on every node after {final.converged_after:.1f}s"
              if ok else f"not the same within {bound:g}s")  # fmt: skip
    return CheckResult("converged", ok, 0 if ok else 1, detail, () if ok else tuple(views))


def check_strays(final: Final) -> CheckResult:
    bad = [f"node {n.index}: {n.runners} runner process(es), the State assigns {n.assigned}"
           for n in final.nodes if n.runners > n.assigned]  # fmt: skip
    bad += [f"runner pid {pid} outlived its node" for pid in final.orphans]
    return CheckResult(
        "strays",
        not bad,
        len(bad),
        "runner processes per node within what the State assigns; none orphaned",
        tuple(bad[:EXAMPLES]),
    )


def check_healthy(final: Final, bound: float) -> CheckResult:
    bad = [f"node {n.index}: /health not 200 within {bound:g}s"
           for n in final.nodes if n.running and n.healthy_after is None]  # fmt: skip
    bad += [f"node {n.index}: not running" for n in final.nodes if not n.running]
    slowest = max((n.healthy_after or 0.0 for n in final.nodes), default=0.0)
    return CheckResult(
        "healthy", not bad, len(bad), f"every node /health 200 (slowest {slowest:.1f}s)", tuple(bad)
    )


def check_all(
    ops: list[Op], faults: list[FaultRecord], final: Final, *, deadline: float,
    converge_bound: float, healthy_bound: float,
) -> list[CheckResult]:  # fmt: skip
    return [
        check_deadlines(ops, faults, deadline),
        check_streams(ops),
        check_produced(ops, final),
        check_control(ops, final),
        check_converged(final, converge_bound),
        check_strays(final),
        check_healthy(final, healthy_bound),
    ]

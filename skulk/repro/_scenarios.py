"""The hang classes, one :class:`Scenario` each, and the deliberate breakages (the
distributed ones are in :mod:`skulk.repro._distributed`).

Each scenario names the fault that provokes the hang (``--runner-faults``, see
``skulk/runner``), the deadlines it shortens, and a script that sends real requests and
checks the outcome. The session adds the checks every scenario shares: nodes shut down
cleanly and no runner process outlives them.
"""

from __future__ import annotations

import threading
import time

from skulk.harness import pid_alive
from skulk.repro._client import chat_body, request, stream_chat
from skulk.repro._control_faults import CONTROL_BREAKS, CONTROL_FAULTS
from skulk.repro._distributed import DISTRIBUTED, DISTRIBUTED_BREAKS
from skulk.repro._node_faults import NODE_BREAKS, NODE_FAULTS
from skulk.repro._scenario import Break, Scenario
from skulk.repro._session import MARGIN, Session
from skulk.repro._steps import (
    deadline_event_within,
    expect_recovery,
    expect_runner_failed,
    fresh_request,
    stream_broken_by_fault,
)
from skulk.repro._storage_faults import STORAGE_FAULTS

#: How long a runner may outlive its SIGKILLed node (its parent-pid watchdog).
ORPHAN_EXIT_LIMIT = 10.0
#: A gap between tokens this long means the hang fault has struck (greedy decoding of the
#: demo model takes milliseconds per token).
STALL_S = 1.0


def _silent_at_start(s: Session) -> None:
    node = s.start_node(wait_ready=False)
    reported: list[str] = []

    def failed_or_ready() -> bool:
        health = node.get("/health")
        if health.status == 503 and health.field("failure", "reason") == "hello_timeout":
            reported.append(health.describe())
        return bool(reported) or health.status == 200

    s.wait_until(failed_or_ready, s.setting("hello-timeout") + MARGIN)
    s.check(
        "/health said 503 hello_timeout while no runner was ready",
        bool(reported),
        reported[0] if reported else node.get("/health").describe(),
    )
    view = expect_runner_failed(s, node, 1, "hello_timeout", events=("deadline", "exit"))
    deadline_event_within(s, view, "hello-timeout")
    expect_recovery(s, node, after=1)


def _wedged_mid_decode(s: Session) -> None:
    node = s.start_node()
    stream_broken_by_fault(s, node, reason="runner_wedged", deadline_flag="progress-timeout")
    expect_runner_failed(
        s,
        node,
        1,
        "runner_wedged",
        events=("request.start", "request.first_token", "deadline", "request.fail", "exit"),
    )
    expect_recovery(s, node, after=1)


def _crash_mid_stream(s: Session) -> None:
    node = s.start_node()
    stream_broken_by_fault(s, node, reason="runner_crashed", deadline_flag=None)
    view = expect_runner_failed(
        s,
        node,
        1,
        "runner_crashed",
        events=("request.start", "request.first_token", "request.fail", "exit"),
    )
    s.check(
        "runner #1 exited with the crash fault's code 13",
        view is not None and view.exit_code == 13,
        f"exit code {view.exit_code if view is not None else None}",
    )
    expect_recovery(s, node, after=1)


def _ignores_sigterm(s: Session) -> None:
    node = s.start_node()
    stream_broken_by_fault(s, node, reason="runner_wedged", deadline_flag="progress-timeout")
    view = expect_runner_failed(s, node, 1, "runner_wedged", events=("deadline", "signal", "exit"))
    term = view.first("signal", "SIGTERM") if view is not None else None
    kill = view.first("signal", "SIGKILL") if view is not None else None
    grace = s.setting("shutdown-grace")
    gap = kill.since_spawn - term.since_spawn if term is not None and kill is not None else None
    s.check(
        "SIGTERM was ignored and SIGKILL followed after the shutdown grace",
        gap is not None and grace / 2 <= gap <= grace + MARGIN,
        f"SIGKILL {gap:.2f}s after SIGTERM (--shutdown-grace {grace:g}s)"
        if gap is not None
        else f"signal events: SIGTERM {term is not None}, SIGKILL {kill is not None}",
    )
    code = view.exit_code if view is not None else None
    s.check("runner #1 died of SIGKILL", code in (-9, 137), f"exit code {code}")
    expect_recovery(s, node, after=1)


def _crash_loop(s: Session) -> None:
    node = s.start_node(wait_ready=False)
    limit = int(s.flags["restart-limit"])
    # Each of the limit + 1 runners crashes as soon as it starts loading.
    took = s.wait_until(
        lambda: node.get("/health").field("state") == "failed", MARGIN * (limit + 2)
    )
    health = node.get("/health")
    s.require(
        "the model ended up failed",
        took is not None,
        f"after {took:.1f}s" if took is not None else health.describe(),
    )
    s.check(
        "/health is 503 with reason crash_loop",
        health.status == 503 and health.field("failure", "reason") == "crash_loop",
        health.describe(),
    )
    chat = request(
        "POST",
        node.url + "/v1/chat/completions",
        budget=s.budget(MARGIN),
        body=chat_body(8, stream=False),
    )
    s.check("a chat request gets 503, not a hang", chat.status == 503, chat.describe())
    models = node.get("/v1/models")
    s.check("the node still answers HTTP", models.status == 200, models.describe())
    node.recorder.poll()
    runners = node.recorder.runners()
    started = max((r.incarnation for r in runners), default=0)
    s.check(
        f"it relaunched, then gave up after --restart-limit {limit}",
        2 <= started <= limit + 1,
        f"{started} runners started; /health restarts={health.field('restarts')}",
    )
    crashed = [(r.incarnation, r.exit_code) for r in runners]
    s.check(
        "every runner exited with the crash fault's code 13",
        bool(runners) and all(code == 13 for _, code in crashed),
        f"(incarnation, exit code): {crashed}",
    )
    alive = sorted(p for p in node.recorder.pids() if pid_alive(p))
    s.check(
        "no runner process is left while the model is failed",
        not alive,
        f"alive: {alive}" if alive else f"{len(node.recorder.pids())} runner pids, all gone",
    )


def _parent_killed(s: Session) -> None:
    node = s.start_node()
    node.recorder.poll()
    current = node.recorder.current()
    pid = current.pid if current is not None else None
    s.require(
        "the runner's pid is in diagnostics",
        pid is not None and pid_alive(pid),
        f"pid {pid}",
    )
    assert pid is not None
    last_token: list[float] = []
    killed_at: list[float] = []
    give_up = time.monotonic() + s.budget(MARGIN * 3)
    stream_over = threading.Event()

    def kill_when_wedged() -> None:
        # Tokens stopped: the runner is stuck in its decode step. Kill the node now, well
        # before its progress deadline would notice, so only the runner's own parent-pid
        # watchdog can end it.
        while not stream_over.wait(0.05) and time.monotonic() < give_up:
            if last_token and time.monotonic() - last_token[-1] >= STALL_S:
                node.kill()
                killed_at.append(time.monotonic())
                return

    killer = threading.Thread(target=kill_when_wedged, daemon=True)
    killer.start()
    out = stream_chat(
        node.url,
        max_tokens=1500,
        budget=s.budget(MARGIN * 3),
        on_token=lambda _: last_token.append(time.monotonic()),
    )
    stream_over.set()
    killer.join(1.0)
    s.require(
        f"the node was SIGKILLed once the stream stalled for {STALL_S:g}s",
        bool(killed_at),
        out.describe(),
    )
    after = out.ended - killed_at[0]
    s.check(
        "the client saw the stream end at once",
        out.finish_reason is None and after <= MARGIN,
        f"{out.describe()}, {after:.1f}s after the kill",
    )
    s.wait_until(lambda: not pid_alive(pid), ORPHAN_EXIT_LIMIT)
    gone = time.monotonic() - killed_at[0]
    s.check(
        "the orphaned runner exited on its own",
        not pid_alive(pid),
        f"pid {pid} gone {gone:.1f}s after the node's SIGKILL"
        if not pid_alive(pid)
        else f"pid {pid} still running {gone:.1f}s after the node's SIGKILL",
    )
    second = s.start_node(faults=False)
    fresh_request(s, second, "a freshly started node serves")


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "runner-silent-at-start",
        "the first runner never says hello: hello_timeout, then a relaunch serves",
        _silent_at_start,
        faults="hang@hello#1",
        flags={"hello-timeout": "5"},
    ),
    Scenario(
        "runner-wedged-mid-decode",
        "the runner stops mid-stream without a word: the progress deadline ends the stream "
        "with runner_wedged, then a relaunch serves",
        _wedged_mid_decode,
        faults="hang@decode:3#1",
    ),
    Scenario(
        "runner-crash-mid-stream",
        "the runner exits mid-stream: the stream ends with runner_crashed, then a relaunch serves",
        _crash_mid_stream,
        faults="crash@decode:3#1",
    ),
    Scenario(
        "runner-ignores-sigterm",
        "a wedged runner that ignores SIGTERM: SIGKILL after the shutdown grace, then a "
        "relaunch serves",
        _ignores_sigterm,
        faults="ignore-sigterm;hang@decode:3#1",
    ),
    Scenario(
        "runner-crash-loop",
        "every runner crashes while loading: after the restart limit the model is failed "
        "(crash_loop) and the node still answers",
        _crash_loop,
        faults="crash@load",
        flags={"restart-limit": "2", "restart-window": "300"},
    ),
    Scenario(
        "parent-killed",
        "the node is SIGKILLed while its runner is wedged mid-stream: the runner exits on its "
        "own (its parent-pid watchdog) and a new node serves",
        _parent_killed,
        # Wedged, the runner cannot notice the closed socket: only its parent-pid watchdog
        # can end it. The node is killed before its progress deadline fires.
        faults="hang@decode:3#1",
        flags={"progress-timeout": "20"},
    ),
    *DISTRIBUTED,
    *NODE_FAULTS,
    *CONTROL_FAULTS,
    *STORAGE_FAULTS,
)

BREAKS: tuple[Break, ...] = (
    Break(
        "progress-deadline",
        "no progress deadline (--progress-timeout 0): a wedged runner goes unnoticed",
        {"progress-timeout": "0"},
    ),
    *DISTRIBUTED_BREAKS,
    *NODE_BREAKS,
    *CONTROL_BREAKS,
)


def find_scenario(name: str) -> Scenario:
    for scenario in SCENARIOS:
        if scenario.name == name:
            return scenario
    raise KeyError(name)


def find_break(name: str) -> Break:
    for breakage in BREAKS:
        if breakage.name == name:
            return breakage
    raise KeyError(name)

"""A fault waits for the last fault on its node to heal: a restart may take longer than the
schedule gave it, and a kill landing while the node restarts would kill the half-started
process (seen in a 5-node run as restarts that "never listened")."""

from __future__ import annotations

import threading
import time

from skulk.chaos._history import History
from skulk.chaos._run import _apply
from skulk.chaos._schedule import FaultEvent


class SlowNode:
    def __init__(self) -> None:
        self.index = 1
        self.faulted = threading.Lock()
        self.events: list[str] = []

    def kill(self) -> None:
        self.events.append("kill")

    def pause(self) -> None:
        self.events.append("pause")

    def resume(self) -> None:
        self.events.append("resume")


class SlowCluster:
    """One node whose restart takes 0.4 s, far past its kill's scheduled heal."""

    def __init__(self) -> None:
        self.the_node = SlowNode()

    def node(self, index: int) -> SlowNode:
        return self.the_node

    def restart(self, node: SlowNode) -> None:
        node.events.append("restarting")
        time.sleep(0.4)
        node.events.append("listening")


def test_a_fault_on_a_node_waits_for_its_last_restart_to_finish() -> None:
    cluster = SlowCluster()
    history = History()
    first = FaultEvent(0.0, "kill", 1, 0.05)
    second = FaultEvent(0.1, "kill", 1, 0.05)  # scheduled after the first "healed"
    threads = [
        threading.Thread(target=_apply, args=(cluster, e, history, lambda _: None))
        for e in (first, second)
    ]
    threads[0].start()
    time.sleep(0.1)
    threads[1].start()
    for t in threads:
        t.join(5)
    assert cluster.the_node.events == ["kill", "restarting", "listening"] * 2
    assert [f.kind for f in history.faults()] == ["kill", "kill"]
    assert all(not f.problem for f in history.faults())

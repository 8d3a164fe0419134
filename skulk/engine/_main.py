"""The runner process's main loop (``python -m skulk.engine``).

The runner is deliberately not a Trio program: decode steps are blocking mlx calls, so the main
thread runs the engine and a reader thread turns the socket's bytes into frames on a queue. The
main thread looks at that queue between decode steps, so a ``Cancel`` takes effect within one
step (of the whole decode batch, see :mod:`skulk.engine._batch`), and it sends a
``Heartbeat`` every heartbeat interval — while idle, between prefill chunks and between decode
steps — so a runner whose main loop is stuck falls silent and the node
can tell it is wedged. Nothing a request carries may stall that loop for long: prompts are
tokenized on a worker thread (:mod:`skulk.engine._prepare`) whose results come back through the
same queue, and sampling parameters never trigger a compilation (:mod:`skulk.engine._sampling`).
Frames are written under a lock.

The runner never outlives its node: a watchdog thread exits the process within 0.2 s of the
parent pid changing (the node died, even by SIGKILL), and the node's socket closing ends it too.

A ``Load`` with a shard makes the runner one rank of a sharded instance
(:mod:`skulk.engine._sharded`: group formation, shard loading); its rank 0 then serves with this
same loop and scheduler over the distributed forward pass
(:mod:`skulk.engine._sharded_forward`), and the other ranks follow rank 0's messages.

Exit codes: 0 after ``Shutdown`` or when the node closes the socket (a rank > 0: also when
rank 0 ended the group); 2 after a load failure (reported first as ``RunnerFailed``); 3 on a
protocol error from the node; 70 when the node is gone; 13 from a ``crash`` fault hook; 71 after
``CollectiveTimeout`` and 72 after ``RunnerFailed(collective_failed)`` (a sharded rank whose
compute group broke, see :mod:`skulk.engine._watchdog`); killed by ``SIGALRM`` when the compute
group did not form within its connect timeout.
"""

from __future__ import annotations

import os
import socket
import threading
import time

from skulk import __version__
from skulk.engine._link import EOF, Link
from skulk.engine._serve import run_single
from skulk.engine._sharded import run_sharded
from skulk.engine.faults import Faults
from skulk.wire.runner import PROTOCOL_VERSION, Hello, Load, Shutdown

PARENT_GONE_EXIT_CODE = 70


def main(
    fd: int,
    parent_pid: int,
    incarnation: int,
    heartbeat_interval: float,
    load_timeout: float = 600.0,
) -> int:
    _die_with_parent(parent_pid)
    faults = Faults.from_env(incarnation)
    faults.arm()
    link = Link(socket.socket(fileno=fd), heartbeat_interval)
    threading.Thread(target=link.read_forever, name="runner-reader", daemon=True).start()
    faults.hit("hello")
    link.send(Hello(protocol_version=PROTOCOL_VERSION, pid=os.getpid(), skulk_version=__version__))
    first = link.next_frame(block=True)
    if not isinstance(first, Load):
        return 0 if first is EOF or isinstance(first, Shutdown) else 3
    if first.shard is not None:
        run_sharded(link, first, first.shard, faults, load_timeout)
    return run_single(link, first, faults)


def _die_with_parent(parent_pid: int) -> None:
    """Exit within 0.2 s when the node dies, even by SIGKILL: a watchdog thread notices that
    the parent pid changed (the orphan is re-parented). Not ``PR_SET_PDEATHSIG``: that fires
    when the *thread* that spawned us exits, and Trio spawns from short-lived worker threads."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.2)
        os._exit(PARENT_GONE_EXIT_CODE)

    if os.getppid() != parent_pid:  # the parent died before we got here
        os._exit(PARENT_GONE_EXIT_CODE)
    threading.Thread(target=watch, name="runner-parent-watch", daemon=True).start()

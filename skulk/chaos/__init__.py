"""Chaos with real processes: ``python -m skulk.chaos run --nodes 3 --minutes N --seed S``.

A seeded schedule (:func:`generate`: data, a list of timed fault events — SIGKILL and
restart on the same data dir, SIGSTOP then SIGCONT) is played against N real
``python -m skulk serve`` processes on loopback while client load runs throughout: chat
completions through the official ``openai`` client, streamed and plain, through randomly
chosen nodes, and placements and deletions through the HTTP API. Every operation and fault
is recorded in a :class:`History`; once the faults heal, the cluster is observed and
Jepsen-style checkers judge the history (:func:`check_all`: deadlines, streams, what the
runners produced, control commands, convergence, strays, health). The summary prints as
``rich`` tables; a failing schedule is written out and replays with
``python -m skulk.chaos replay FILE``.
"""

from skulk.chaos._checks import (
    CheckResult,
    check_all,
    check_control,
    check_converged,
    check_deadlines,
    check_healthy,
    check_produced,
    check_strays,
    check_streams,
)
from skulk.chaos._history import FaultRecord, History, Op
from skulk.chaos._observe import Bounds, Final, NodeFinal, read_produced
from skulk.chaos._run import FLAGS, RunResult, execute, request_deadline
from skulk.chaos._schedule import FaultEvent, Schedule, ScheduleError, generate
from skulk.chaos._summary import print_summary, summary_tables
from skulk.harness import LinkMode, LinkProxy, Proxies, ProxyStatistics

__all__ = [
    "FLAGS",
    "Bounds",
    "CheckResult",
    "FaultEvent",
    "FaultRecord",
    "Final",
    "History",
    "LinkMode",
    "LinkProxy",
    "NodeFinal",
    "Op",
    "Proxies",
    "ProxyStatistics",
    "RunResult",
    "Schedule",
    "ScheduleError",
    "check_all",
    "check_control",
    "check_converged",
    "check_deadlines",
    "check_healthy",
    "check_produced",
    "check_strays",
    "check_streams",
    "execute",
    "generate",
    "print_summary",
    "read_produced",
    "request_deadline",
    "summary_tables",
]

"""The values a repro is made of: scenarios, deliberate breakages, checks and results."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import attrs

from skulk.repro._timeline import Event

if TYPE_CHECKING:
    from skulk.repro._session import Session


@attrs.frozen
class Scenario:
    """One hang class: the node flags and runner faults that provoke it, and a script.

    ``script`` drives the node through a :class:`~skulk.repro._session.Session` (start nodes,
    send requests, record checks). Cleanup and the stray-process check are not its business:
    the session does them after the script, whatever happened.

    ``faults`` go to a single node's runners (:meth:`Session.start_node`); ``node_faults`` to
    the runners of one node of a cluster (:meth:`Session.start_cluster_node`), by the node's
    number (1 = the first started).
    """

    name: str
    description: str
    script: Callable[[Session], None]
    faults: str = ""
    node_faults: Mapping[int, str] = attrs.field(factory=dict)
    #: Node flags (without the leading ``--``) on top of :data:`~skulk.repro._session.BASE_FLAGS`.
    flags: Mapping[str, str] = attrs.field(factory=dict)
    #: Seconds the script may take in all; every wait inside it is capped by what is left.
    budget_s: float = 90.0


@attrs.frozen
class Break:
    """A deliberately broken node configuration (a negative control): the scenarios that it
    breaks must then fail."""

    name: str
    description: str
    flags: Mapping[str, str]
    #: Each node of a cluster offers only this many compute ports (``--compute-ports``, free
    #: ones picked per node), instead of its default range.
    compute_ports: int | None = None
    #: Flags (without the leading ``--``) for some nodes of a cluster only, by node number
    #: (1 = the first started): a break that would stop the cluster forming if the founder
    #: had it too.
    node_flags: Mapping[int, Mapping[str, str]] = attrs.field(factory=dict)


@attrs.frozen
class Check:
    name: str
    passed: bool
    detail: str = ""


@attrs.frozen
class Result:
    scenario: str
    description: str
    faults: str
    flags: Mapping[str, str]
    breakage: str | None
    checks: tuple[Check, ...]
    timeline: tuple[Event, ...]
    #: Unix time the run started (timeline times count from it).
    started_at: float
    duration_s: float
    #: Set when the script stopped early (a required check failed, or an error).
    aborted: str | None = None
    node_log: tuple[str, ...] = ()
    #: The break's flags for some nodes only (:attr:`Break.node_flags`).
    node_flags: Mapping[int, Mapping[str, str]] = attrs.field(factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and self.aborted is None and all(c.passed for c in self.checks)


class StepFailed(Exception):
    """A required check failed: the rest of the script is skipped (cleanup still runs)."""

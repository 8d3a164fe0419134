"""The simulated network: per-directed-link loss, delay, duplication, partitions and flapping.

:meth:`SimNetwork.send` decides, with the network's own seeded ``random.Random``, how many
copies of a message arrive (0 if lost or the link is down, 2 if duplicated) and when (``now``
plus a delay drawn from the link's ``[lo, hi]``; reordering comes from the random delays). The
world calls :meth:`SimNetwork.blocked` again at delivery time: a link that went down while a
message was in flight loses it, as a broken TCP connection would.

Partitions are sets of blocked *directed* pairs, so a one-way cut, a split and a bridge (a node
in no group, connected to both sides that cannot reach each other) are the same mechanism.
An isolated node is kept apart from them, so that it can rejoin (:meth:`SimNetwork.rejoin`)
while every other fault stays, another isolated node's included.
A flapping link is blocked during alternate periods of ``n`` ticks, counted from when it
started flapping. Nothing here reads a clock or iterates a hash-ordered container.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import attrs

from skulk.sim._faults import Action

NETWORK_OPS = frozenset(
    {"partition", "isolate", "rejoin", "cut", "flap", "heal", "drop", "dup", "delay"}
)
"""The plan operations :meth:`SimNetwork.apply` runs (see :data:`skulk.sim._faults.OPS`)."""


@attrs.frozen
class LinkParams:
    """Loss and duplication probabilities and the delay range (ticks, inclusive, ``lo >= 1``)."""

    drop: float = 0.0
    dup: float = 0.0
    lo: int = 1
    hi: int = 3


@attrs.frozen
class NetworkStatistics:
    sent: int
    lost: int
    blocked: int
    duplicated: int
    blocked_pairs: int
    isolated: int
    flapping: int


class SimNetwork:
    """Links between ``node_ids`` with ``base`` parameters until a fault changes them."""

    def __init__(self, rng: random.Random, node_ids: Sequence[str], base: LinkParams) -> None:
        self._rng = rng
        self._nodes = tuple(node_ids)
        self._base = base
        self._default = base
        self._links: dict[tuple[str, str, str], LinkParams] = {}
        self._blocked: set[tuple[str, str]] = set()
        self._blocked_kinds: set[tuple[str, str, str]] = set()
        self._isolated: set[str] = set()
        self._flaps: dict[tuple[str, str], tuple[int, int]] = {}
        self._sent = self._lost = self._blocked_count = self._dups = 0

    # --- faults -------------------------------------------------------------------------

    def partition(self, groups: Sequence[Sequence[str]]) -> None:
        """Block both directions between nodes of different groups (adds to existing cuts)."""
        for i, left in enumerate(groups):
            for right in groups[i + 1 :]:
                for a in left:
                    for b in right:
                        if a != b:
                            self._blocked.add((a, b))
                            self._blocked.add((b, a))

    def isolate(self, node: str) -> None:
        """Cut ``node`` off from every other node, both ways, until :meth:`rejoin` or
        :meth:`heal`."""
        self._isolated.add(node)

    def rejoin(self, node: str) -> None:
        """End ``node``'s isolation; partitions, cuts and flapping links stay."""
        self._isolated.discard(node)

    def cut(self, src: str, dst: str, kind: str = "") -> None:
        """One-way cut: ``src -> dst`` loses everything (only messages of ``kind``, a payload
        class name, if given); ``dst -> src`` still works."""
        if kind:
            self._blocked_kinds.add((src, dst, kind))
        else:
            self._blocked.add((src, dst))

    def flap(self, a: str, b: str, period: int, now: int) -> None:
        """Both directions between ``a`` and ``b`` go down for ``period`` ticks, up for
        ``period`` ticks, and so on, until :meth:`heal`."""
        self._flaps[(a, b)] = (now, period)
        self._flaps[(b, a)] = (now, period)

    def heal(self) -> None:
        """Remove every partition, isolation, cut and flapping link (loss/delay settings
        stay)."""
        self._isolated.clear()
        self._blocked.clear()
        self._blocked_kinds.clear()
        self._flaps.clear()

    def set_params(
        self,
        *,
        link: tuple[str, str] | None = None,
        kind: str = "",
        drop: float | None = None,
        dup: float | None = None,
        lo: int | None = None,
        hi: int | None = None,
    ) -> None:
        """Change loss/duplication/delay for one directed ``link`` and/or one message ``kind``
        (a payload class name such as ``"AppendRequest"``), or for all traffic (which also
        applies the change to every narrower override)."""

        def change(p: LinkParams) -> LinkParams:
            new_lo = p.lo if lo is None else max(1, lo)
            return LinkParams(
                drop=p.drop if drop is None else drop,
                dup=p.dup if dup is None else dup,
                lo=new_lo,
                hi=max(new_lo, p.hi if hi is None else hi),
            )

        if link is None and not kind:
            self._default = change(self._default)
            self._links = {k: change(v) for k, v in self._links.items()}
            return
        src, dst = link if link is not None else ("", "")
        key = (src, dst, kind)
        self._links[key] = change(self._params(src, dst, kind))

    def reset_params(self) -> None:
        """Back to the parameters the network was built with."""
        self._default = self._base
        self._links.clear()

    def apply(self, a: Action, now: int) -> None:
        """Run the plan action ``a`` (one of :data:`NETWORK_OPS`, nodes already resolved) at
        tick ``now``."""
        link = (a.node, a.peer) if a.node and a.peer else None
        if a.op == "partition":
            self.partition(a.groups)
        elif a.op == "isolate":
            self.isolate(a.node)
        elif a.op == "rejoin":
            self.rejoin(a.node)
        elif a.op == "cut":
            self.cut(a.node, a.peer, a.msg)
        elif a.op == "flap":
            self.flap(a.node, a.peer, a.n, now)
        elif a.op == "heal":
            self.heal()
        elif a.op == "drop":
            self.set_params(link=link, kind=a.msg, drop=a.p)
        elif a.op == "dup":
            self.set_params(link=link, kind=a.msg, dup=a.p)
        elif a.op == "delay":
            self.set_params(link=link, kind=a.msg, lo=max(1, a.lo), hi=a.hi)
        else:
            raise ValueError(f"not a network action: {a.op}")

    # --- traffic ------------------------------------------------------------------------

    def _params(self, src: str, dst: str, kind: str) -> LinkParams:
        links = self._links
        if not links:
            return self._default
        return (
            links.get((src, dst, kind))
            or links.get((src, dst, ""))
            or links.get(("", "", kind))
            or self._default
        )

    def blocked(self, src: str, dst: str, now: int, kind: str = "") -> bool:
        """Whether ``src -> dst`` is down at tick ``now`` (for messages of ``kind``)."""
        if (src, dst) in self._blocked:
            return True
        if self._isolated and (src in self._isolated or dst in self._isolated):
            return True
        if kind and (src, dst, kind) in self._blocked_kinds:
            return True
        flap = self._flaps.get((src, dst))
        if flap is not None:
            start, period = flap
            return ((now - start) // period) % 2 == 0
        return False

    def send(self, src: str, dst: str, now: int, kind: str = "") -> list[int]:
        """Delivery ticks of the copies of one message of ``kind`` sent ``src -> dst`` at
        ``now`` (empty if it is lost). Always draws the same number of random values per call,
        so that one fault changes as little of the rest of the run as possible."""
        p = self._params(src, dst, kind)
        self._sent += 1
        rng = self._rng.random
        r_drop = rng()
        r_dup = rng()
        span = p.hi - p.lo + 1
        d1 = p.lo + int(rng() * span)
        d2 = p.lo + int(rng() * span)
        if self.blocked(src, dst, now, kind):
            self._blocked_count += 1
            return []
        if r_drop < p.drop:
            self._lost += 1
            return []
        if r_dup < p.dup:
            self._dups += 1
            return [now + d1, now + d2]
        return [now + d1]

    def statistics(self) -> NetworkStatistics:
        return NetworkStatistics(
            sent=self._sent,
            lost=self._lost,
            blocked=self._blocked_count,
            duplicated=self._dups,
            blocked_pairs=len(self._blocked),
            isolated=len(self._isolated),
            flapping=len(self._flaps) // 2,
        )

"""Raft storage full during a placement: ``raft-storage-full`` (the only voter's disk) and
``raft-storage-full-leader`` (the leader's, of three).

A real ``ENOSPC`` without privileges: writes to ``/dev/full`` fail with it. The node runs with
``--raft-segment-bytes 1``, so every batch its Raft storage persists starts a new segment file
(``<home>/raft/NNNNNNNNNNNNNNNN.seg``, the next number). A :class:`FullDisk` thread keeps that
next name a symbolic link to ``/dev/full``: the node's ``open(O_CREAT|O_APPEND)`` follows it,
its ``write`` fails with ``ENOSPC`` from the kernel, and storage removes the partial file (the
link) as it does after any write that ran out of space; the thread puts it back at once, so
the disk stays full until :meth:`FullDisk.stop` ("space is back").

What must hold, on a one-node cluster (its only voter: nothing is committed that it did not
persist): the placement asked meanwhile is answered with a typed error within its deadline —
never a 201, a 500 or a hang — and its instance is not in the State; the node process keeps
running (no crash, no crash loop) and says why (``/v1/cluster/raft`` ``unavailable:
disk_full``, ``/health`` 503 ``consensus_unavailable``); once space is back its storage reopens
by itself and a retry under the same ``Idempotency-Key`` places exactly one instance, which
serves.

With three nodes, the leader's disk full: it refuses the placement forwarded to it
``unavailable`` and stops leading; the follower that took it asks the next leader again
within its own deadline (the key makes that safe), so the client gets its 201; once space is
back the old leader follows the new one without a restart, and the State converges.

No ``--break``: no node flag turns the disk-full handling off (it is the storage's own
contract, tested below the process in ``tests/unit/test_consensus_storage.py`` and the
simulator's full disks).
"""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from pathlib import Path

from skulk.repro._client import MODEL, Reply, request
from skulk.repro._cluster_steps import PLACE_BUDGET, fresh_request_via, start_cluster, wait_serving
from skulk.repro._control_faults import (
    CONTROL_FLAGS,
    PLACE_DEADLINE,
    check_one_instance,
    raft_of,
    require_voters,
    typed_answer,
)
from skulk.repro._distributed import CLUSTER_FLAGS
from skulk.repro._node_faults import check_converged
from skulk.repro._scenario import Scenario
from skulk.repro._session import MARGIN, Node, Session

DEV_FULL = Path("/dev/full")
_SEGMENT = re.compile(r"(\d{16})\.seg(\.zst)?")
#: How often the full disk checks that its link is still there.
FULL_POLL = 0.002
#: Writes that must fail ENOSPC before space comes back (each a reopen and a persist later).
FULL_HITS = 3
#: Storage reopens with a backoff doubling to 5 s: after space is back, it is up within this.
REOPEN_BOUND = 5.0 + MARGIN


class FullDisk:
    """Keeps the next Raft segment of ``raft_dir`` a link to ``/dev/full`` (see the module
    doc). :attr:`hits` counts the links the node removed: each is a write that failed
    ``ENOSPC``."""

    def __init__(self, raft_dir: Path) -> None:
        self.raft_dir = raft_dir
        self.hits = 0
        self._planted: Path | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="full-disk", daemon=True)

    def _next_segment(self) -> Path:
        seqs = [0]
        with os.scandir(self.raft_dir) as it:
            for entry in it:
                m = _SEGMENT.fullmatch(entry.name)
                if m and not entry.is_symlink():
                    seqs.append(int(m[1]))
        return self.raft_dir / f"{max(seqs) + 1:016d}.seg"

    def _plant(self) -> None:
        if self._planted is not None and not self._planted.is_symlink():
            self.hits += 1  # the node wrote to it, failed ENOSPC and removed it
            self._planted = None
        target = self._next_segment()
        if target != self._planted:
            if self._planted is not None:
                self._planted.unlink(missing_ok=True)
            try:
                target.symlink_to(DEV_FULL)
            except FileExistsError:  # the node created it first: the next one, then
                return
            self._planted = target

    def start(self) -> None:
        self._plant()
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(FULL_POLL):
            self._plant()

    def stop(self) -> None:
        """Space is back: stop planting and remove the link."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2.0)
        if self._planted is not None:
            self._planted.unlink(missing_ok=True)
            self._planted = None


def _place(
    s: Session, node: Node, key: str, *, dry_run: bool = False, on: Node | None = None
) -> Reply:
    """Place the demo model on ``on`` (default: ``node``) through ``node``."""
    target = on if on is not None else node
    body: dict[str, object] = {"model": MODEL, "sharding": "single", "nodes": [target.node_id]}
    if dry_run:
        body["dry_run"] = True
    return request(
        "POST", node.url + "/v1/placements", budget=s.budget(PLACE_DEADLINE), body=body,
        headers={"Idempotency-Key": key},
    )  # fmt: skip


def _raft_storage_full(s: Session) -> None:
    (a,) = start_cluster(s, 1)
    pid = a.pid
    dry = s.wait_until(
        lambda: _place(s, a, uuid.uuid4().hex, dry_run=True).status == 200, PLACE_BUDGET
    )
    s.require("a dry run registers the model and plans the placement", dry is not None)
    disk = FullDisk(a.process.home / "raft")
    s.defer(disk.stop)
    disk.start()
    key = uuid.uuid4().hex
    started = time.monotonic()
    first = _place(s, a, key)
    took = time.monotonic() - started
    s.wait_until(lambda: disk.hits > 0, MARGIN)  # the thread sees its link gone a moment later
    s.require(
        "the node's Raft storage hit ENOSPC (a real write to /dev/full failed)",
        disk.hits > 0,
        f"{disk.hits} failed segment writes; the placement: {first.describe()}",
    )
    code = first.field("error", "code")
    s.check(
        "the placement was answered with a typed error within its deadline, not acknowledged",
        first.status is not None and 400 <= first.status < 600 and first.status != 500
        and isinstance(code, str),
        f"{first.describe()} after {took:.1f}s (deadline {PLACE_DEADLINE:g}s)",
    )  # fmt: skip
    instances = a.get("/v1/instances").field("instances")
    s.check(
        "its instance is not in the State",
        instances == [],
        f"/v1/instances: {instances}",
    )
    # Between a reopen (which writes nothing) and its next persist the node is healthy again,
    # without a leader: poll until it says why.
    said: list[str] = []

    def says_why() -> bool:
        raft, health = raft_of(a), a.get("/health")
        said[:] = [f"raft unavailable={raft.get('unavailable')}, /health {health.describe()}"]
        return (
            raft.get("unavailable") == "disk_full"
            and health.status == 503
            and health.field("status") == "consensus_unavailable"
        )

    s.check(
        "the node says why: Raft unavailable disk_full, /health 503 consensus_unavailable",
        s.wait_until(says_why, MARGIN) is not None,
        said[0] if said else "",
    )
    kept = s.wait_until(lambda: disk.hits >= FULL_HITS, 3 * MARGIN)
    s.require(
        f"the disk stayed full: {FULL_HITS} writes failed ENOSPC (it retries with backoff), "
        "and the node process kept running and answering (no crash, no crash loop)",
        kept is not None and a.serving and a.pid == pid and a.get("/v1/models").status == 200,
        f"{disk.hits} failed writes in {time.monotonic() - started:.1f}s; pid {pid}, "
        f"serving {a.serving}",
    )
    hits = disk.hits
    disk.stop()
    reopened = s.wait_until(
        lambda: raft_of(a).get("unavailable") is None and raft_of(a).get("leader") == a.node_id,
        REOPEN_BOUND,
    )
    s.require(
        "once space is back, Raft storage reopens by itself and the node leads again",
        reopened is not None,
        f"after {reopened:.1f}s ({hits} writes failed ENOSPC meanwhile)"
        if reopened is not None
        else f"raft: {raft_of(a)}",
    )
    retry = _place(s, a, key)
    placed = retry.field("instance", "id")
    s.require(
        "a retry under the same Idempotency-Key is a 201",
        retry.status == 201 and isinstance(placed, str),
        retry.describe(),
    )
    assert isinstance(placed, str)
    check_one_instance(s, placed)
    wait_serving(s, "the instance serves", instance=placed)
    fresh_request_via(s, a, "a fresh request succeeds")
    s.check(
        "the node never restarted",
        a.pid == pid and a.serving,
        f"pid {pid} throughout",
    )


def _leader_storage_full(s: Session) -> None:
    a, b, c = start_cluster(s, 3, flags={1: {"raft-segment-bytes": "1"}})
    require_voters(s, a, [a, b, c])
    pid = a.pid
    dry = s.wait_until(
        lambda: _place(s, b, uuid.uuid4().hex, dry_run=True).status == 200, PLACE_BUDGET
    )
    s.require("a dry run through node 2 registers the model and plans", dry is not None)
    disk = FullDisk(a.process.home / "raft")
    s.defer(disk.stop)
    disk.start()
    key = uuid.uuid4().hex
    started = time.monotonic()
    first = _place(s, b, key)
    took = time.monotonic() - started
    s.wait_until(lambda: disk.hits > 0, MARGIN)
    s.require(
        "the leader's Raft storage hit ENOSPC (a real write to /dev/full failed)",
        disk.hits > 0,
        f"{disk.hits} failed segment writes; the placement: {first.describe()}",
    )
    s.check(
        "node 2 asked the next leader and the placement was answered 201 within its deadline",
        first.status == 201 and typed_answer(first),
        f"{first.describe()} after {took:.1f}s (deadline {PLACE_DEADLINE:g}s)",
    )
    leaders: list[str] = []

    def new_leader() -> bool:
        seen = {str(raft_of(n).get("leader")) for n in (b, c)}
        leaders[:] = sorted(seen)
        return len(seen) == 1 and seen.pop() in (b.node_id, c.node_id)

    elected = s.wait_until(new_leader, s.setting("election-timeout") * 2 + MARGIN)
    s.require(
        "the full leader stopped leading: nodes 2 and 3 elected a new leader",
        elected is not None,
        f"they follow {leaders}" + (f" after {elected:.1f}s" if elected is not None else ""),
    )
    said: list[str] = []

    def says_why() -> bool:
        raft = raft_of(a)
        said[:] = [f"raft unavailable={raft.get('unavailable')}, role={raft.get('role')}"]
        return raft.get("unavailable") == "disk_full"

    s.check(
        "node 1 says why: Raft unavailable disk_full",
        s.wait_until(says_why, MARGIN) is not None,
        said[0] if said else "",
    )
    retry = _place(s, c, key, on=b)
    placed = retry.field("instance", "id")
    s.require(
        "a retry under the same Idempotency-Key (through node 3) is a 201",
        retry.status == 201 and isinstance(placed, str),
        retry.describe(),
    )
    ours = first.field("instance", "id") if first.status == 201 else placed
    s.check("it names the instance the first try placed", placed == ours, f"{ours}, {placed}")
    kept = s.wait_until(lambda: disk.hits >= FULL_HITS, 3 * MARGIN)
    s.require(
        f"the disk stayed full ({FULL_HITS} writes failed ENOSPC) and node 1 kept running",
        kept is not None and a.serving and a.pid == pid,
        f"{disk.hits} failed writes; pid {pid}, serving {a.serving}",
    )
    disk.stop()
    leader = leaders[0]

    def rejoined() -> bool:
        raft = raft_of(a)
        return raft.get("unavailable") is None and raft.get("leader") == leader

    back = s.wait_until(rejoined, REOPEN_BOUND)
    s.require(
        "once space is back, node 1 reopens its storage and follows the new leader",
        back is not None,
        f"after {back:.1f}s" if back is not None else f"raft: {raft_of(a)}",
    )
    assert isinstance(placed, str)
    wait_serving(s, "the instance serves on node 2", instance=placed)
    check_one_instance(s, placed)
    fresh_request_via(s, a, "a fresh request through node 1 succeeds")
    check_converged(s, [a, b, c])
    s.check("node 1 never restarted", a.pid == pid and a.serving, f"pid {pid} throughout")


STORAGE_FAULTS: tuple[Scenario, ...] = (
    Scenario(
        "raft-storage-full",
        "the only voter's Raft storage fails ENOSPC (its next log segment is /dev/full) "
        "during a placement: a typed error in time, nothing acknowledged or applied, no "
        "crash, disk_full reported; once space is back it recovers by itself and a retry "
        "under the same Idempotency-Key places one instance, which serves",
        _raft_storage_full,
        flags={**CLUSTER_FLAGS, "raft-segment-bytes": "1"},
        budget_s=90.0,
    ),
    Scenario(
        "raft-storage-full-leader",
        "the Raft leader's storage fails ENOSPC during a placement sent through a follower: "
        "the full leader refuses it unavailable and stops leading, the others elect a new "
        "one, which the follower asks again (201 in time), a retry under the same "
        "Idempotency-Key names one instance; once space is back the old leader rejoins as a "
        "follower without a restart and the State converges",
        _leader_storage_full,
        flags=CONTROL_FLAGS,
        budget_s=120.0,
    ),
)

"""The client workload: a few clients submitting ``(client_id, seq)`` commands with retries.

What a command *is* is decided when it is sent, by ``compose(node, client_id, seq, now)``: in
the world, the node's cluster command if it leads (:mod:`skulk.sim._commands`); by default
the bytes ``b"client:seq"``.

Each client has at most one command outstanding (which is what makes "``seq`` at or below the
last applied one is a retry" a correct dedup rule). It submits to the node it believes leads
(the last ``NotLeader`` hint) or a random node, and then:

* the node answers with the log position ``(index, term)`` where the command landed: the
  client waits. The command is *acknowledged* when that node applies the entry at ``index``
  with that ``term`` (whether or not dedup made it a no-op: either way it is in effect exactly
  once), and it is told the entry's result there. If the node applies a different entry
  there, or installs a snapshot past it, or goes down, the attempt failed;
* ``NotLeader`` / refused / node down: try again shortly (following a hint at once);
* no answer (a paused node) or no outcome within ``timeout`` ticks: try again.

A retry always reuses the same ``seq`` -- possibly at another node -- so a command that did
commit after all is applied once. Randomness comes from the workload's own ``random.Random``.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Sequence

import attrs

from skulk.consensus import Entry, LogPosition


class Outcome(enum.Enum):
    """How a node answered a submission (besides a :class:`LogPosition`)."""

    NOT_LEADER = "not_leader"
    REFUSED = "refused"
    DOWN = "down"
    """The node is not running: the connection is refused at once."""
    NO_ANSWER = "no_answer"
    """The node is paused: the client hears nothing until its timeout."""


@attrs.frozen
class Answer:
    """A node's answer to a submission. ``applied``: entries the node applied while taking it
    (a single-voter leader commits at once) with their results, checked against the new
    submission."""

    position: LogPosition | None = None
    outcome: Outcome | None = None
    hint: str | None = None
    applied: tuple[tuple[Entry, bytes], ...] = ()


Submit = Callable[[str, str, int, bytes], Answer]
"""``submit(node, client_id, seq, data)``: propose at ``node`` now."""
Compose = Callable[[str, str, int, int], bytes]
"""``compose(node, client_id, seq, now)``: the command ``node`` would propose for it now."""


def plain_command(node: str, client_id: str, seq: int, now: int) -> bytes:
    """The default :data:`Compose`: ``b"client:seq"``."""
    return f"{client_id}:{seq}".encode()


@attrs.frozen
class Ack:
    client: str
    seq: int
    index: int
    term: int
    node: str
    time: int
    attempts: int
    result: bytes = b""
    """What the client was told: the entry's result bytes on ``node``."""


@attrs.define
class Client:
    client_id: str
    auto: bool
    """Submit new commands at random (``rate`` per tick when idle); else only queued ones."""
    queued: int = 0
    seq: int = 0
    outstanding: bool = False
    attempts: int = 0
    send_at: int = 0
    deadline: int = 0
    waiting_on: tuple[str, int] | None = None
    hint: str | None = None
    acked: int = 0
    timeout: int = 0
    """Ticks to wait for an outcome (0: the workload's default)."""


class Workload:
    """Clients ``c1..c<clients>`` (auto) plus any added with :meth:`add_client`."""

    def __init__(
        self,
        rng: random.Random,
        node_ids: Sequence[str],
        *,
        clients: int,
        rate: float,
        timeout: int,
        trace: Callable[[str], None],
        compose: Compose = plain_command,
    ) -> None:
        self._rng = rng
        self._nodes = tuple(node_ids)
        self._rate = rate
        self._timeout = timeout
        self._trace = trace
        self._compose = compose
        self.clients: dict[str, Client] = {}
        for i in range(1, clients + 1):
            self.add_client(f"c{i}", auto=True)
        self._pending: dict[tuple[str, int], tuple[str, int, int]] = {}
        """(node, index) -> (client, seq, term) of a submission waiting for its apply."""
        self.acks: list[Ack] = []
        self.submissions = 0

    def add_client(self, client_id: str, *, auto: bool = False) -> Client:
        client = self.clients.get(client_id)
        if client is None:
            client = self.clients[client_id] = Client(client_id, auto)
        return client

    def enqueue(self, client_id: str, count: int) -> None:
        """Have ``client_id`` submit ``count`` more commands, one after the other."""
        self.add_client(client_id).queued += count

    def acked_by(self, client_id: str) -> int:
        client = self.clients.get(client_id)
        return client.acked if client else 0

    def idle(self) -> bool:
        """No command outstanding or queued."""
        return all(not c.outstanding and not c.queued for c in self.clients.values())

    # --- driving ------------------------------------------------------------------------

    def tick(self, now: int, submit: Submit) -> None:
        for client_id in sorted(self.clients):
            client = self.clients[client_id]
            if not client.outstanding:
                if client.queued:
                    client.queued -= 1
                elif not (client.auto and self._rng.random() < self._rate):
                    continue
                client.seq += 1
                client.outstanding = True
                client.attempts = 0
                client.send_at = now
            if client.waiting_on is not None:
                if now < client.deadline:
                    continue
                self._pending.pop(client.waiting_on, None)
                client.waiting_on = None
                client.hint = None
                self._trace(f"{now} C {client_id} {client.seq} timeout")
            if now >= client.send_at:
                self._send(client, now, submit)

    def _send(self, client: Client, now: int, submit: Submit) -> None:
        node = client.hint if client.hint in self._nodes else self._rng.choice(self._nodes)
        assert node is not None
        client.attempts += 1
        self.submissions += 1
        data = self._compose(node, client.client_id, client.seq, now)
        answer = submit(node, client.client_id, client.seq, data)
        pos = answer.position
        if pos is not None:
            self._trace(f"{now} C {client.client_id} {client.seq} {node} at {pos.index}@{pos.term}")
            key = (node, pos.index)
            displaced = self._pending.pop(key, None)
            if displaced is not None:  # cannot happen: one entry per index per leader term
                self._fail_pending(displaced[0], now)
            self._pending[key] = (client.client_id, client.seq, pos.term)
            client.waiting_on = key
            client.deadline = now + (client.timeout or self._timeout)
            for entry, result in answer.applied:
                self.on_applied(node, entry, now, result)
            return
        outcome = answer.outcome
        self._trace(
            f"{now} C {client.client_id} {client.seq} {node} "
            f"{outcome.value if outcome else '?'} {answer.hint or ''}"
        )
        if outcome is Outcome.NOT_LEADER and answer.hint and answer.hint != node:
            client.hint = answer.hint
            client.send_at = now + 1
        elif outcome is Outcome.NO_ANSWER:
            client.hint = None
            client.waiting_on = (node, -1)
            client.deadline = now + (client.timeout or self._timeout)
        else:
            client.hint = None
            client.send_at = now + self._rng.randint(2, 6)

    def _fail_pending(self, client_id: str, now: int) -> None:
        client = self.clients[client_id]
        client.waiting_on = None
        client.hint = None
        client.send_at = now + 1

    # --- what nodes report ------------------------------------------------------------------

    def on_applied(self, node: str, entry: Entry, now: int, result: bytes = b"") -> Ack | None:
        """``node`` applied ``entry``, answering ``result``: acknowledge or fail the
        submission waiting there."""
        pending = self._pending.pop((node, entry.index), None)
        if pending is None:
            return None
        client_id, seq, term = pending
        client = self.clients[client_id]
        if (entry.term, entry.client_id, entry.seq) != (term, client_id, seq):
            self._trace(f"{now} C {client_id} {seq} lost-at {node} {entry.index}")
            self._fail_pending(client_id, now)
            return None
        ack = Ack(client_id, seq, entry.index, term, node, now, client.attempts, result)
        self.acks.append(ack)
        self._trace(f"{now} C {client_id} {seq} acked {node} {entry.index}@{term}")
        client.acked += 1
        client.outstanding = False
        client.waiting_on = None
        client.send_at = now + 1
        return ack

    def on_restored(self, node: str, index: int, now: int) -> None:
        """``node`` jumped to a snapshot at ``index``: submissions there at or below it have an
        unknown outcome -- retry them."""
        for key in sorted(k for k in self._pending if k[0] == node and k[1] <= index):
            client_id, _, _ = self._pending.pop(key)
            self._fail_pending(client_id, now)

    def on_node_down(self, node: str, now: int) -> None:
        """``node`` stopped: its clients' connections break; they retry elsewhere."""
        for key in sorted(k for k in self._pending if k[0] == node):
            client_id, _, _ = self._pending.pop(key)
            self._fail_pending(client_id, now)

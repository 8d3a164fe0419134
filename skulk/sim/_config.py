"""The simulation's configuration: one frozen value, stored whole in repro files."""

from __future__ import annotations

from typing import Any

import attrs

from skulk.consensus import RaftConfig


class ConfigError(ValueError):
    """A configuration key or value the simulator does not know."""


@attrs.frozen
class SimConfig:
    """Everything but the seed and the fault plan that decides a run.

    Times are ticks. ``voters`` founding members (0: all ``nodes``) form the cluster; the others
    start empty and join through membership changes. ``faults``: generate a random fault plan
    (faults during the first ``fault_fraction`` of ``steps``, then ``heal_all``);
    ``liveness``: after ``heal_all``, require a leader within 5 maximal election timeouts and
    a probe command acknowledged within 5 more.
    """

    nodes: int = 5
    voters: int = 0
    steps: int = 2000
    election_ticks: int = 10
    heartbeat_ticks: int = 2
    pre_vote: bool = True
    check_quorum: bool = True
    max_append_entries: int = 64
    max_inflight: int = 8
    snapshot_chunk_bytes: int = 512
    learner_catchup_entries: int = 16
    compact_every: int = 50
    segment_bytes: int = 16 * 1024
    """Storage segment size: small, so that rotation, compression and segment removal run."""
    clients: int = 3
    command_rate: float = 0.25
    client_timeout: int = 0
    """0: four maximal election timeouts."""
    drop: float = 0.01
    dup: float = 0.01
    delay_lo: int = 1
    delay_hi: int = 3
    faults: bool = True
    fault_fraction: float = 0.7
    mean_fault_gap: int = 25
    disk_faults: bool = True
    bit_flips: bool = True
    membership: bool = True
    """Random plans remove voters and add them back (membership changes under faults)."""
    liveness: bool = True
    restart_delay: int = 20
    """A node that crashed on its own (I/O error) is restarted this long after."""
    degraded_retry: int = 10
    """A DEGRADED node re-opens its storage this often."""
    impure_apply: bool = False
    vary: bool = True
    """Let the seed also pick protocol and network parameters (delays, loss, batch sizes,
    pipelining, compaction, chunk and segment sizes and, with a random plan, 3 nodes instead
    of ``nodes`` half the time): see ``skulk.sim._run.varied``. The effective configuration
    (with ``vary`` off) is what results and repro files record."""

    def raft(self) -> RaftConfig:
        return RaftConfig(
            election_ticks=self.election_ticks,
            heartbeat_ticks=self.heartbeat_ticks,
            pre_vote=self.pre_vote,
            check_quorum=self.check_quorum,
            max_append_entries=self.max_append_entries,
            max_inflight=self.max_inflight,
            snapshot_chunk_bytes=self.snapshot_chunk_bytes,
            learner_catchup_entries=self.learner_catchup_entries,
        )

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(f"n{i}" for i in range(1, self.nodes + 1))

    @property
    def founders(self) -> tuple[str, ...]:
        return self.node_ids[: self.voters or self.nodes]

    @property
    def election_timeout_max(self) -> int:
        return 2 * self.election_ticks

    @property
    def timeout(self) -> int:
        return self.client_timeout or 4 * self.election_timeout_max

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any], base: SimConfig | None = None) -> SimConfig:
        """``base`` (default: the defaults) with the keys of ``raw`` replaced; types checked."""
        base = base or cls()
        fields = {f.name: f for f in attrs.fields(cls)}
        changes: dict[str, Any] = {}
        for key, value in raw.items():
            field = fields.get(key)
            if field is None:
                raise ConfigError(f"unknown configuration key {key!r}")
            want = type(getattr(base, key))
            if want is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if type(value) is not want:
                raise ConfigError(f"{key}: expected {want.__name__}, got {value!r}")
            changes[key] = value
        cfg = attrs.evolve(base, **changes)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if not 1 <= self.nodes <= 32:
            raise ConfigError("nodes must be within 1..32")
        if not 0 <= self.voters <= self.nodes:
            raise ConfigError("voters must be within 0..nodes")
        if self.steps < 1 or self.election_ticks < 2 or self.heartbeat_ticks < 1:
            raise ConfigError("steps >= 1, election_ticks >= 2, heartbeat_ticks >= 1")
        if not 1 <= self.delay_lo <= self.delay_hi:
            raise ConfigError("need 1 <= delay_lo <= delay_hi")
        for name in ("drop", "dup", "command_rate", "fault_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{name} must be within [0, 1]")
        if self.compact_every < 1:
            raise ConfigError("compact_every must be >= 1")

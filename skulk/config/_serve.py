"""A node's settings (:class:`ServeConfig`) and the objects of other packages built from them
(runner, restart, route and link settings)."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from skulk.actors import CooldownPolicy, RestartPolicy
from skulk.config._checks import _api_key
from skulk.config._values import (
    _WILDCARD_HOSTS,
    DEFAULT_MODEL,
    DEFAULT_PORT,
    DISABLED_DEADLINE,
    RAFT_TICK,
    default_compute_ports,
    default_home,
    parse_port_range,
)
from skulk.consensus import DEFAULT_SEGMENT_BYTES
from skulk.runner import RunnerConfig
from skulk.worker import CRASH_LOOP_COOLDOWN, RUNNER_RESTARTS

if TYPE_CHECKING:
    from skulk.consensus import DriverConfig
    from skulk.federation import LinkConfig
    from skulk.routing import RouteTimeouts

_RUNNER = RunnerConfig()


@attrs.frozen
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    home: Path = attrs.field(factory=lambda: default_home(os.environ))
    model: str = DEFAULT_MODEL
    model_given: bool = False  # --model (or SKULK_MODEL) was set explicitly
    log_level: str = "info"
    log_format: str = "text"  # or "json" (skulk.tracing)
    stream_interval: float = 0.02
    # runner deadlines (seconds); the defaults are the runner's own
    hello_timeout: float = _RUNNER.hello_timeout
    load_timeout: float = _RUNNER.load_timeout
    warmup_timeout: float = _RUNNER.warmup_timeout
    progress_timeout: float = _RUNNER.progress_timeout
    cancel_timeout: float = _RUNNER.cancel_timeout
    shutdown_grace: float = _RUNNER.shutdown_grace
    heartbeat_interval: float = _RUNNER.heartbeat_interval
    # a rank of a pipeline/tensor instance (seconds; 0 disables: only for repro --break runs)
    group_connect_timeout: float = 60.0
    collective_timeout: float = 20.0
    rank_pause_timeout: float = _RUNNER.rank_pause_timeout
    cpu_blas: str = "reference"  # or "openblas" (skulk.runner._blas)
    # the remote hop and the node links (seconds; 0 disables: only for repro --break runs); the
    # defaults are RouteTimeouts().idle and LinkConfig().liveness_timeout
    route_idle_timeout: float = 10.0
    link_liveness_timeout: float = 5.0
    # the Raft election timeout (seconds); the default is RaftConfig().election_ticks ticks
    election_timeout: float = 0.5
    # bytes a Raft log segment grows to before the next starts; the default is the storage's
    raft_segment_bytes: int = DEFAULT_SEGMENT_BYTES
    # runner relaunches; the defaults are the model service's own
    restart_backoff: float = RUNNER_RESTARTS.initial_backoff
    restart_limit: int = RUNNER_RESTARTS.max_restarts
    restart_window: float = RUNNER_RESTARTS.window
    crash_loop_cooldown: float = CRASH_LOOP_COOLDOWN.initial
    # fault hooks for tests and repro scripts (see skulk.engine.faults)
    runner_faults: str = ""
    # the cluster (committed into the cluster State's config when given; else its defaults)
    node_down_after: float | None = None
    node_remove_after: float | None = None
    max_queue: int = 64
    # routing among a model's instances (skulk.routing._policy)
    route_policy: str = "prefix"  # or "least-loaded"
    route_affinity_slack: int = 4
    # telemetry gossip: digests a round sends (0: to every peer; skulk.telemetry.DEFAULT_FANOUT)
    gossip_fanout: int = 4
    # what this node offers to placement
    memory_limit: int | None = None
    # the model store (<home>/store): at most this many bytes (None: the disk, less a reserve)
    store_budget: int | None = None
    # no Hub calls: the store and the local Hub cache only (HF_HUB_OFFLINE=1 says the same)
    offline: bool = False
    # a runner's KV memory for running requests, and for kept prefixes (None: the runner's
    # defaults, see skulk.engine._batch and skulk.engine._prefix_cache)
    kv_cache_memory: int | None = None
    prefix_cache_memory: int | None = None
    speculative_tokens: int | None = None  # None: the runner's default
    compute_ports: str = ""  # LO-HI; "" derives them from the federation port
    compute_host: str = ""  # "" is the --listen host (the hostname for a wildcard)
    # federation
    listen: str = "127.0.0.1:52416"
    advertise: str = ""  # "" is the bound --listen address
    join: tuple[str, ...] = ()
    cluster_secret_file: Path | None = None
    # TLS for node-to-node links (wss://); see skulk.federation.tls_contexts
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    # API keys (skulk.api._auth): one of them is required on every route but /health
    api_key: tuple[str, ...] = attrs.field(default=(), repr=False)
    api_key_file: Path | None = None

    def api_keys(self) -> tuple[str, ...]:
        """Every key clients may use: ``--api-key``'s, then ``--api-key-file``'s (one per
        line; blank lines and lines starting with ``#`` are skipped), each once. Raises
        ``ValueError`` naming the file when it cannot be read or a line is not a key."""
        keys = list(self.api_key)
        if self.api_key_file is not None:
            where = f"--api-key-file {self.api_key_file}"
            try:
                lines = self.api_key_file.read_text(encoding="utf-8").splitlines()
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"{where}: cannot read it: {exc}") from None
            for number, line in enumerate(lines, 1):
                key = line.strip()
                if not key or key.startswith("#"):
                    continue
                if (problem := _api_key(key)) is not None:
                    raise ValueError(f"{where}: line {number} is not {problem}")
                keys.append(key)
            if not keys:
                raise ValueError(f"{where}: no key in it")
        return tuple(dict.fromkeys(keys))

    def ensured_model(self, *, founder: bool) -> str | None:
        """The model this node makes sure the cluster has an instance of: ``--model``; the
        demo model when a founder is given none; nothing for ``--model none`` or for a joining
        node left at the default (it joins as capacity)."""
        if self.model == "none":
            return None
        if self.model == DEFAULT_MODEL and not founder and not self.model_given:
            return None
        return self.model

    def compute_port_range(self, federation_port: int) -> tuple[int, int]:
        """``--compute-ports``, else :func:`default_compute_ports` of the bound federation
        port."""
        if self.compute_ports:
            return parse_port_range(self.compute_ports)
        return default_compute_ports(federation_port)

    def compute_host_for(self, federation_host: str) -> str:
        """``--compute-host``, else the federation listen host, else (a wildcard listen says
        nothing about where the node is reached) this machine's hostname."""
        if self.compute_host:
            return self.compute_host
        if federation_host not in _WILDCARD_HOSTS:
            return federation_host
        return socket.gethostname()

    def cluster_config_changes(self) -> dict[str, int]:
        """The cluster config fields this node's flags set (milliseconds)."""
        changes: dict[str, int] = {}
        if self.node_down_after is not None:
            changes["node_down_after_ms"] = round(self.node_down_after * 1000)
        if self.node_remove_after is not None:
            changes["node_remove_after_ms"] = round(self.node_remove_after * 1000)
        return changes

    def restart_policy(self) -> RestartPolicy:
        return attrs.evolve(
            RUNNER_RESTARTS,
            initial_backoff=self.restart_backoff,
            max_backoff=max(RUNNER_RESTARTS.max_backoff, self.restart_backoff),
            max_restarts=self.restart_limit,
            window=self.restart_window,
        )

    def cooldown_policy(self) -> CooldownPolicy:
        return attrs.evolve(
            CRASH_LOOP_COOLDOWN,
            initial=self.crash_loop_cooldown,
            maximum=max(CRASH_LOOP_COOLDOWN.maximum, self.crash_loop_cooldown),
        )

    def shard_timeouts(self) -> tuple[float, float]:
        """``(connect, collective)`` deadlines for a rank of a sharded instance (a disabled
        one, 0, becomes a deadline that never fires in practice)."""
        return (
            self.group_connect_timeout or DISABLED_DEADLINE,
            self.collective_timeout or DISABLED_DEADLINE,
        )

    def route_timeouts(self) -> RouteTimeouts:
        """The remote hop's deadlines: ``--route-idle-timeout`` (0, disabled, becomes a
        deadline that never fires in practice); the others are the hop's defaults."""
        from skulk.routing import RouteTimeouts

        return RouteTimeouts(idle=self.route_idle_timeout or DISABLED_DEADLINE)

    def link_config(self) -> LinkConfig:
        """The node links' settings: ``--link-liveness-timeout`` (0, disabled, becomes a
        deadline that never fires in practice); the others are the links' defaults."""
        from skulk.federation import LinkConfig

        return LinkConfig(liveness_timeout=self.link_liveness_timeout or DISABLED_DEADLINE)

    def raft_config(self) -> DriverConfig:
        """The Raft driver's settings: ``--election-timeout`` in ticks (rounded); the others
        are the driver's defaults."""
        from skulk.consensus import DriverConfig, RaftConfig

        ticks = max(1, round(self.election_timeout / RAFT_TICK))
        return DriverConfig(tick_seconds=RAFT_TICK, raft=RaftConfig(election_ticks=ticks))

    def runner_config(self) -> RunnerConfig:
        return RunnerConfig(
            hello_timeout=self.hello_timeout,
            load_timeout=self.load_timeout,
            warmup_timeout=self.warmup_timeout,
            progress_timeout=self.progress_timeout,
            cancel_timeout=self.cancel_timeout,
            shutdown_grace=self.shutdown_grace,
            heartbeat_interval=self.heartbeat_interval,
            rank_pause_timeout=self.rank_pause_timeout,
            faults=self.runner_faults,
            kv_cache_bytes=self.kv_cache_memory,
            prefix_cache_bytes=self.prefix_cache_memory,
            kv_waiting=self.max_queue,
            speculative_tokens=self.speculative_tokens,
        )

"""Every option declared once (:data:`OPTIONS`: flag, environment variable, type, help, check),
and the config built from flags over environment over defaults (:func:`serve_config`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs

from skulk.config._checks import (
    _api_key,
    _at_least_one,
    _count,
    _cpu_blas,
    _election,
    _faults,
    _file,
    _host,
    _join,
    _level,
    _link_liveness,
    _listen,
    _log_format,
    _port,
    _port_range,
    _positive,
    _positive_size,
    _route_idle,
    _route_policy,
    _seconds,
    _size,
)
from skulk.config._serve import ServeConfig
from skulk.config._values import (
    COMPUTE_PORTS_CEILING,
    COMPUTE_PORTS_COUNT,
    COMPUTE_PORTS_FLOOR,
    COMPUTE_PORTS_OFFSET,
    ByteSize,
    Switch,
    default_home,
)


@attrs.frozen
class Option:
    """One setting. ``multiple``: the flag repeats and the variable is comma-separated."""

    name: str
    kind: type
    help: str
    check: Callable[[object], str | None] | None = None
    multiple: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "SKULK_" + self.name.upper()


OPTIONS: tuple[Option, ...] = (
    Option("host", str, "address the HTTP API binds"),
    Option("port", int, "HTTP API port, 0 for any free port", _port),
    Option("home", Path, "data directory (models, node state)"),
    Option("model", str,
           "model the cluster must have an instance of: a name or an mlx-lm model directory; "
           "'none' joins as capacity only (a joining node left at the default does too)"),
    Option("log_level", str, "debug, info, warning or error", _level),
    Option("log_format", str,
           "text or json: one JSON object per line with timestamp, level, logger, "
           "node, request_id, instance and message", _log_format),
    Option("stream_interval", float,
           "seconds between streamed deltas after the first token; 0 sends every token",
           _seconds),
    Option("hello_timeout", float, "seconds a new runner has to say hello", _positive),
    Option("load_timeout", float, "seconds a runner has to load its model", _positive),
    Option("warmup_timeout", float, "seconds a runner has for its warm-up generation", _positive),
    Option("progress_timeout", float,
           "seconds a busy runner may send nothing (no token, no heartbeat) before it is "
           "declared wedged; 0 disables (not for production)", _seconds),
    Option("cancel_timeout", float, "seconds a runner has to acknowledge a cancel", _positive),
    Option("shutdown_grace", float, "seconds between SIGTERM and SIGKILL when stopping a runner",
           _seconds),
    Option("heartbeat_interval", float, "seconds between a runner's heartbeats", _positive),
    Option("group_connect_timeout", float,
           "seconds the ranks of a pipeline/tensor instance have to form their compute group; "
           "0 disables (not for production)", _seconds),
    Option("collective_timeout", float,
           "seconds one distributed step (a collective) may take before the rank is declared "
           "wedged and the instance re-placed; 0 disables (not for production)", _seconds),
    Option("rank_pause_timeout", float,
           "seconds the process of a pipeline/tensor rank may be stopped by a signal "
           "(SIGSTOP) before the rank fails runner_paused and its node is blamed; kept under "
           "half the collective timeout; 0 disables (not for production)", _seconds),
    Option("route_idle_timeout", float,
           "seconds a request routed to another node may wait for the next chunk of its "
           "answer (the serving node sends a keepalive every 2 s) before it fails "
           "node_unreachable; 0 disables (not for production)", _route_idle),
    Option("link_liveness_timeout", float,
           "seconds a link to another node may receive nothing (it is pinged every second) "
           "before it is declared down; 0 disables (not for production)", _link_liveness),
    Option("election_timeout", float,
           "seconds a Raft follower hears nothing from the leader before it calls an election "
           "(each wait is drawn from T to 2T); a lost leader is replaced after about this "
           "long", _election),
    Option("raft_segment_bytes", ByteSize,
           "bytes a Raft log segment (<home>/raft) grows to before the next one starts and "
           "the closed one is compressed (512K, 4M, ...)", _positive_size),
    Option("restart_backoff", float, "first relaunch delay of a failed runner (then doubling)",
           _seconds),
    Option("restart_limit", int,
           "relaunches allowed within the restart window before the model is marked failed",
           _count),
    Option("restart_window", float, "the window of --restart-limit, in seconds", _positive),
    Option("crash_loop_cooldown", float,
           "seconds a crash-looping model rests before one more try (doubling while tries "
           "fail, at most 600 s or this)", _positive),
    Option("cpu_blas", str,
           "the BLAS the runners use on a Linux CPU: reference (the mlx wheel's own, slow) or "
           "openblas (fast; needs the cpu-blas extra; results then depend in their last bits "
           "on batch neighbours)", _cpu_blas),
    Option("runner_faults", str, "fault hooks for tests and repro scripts; never in production",
           _faults),
    Option("node_down_after", float,
           "seconds the leader waits before it commits an unreachable node down and moves its "
           "instances (sets the cluster config; default 5)", _positive),
    Option("node_remove_after", float,
           "seconds a down node that holds no instance stays in the cluster before it is "
           "removed for good (sets the cluster config; default 600)", _positive),
    Option("max_queue", int,
           "requests one instance on this node takes at once; more are answered 429",
           _at_least_one),
    Option("route_policy", str,
           "how this node picks among a model's ready instances: prefix (the instance a "
           "prompt's head hashes to, the same from every node, so a conversation reuses one "
           "prefix cache) or least-loaded", _route_policy),
    Option("route_affinity_slack", int,
           "how many more of this node's requests the instance a prompt's prefix prefers may "
           "have in flight than the least loaded one before load overrides affinity", _count),
    Option("gossip_fanout", int,
           "peers each telemetry gossip round sends its digest to, chosen at random (0: every "
           "peer; bounding it keeps gossip bytes per node linear in the cluster's size)",
           _count),
    Option("memory_limit", ByteSize,
           "advertise at most this much memory to placement (512M, 2G, ...): available is "
           "at most the limit less what this node's runners use", _positive_size),
    Option("store_budget", ByteSize,
           "most bytes this node's model store (<home>/store) keeps; least recently used "
           "models not in use are evicted to make room (512M, 20G, ...; default: the disk, "
           "less 1G kept free)", _size),
    Option("offline", Switch,
           "serve only what the model store and the local Hugging Face cache hold: no Hub "
           "call (also HF_HUB_OFFLINE=1)"),
    Option("kv_cache_memory", ByteSize,
           "KV-cache memory each runner gives its running requests (512M, 2G, ...); a request "
           "reserves its prompt plus max_tokens, others wait for room (default: half the "
           "memory available when the runner loaded, at least one full context)",
           _positive_size),
    Option("prefix_cache_memory", ByteSize,
           "memory each runner keeps KV state of earlier prompts in for reuse (system "
           "prompts, earlier chat turns), least recently used evicted first; 0 disables "
           "(default: 256M)", _size),
    Option("speculative_tokens", int,
           "most tokens a runner drafts per step by n-gram (prompt-lookup) speculative "
           "decoding while one request runs alone; it drafts only while measured to pay; 0 "
           "disables (default: 6)", _count),
    Option("compute_ports", str,
           "LO-HI: ports this node's runners may listen on for pipeline/tensor compute "
           f"groups; keep them outside the kernel's ephemeral port range (default: "
           f"{COMPUTE_PORTS_COUNT} ports from the federation port + {COMPUTE_PORTS_OFFSET}, "
           f"wrapped into {COMPUTE_PORTS_FLOOR}-{COMPUTE_PORTS_CEILING})", _port_range),
    Option("compute_host", str,
           "host the other nodes reach this node's compute ports at (default: the --listen "
           "host; the hostname when it is a wildcard)", _host),
    Option("listen", str, "HOST:PORT where this node accepts other nodes (port 0: any)",
           _listen),
    Option("advertise", str,
           "ws://HOST:PORT (wss:// with TLS) the other nodes dial to reach this one, gossiped "
           "instead of the bound --listen address (behind NAT, a port forward or a proxy)",
           _join),
    Option("join", str,
           "ws://HOST:PORT (wss:// with TLS) of a node of the cluster to join (repeatable)",
           _join, multiple=True),
    Option("cluster_secret_file", Path,
           "file holding the cluster secret (else $SKULK_CLUSTER_SECRET, else one generated in "
           "the data dir)"),
    Option("tls_cert", Path,
           "PEM certificate chain: the node listens for nodes with TLS (wss://); needs "
           "--tls-key", _file),
    Option("tls_key", Path, "PEM private key of --tls-cert", _file),
    Option("tls_ca", Path,
           "PEM CA bundle that wss:// peers' certificates are verified against (each must name "
           "the host it is dialed by); needed to --join wss://", _file),
    Option("api_key", str,
           "a key clients must send (Authorization: Bearer KEY, or x-api-key: KEY) on every "
           "HTTP route but /health (repeatable; the variable is comma-separated)", _api_key,
           multiple=True),
    Option("api_key_file", Path,
           "file of API keys, one per line (# starts a comment), allowed besides --api-key",
           _file),
)  # fmt: skip


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = ServeConfig(home=Path("~/.local/share/skulk"))
    for opt in OPTIONS:
        default = getattr(defaults, opt.name)
        shown = f"default {default}" if default not in ("", (), None) else "default none"
        if opt.kind is Switch:  # a bare flag: on
            parser.add_argument(
                opt.flag,
                dest=opt.name,
                action="store_const",
                const="1",
                help=f"{opt.help} [{opt.env}]",
            )
            continue
        parser.add_argument(
            opt.flag,
            dest=opt.name,
            action="append" if opt.multiple else "store",
            help=f"{opt.help} ({shown}) [{opt.env}]",
        )


def serve_config(args: argparse.Namespace, env: Mapping[str, str]) -> ServeConfig:
    """Build the config; raises ``ValueError`` naming the flag or variable that is wrong."""
    values: dict[str, object] = {}
    for opt in OPTIONS:
        raw, source = getattr(args, opt.name, None), opt.flag
        if raw is None:
            raw, source = env.get(opt.env), opt.env
            if raw is not None and opt.multiple:
                raw = [part.strip() for part in raw.split(",") if part.strip()]
        if raw is None:
            continue
        parsed = tuple(_value(opt, item, source) for item in raw) if opt.multiple else None
        values[opt.name] = parsed if parsed is not None else _value(opt, raw, source)
    values.setdefault("home", default_home(env))
    values["model_given"] = "model" in values
    config = ServeConfig(**values)  # type: ignore[arg-type]
    if (config.tls_cert is None) != (config.tls_key is None):
        given, missing = (
            ("--tls-cert", "--tls-key") if config.tls_key is None else ("--tls-key", "--tls-cert")
        )
        raise ValueError(f"{given} needs {missing} as well")
    if config.tls_ca is None and (
        wss := [u for u in config.join if u.strip().lower().startswith("wss:")]
    ):
        raise ValueError(f"--join {wss[0]!r}: a wss:// peer needs --tls-ca")
    config.api_keys()  # reads --api-key-file now: a bad one is a command-line error
    return config


def _value(opt: Option, raw: object, source: str) -> object:
    try:
        value = opt.kind(raw)
    except ValueError:
        expected = getattr(opt.kind, "description", opt.kind.__name__)
        raise ValueError(f"{source}: expected {expected}, got {raw!r}") from None
    if opt.check is not None and (problem := opt.check(value)) is not None:
        raise ValueError(f"{source}: expected {problem}, got {raw!r}")
    if isinstance(value, Switch):
        return bool(value)
    if isinstance(value, ByteSize):
        return int(value)  # a plain int from here on (the wire codecs take exact types)
    return value.expanduser() if isinstance(value, Path) else value

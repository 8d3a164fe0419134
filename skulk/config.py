"""Node configuration: defaults, overridden by ``SKULK_*`` environment, overridden by flags.

Each option is declared once in :data:`OPTIONS` (flag, environment variable, type, help, check);
its default is the matching :class:`ServeConfig` field. ``docs/operations.md`` lists them all.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from skulk.actors import CooldownPolicy, RestartPolicy
from skulk.runner import RunnerConfig
from skulk.worker import CRASH_LOOP_COOLDOWN, RUNNER_RESTARTS

if TYPE_CHECKING:
    from skulk.federation import LinkConfig
    from skulk.routing import RouteTimeouts

DEFAULT_PORT = 52415
DEFAULT_MODEL = "skulk-demo"
_RUNNER = RunnerConfig()
#: Without --compute-ports a node offers :data:`COMPUTE_PORTS_COUNT` ports starting this far
#: above its federation port, wrapped into ``COMPUTE_PORTS_FLOOR``-``COMPUTE_PORTS_CEILING``
#: (21703-21734 for the default --listen; see :func:`default_compute_ports`).
COMPUTE_PORTS_OFFSET = 1000
COMPUTE_PORTS_COUNT = 32
#: Default compute ports lie in this range: above the privileged ports, and below every
#: kernel's ephemeral range (Linux usually 32768-60999, macOS/BSD/Windows 49152-65535), where an
#: outgoing connection may hold a port a rank then cannot bind (``group_connect_failed``).
COMPUTE_PORTS_FLOOR = 1024
COMPUTE_PORTS_CEILING = 32767
_WILDCARD_HOSTS = ("", "0.0.0.0", "::")


class ByteSize(int):
    """A byte count written as a number with an optional binary suffix: ``1073741824``,
    ``512M``, ``2G``, ``1.5GiB``, ``64k`` (K/M/G/T, optionally with ``i`` and/or ``B``; powers
    of 1024). ``ValueError`` otherwise."""

    description = "a size in bytes (1073741824, 512M, 2G, 1.5GiB)"
    _SCALE = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    _PATTERN = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(I?B?)", re.IGNORECASE)

    def __new__(cls, value: object) -> ByteSize:
        if isinstance(value, int) and not isinstance(value, bool):
            return super().__new__(cls, value)
        match = cls._PATTERN.fullmatch(str(value).strip())
        if match is None or (not match[2] and match[3].upper() not in ("", "B")):
            raise ValueError(f"not a size: {value!r}")
        scale = cls._SCALE[match[2].upper()]
        whole, _, fraction = match[1].partition(".")
        amount = int(whole) * scale + (int(fraction or "0") * scale) // 10 ** len(fraction)
        return super().__new__(cls, amount)


def parse_port_range(text: str) -> tuple[int, int]:
    """``LO-HI`` (``1 <= LO <= HI <= 65535``) as ``(LO, HI)``; ``ValueError`` otherwise."""
    lo, sep, hi = text.strip().partition("-")
    if not sep or not lo.strip().isdigit() or not hi.strip().isdigit():
        raise ValueError(f"expected LO-HI, got {text!r}")
    first, last = int(lo), int(hi)
    if not 1 <= first <= last <= 65535:
        raise ValueError(f"expected 1 <= LO <= HI <= 65535, got {text!r}")
    return first, last


#: What a deadline flag of 0 ("disabled") becomes where a finite number must travel (a year).
DISABLED_DEADLINE = 365 * 24 * 3600.0
#: RouteTimeouts().keepalive and LinkConfig().heartbeat_interval: --route-idle-timeout and
#: --link-liveness-timeout must exceed them (else a healthy, silent peer would be given up).
ROUTE_KEEPALIVE = 2.0
LINK_HEARTBEAT = 1.0


def default_compute_ports(federation_port: int) -> tuple[int, int]:
    """The compute ports a node offers without --compute-ports: :data:`COMPUTE_PORTS_COUNT`
    ports from ``federation_port + COMPUTE_PORTS_OFFSET``, wrapped (modulo the number of
    possible first ports) into :data:`COMPUTE_PORTS_FLOOR`-:data:`COMPUTE_PORTS_CEILING`.

    So the range never lies in a kernel's ephemeral range, whatever the federation port (the
    default 52416 gives 21703-21734; an OS-picked one such as 53416 gives 22703-22734), and
    never holds the federation port itself; a federation port up to 31736 keeps the plain
    ``+ 1000`` (8000 gives 9000-9031). It is a pure function of the federation port, so nodes on
    one machine (which listen on different federation ports) get disjoint ranges whenever their
    federation ports differ by at least :data:`COMPUTE_PORTS_COUNT` and by at least that much
    less than the span the wrap repeats over (31713 ports): so for any two OS-picked federation
    ports that far apart (Linux's and macOS's whole ephemeral ranges are narrower than the
    span), and any two in 1024-31736. Where ranges do overlap, or a range holds another
    service's port, nothing breaks silently: placement never gives one ``host:port`` to two
    ranks, and a rank whose port is taken fails ``group_connect_failed`` and is re-placed."""
    # how many first ports keep the whole range within FLOOR-CEILING
    span = COMPUTE_PORTS_CEILING - COMPUTE_PORTS_COUNT + 2 - COMPUTE_PORTS_FLOOR
    shifted = federation_port + COMPUTE_PORTS_OFFSET - COMPUTE_PORTS_FLOOR
    first = COMPUTE_PORTS_FLOOR + shifted % span
    return first, first + COMPUTE_PORTS_COUNT - 1


def default_home(env: Mapping[str, str]) -> Path:
    """``$SKULK_HOME``, else ``$XDG_DATA_HOME/skulk``, else ``~/.local/share/skulk``."""
    if home := env.get("SKULK_HOME"):
        return Path(home).expanduser()
    xdg = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "skulk"


@attrs.frozen
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    home: Path = attrs.field(factory=lambda: default_home(os.environ))
    model: str = DEFAULT_MODEL
    model_given: bool = False  # --model (or SKULK_MODEL) was set explicitly
    log_level: str = "info"
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
    # the remote hop and the node links (seconds; 0 disables: only for repro --break runs); the
    # defaults are RouteTimeouts().idle and LinkConfig().liveness_timeout
    route_idle_timeout: float = 10.0
    link_liveness_timeout: float = 5.0
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
    # what this node offers to placement
    memory_limit: int | None = None
    # a runner's KV memory for running requests, and for kept prefixes (None: the runner's
    # defaults, see skulk.engine._batch and skulk.engine._prefix_cache)
    kv_cache_memory: int | None = None
    prefix_cache_memory: int | None = None
    speculative_tokens: int | None = None  # None: the runner's default
    compute_ports: str = ""  # LO-HI; "" derives them from the federation port
    compute_host: str = ""  # "" is the --listen host (the hostname for a wildcard)
    # federation
    listen: str = "127.0.0.1:52416"
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

    def runner_config(self) -> RunnerConfig:
        return RunnerConfig(
            hello_timeout=self.hello_timeout,
            load_timeout=self.load_timeout,
            warmup_timeout=self.warmup_timeout,
            progress_timeout=self.progress_timeout,
            cancel_timeout=self.cancel_timeout,
            shutdown_grace=self.shutdown_grace,
            heartbeat_interval=self.heartbeat_interval,
            faults=self.runner_faults,
            kv_cache_bytes=self.kv_cache_memory,
            prefix_cache_bytes=self.prefix_cache_memory,
            kv_waiting=self.max_queue,
            speculative_tokens=self.speculative_tokens,
        )


def _seconds(value: object) -> str | None:
    assert isinstance(value, float)
    return None if math.isfinite(value) and value >= 0 else "a finite number of seconds >= 0"


def _route_idle(value: object) -> str | None:
    assert isinstance(value, float)
    ok = value == 0 or (math.isfinite(value) and value > ROUTE_KEEPALIVE)
    return None if ok else f"0 (disabled) or more seconds than the keepalive ({ROUTE_KEEPALIVE:g})"


def _link_liveness(value: object) -> str | None:
    assert isinstance(value, float)
    ok = value == 0 or (math.isfinite(value) and value > LINK_HEARTBEAT)
    return None if ok else f"0 (disabled) or more seconds than the heartbeat ({LINK_HEARTBEAT:g})"


def _positive(value: object) -> str | None:
    assert isinstance(value, float)
    return None if math.isfinite(value) and value > 0 else "a finite number of seconds > 0"


def _port(value: object) -> str | None:
    assert isinstance(value, int)
    return None if 0 <= value <= 65535 else "a port number from 0 to 65535"


def _count(value: object) -> str | None:
    assert isinstance(value, int)
    return None if value >= 0 else "a whole number >= 0"


def _at_least_one(value: object) -> str | None:
    assert isinstance(value, int)
    return None if value >= 1 else "a whole number >= 1"


def _level(value: object) -> str | None:
    return None if value in ("debug", "info", "warning", "error") else "debug/info/warning/error"


def _faults(value: object) -> str | None:
    from skulk.engine.faults import Faults, FaultSpecError

    try:
        Faults.parse(str(value), incarnation=1)
    except FaultSpecError as exc:
        return str(exc)
    return None


def _listen(value: object) -> str | None:
    from skulk.federation import MeshAddressError, parse_listen_address

    try:
        parse_listen_address(str(value))
    except MeshAddressError as exc:
        return str(exc)
    return None


def _join(value: object) -> str | None:
    from skulk.federation import MeshAddressError, parse_join_url

    try:
        parse_join_url(str(value))
    except MeshAddressError as exc:
        return str(exc)
    return None


def _port_range(value: object) -> str | None:
    try:
        parse_port_range(str(value))
    except ValueError:
        return "LO-HI, two port numbers with 1 <= LO <= HI <= 65535"
    return None


def _host(value: object) -> str | None:
    text = str(value)
    ok = text and text not in _WILDCARD_HOSTS and not any(c.isspace() for c in text)
    return None if ok else "a host name or address the other nodes reach this one at"


def _positive_size(value: object) -> str | None:
    assert isinstance(value, int)
    return None if value > 0 else "a size in bytes > 0"


def _size(value: object) -> str | None:
    assert isinstance(value, int)
    return None if value >= 0 else "a size in bytes >= 0"


def _api_key(value: object) -> str | None:
    text = str(value)
    ok = text and all(33 <= ord(c) <= 126 for c in text) and "," not in text
    return None if ok else "an API key: printable ASCII, no spaces or commas"


def _file(value: object) -> str | None:
    assert isinstance(value, Path)
    return None if value.expanduser().is_file() else "an existing file"


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
    Option("route_idle_timeout", float,
           "seconds a request routed to another node may wait for the next chunk of its "
           "answer (the serving node sends a keepalive every 2 s) before it fails "
           "node_unreachable; 0 disables (not for production)", _route_idle),
    Option("link_liveness_timeout", float,
           "seconds a link to another node may receive nothing (it is pinged every second) "
           "before it is declared down; 0 disables (not for production)", _link_liveness),
    Option("restart_backoff", float, "first relaunch delay of a failed runner (then doubling)",
           _seconds),
    Option("restart_limit", int,
           "relaunches allowed within the restart window before the model is marked failed",
           _count),
    Option("restart_window", float, "the window of --restart-limit, in seconds", _positive),
    Option("crash_loop_cooldown", float,
           "seconds a crash-looping model rests before one more try (doubling while tries "
           "fail, at most 600 s or this)", _positive),
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
    Option("memory_limit", ByteSize,
           "advertise at most this much memory to placement (512M, 2G, ...): available is "
           "at most the limit less what this node's runners use", _positive_size),
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
    if isinstance(value, ByteSize):
        return int(value)  # a plain int from here on (the wire codecs take exact types)
    return value.expanduser() if isinstance(value, Path) else value

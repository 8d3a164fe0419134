"""The values a node's settings are made of: byte sizes, port ranges, the data directory, and
the defaults derived from them (compute ports from the federation port)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

DEFAULT_PORT = 52415
DEFAULT_MODEL = "skulk-demo"
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


class Switch(int):
    """An on/off setting: ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off`` (any
    case; a bare flag is on). ``ValueError`` otherwise."""

    description = "1, true, yes, on, 0, false, no or off"
    _ON = ("1", "true", "yes", "on")
    _OFF = ("0", "false", "no", "off", "")

    def __new__(cls, value: object) -> Switch:
        text = str(value).strip().lower()
        if text not in cls._ON + cls._OFF:
            raise ValueError(f"not on or off: {value!r}")
        return super().__new__(cls, text in cls._ON)


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
#: DriverConfig().tick_seconds and the Raft leader's heartbeat (RaftConfig().heartbeat_ticks
#: ticks): --election-timeout counts in ticks and must be over twice the heartbeat.
RAFT_TICK = 0.05
RAFT_HEARTBEAT = 0.1


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

"""The checks an option's value must pass: each returns ``None`` when the value is good, else
what was expected (the message names the flag or variable around it)."""

from __future__ import annotations

import math
from pathlib import Path

from skulk.config._values import (
    _WILDCARD_HOSTS,
    LINK_HEARTBEAT,
    RAFT_HEARTBEAT,
    ROUTE_KEEPALIVE,
    parse_port_range,
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


def _election(value: object) -> str | None:
    assert isinstance(value, float)
    ok = math.isfinite(value) and value > 2 * RAFT_HEARTBEAT
    return None if ok else f"seconds > twice the leader's heartbeat ({2 * RAFT_HEARTBEAT:g})"


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


def _log_format(value: object) -> str | None:
    return None if value in ("text", "json") else "text or json"


def _cpu_blas(value: object) -> str | None:
    return None if value in ("reference", "openblas") else "reference or openblas"


def _route_policy(value: object) -> str | None:
    return None if value in ("prefix", "least-loaded") else "prefix or least-loaded"


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

"""The leader's check of the compute ports a node advertises in telemetry, before placement
gives any of them to a rank (pure).

Telemetry is a node's word, and a wrong word must not become a wrong placement: a port outside
``1..65535`` or a host no peer can dial would be committed into the State as a rank's compute
address, and a huge range would make every plan walk it. :func:`usable_compute_ports` answers
the ports to plan with, or why the reading is not usable (the leader then treats the node as
having advertised none: pipeline and tensor ranks go elsewhere, and the node is "pending").
Two nodes advertising overlapping ranges on one host are fine: placement never gives one
``host:port`` to two ranks.
"""

from __future__ import annotations

import ipaddress
import re

import attrs

from ..wire.telemetry import ComputePorts

MAX_COMPUTE_PORTS = 1024
"""The most ports of one node's range the leader plans with: a wider range is used as its
first ``MAX_COMPUTE_PORTS`` ports (more ranks than that on one node is not a real cluster)."""
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,62})?(?:\.[A-Za-z0-9_-]{1,63})*\.?$"
)


def usable_compute_ports(ports: ComputePorts) -> ComputePorts | str:
    """``ports`` as the leader plans with them (a range wider than :data:`MAX_COMPUTE_PORTS`
    cut to its first ports), or what is wrong with them: a port that is not an integer in
    ``1..65535``, ``first_port > last_port``, a host that is neither an IP address nor a DNS
    name."""
    first, last = ports.first_port, ports.last_port
    for name, port in (("first_port", first), ("last_port", last)):
        if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
            return f"{name} {port!r} is not a port (1..65535)"
    if first > last:
        return f"first_port {first} is above last_port {last}"
    problem = _host_problem(ports.host)
    if problem is not None:
        return problem
    if last - first + 1 > MAX_COMPUTE_PORTS:
        return attrs.evolve(ports, last_port=first + MAX_COMPUTE_PORTS - 1)
    return ports


def _host_problem(host: object) -> str | None:
    if not isinstance(host, str) or not host:
        return "no compute host"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return None
    if _HOSTNAME.match(host) is None:
        return f"compute host {host[:80]!r} is neither an IP address nor a host name"
    return None

"""A private network namespace for a run with link faults.

With ``--links`` every node listens for other nodes on the wildcard address: gossip never
dials a wildcard (it says nothing about where a node is reachable), so the only links are the
ones each node dials through its ``--join`` URLs — the fault proxies. Listening on the wildcard
must not open ports on the machine's real interfaces, so the run first moves itself into a new
network namespace holding only its own loopback (unprivileged: inside a new user namespace
that maps the caller's own uid and gid). Every node, runner and client of the run is a child
and shares it; nothing outside can reach it, and it goes away with the run.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
from pathlib import Path

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


class NamespaceError(RuntimeError):
    """The kernel refused a new network namespace (the message says why)."""


def _unshare(flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        err = ctypes.get_errno()
        raise NamespaceError(f"unshare: {os.strerror(err)}")


def enter_private_network() -> None:
    """Move this process (single-threaded: call it first) into a new network namespace and
    bring its loopback up. Linux only."""
    if os.geteuid() == 0:
        _unshare(CLONE_NEWNET)
    else:
        uid, gid = os.getuid(), os.getgid()
        _unshare(CLONE_NEWUSER | CLONE_NEWNET)
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        req = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(sock, SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | IFF_UP))


def in_private_network() -> bool:
    """Whether only a loopback interface is visible (so a wildcard listener is private)."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]

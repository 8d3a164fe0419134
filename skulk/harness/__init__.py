"""Real nodes as subprocesses, for tests, benchmarks, hang-repro scripts and chaos runs, and
the fault-injecting TCP proxy their links can pass through (:class:`Proxies`)."""

from skulk.harness._node import NodeProcess, pid_alive
from skulk.harness._proxy import LinkMode, LinkProxy, Proxies, ProxyStatistics

__all__ = ["LinkMode", "LinkProxy", "NodeProcess", "Proxies", "ProxyStatistics", "pid_alive"]

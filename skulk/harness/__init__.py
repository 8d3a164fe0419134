"""Real nodes as subprocesses, for tests, benchmarks and hang-repro scripts."""

from skulk.harness._node import NodeProcess, pid_alive

__all__ = ["NodeProcess", "pid_alive"]

"""Clock faults: a node's wall clock jumping forward and back.

Nobody can move the machine's clock for one process, a time namespace offsets only the
monotonic clocks, and Debian's ``libfaketime`` (0.9.10) breaks Python 3.11's ``time.sleep``
when it leaves the monotonic clocks alone (its issue #426). So every wall-clock read of Skulk
goes through :func:`skulk.clock.wall`, and a run with ``clock`` starts every node (and so its
runners) with ``SKULK_CLOCK_SKEW_FILE`` naming a file in the node's data dir. A ``clock``
fault writes a jump there (``+3600`` or ``-900`` seconds) and healing writes ``+0``; the
monotonic clocks every deadline uses go on undisturbed. That is what is under test: nothing
may depend on a node's wall clock going forward, and the leader's committed timestamps only
inform. (Libraries' own wall-clock reads, such as an HTTP ``Date`` header, do not jump.)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from skulk.clock import SKEW_FILE_ENV

SKEW_FILE = "clock-skew"


def clock_env(home: Path, env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for a node whose wall clock follows ``home``'s skew file (set to ``+0``)."""
    set_offset(home, 0.0)
    return {**env, SKEW_FILE_ENV: str(home / SKEW_FILE)}


def set_offset(home: Path, seconds: float) -> None:
    """Jump the wall clock of the node at ``home`` to ``seconds`` off the machine's."""
    path = home / SKEW_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{seconds:+g}\n")
    os.replace(tmp, path)  # never read half written

"""The wall clock, one place for all of Skulk.

Every deadline and timer of Skulk runs on a monotonic clock (Trio's, ``time.monotonic``); the
wall clock only stamps things people read: the leader's committed timestamps, API ``created``
fields, trace events, telemetry's ``sampled_at``. No decision may depend on it going forward,
and every read of it goes through :func:`wall` (``ruff`` bans ``time.time`` elsewhere in the
package) so that can be checked: a chaos run (``python -m skulk.chaos run --clock``) starts a
node with ``SKULK_CLOCK_SKEW_FILE`` naming a file that holds a skew in seconds (``+3600``,
``-900``), and moves that node's wall clock by rewriting it. The file is re-read at most once a
second; without the variable :func:`wall` is ``time.time()``.
"""

from __future__ import annotations

import math
import os
import time

#: The environment variable naming a skew file (chaos runs only).
SKEW_FILE_ENV = "SKULK_CLOCK_SKEW_FILE"
#: How often (monotonic seconds) the skew file is re-read.
REREAD_S = 1.0

_skew_file = os.environ.get(SKEW_FILE_ENV, "")
_skew = 0.0
_read_at = -math.inf


def wall() -> float:
    """Seconds since the Unix epoch, as this node's wall clock says (may jump either way)."""
    if _skew_file:
        return time.time() + _current_skew()
    return time.time()


def wall_ms() -> int:
    """:func:`wall` in whole milliseconds."""
    return int(wall() * 1000)


def _current_skew() -> float:
    global _skew, _read_at
    now = time.monotonic()
    if now - _read_at >= REREAD_S:
        _read_at = now
        try:
            with open(_skew_file) as f:
                _skew = float(f.read().strip() or 0)
        except (OSError, ValueError):  # no file yet, or half written: keep the last skew
            pass
    return _skew

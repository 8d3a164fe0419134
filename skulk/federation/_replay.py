"""A bounded memory of recently seen client nonces, to name replayed handshakes."""

from __future__ import annotations

import math
from collections import OrderedDict

import attrs

DEFAULT_REPLAY_ENTRIES = 8192
DEFAULT_REPLAY_TTL = 600.0


@attrs.frozen
class ReplayCacheStatistics:
    entries: int
    max_entries: int
    ttl: float
    remembered: int  # nonces ever added
    replays: int  # nonces refused because they were remembered
    evicted: int  # entries dropped early because the cache was full


class ReplayCache:
    """Client nonces seen in the last ``ttl`` seconds, at most ``max_entries`` of them.

    One cache is shared by every :class:`ServerHandshake` of a node (the listener owns it), so a
    captured ``ClientHello`` replayed on a new connection is refused as ``REPLAYED``. Memory is
    bounded whatever the peers send: when full, the oldest entry is dropped. Dropping one only
    loses the *name* of a later replay: a replayed handshake still fails, because the server's
    fresh nonce makes the old client proof wrong (``WRONG_SECRET``).

    Time is the caller's (``now``, any clock that does not run backwards; ``trio.current_time()``
    in the driver); nothing here reads a clock. Not thread-safe (one Trio thread uses it).
    """

    def __init__(
        self, *, max_entries: int = DEFAULT_REPLAY_ENTRIES, ttl: float = DEFAULT_REPLAY_TTL
    ) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, not {max_entries}")
        if not (math.isfinite(ttl) and ttl > 0):
            raise ValueError(f"ttl must be a finite number of seconds > 0, not {ttl}")
        self._max_entries = max_entries
        self._ttl = ttl
        self._expiry: OrderedDict[bytes, float] = OrderedDict()  # insertion (= time) order
        self._remembered = 0
        self._replays = 0
        self._evicted = 0

    def __len__(self) -> int:
        return len(self._expiry)

    def check_and_remember(self, nonce: bytes, now: float) -> bool:
        """``True`` if ``nonce`` is fresh (it is remembered from now on), ``False`` if it was
        seen less than ``ttl`` seconds ago (a replay; its expiry is not extended)."""
        self._forget_expired(now)
        expiry = self._expiry.get(nonce)
        if expiry is not None and expiry > now:
            self._replays += 1
            return False
        self._expiry.pop(nonce, None)
        self._expiry[nonce] = now + self._ttl
        self._remembered += 1
        while len(self._expiry) > self._max_entries:
            self._expiry.popitem(last=False)
            self._evicted += 1
        return True

    def _forget_expired(self, now: float) -> None:
        while self._expiry:
            oldest, expiry = next(iter(self._expiry.items()))
            if expiry > now:
                return
            del self._expiry[oldest]

    def statistics(self) -> ReplayCacheStatistics:
        return ReplayCacheStatistics(
            entries=len(self._expiry),
            max_entries=self._max_entries,
            ttl=self._ttl,
            remembered=self._remembered,
            replays=self._replays,
            evicted=self._evicted,
        )

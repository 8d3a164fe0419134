"""Stop-string matching over a stream of text deltas (pure, no mlx)."""

from __future__ import annotations


class StopMatcher:
    """Feeds text deltas and releases only text that cannot be the start of a stop string.

    ``feed(delta)`` returns ``(text_to_emit, stopped)``. Once a stop string is seen, the text
    before it is released, the stop string and everything after it are dropped, and ``stopped``
    is true. Text that might still become a stop string is held back until it cannot;
    ``flush()`` releases what is held when generation ends for another reason.

    The result never depends on how the text is cut into deltas. The rule is the one a reader
    of the text one character at a time would apply: generation stops at the **first stop
    string to complete** (the one whose last character comes earliest), and the output is cut
    at that stop string's start. When several complete on the same character, the longest
    (the one starting earliest) is cut. So with stops ``("c", "DcD")``, ``"DDcD"`` gives
    ``"DD"`` however it arrives: ``"c"`` completes before ``"DcD"``. :attr:`matched` is then
    the stop string that cut it (Anthropic's ``stop_sequence``).
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.matched: str | None = None

    def feed(self, delta: str) -> tuple[str, bool]:
        if not self._stops:
            return delta, False
        buf = self._held + delta
        # The held text holds no complete stop string (it would have stopped already), so the
        # first occurrence of each stop in ``buf`` is the earliest it can complete.
        hits = [(i + len(s), i, s) for s in self._stops if (i := buf.find(s)) >= 0]
        if hits:
            self._held = ""
            _end, start, self.matched = min(hits)
            return buf[:start], True
        keep = self._longest_partial_suffix(buf)
        self._held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held

    def _longest_partial_suffix(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of a stop string."""
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(buf)), best, -1):
                if buf.endswith(stop[:n]):
                    best = n
                    break
        return best

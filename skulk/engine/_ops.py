"""What rank 0 of a sharded instance tells the other ranks to do (pure, no mlx).

Rank 0 runs the scheduler; every call it makes on its forward pass
(:class:`~skulk.engine._sharded_forward.ShardForward`) that the other ranks must mirror becomes
an :data:`Op`, and the ops travel along the ring in *messages*: a fixed-shape header of
:data:`HEADER_SIZE` int32 values (magic, sequence number, payload length, idle milliseconds,
flags), then, when the payload is not empty, the ops as one int32 array. Every rank applies
the same ops in the same order, so every rank holds the same caches (by key) and runs the same
forward passes. Keys name caches and prefix-cache entries; ``0`` is "none". A header with the
wrong magic or sequence number is refused with :class:`OpsError` (the ranks lost step).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

MAGIC = 0x534B4C4B  # "SKLK"
HEADER_SIZE = 8
#: A header flag: the message goes all the way round the ring, back to rank 0 (an idle
#: message, or a check that the group still answers).
ECHO = 1


class OpsError(Exception):
    """A message that is not what every rank must agree on."""


@attrs.frozen
class New:
    """A fresh single-row cache under ``key``."""

    key: int


@attrs.frozen
class Free:
    """Forget cache (or prefix entry) ``key``."""

    key: int


@attrs.frozen
class Forward:
    """A forward pass over ``rows`` x ``length`` tokens through cache ``key`` (``0``: none).
    ``back``: rank 0 needs the output (a pipeline's last rank sends its hidden state back);
    otherwise the pass only fills the cache."""

    key: int
    rows: int
    length: int
    back: bool


@attrs.frozen
class Join:
    """A new last row, cache ``own``, joins the batch cache ``batch`` of ``rows`` rows; the
    result is ``result`` (see :func:`skulk.engine._rows.join_rows`)."""

    batch: int
    rows: int
    own: int
    result: int


@attrs.frozen
class Drop:
    """Row ``index`` leaves the batch cache ``batch`` of ``rows`` rows: the rest is ``rest``
    (``0``: none left), the row's own cache ``own`` (``0``: not kept)."""

    batch: int
    rows: int
    index: int
    rest: int
    own: int


@attrs.frozen
class Trim:
    """Drop the last ``n`` positions of cache ``key``."""

    key: int
    n: int


@attrs.frozen
class Keep:
    """Prefix entry ``entry``: a compact copy of the first ``n`` tokens of cache ``key``."""

    key: int
    n: int
    entry: int


@attrs.frozen
class Copy:
    """Cache ``key``: a copy of prefix entry ``entry`` cut to its first ``n`` tokens."""

    entry: int
    n: int
    key: int


@attrs.frozen
class Measure:
    """Every rank measures its KV bytes per token in cache ``key`` and joins the ``all_min``
    of the tokens its KV budget and its prefix bound hold."""

    key: int


@attrs.frozen
class Warmed:
    """The warm-up is over: every rank tells its node ``WarmedUp``."""


@attrs.frozen
class Shutdown:
    """The group ends."""


Op = New | Free | Forward | Join | Drop | Trim | Keep | Copy | Measure | Warmed | Shutdown

_CODES: dict[type, int] = {
    New: 1,
    Free: 2,
    Forward: 3,
    Join: 4,
    Drop: 5,
    Trim: 6,
    Keep: 7,
    Copy: 8,
    Measure: 9,
    Warmed: 10,
    Shutdown: 11,
}
_TYPES = {code: cls for cls, code in _CODES.items()}


@attrs.frozen
class Header:
    """A message's header: its ``seq``, the ``length`` of its payload (int32 words), how long
    rank 0 will stay idle (``idle_ms``, the others may sleep instead of spinning in a
    receive), and whether it goes back to rank 0 (``echo``)."""

    seq: int
    length: int
    idle_ms: int = 0
    echo: bool = False


def encode_header(header: Header) -> list[int]:
    return [
        _i32(MAGIC),
        _i32(header.seq),
        header.length,
        header.idle_ms,
        ECHO if header.echo else 0,
        0,
        0,
        0,
    ]


def decode_header(words: Sequence[int], seq: int) -> Header:
    """The header in ``words``, which must be message ``seq``."""
    if len(words) != HEADER_SIZE or words[0] != _i32(MAGIC):
        raise OpsError(f"not a message header (magic {words[0] if words else None})")
    if words[1] != _i32(seq):
        raise OpsError(f"message {words[1]} arrived as message {_i32(seq)}")
    if words[2] < 0 or words[3] < 0:
        raise OpsError(f"a header with length {words[2]} and idle {words[3]} ms")
    return Header(seq, words[2], words[3], bool(words[4] & ECHO))


def encode(ops: Iterable[Op]) -> list[int]:
    """``ops`` as int32 words: each op's code, then its fields in order."""
    words: list[int] = []
    for op in ops:
        words.append(_CODES[type(op)])
        words.extend(int(v) for v in attrs.astuple(op))
    return words


def decode(words: Sequence[int]) -> list[Op]:
    ops: list[Op] = []
    i = 0
    while i < len(words):
        cls = _TYPES.get(words[i])
        if cls is None:
            raise OpsError(f"unknown op code {words[i]} at word {i}")
        n = len(attrs.fields(cls))
        fields = words[i + 1 : i + 1 + n]
        if len(fields) != n:
            raise OpsError(f"op {cls.__name__} cut short at word {i}")
        values = [bool(v) if f.type in ("bool", bool) else int(v)
                  for f, v in zip(attrs.fields(cls), fields, strict=True)]
        ops.append(cls(*values))
        i += 1 + n
    return ops


_ROUTINE = (Forward, Free, Trim)


def describe(ops: Iterable[Op]) -> str:
    """What a message carries beyond a routine step (for the trace), or ``""``: a step's
    passes, forgotten caches and trimmed drafts are routine. A join or drop names the rows
    the decode batch has after it (``join 2``: two requests decode together now)."""
    words = []
    for op in ops:
        if isinstance(op, Join):
            words.append(f"join {op.rows + 1}")
        elif isinstance(op, Drop):
            words.append(f"drop {op.rows - 1}")
        elif not isinstance(op, _ROUTINE):
            words.append(type(op).__name__.lower())
    return " ".join(words)


def _i32(value: int) -> int:
    """``value`` wrapped to a signed 32-bit integer."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value

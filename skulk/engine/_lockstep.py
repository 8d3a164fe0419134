"""The control block that keeps the ranks of a sharded instance in lockstep (pure, no mlx).

Every iteration of a sharded runner's loop starts with one fixed-shape collective: rank 0's
:class:`Control` as :data:`CONTROL_SIZE` int32 values, broadcast to every rank (see
:mod:`skulk.engine._sharded_loop`). A block says, in this order: whether
the group shuts down; which slots to free (cancelled or finished requests); which slot to open
for a new request, with its sampling parameters (the seed chosen by rank 0 when the request
has none, so whichever rank samples draws what rank 0 would); then the work every rank runs:
at most one prefill :class:`Chunk` of ``n`` prompt tokens for one slot, and one decode step
for a set of slots (a 64-bit mask) with each slot's token to feed (one word per slot). All
ranks apply the same blocks in the same order, so they do the same work and commit the same
tokens.

Floats travel as the two 32-bit halves of their IEEE-754 double, so a sampling parameter
arrives bit for bit; 64-bit seeds and slot masks likewise. A block with a wrong magic number
or a step other than the receiver's own is refused with :class:`LockstepError` (the ranks lost
step).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

import attrs

#: Most requests one sharded instance works on at once (slots ``0 .. MAX_SLOTS - 1``); a slot
#: set travels as a 64-bit mask.
MAX_SLOTS = 64
#: A block frees any number of slots (a mask).
MAX_FREES = MAX_SLOTS
_HEAD = 32  # words before the decode tokens, one per slot
CONTROL_SIZE = _HEAD + MAX_SLOTS
MAGIC = 0x534B4C4B  # "SKLK"

_SHUTDOWN = 1
_WARMED = 2


class LockstepError(Exception):
    """A control block that is not what every rank must agree on."""


@attrs.frozen
class Opening:
    """A new request in ``slot``, and how its tokens are sampled (``seed`` always set)."""

    slot: int
    temperature: float
    top_p: float
    top_k: int
    seed: int


@attrs.frozen
class Chunk:
    """Prefill ``n`` prompt tokens of ``slot`` into its own cache."""

    slot: int
    n: int


def _sorted_slots(slots: Iterable[int]) -> tuple[int, ...]:
    return tuple(sorted(set(slots)))


def _sorted_feeds(feeds: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    return tuple(sorted(feeds))


@attrs.frozen
class Control:
    """Rank 0's decision for one lockstep step. ``idle_ms`` > 0: rank 0 has nothing to do and
    will not send the next block for about that long (the others may sleep instead of waiting
    inside the collective, which spins a CPU core). ``warmed``: the warm-up ends with this
    step. ``prefill``: the step's prompt chunk; ``batch``: ``(slot, token)`` for every slot
    in the step's decode batch, ``token`` the one to feed (its last prompt token, or the token
    sampled for it last). Slot sets are kept sorted."""

    step: int
    shutdown: bool = False
    warmed: bool = False
    idle_ms: int = 0
    frees: tuple[int, ...] = attrs.field(default=(), converter=_sorted_slots)
    opening: Opening | None = None
    prefill: Chunk | None = None
    batch: tuple[tuple[int, int], ...] = attrs.field(default=(), converter=_sorted_feeds)

    def describe(self) -> str:
        """What the block carries beyond a routine step (for the trace), or ``""``."""
        parts = []
        if self.shutdown:
            parts.append("shutdown")
        if self.warmed:
            parts.append("warmed")
        if self.frees:
            parts.append("free " + ",".join(map(str, self.frees)))
        if self.opening is not None:
            parts.append(f"open {self.opening.slot}")
        return " ".join(parts)


def encode(control: Control) -> list[int]:
    """``control`` as :data:`CONTROL_SIZE` int32 values."""
    block = [0] * CONTROL_SIZE
    block[0] = _i32(MAGIC)
    block[1] = _i32(control.step)
    block[2] = (_SHUTDOWN if control.shutdown else 0) | (_WARMED if control.warmed else 0)
    block[3] = control.idle_ms
    block[4:6] = _mask(control.frees)
    if (o := control.opening) is not None:
        block[13] = _slot(o.slot) + 1
        block[14:16] = _f64(o.temperature)
        block[16:18] = _f64(o.top_p)
        block[18] = _i32(o.top_k)
        block[19:21] = _u64(o.seed)
    if (chunk := control.prefill) is not None:
        block[21] = _slot(chunk.slot) + 1
        block[22] = chunk.n
    block[23:25] = _mask(slot for slot, _ in control.batch)
    for slot, token in control.batch:
        block[_HEAD + slot] = _i32(token)
    return block


def decode(block: Sequence[int], step: int) -> Control:
    """The control in ``block``, which must be for lockstep ``step``."""
    if len(block) != CONTROL_SIZE or block[0] != _i32(MAGIC):
        raise LockstepError(f"not a control block (magic {block[0] if block else None})")
    if block[1] != _i32(step):
        raise LockstepError(f"control block for step {block[1]} arrived at step {_i32(step)}")
    flags = block[2]
    opening = None
    if block[13]:
        opening = Opening(
            _slot(block[13] - 1),
            _from_f64(block[14:16]),
            _from_f64(block[16:18]),
            block[18],
            _from_u64(block[19:21]),
        )
    chunk = None
    if block[21]:
        chunk = Chunk(_slot(block[21] - 1), block[22])
        if chunk.n < 1:
            raise LockstepError(f"prefill of {chunk.n} tokens")
    return Control(
        step=step,
        shutdown=bool(flags & _SHUTDOWN),
        warmed=bool(flags & _WARMED),
        idle_ms=block[3],
        frees=_unmask(block[4:6]),
        opening=opening,
        prefill=chunk,
        batch=tuple((slot, block[_HEAD + slot]) for slot in _unmask(block[23:25])),
    )


def _slot(slot: int) -> int:
    if not 0 <= slot < MAX_SLOTS:
        raise LockstepError(f"slot {slot} out of range")
    return slot


def _mask(slots: Iterable[int]) -> list[int]:
    """A set of slots as a 64-bit mask, in two words."""
    bits = 0
    for slot in slots:
        bits |= 1 << _slot(slot)
    return _u64(bits)


def _unmask(words: Sequence[int]) -> tuple[int, ...]:
    bits = _from_u64(words)
    return tuple(slot for slot in range(MAX_SLOTS) if bits >> slot & 1)


def _i32(value: int) -> int:
    """``value`` wrapped to a signed 32-bit integer."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _u64(value: int) -> list[int]:
    value %= 1 << 64
    return [_i32(value), _i32(value >> 32)]


def _from_u64(halves: Sequence[int]) -> int:
    return (halves[0] & 0xFFFFFFFF) | ((halves[1] & 0xFFFFFFFF) << 32)


def _f64(value: float) -> list[int]:
    (bits,) = struct.unpack("<Q", struct.pack("<d", value))
    return _u64(bits)


def _from_f64(halves: Sequence[int]) -> float:
    (value,) = struct.unpack("<d", struct.pack("<Q", _from_u64(halves)))
    return float(value)

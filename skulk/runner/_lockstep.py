"""The control block that keeps the ranks of a sharded instance in lockstep (pure, no mlx).

Every iteration of a sharded runner's loop starts with one fixed-shape collective: rank 0's
:class:`Control` as :data:`CONTROL_SIZE` int32 values, broadcast to every rank (see
:mod:`skulk.runner._sharded_loop`). A block says, in this order: whether
the group shuts down; which slots to free (cancelled or finished requests); which slot to open
for a new request, with its sampling parameters (the seed chosen by rank 0 when the request
has none, so whichever rank samples draws what rank 0 would); and the one operation every rank
then runs: a prefill chunk of ``n`` tokens or a decode step of one token for a slot. All ranks
apply the same blocks in the same order, so they do the same work and commit the same tokens.

Floats travel as the two 32-bit halves of their IEEE-754 double, so a sampling parameter
arrives bit for bit; 64-bit seeds likewise. A block with a wrong magic number or a step other
than the receiver's own is refused with :class:`LockstepError` (the ranks lost step).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Literal

import attrs

CONTROL_SIZE = 32
MAGIC = 0x534B4C4B  # "SKLK"
MAX_FREES = 8
#: Most requests one sharded instance works on at once (slots ``0 .. MAX_SLOTS - 1``).
MAX_SLOTS = 64

_SHUTDOWN = 1
_WARMED = 2
OpKind = Literal["prefill", "decode"]
_OPS: dict[int, OpKind] = {1: "prefill", 2: "decode"}
_OP_CODES: dict[OpKind, int] = {v: k for k, v in _OPS.items()}


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
class Op:
    """The step's work: ``prefill`` ``n`` prompt tokens of ``slot`` into its cache, or
    ``decode`` one token (``token``, the request's last token) and sample the next."""

    kind: OpKind
    slot: int
    n: int
    token: int = 0


@attrs.frozen
class Control:
    """Rank 0's decision for one lockstep step. ``idle_ms`` > 0: rank 0 has nothing to do and
    will not send the next block for about that long (the others may sleep instead of waiting
    inside the collective, which spins a CPU core). ``warmed``: the warm-up ends with this
    step."""

    step: int
    shutdown: bool = False
    warmed: bool = False
    idle_ms: int = 0
    frees: tuple[int, ...] = ()
    opening: Opening | None = None
    op: Op | None = None

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
    if len(control.frees) > MAX_FREES:
        raise ValueError(f"at most {MAX_FREES} frees per step")
    block = [0] * CONTROL_SIZE
    block[0] = _i32(MAGIC)
    block[1] = _i32(control.step)
    block[2] = (_SHUTDOWN if control.shutdown else 0) | (_WARMED if control.warmed else 0)
    block[3] = control.idle_ms
    block[4] = len(control.frees)
    for i, slot in enumerate(control.frees):
        block[5 + i] = _slot(slot)
    if (o := control.opening) is not None:
        block[13] = _slot(o.slot) + 1
        block[14:16] = _f64(o.temperature)
        block[16:18] = _f64(o.top_p)
        block[18] = _i32(o.top_k)
        block[19:21] = _u64(o.seed)
    if (op := control.op) is not None:
        block[21] = _OP_CODES[op.kind]
        block[22] = _slot(op.slot)
        block[23] = op.n
        block[24] = _i32(op.token)
    return block


def decode(block: Sequence[int], step: int) -> Control:
    """The control in ``block``, which must be for lockstep ``step``."""
    if len(block) != CONTROL_SIZE or block[0] != _i32(MAGIC):
        raise LockstepError(f"not a control block (magic {block[0] if block else None})")
    if block[1] != _i32(step):
        raise LockstepError(f"control block for step {block[1]} arrived at step {_i32(step)}")
    flags, n_frees = block[2], block[4]
    if not 0 <= n_frees <= MAX_FREES:
        raise LockstepError(f"control block frees {n_frees} slots")
    opening = None
    if block[13]:
        opening = Opening(
            _slot(block[13] - 1),
            _from_f64(block[14:16]),
            _from_f64(block[16:18]),
            block[18],
            _from_u64(block[19:21]),
        )
    op = None
    if block[21]:
        kind = _OPS.get(block[21])
        if kind is None:
            raise LockstepError(f"unknown operation {block[21]}")
        op = Op(kind, _slot(block[22]), block[23], block[24])
        if op.n < 1:
            raise LockstepError(f"{kind} of {op.n} tokens")
    return Control(
        step=step,
        shutdown=bool(flags & _SHUTDOWN),
        warmed=bool(flags & _WARMED),
        idle_ms=block[3],
        frees=tuple(_slot(s) for s in block[5 : 5 + n_frees]),
        opening=opening,
        op=op,
    )


def _slot(slot: int) -> int:
    if not 0 <= slot < MAX_SLOTS:
        raise LockstepError(f"slot {slot} out of range")
    return slot


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

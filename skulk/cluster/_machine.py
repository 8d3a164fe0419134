"""The cluster State as a Raft state machine (the ``StateMachine`` protocol of
:mod:`skulk.consensus`), ready to replace the toy ``Registry``.

A command entry's ``data`` is one :data:`~skulk.wire.cluster.ClusterCommand` encoded by the
strict codec; its result bytes are the encoded :data:`~skulk.wire.cluster.ClusterResult`. An
entry that is not a command (a leader's no-op, a membership change) leaves the State as it is
and answers ``b""``. A command that does not decode is ``Rejected("undecodable")``, never an
exception: a bad entry in the log must not stop a replica. Snapshots are the State's canonical
CBOR compressed with zstd (:func:`skulk.wire.pack`).
"""

from __future__ import annotations

from ..wire import Codec, SnapshotCorrupt, WireError, pack, unpack
from ..wire.cluster import ClusterCommand, ClusterResult, Rejected
from ..wire.raft import Entry, EntryKind
from ._apply import COMMAND_CODEC, apply
from ._state import STATE_CODEC, State

RESULT_CODEC: Codec[ClusterResult] = Codec(ClusterResult)


def encode_command(command: ClusterCommand) -> bytes:
    """The bytes to submit to Raft for ``command``."""
    return COMMAND_CODEC.encode(command)


def decode_result(data: bytes) -> ClusterResult:
    """The result a committed command answered (raises :class:`WireError` if ``data`` is not
    one: results come from our own replicas, so that is a bug, not input)."""
    return RESULT_CODEC.decode(data)


class ClusterMachine:
    """Pure functions over :class:`State` for the Raft driver (see the module doc)."""

    def initial(self) -> State:
        return State()

    def apply(self, state: State, entry: Entry) -> tuple[State, bytes]:
        if entry.kind is not EntryKind.COMMAND:
            return state, b""
        try:
            command = COMMAND_CODEC.decode(entry.data)
        except WireError as exc:
            result: ClusterResult = Rejected("undecodable", str(exc)[:200])
        else:
            state, result = apply(state, command)
        return state, RESULT_CODEC.encode(result)

    def snapshot(self, state: State) -> bytes:
        return pack(STATE_CODEC.unstructure(state))

    def restore(self, data: bytes) -> State:
        """The State an image holds; ``SnapshotCorrupt`` for anything else."""
        try:
            return STATE_CODEC.structure(unpack(data))
        except WireError as exc:
            raise SnapshotCorrupt(f"not a cluster State: {exc}") from None

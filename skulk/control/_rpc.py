"""The control rpc's terms: the method asks travel under to the leader, their codecs, and the
error for a cluster that cannot decide now."""

from __future__ import annotations

from skulk.wire import Codec
from skulk.wire.cluster import ControlCall, ControlReply

CONTROL_METHOD = "control.call"
CALL_CODEC: Codec[ControlCall] = Codec(ControlCall)
REPLY_CODEC: Codec[ControlReply] = Codec(ControlReply)


class ControlUnavailable(Exception):
    """The cluster cannot decide now (no leader reachable, no quorum, storage failed):
    ``code`` is ``no_quorum`` or ``unavailable``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

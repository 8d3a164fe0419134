"""Codecs for the node ↔ runner socket (frames defined in :mod:`skulk.wire.runner`)."""

from __future__ import annotations

from skulk.wire import Codec
from skulk.wire.runner import FromRunner, ToRunner

#: Largest frame either side accepts; a prompt or a chunk never comes near it.
MAX_FRAME_SIZE = 16 * 1024 * 1024

TO_RUNNER: Codec[ToRunner] = Codec(ToRunner, max_frame_size=MAX_FRAME_SIZE)
FROM_RUNNER: Codec[FromRunner] = Codec(FromRunner, max_frame_size=MAX_FRAME_SIZE)

"""What this node's runners produced, written down for a chaos run's stream checker.

``SKULK_PRODUCED_FILE`` (chaos runs only) names a file. When it is set, every text chunk a
runner sends for a generation is appended to it as one JSON line,
``{"id": REQUEST, "runner": PID, "text": TEXT}`` — ``REQUEST`` is the API request's id
(``x-request-id``) the generation was started for — the moment the node reads the chunk from the
runner, whether or not its consumer still waits. Each line is one ``O_APPEND`` write, so lines
never interleave and survive the node's SIGKILL. A write that fails is logged once and given up:
the record never fails a request.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Callable

#: The environment variable naming the file (chaos runs only).
PRODUCED_FILE_ENV = "SKULK_PRODUCED_FILE"

log = logging.getLogger("skulk.runner")

#: Called with (request id as recorded, runner pid, text) for each chunk a runner sent.
ProducedSink = Callable[[str, int, str], None]


class ProducedFile:
    """Appends produced chunks to ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._failed = False

    def __call__(self, request_id: str, runner: int, text: str) -> None:
        if self._failed:
            return
        line = json.dumps({"id": request_id, "runner": runner, "text": text}) + "\n"
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.write(self._fd, line.encode())
        except OSError as exc:
            self._failed = True
            log.warning("cannot record produced text in %s: %s; recording stops", self.path, exc)


def produced_sink() -> ProducedSink | None:
    """This process's sink when ``SKULK_PRODUCED_FILE`` is set (one file for every runner of
    the node), else None."""
    path = os.environ.get(PRODUCED_FILE_ENV, "")
    return _file(path) if path else None


@functools.cache
def _file(path: str) -> ProducedFile:
    return ProducedFile(path)

"""Tokenizing prompts off the runner's main loop.

The main thread decodes every active stream and sends the heartbeats that prove the runner is
alive, so it must never spend seconds on one request. Tokenizing is the one per-request cost
that grows with the prompt and cannot be cut into ticks (16 MB of text takes ~30 s here), so
:class:`PromptPreparer` does it on a worker thread and posts the result back to the main loop's
inbox, where it arrives between frames. The HF ``tokenizers`` library releases the GIL while it
encodes; a chat template renders in Python and shares the GIL in 5 ms slices — either way the
main loop keeps decoding and beating. Prompts that cannot fit are refused before they are
encoded (:meth:`~skulk.runner._engine.Engine.tokenize`), so the queue stays short.

One worker, first come first served. A request cancelled while its prompt is prepared is
answered at once by the main loop; the result, when it comes, no longer matches a waiting job
and is dropped (job numbers never repeat).
"""

from __future__ import annotations

import logging
import queue
import threading
import traceback
from collections.abc import Callable

import attrs

from skulk.runner._engine import RequestError
from skulk.wire.runner import Generate, Prompt

log = logging.getLogger("skulk.runner")

#: Longest message a runner puts in a ``RequestFailed``: an exception's text can quote the
#: request (a 16 MB role name in a template error), and the frame must stay small.
MAX_MESSAGE = 1000


def shorten(message: str, limit: int = MAX_MESSAGE) -> str:
    """``message`` cut to ``limit`` characters (with an ellipsis when cut)."""
    return message if len(message) <= limit else message[: limit - 1] + "…"


def log_failure(what: str, exc: BaseException) -> None:
    """Log an unexpected failure with its traceback but only an excerpt of its message."""
    frames = "".join(traceback.format_tb(exc.__traceback__))
    log.error("runner: %s: %s: %s\n%s", what, type(exc).__name__, shorten(str(exc)), frames)


@attrs.frozen
class Prepared:
    """A prompt tokenized for ``request`` (job ``job``), or why it cannot be served
    (``failure`` is ``(reason, message)`` for a ``RequestFailed``)."""

    job: int
    request: Generate
    tokens: tuple[int, ...] = ()
    failure: tuple[str, str] | None = None


class PromptPreparer:
    """Tokenizes prompts on one daemon thread; results go to ``inbox`` as :class:`Prepared`."""

    def __init__(self, tokenize: Callable[[Prompt], list[int]], inbox: queue.Queue[object]) -> None:
        self._tokenize = tokenize
        self._inbox = inbox
        self._jobs: queue.Queue[tuple[int, Generate]] = queue.Queue()
        self._next_job = 0
        threading.Thread(target=self._work, name="runner-tokenizer", daemon=True).start()

    def submit(self, request: Generate) -> int:
        """Queue ``request``'s prompt; returns the job number its :class:`Prepared` carries."""
        self._next_job += 1
        self._jobs.put((self._next_job, request))
        return self._next_job

    def _work(self) -> None:
        while True:
            job, request = self._jobs.get()
            try:
                tokens = tuple(self._tokenize(request.prompt))
            except RequestError as exc:
                result = Prepared(job, request, failure=(exc.reason, shorten(exc.message)))
            except Exception as exc:
                log_failure("could not tokenize a prompt", exc)
                message = shorten(f"tokenizing failed: {type(exc).__name__}: {exc}")
                result = Prepared(job, request, failure=("engine_error", message))
            else:
                result = Prepared(job, request, tokens)
            self._inbox.put(result)

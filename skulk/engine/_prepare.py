"""Tokenizing prompts off the runner's main loop.

The main thread decodes every active stream and sends the heartbeats that prove the runner is
alive, so it must never spend seconds on one request. Tokenizing is the one per-request cost
that grows with the prompt and cannot be cut into ticks (16 MB of text takes ~30 s here), so
:class:`PromptPreparer` does it on a worker thread and posts the result back to the main loop's
inbox, where it arrives between frames. The HF ``tokenizers`` library releases the GIL while it
encodes; a chat template renders in Python and shares the GIL in 5 ms slices — either way the
main loop keeps decoding and beating. Prompts that cannot fit are refused before they are
encoded (:meth:`~skulk.engine._engine.Engine.tokenize`), so the queue stays short.

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

from skulk.engine._engine import RequestError
from skulk.engine._grammar import Constraint
from skulk.wire.runner import Embed, Generate, Prompt, SamplingParams, Tokenize

log = logging.getLogger("skulk.engine")

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


#: What the preparer tokenizes: a generation's prompt, a prompt to count, inputs to embed.
Job = Generate | Tokenize | Embed


@attrs.frozen
class Prepared:
    """A prompt tokenized for ``request`` (job ``job``), or why it cannot be served
    (``failure`` is ``(reason, message)`` for a ``RequestFailed``). ``constraint``: the
    grammar state of a structured-output request, compiled here too (tens of milliseconds for
    a large schema). For an ``Embed``, ``inputs`` holds each input's tokens (``tokens`` is
    empty)."""

    job: int
    request: Job
    tokens: tuple[int, ...] = ()
    failure: tuple[str, str] | None = None
    constraint: Constraint | None = None
    inputs: tuple[tuple[int, ...], ...] = ()


class PromptPreparer:
    """Tokenizes prompts on one daemon thread; results go to ``inbox`` as :class:`Prepared`.
    ``constrain`` builds a request's grammar constraint (see
    :func:`skulk.engine._grammar.request_constraint`) on the same thread."""

    def __init__(
        self,
        tokenize: Callable[[Prompt], list[int]],
        inbox: queue.Queue[object],
        constrain: Callable[[SamplingParams], Constraint | None] = lambda _: None,
        embed_tokens: Callable[[Embed], list[list[int]]] | None = None,
    ) -> None:
        self._tokenize = tokenize
        self._constrain = constrain
        self._embed_tokens = embed_tokens
        self._inbox = inbox
        self._jobs: queue.Queue[tuple[int, Job]] = queue.Queue()
        self._next_job = 0
        threading.Thread(target=self._work, name="runner-tokenizer", daemon=True).start()

    def submit(self, request: Job) -> int:
        """Queue ``request``'s prompt; returns the job number its :class:`Prepared` carries."""
        self._next_job += 1
        self._jobs.put((self._next_job, request))
        return self._next_job

    def _work(self) -> None:
        while True:
            job, request = self._jobs.get()
            try:
                if isinstance(request, Embed):
                    result = Prepared(job, request, inputs=self._inputs(request))
                elif isinstance(request, Tokenize):
                    result = Prepared(job, request, tuple(self._tokenize(request.prompt)))
                else:
                    tokens = tuple(self._tokenize(request.prompt))
                    constraint = self._constrain(request.params)
                    result = Prepared(job, request, tokens, constraint=constraint)
            except RequestError as exc:
                result = Prepared(job, request, failure=(exc.reason, shorten(exc.message)))
            except Exception as exc:
                log_failure("could not tokenize a prompt", exc)
                message = shorten(f"tokenizing failed: {type(exc).__name__}: {exc}")
                result = Prepared(job, request, failure=("engine_error", message))
            self._inbox.put(result)

    def _inputs(self, request: Embed) -> tuple[tuple[int, ...], ...]:
        if self._embed_tokens is None:
            raise RequestError("unsupported", "this runner does not embed")
        return tuple(tuple(ids) for ids in self._embed_tokens(request))


def load_failure_reason(exc: Exception) -> str:
    """The ``RunnerFailed`` reason for an exception that ended a model's load."""
    if isinstance(exc, FileNotFoundError):
        return "model_not_found"
    if isinstance(exc, MemoryError):
        return "out_of_memory"
    return "load_error"

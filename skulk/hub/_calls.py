"""Every Hub call goes through :func:`call_hub`: a deadline per call, retries that back off,
and huggingface_hub's exceptions turned into this package's typed errors."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

import attrs
import httpx2
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from skulk.hub._errors import (
    Gated,
    HubError,
    HubUnreachable,
    OfflineMissing,
    RepoNotFound,
    RevisionNotFound,
)
from skulk.hub._ref import HubRef

T = TypeVar("T")

DEFAULT_ENDPOINT = "https://huggingface.co"
#: Statuses worth another try: the Hub (or a proxy) is overloaded or restarting.
_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})


@attrs.frozen
class HubPolicy:
    """Deadlines and retries for Hub calls.

    ``call_timeout_s`` bounds one metadata call (revision info, a file's HEAD, config.json).
    A failing call is tried ``attempts`` times in all, sleeping ``backoff_s`` before the
    second, doubling up to ``max_backoff_s``. A file's body is read by huggingface_hub's
    ``http_get``, whose own read time-out is ``HF_HUB_DOWNLOAD_TIMEOUT`` (10 s) and which
    resumes a broken stream itself (up to 5 times, 1 s apart, while no byte arrives); when
    it gives up, the file counts as one failed attempt here. So nothing waits forever: a
    call ends within about ``attempts x (timeout + 5 s) + the backoffs``."""

    call_timeout_s: float = 10.0
    attempts: int = 4
    backoff_s: float = 1.0
    max_backoff_s: float = 8.0

    def __attrs_post_init__(self) -> None:
        if self.attempts < 1 or self.call_timeout_s <= 0 or self.backoff_s < 0:
            raise ValueError("HubPolicy needs attempts >= 1, call_timeout_s > 0, backoff_s >= 0")


DEFAULT_POLICY = HubPolicy()


def default_endpoint() -> str:
    """``HF_ENDPOINT`` read now (huggingface_hub reads it once, at import), else the Hub."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def call_hub(
    ref: HubRef, endpoint: str, token: str | None, policy: HubPolicy, fn: Callable[[], T]
) -> T:
    """``fn()`` with retries on transient failures, translating errors (see the module doc).
    :class:`HubError` raised by ``fn`` passes through unchanged."""
    delay = policy.backoff_s
    detail = ""
    for attempt in range(1, policy.attempts + 1):
        try:
            return fn()
        except HubError:
            raise
        except OfflineModeIsEnabled:  # HF_HUB_OFFLINE was set when huggingface_hub was imported
            raise OfflineMissing(str(ref), "huggingface_hub is in offline mode") from None
        except httpx2.TransportError as exc:
            detail = f"{type(exc).__name__}: {exc}"
        except HfHubHTTPError as exc:
            translated = translate_http_error(ref, exc, token)
            if translated is not None:
                raise translated from None
            detail = f"HTTP {status_of(exc)}"
        if attempt < policy.attempts:
            time.sleep(delay)
            delay = min(policy.max_backoff_s, delay * 2)
    raise HubUnreachable(str(ref), endpoint, policy.attempts, detail)


def status_of(exc: HfHubHTTPError) -> int:
    response = getattr(exc, "response", None)
    return int(getattr(response, "status_code", 0) or 0)


def translate_http_error(ref: HubRef, exc: HfHubHTTPError, token: str | None) -> HubError | None:
    """The typed error for an HTTP failure, or ``None`` when it is worth another try."""
    status = status_of(exc)
    if isinstance(exc, GatedRepoError):
        return Gated(str(ref), status, token is not None)
    if isinstance(exc, RevisionNotFoundError):
        return RevisionNotFound(ref.repo, ref.revision_or_default)
    if isinstance(exc, RepositoryNotFoundError):
        return RepoNotFound(str(ref))
    if status in (401, 403):
        return Gated(str(ref), status, token is not None)
    if isinstance(exc, RemoteEntryNotFoundError) or status == 404:
        return HubError(str(ref), f"Hub repo {ref}: a listed file is missing ({exc})")
    if status in _TRANSIENT_STATUS:
        return None
    return HubError(str(ref), f"Hub repo {ref}: unexpected HTTP {status} ({exc})")

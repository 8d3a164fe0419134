"""The typed failures of getting a model from the Hub: one base class, a stable ``reason``
each (snake_case, what the node reports in State), a message naming the repo."""

from __future__ import annotations


class HubError(Exception):
    """Base: ``repo`` (``org/name``, with ``@revision`` when one was asked) could not be
    checked or downloaded. ``reason`` is stable; the message is for people."""

    reason = "hub_error"

    def __init__(self, repo: str, message: str) -> None:
        super().__init__(message)
        self.repo = repo


class RepoNotFound(HubError):
    """The repo does not exist (or is private and the token cannot see it)."""

    reason = "repo_not_found"

    def __init__(self, repo: str) -> None:
        super().__init__(
            repo,
            f"Hub repo {repo} not found (check the id; a private repo also needs HF_TOKEN)",
        )


class RevisionNotFound(HubError):
    """The repo exists, the revision (branch, tag or commit) does not."""

    reason = "revision_not_found"

    def __init__(self, repo: str, revision: str) -> None:
        super().__init__(repo, f"Hub repo {repo} has no revision {revision!r}")
        self.revision = revision


class Gated(HubError):
    """The repo is gated or private and no token, or a token without access, was given
    (HTTP ``status`` 401 or 403)."""

    reason = "gated"

    def __init__(self, repo: str, status: int, had_token: bool) -> None:
        hint = (
            "the token given has no access: accept the model's terms on the Hub with that account"
            if had_token
            else "set HF_TOKEN to a token of an account that accepted the model's terms"
        )
        super().__init__(repo, f"Hub repo {repo} is gated (HTTP {status}): {hint}")
        self.status = status


class UnsupportedArchitecture(HubError):
    """config.json names a ``model_type`` mlx-lm cannot load (or there is no config.json)."""

    reason = "unsupported_architecture"

    def __init__(self, repo: str, model_type: str | None, detail: str = "") -> None:
        what = f"model_type {model_type!r}" if model_type else "no model_type"
        extra = f" ({detail})" if detail else ""
        super().__init__(repo, f"Hub repo {repo}: {what} is not loadable by mlx-lm{extra}")
        self.model_type = model_type


class NoWeights(HubError):
    """The revision has no ``*.safetensors`` file at its top level."""

    reason = "no_weights"

    def __init__(self, repo: str) -> None:
        super().__init__(
            repo,
            f"Hub repo {repo} has no safetensors weights at its top level "
            "(an mlx-lm model needs *.safetensors, e.g. an mlx-community conversion)",
        )


class HubUnreachable(HubError):
    """The Hub did not answer (connection refused or reset, time-outs, 5xx) past the
    retries: ``attempts`` calls were made, the last failing with ``detail``."""

    reason = "hub_unreachable"

    def __init__(self, repo: str, endpoint: str, attempts: int, detail: str) -> None:
        super().__init__(
            repo,
            f"Hub repo {repo}: {endpoint} unreachable after {attempts} attempts ({detail})",
        )
        self.endpoint = endpoint
        self.attempts = attempts


class HashMismatch(HubError):
    """A downloaded file did not hash to what the Hub lists for it, twice in a row (the
    file was deleted and fetched again once)."""

    reason = "hash_mismatch"

    def __init__(self, repo: str, file: str, expected: str, got: str) -> None:
        super().__init__(
            repo,
            f"Hub repo {repo}: {file} hashed to {got[:16]}… twice, the Hub lists {expected[:16]}…",
        )
        self.file = file
        self.expected = expected
        self.got = got


class OfflineMissing(HubError):
    """Offline (``HF_HUB_OFFLINE=1`` or ``offline=True``) and the local Hub cache lacks the
    revision or one of the files a runner needs."""

    reason = "offline_missing"

    def __init__(self, repo: str, detail: str) -> None:
        super().__init__(repo, f"Hub repo {repo} is not in the local Hub cache (offline): {detail}")


class DownloadCancelled(HubError):
    """``cancel_check`` asked to stop; the partial files stay in staging for a resume."""

    reason = "cancelled"

    def __init__(self, repo: str) -> None:
        super().__init__(repo, f"download of Hub repo {repo} cancelled")

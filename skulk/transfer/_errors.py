"""The typed failures of fetching a model's weights from peers."""

from __future__ import annotations

from collections.abc import Mapping


class FetchError(Exception):
    """Base: the weights of ``model`` could not be fetched. ``reason`` is the runner failure
    the node reports for it (snake_case, in the State)."""

    reason = "fetch_failed"

    def __init__(self, model: str, message: str) -> None:
        super().__init__(message)
        self.model = model


class NoHolderReachable(FetchError):
    """No holder of the model could serve what is missing (within the retries): ``tried``
    maps each holder asked to its last error."""

    reason = "no_holder_reachable"

    def __init__(self, model: str, tried: Mapping[str, str]) -> None:
        if tried:
            why = "; ".join(f"{node}: {error}" for node, error in sorted(tried.items()))
        else:
            why = "the model card names no other node holding it"
        super().__init__(model, f"no node holding model {model} could send its weights ({why})")
        self.tried = dict(tried)


class ManifestMismatch(FetchError):
    """The manifest a holder sent (or the one stored here) does not hash to the card's
    ``manifest_sha256``: a holder's files changed, or it lies."""

    reason = "manifest_mismatch"

    def __init__(self, model: str, expected: str, detail: str) -> None:
        super().__init__(
            model, f"model {model}: no holder has the manifest {expected[:16]}… ({detail})"
        )
        self.expected = expected


class NoManifest(FetchError):
    """The model is not on this node and its card has no manifest to fetch it by."""

    reason = "no_manifest"


class DiskFull(FetchError):
    """Not enough space for the weights: ``needed`` more bytes under ``path``, ``free`` left
    (``free`` is -1 when the file system said so only by failing a write)."""

    reason = "disk_full"

    def __init__(self, model: str, path: str, needed: int, free: int) -> None:
        have = f"{free} bytes are free" if free >= 0 else "the disk is full (ENOSPC)"
        super().__init__(
            model,
            f"not enough disk space for model {model}'s weights under {path}: "
            f"{needed} more bytes needed, {have}",
        )
        self.path = path
        self.needed = needed
        self.free = free


class PeerFailure(Exception):
    """One holder failed one request (internal to a fetch: it tries another holder).
    ``lasting``: the holder cannot serve this model at all (it refused it, or sent bytes that
    fail their hash); otherwise it may succeed later (a lost link, a timeout, busy)."""

    def __init__(self, peer: str, message: str, *, lasting: bool, reason: str = "") -> None:
        super().__init__(message)
        self.peer = peer
        self.lasting = lasting
        self.reason = reason
        """The holder's refusal reason (rpc error or ``TransferFailed``), if it gave one."""

"""The typed failures of the model store."""

from __future__ import annotations


class StoreError(Exception):
    """Base of the store's refusals. ``reason`` is stable (snake_case) for State and the API."""

    reason = "store_error"


class NotStored(StoreError):
    """No stored model has this name or manifest hash."""

    reason = "model_not_found"

    def __init__(self, model: str) -> None:
        super().__init__(f"no model {model!r} in the store")
        self.model = model


class MissingBlobs(StoreError):
    """A manifest was committed before all its files' blobs were in the store. ``missing`` maps
    each absent blob (sha256 hex) to the manifest's file name(s) for it."""

    reason = "missing_blobs"

    def __init__(self, manifest_sha256: str, missing: dict[str, tuple[str, ...]]) -> None:
        names = ", ".join(sorted(n for ns in missing.values() for n in ns))
        super().__init__(
            f"model {manifest_sha256[:16]}…: {len(missing)} file(s) not in the store: {names}"
        )
        self.manifest_sha256 = manifest_sha256
        self.missing = dict(missing)


class ModelInUse(StoreError):
    """The model is used by an instance: it is neither removed nor evicted."""

    reason = "model_in_use"

    def __init__(self, model: str, manifest_sha256: str) -> None:
        super().__init__(f"model {model!r} is in use by an instance; stop it first")
        self.model = model
        self.manifest_sha256 = manifest_sha256


class StoreFull(StoreError):
    """``needed`` bytes do not fit: ``available`` is the room now (the smaller of what the
    budget and the disk, less its reserve, allow) and ``reclaimable`` what evicting every model
    not in use would add. Nothing was evicted."""

    reason = "disk_full"

    def __init__(self, needed: int, available: int, reclaimable: int, *, limit: str) -> None:
        super().__init__(
            f"the model store cannot hold {needed} more bytes: {available} available "
            f"({limit}), and evicting every model not in use would free only {reclaimable}"
        )
        self.needed = needed
        self.available = available
        self.reclaimable = reclaimable
        self.limit = limit

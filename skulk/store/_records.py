"""What the store answers: a stored model, a verification's findings, progress callbacks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import attrs

#: ``progress(done_bytes, total_bytes)``.
Progress = Callable[[int, int], None]


@attrs.frozen
class StoredModel:
    """A complete model in the store. ``directory`` is what mlx-lm loads; ``sha256`` (the
    manifest hash) is its identity; ``size`` counts its distinct files once."""

    sha256: str
    directory: Path
    size: int
    last_used: float
    names: tuple[str, ...]


@attrs.frozen
class VerifyReport:
    """What :meth:`ModelStore.verify` found: ``corrupt`` lists ``(file name, expected sha256)``
    of every file whose bytes did not match (those blobs are deleted), ``dropped`` the models
    that used them (removed from the store: fetch them again)."""

    model: str
    checked_bytes: int
    corrupt: tuple[tuple[str, str], ...]
    dropped: tuple[StoredModel, ...]

    @property
    def ok(self) -> bool:
        return not self.corrupt


@attrs.frozen
class StoreStatistics:
    """The store at a glance: ``used_bytes`` of blobs (``loose_bytes`` of them in no model:
    downloads not committed yet), ``available_bytes`` of room (negative when over budget)."""

    models: int
    used_bytes: int
    loose_bytes: int
    budget_bytes: int | None
    available_bytes: int

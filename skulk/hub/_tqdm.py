"""Progress bar classes for huggingface_hub that draw nothing (progress is ours to report)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from huggingface_hub.utils.tqdm import tqdm


class SilentTqdm(tqdm):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["disable"] = True
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]


def forwarding_tqdm(on_bytes: Callable[[int], None]) -> type[SilentTqdm]:
    """A silent bar class whose "reconstructing file" bars (``xet_get``'s count of bytes
    written to disk; its other bar counts bytes received) pass each update to
    ``on_bytes``. It is called from hf_xet's threads: ``on_bytes`` must not raise."""

    class _Forwarding(SilentTqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._forward = "reconstructing" in str(kwargs.get("desc", ""))
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            if self._forward and n:
                on_bytes(int(n))
            return None

    return _Forwarding

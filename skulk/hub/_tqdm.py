"""A progress bar class for huggingface_hub that draws nothing (progress is ours to report)."""

from __future__ import annotations

from typing import Any

from huggingface_hub.utils.tqdm import tqdm


class SilentTqdm(tqdm):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["disable"] = True
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]

"""Typed failures of model resolution."""

from __future__ import annotations

from collections.abc import Iterable


class ModelNotFound(LookupError):
    """No model answers to ``name``.

    ``available`` lists the names that would have resolved (the built-in demo model,
    model directories under the data dir, Hugging Face repos in the local cache);
    ``reason`` says why ``name`` itself was rejected when it looked like a path.
    """

    def __init__(self, name: str, available: Iterable[str] = (), reason: str = "") -> None:
        self.name = name
        self.available: tuple[str, ...] = tuple(available)
        self.reason = reason
        super().__init__(self._message())

    def _message(self) -> str:
        head = f"model {self.name!r} not found"
        if self.reason:
            head += f" ({self.reason})"
        listed = ", ".join(self.available) if self.available else "none"
        return (
            f"{head}; available: {listed}. Pass a built-in model name, a model under the "
            "data dir's models/ folder, a Hugging Face repo already in the local cache, or "
            "the path of an mlx-lm model directory (one with a config.json)."
        )

"""Turning a model name or path into a local model directory (no network)."""

from __future__ import annotations

import os
from pathlib import Path

from skulk.models._demo import DEMO_MODEL_ID, ensure_demo_model
from skulk.models._errors import ModelNotFound


def resolve_model(name_or_path: str, home: Path) -> tuple[str, Path]:
    """Resolve ``name_or_path`` to ``(model_id, directory)``.

    Tried in order:

    1. ``"skulk-demo"``: the built-in demo model, generated into ``home/models`` on first use.
    2. An existing directory holding a ``config.json``: its id is the directory's basename.
    3. ``home/models/<name>``: a model directory installed under the data dir.
    4. ``"org/repo"``: a Hugging Face repo already in the local hub cache (``HF_HUB_CACHE``,
       ``HF_HOME/hub`` or ``~/.cache/huggingface/hub``); never downloads.

    Raises :class:`ModelNotFound` listing what is available otherwise.
    """
    if not name_or_path.strip():
        raise ModelNotFound(name_or_path, available_models(home), reason="empty name")
    if name_or_path == DEMO_MODEL_ID:
        return DEMO_MODEL_ID, ensure_demo_model(home)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            resolved = path.resolve()
            return resolved.name, resolved
        if name_or_path != path.name:  # clearly meant as a path, not a name
            raise ModelNotFound(
                name_or_path, available_models(home), reason="directory has no config.json"
            )
    local = home / "models" / name_or_path
    if name_or_path and not name_or_path.startswith(".") and _is_model_dir(local):
        return name_or_path, local.resolve()
    cached = _hf_cached(name_or_path)
    if cached is not None:
        return name_or_path, cached
    raise ModelNotFound(name_or_path, available_models(home))


def available_models(home: Path) -> tuple[str, ...]:
    """Names ``resolve_model`` accepts without a path: demo, data-dir models, cached repos."""
    names = {DEMO_MODEL_ID}
    models_dir = home / "models"
    if models_dir.is_dir():
        names.update(
            child.name
            for child in models_dir.iterdir()
            if not child.name.startswith(".") and _is_model_dir(child)
        )
    hub = _hf_hub_cache()
    if hub.is_dir():
        for child in hub.glob("models--*"):
            repo = child.name.removeprefix("models--").replace("--", "/")
            if _hf_cached(repo) is not None:
                names.add(repo)
    return (DEMO_MODEL_ID, *sorted(names - {DEMO_MODEL_ID}))


def _is_model_dir(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def _hf_hub_cache() -> Path:
    if cache := os.environ.get("HF_HUB_CACHE"):
        return Path(cache).expanduser()
    if home := os.environ.get("HF_HOME"):
        return Path(home).expanduser() / "hub"
    return Path("~/.cache/huggingface/hub").expanduser()


def _hf_cached(repo: str) -> Path | None:
    """The snapshot directory of a cached Hugging Face ``org/name`` repo, if complete enough."""
    parts = repo.split("/")
    if len(parts) != 2 or not all(parts) or any(p in (".", "..") for p in parts):
        return None
    root = _hf_hub_cache() / ("models--" + "--".join(parts))
    snapshots = root / "snapshots"
    ref = root / "refs" / "main"
    if ref.is_file():
        snapshot = snapshots / ref.read_text().strip()
        if _is_model_dir(snapshot):
            return snapshot
    if snapshots.is_dir():
        candidates = sorted(s for s in snapshots.iterdir() if _is_model_dir(s))
        if len(candidates) == 1:
            return candidates[0]
    return None

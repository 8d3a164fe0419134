"""Model cards: what the cluster State records about a model, read from its directory.

A card is made on a node that has the model (the one started with ``--model``, or the one a
placement names) and committed with ``RegisterModel``; a node assigned a shard gets the
weights it needs from the card (:func:`skulk.transfer.fetch_model`: generated, used in place
on a holder, or fetched from one).
"""

from __future__ import annotations

import json
from pathlib import Path

from skulk.models._demo import DEFAULT_DEMO_SEED, DEMO_MODEL_ID
from skulk.models._manifest import local_manifest
from skulk.models._resolve import resolve_model
from skulk.wire.cluster import Architecture, DemoSource, ModelCard, ModelSource, PathSource

#: The context length assumed when a model's config names none.
DEFAULT_CONTEXT = 4096


def model_card(name_or_path: str, home: Path, node_id: str | None = None) -> ModelCard:
    """The card of the model ``name_or_path`` resolves to on this node (slow: may generate the
    demo model, or hash a model's files for its manifest the first time; blocking). Raises
    :class:`ModelNotFound`, or ``ValueError`` for a config.json that does not describe a
    transformer we can place (or a damaged safetensors file).

    A model in a directory gets its weight manifest's hash (:mod:`skulk.models._manifest`,
    cached under ``home``) and, with ``node_id``, that node as its holder: peers fetch its
    weights from there. The demo model has neither (every node generates it)."""
    model_id, path = resolve_model(name_or_path, home)
    if model_id == DEMO_MODEL_ID:
        return card_from_directory(model_id, path, DemoSource(DEFAULT_DEMO_SEED))
    try:
        manifest = local_manifest(path, home)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the model's files: {exc}") from None
    return card_from_directory(
        model_id,
        path,
        PathSource(str(path)),
        manifest_sha256=manifest.sha256,
        holders=(node_id,) if node_id is not None else (),
    )


def card_from_directory(
    model_id: str,
    path: Path,
    source: ModelSource,
    *,
    manifest_sha256: str | None = None,
    holders: tuple[str, ...] = (),
) -> ModelCard:
    """The card of the mlx-lm model directory ``path`` (``manifest_sha256`` and ``holders``
    are copied into it as given)."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}/config.json: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}/config.json is not a JSON object")
    text = config.get("text_config")  # multimodal configs nest the language model
    if not isinstance(text, dict):
        text = config

    def field(*names: str, default: int | None = None) -> int:
        for name in names:
            value = text.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        if default is not None:
            return default
        raise ValueError(f"{path}/config.json has no positive integer {names[0]}")

    heads = field("num_attention_heads", "n_heads")
    architecture = Architecture(
        family=str(config.get("model_type", "unknown")),
        layers=field("num_hidden_layers", "n_layers"),
        hidden_size=field("hidden_size", "dim"),
        heads=heads,
        kv_heads=field("num_key_value_heads", default=heads),
        vocab=field("vocab_size"),
    )
    weights = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    context = field("max_position_embeddings", default=DEFAULT_CONTEXT)
    return ModelCard(
        model_id, source, architecture, weights, context, manifest_sha256, tuple(sorted(holders))
    )

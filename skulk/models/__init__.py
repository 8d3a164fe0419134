"""Models: the built-in ``skulk-demo`` model and resolving model names to directories.

* :func:`write_demo_model` generates the demo model (a small Llama in mlx-lm format with a
  byte-level BPE tokenizer and chat template) deterministically from a seed;
* :func:`ensure_demo_model` keeps one generated copy under the data dir;
* :func:`local_manifest` describes a model directory's files and tensors with their hashes
  (cached on disk), the manifest whose hash a model card carries;
* :func:`resolve_model` maps a name or path to ``(model_id, directory)``, raising
  :class:`ModelNotFound` otherwise.

The demo model's chat format is ``<|role|>\\n{content}<|end|>\\n`` per message (roles
``system``, ``user``, ``assistant``, ``tool``) with generation prompt ``<|assistant|>\\n``;
``<|end|>`` (token id 0) is its EOS token.
"""

from skulk.models._card import card_from_directory, model_card, model_directory
from skulk.models._demo import (
    DEFAULT_DEMO_SEED,
    DEMO_MODEL_ID,
    ensure_demo_model,
    write_demo_model,
)
from skulk.models._errors import ModelNotFound
from skulk.models._manifest import (
    LocalManifest,
    ManifestInvalid,
    decode_manifest,
    encode_manifest,
    local_manifest,
)
from skulk.models._resolve import available_models, resolve_model

__all__ = [
    "DEFAULT_DEMO_SEED",
    "DEMO_MODEL_ID",
    "LocalManifest",
    "ManifestInvalid",
    "ModelNotFound",
    "available_models",
    "card_from_directory",
    "decode_manifest",
    "encode_manifest",
    "ensure_demo_model",
    "local_manifest",
    "model_card",
    "model_directory",
    "resolve_model",
    "write_demo_model",
]

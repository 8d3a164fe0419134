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

from skulk.models._card import card_from_directory, model_card
from skulk.models._demo import (
    DEFAULT_DEMO_SEED,
    DEMO_MODEL_ID,
    ensure_demo_model,
    write_demo_model,
)
from skulk.models._errors import ModelNotFound
from skulk.models._generated import ModelShape, write_generated_model
from skulk.models._manifest import (
    MAX_MANIFEST_BYTES,
    FileStamp,
    LocalManifest,
    ManifestInvalid,
    decode_manifest,
    encode_manifest,
    fsync_directory,
    is_weight_file,
    local_manifest,
    manifest_sha256,
    stamps_of,
    write_atomically,
)
from skulk.models._resolve import available_models, resolve_model
from skulk.models._shards import ShardSlice, needed_tensors

__all__ = [
    "DEFAULT_DEMO_SEED",
    "DEMO_MODEL_ID",
    "MAX_MANIFEST_BYTES",
    "FileStamp",
    "LocalManifest",
    "ManifestInvalid",
    "ModelNotFound",
    "ModelShape",
    "ShardSlice",
    "available_models",
    "card_from_directory",
    "decode_manifest",
    "encode_manifest",
    "ensure_demo_model",
    "fsync_directory",
    "is_weight_file",
    "local_manifest",
    "manifest_sha256",
    "model_card",
    "needed_tensors",
    "resolve_model",
    "stamps_of",
    "write_atomically",
    "write_demo_model",
    "write_generated_model",
]

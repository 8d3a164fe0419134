"""Generated models of real mlx-lm architectures (llama, qwen2, …) for tests and benchmarks.

:func:`write_generated_model` builds an mlx-lm model directory from a :class:`ModelShape`:
random weights drawn from a seed (the same seed gives the same tensors), ``config.json`` for
the family, the demo model's byte-level BPE tokenizer, and the weights split over ``files``
safetensors files with a ``model.safetensors.index.json`` when there is more than one (as
Hugging Face checkpoints are). No network, nothing downloaded.

By default the weights carry no meaning: such models exist to check that a sharded instance
computes what one process computes, and to be large enough to make a CPU compute-bound in
benchmarks. With ``language="demo"`` (llama only) the weights are the demo model's instead,
fitted at this shape (:func:`~skulk.models._weights.build_weights` from
:func:`~skulk.models._demo.demo_language`): a model that costs what its shape costs and
writes what the demo model writes, so greedy output falls into loops that n-gram speculation
can draft, as a copying model's does.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import attrs

from skulk.models._demo import demo_language
from skulk.models._weights import LlamaShape, build_weights

if TYPE_CHECKING:
    import mlx.core as mx

Family = Literal["llama", "qwen2"]
Language = Literal["random", "demo"]

#: Tokenizer files copied from the demo model directory.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@attrs.frozen
class ModelShape:
    family: Family = "llama"
    layers: int = 4
    hidden_size: int = 64
    heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 128
    vocab_size: int = 1024
    """At least the tokenizer's vocabulary (the demo tokenizer has 1024 ids)."""
    tie_word_embeddings: bool = False
    context_length: int = 2048

    def config(self, eos_token_id: int) -> dict[str, object]:
        config: dict[str, object] = {
            "model_type": self.family,
            "architectures": ["Qwen2ForCausalLM" if self.family == "qwen2" else "LlamaForCausalLM"],
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "max_position_embeddings": self.context_length,
            "tie_word_embeddings": self.tie_word_embeddings,
            "eos_token_id": eos_token_id,
            "torch_dtype": "float32",
        }
        return config


def write_generated_model(
    out: Path,
    shape: ModelShape,
    tokenizer_from: Path,
    *,
    files: int = 1,
    seed: int = 0,
    language: Language = "random",
) -> Path:
    """Write a model of ``shape`` into the (new or empty) directory ``out``, its tokenizer
    copied from the model directory ``tokenizer_from`` (the demo model), its weights over
    ``files`` safetensors files (float32): random, or with ``language="demo"`` the demo
    model's (see the module doc). Returns ``out``."""
    if files < 1:
        raise ValueError("files must be at least 1")
    tok_config = json.loads((tokenizer_from / "config.json").read_text())
    config = shape.config(int(tok_config["eos_token_id"]))
    # the weights first: a shape the language cannot take leaves no half-written directory
    weights = _demo_weights(shape, seed) if language == "demo" else _random_weights(config, seed)
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(tokenizer_from / name, out / name)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    _save(out, weights, files)
    return out


def _random_weights(config: dict[str, object], seed: int) -> dict[str, mx.array]:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes  # private, but the one way from a config to a class

    model_class, args_class = _get_classes(config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    weights = dict(tree_flatten(model.parameters()))
    weights = {k: _init(k, v) for k, v in sorted(weights.items())}
    mx.eval(weights)
    return weights


def _demo_weights(shape: ModelShape, seed: int) -> dict[str, mx.array]:
    import mlx.core as mx

    table = demo_language().table
    if shape.family != "llama" or shape.tie_word_embeddings:
        raise ValueError("the demo language needs an untied llama")
    if shape.vocab_size != table.counts.shape[0]:
        raise ValueError(f"the demo language needs vocab_size {table.counts.shape[0]}")
    llama = LlamaShape(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.layers,
        intermediate_size=shape.intermediate_size,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=shape.context_length,
    )
    built = build_weights(llama, table, seed)
    return {name: mx.array(built[name]) for name in sorted(built)}


def _init(name: str, value: mx.array) -> mx.array:
    """Norm weights 1, everything else small normal values (keeps activations finite)."""
    import mlx.core as mx

    if name.endswith("norm.weight"):
        return mx.ones(value.shape, dtype=mx.float32)
    if name.endswith(".bias"):
        return mx.random.normal(value.shape, dtype=mx.float32) * 0.02
    fan_in = value.shape[-1] if value.ndim > 1 else 1
    scaled: mx.array = mx.random.normal(value.shape, dtype=mx.float32) * (fan_in**-0.5)
    return scaled


def _save(out: Path, weights: dict[str, mx.array], files: int) -> None:
    import mlx.core as mx

    names = list(weights)
    if files == 1:
        mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
        return
    total = sum(w.nbytes for w in weights.values())
    parts: list[list[str]] = [[] for _ in range(files)]
    done = 0
    for name in names:  # contiguous runs of tensors, about total/files bytes each
        part = min(files - 1, done * files // max(total, 1))
        parts[part].append(name)
        done += weights[name].nbytes
    index: dict[str, str] = {}
    for i, part_names in enumerate(p for p in parts if p):
        file = f"model-{i + 1:05d}-of-{files:05d}.safetensors"
        mx.save_safetensors(
            str(out / file), {n: weights[n] for n in part_names}, metadata={"format": "mlx"}
        )
        index.update({n: file for n in part_names})
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": index}, indent=2)
    )

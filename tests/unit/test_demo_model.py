"""The built-in demo model: deterministic generation, mlx-lm compatibility, data-dir upkeep."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from mlx_lm.tokenizer_utils import TokenizerWrapper

from skulk.models import (
    DEFAULT_DEMO_SEED,
    DEMO_MODEL_ID,
    ModelNotFound,
    available_models,
    card_from_directory,
    ensure_demo_model,
    resolve_model,
    write_demo_model,
)
from skulk.models._demo import MANIFEST_NAME, is_complete
from skulk.models._generated import Language
from skulk.models._weights import exact_matmul
from skulk.wire.cluster import DemoSource, PathSource

Loaded = tuple[Any, TokenizerWrapper]


def _chat(tokenizer: TokenizerWrapper, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
    return tokenizer.apply_chat_template(messages, **kwargs)  # type: ignore[no-untyped-call]


EXPECTED_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
    MANIFEST_NAME,
}


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_model(tmp_path_factory.mktemp("demo") / "model")


@pytest.fixture(scope="module")
def loaded(demo_dir: Path) -> Loaded:
    model, tokenizer = mlx_lm.load(str(demo_dir))[:2]
    return model, tokenizer


def _files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


# --- determinism -------------------------------------------------------------------------


def test_writes_a_complete_model_directory(demo_dir: Path) -> None:
    assert {p.name for p in demo_dir.iterdir()} == EXPECTED_FILES
    assert is_complete(demo_dir)
    assert not [p for p in demo_dir.parent.iterdir() if p.name.startswith(".")], "temp left"
    config = json.loads((demo_dir / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["tie_word_embeddings"] is False
    manifest = json.loads((demo_dir / MANIFEST_NAME).read_text())
    assert manifest["seed"] == DEFAULT_DEMO_SEED
    assert manifest["model_id"] == DEMO_MODEL_ID


def test_same_seed_gives_identical_bytes(demo_dir: Path, tmp_path: Path) -> None:
    again = write_demo_model(tmp_path / "again")
    assert _files(again) == _files(demo_dir)


def test_json_files_are_sorted_and_stable(demo_dir: Path) -> None:
    for name in ("config.json", "tokenizer_config.json", MANIFEST_NAME):
        text = (demo_dir / name).read_text()
        canonical = json.dumps(json.loads(text), sort_keys=True, indent=2, ensure_ascii=False)
        assert text == canonical + "\n"


def test_different_seed_changes_weights_not_tokenizer(demo_dir: Path, tmp_path: Path) -> None:
    other = write_demo_model(tmp_path / "other", seed=DEFAULT_DEMO_SEED + 1)
    assert (other / "model.safetensors").read_bytes() != (
        demo_dir / "model.safetensors"
    ).read_bytes()
    assert (other / "tokenizer.json").read_bytes() == (demo_dir / "tokenizer.json").read_bytes()
    a = mx.load(str(demo_dir / "model.safetensors"))
    b = mx.load(str(other / "model.safetensors"))
    assert isinstance(a, dict) and isinstance(b, dict)
    assert a.keys() == b.keys()
    for name in ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight"):
        assert not mx.array_equal(a[name], b[name]).item()


def test_output_does_not_depend_on_thread_counts(demo_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "one-thread"
    code = "import sys; from pathlib import Path; from skulk.models import write_demo_model; "
    code += "write_demo_model(Path(sys.argv[1]))"
    one = "1"
    env = dict(os.environ, OPENBLAS_NUM_THREADS=one, OMP_NUM_THREADS=one, RAYON_NUM_THREADS=one)
    subprocess.run([sys.executable, "-c", code, str(out)], env=env, check=True, timeout=120)
    assert _files(out) == _files(demo_dir)


def test_exact_matmul_does_not_depend_on_summation_order() -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 1000)) * np.exp(rng.standard_normal((64, 1000)))
    b = rng.standard_normal((1000, 48))
    forward = exact_matmul(a, b)
    backward = exact_matmul(a[:, ::-1].copy(), b[::-1].copy())
    assert np.array_equal(forward, backward)
    assert np.allclose(forward, a @ b, rtol=1e-4, atol=1e-4 * float(np.abs(a @ b).max()))


# --- mlx-lm compatibility ----------------------------------------------------------------


def test_chat_template_renders_role_markers(loaded: Loaded) -> None:
    _, tokenizer = loaded
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": [{"type": "text", "text": "More"}]},
    ]
    text = _chat(tokenizer, messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n"
        "<|assistant|>\nHello!<|end|>\n<|user|>\nMore<|end|>\n<|assistant|>\n"
    )
    without = _chat(tokenizer, messages[:2], add_generation_prompt=False, tokenize=False)
    assert without == "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n"
    with pytest.raises(Exception, match="unsupported message role"):
        _chat(tokenizer, [{"role": "robot", "content": "x"}], tokenize=False)


def test_eos_is_one_special_token_emitted_after_each_message(
    loaded: Loaded, demo_dir: Path
) -> None:
    _, tokenizer = loaded
    tok = tokenizer._tokenizer
    assert tokenizer.eos_token_ids == {0}
    assert tok.eos_token == "<|end|>"
    assert tok.encode("<|end|>", add_special_tokens=False) == [0]
    assert json.loads((demo_dir / "config.json").read_text())["eos_token_id"] == 0
    assert json.loads((demo_dir / "generation_config.json").read_text())["eos_token_id"] == 0
    ids = _chat(
        tokenizer,
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
        add_generation_prompt=True,
    )
    assert ids.count(0) == 2
    roles = tok.convert_tokens_to_ids(["<|user|>", "<|assistant|>"])
    assert ids[0] == roles[0] and ids[-2] == roles[1]
    assert tok.decode(ids, skip_special_tokens=True) == "\na\n\nb\n\n"


def test_generates_requested_number_of_tokens(loaded: Loaded) -> None:
    model, tokenizer = loaded
    prompt = _chat(
        tokenizer,
        [{"role": "user", "content": "Tell me about foxes."}],
        add_generation_prompt=True,
        tokenize=False,
    )
    responses = list(mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens=40))
    # Greedy decoding never picks <|end|>, so it runs to max_tokens.
    assert len(responses) == 40
    assert responses[-1].finish_reason == "length"
    text = "".join(r.text for r in responses)
    assert len(text.split()) >= 10
    assert "<|" not in text
    assert mlx_lm.generate(model, tokenizer, prompt, max_tokens=10)


def test_end_token_is_likely_but_never_greedy_after_a_sentence(
    loaded: Loaded,
) -> None:
    model, tokenizer = loaded
    ids = _chat(tokenizer, [{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    ids = ids + tokenizer.encode("The fox is quick.", add_special_tokens=False)
    logits = model(mx.array(ids)[None])[0, -1]
    probs = np.array(mx.softmax(logits.astype(mx.float32)))
    assert 0.05 < probs[0] < probs.max()
    roles = [1, 2, 3, 4, 5]  # <|system|> <|user|> <|assistant|> <|tool|> <|pad|>
    assert probs[roles].max() < 1e-9


# --- data dir ------------------------------------------------------------------------------


def _install_copy(demo_dir: Path, home: Path) -> Path:
    target = home / "models" / DEMO_MODEL_ID
    shutil.copytree(demo_dir, target)
    return target


def test_ensure_is_idempotent(demo_dir: Path, tmp_path: Path) -> None:
    target = _install_copy(demo_dir, tmp_path)
    before = (target / "model.safetensors").stat()
    assert ensure_demo_model(tmp_path) == target
    assert ensure_demo_model(tmp_path) == target
    after = (target / "model.safetensors").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_ensure_generates_when_missing(demo_dir: Path, tmp_path: Path) -> None:
    path = ensure_demo_model(tmp_path / "home")
    assert path == tmp_path / "home" / "models" / DEMO_MODEL_ID
    assert _files(path) == _files(demo_dir)


@pytest.mark.parametrize("damage", ["truncate", "no-manifest", "delete-weights", "other-seed"])
def test_ensure_repairs_an_incomplete_directory(
    demo_dir: Path, tmp_path: Path, damage: str
) -> None:
    target = _install_copy(demo_dir, tmp_path)
    if damage == "truncate":
        with open(target / "model.safetensors", "r+b") as f:
            f.truncate(1000)
    elif damage == "no-manifest":
        (target / MANIFEST_NAME).unlink()
    elif damage == "delete-weights":
        (target / "model.safetensors").unlink()
    else:
        manifest = json.loads((target / MANIFEST_NAME).read_text())
        manifest["seed"] = 1
        (target / MANIFEST_NAME).write_text(json.dumps(manifest))
    leftover = tmp_path / "models" / f".{DEMO_MODEL_ID}.tmp-crashed"
    leftover.mkdir()
    assert not is_complete(target)
    assert ensure_demo_model(tmp_path) == target
    assert _files(target) == _files(demo_dir)
    assert not leftover.exists()


def test_racing_ensures_produce_one_valid_directory(demo_dir: Path, tmp_path: Path) -> None:
    results: list[Path] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(ensure_demo_model(tmp_path))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    assert results == [tmp_path / "models" / DEMO_MODEL_ID] * 3
    assert _files(results[0]) == _files(demo_dir)
    leftovers = [p.name for p in (tmp_path / "models").iterdir() if p.name != DEMO_MODEL_ID]
    assert leftovers == [f".{DEMO_MODEL_ID}.lock"]


def test_write_refuses_to_replace_a_foreign_directory(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        write_demo_model(out)
    assert (out / "notes.txt").read_text() == "keep me"
    assert [p.name for p in tmp_path.iterdir()] == ["mine"]


def test_write_replaces_a_previously_generated_model(demo_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "model"
    shutil.copytree(demo_dir, out)
    (out / "model.safetensors").write_bytes(b"stale")
    assert write_demo_model(out) == out
    assert _files(out) == _files(demo_dir)
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


# --- resolve_model ---------------------------------------------------------------------------


def test_resolve_demo_name(demo_dir: Path, tmp_path: Path) -> None:
    target = _install_copy(demo_dir, tmp_path)
    assert resolve_model(DEMO_MODEL_ID, tmp_path) == (DEMO_MODEL_ID, target)


def test_resolve_directory_path_uses_basename(demo_dir: Path, tmp_path: Path) -> None:
    assert resolve_model(str(demo_dir), tmp_path) == ("model", demo_dir.resolve())


def test_resolve_model_under_home(demo_dir: Path, tmp_path: Path) -> None:
    shutil.copytree(demo_dir, tmp_path / "models" / "tiny")
    assert resolve_model("tiny", tmp_path) == ("tiny", (tmp_path / "models" / "tiny").resolve())
    assert available_models(tmp_path) == (DEMO_MODEL_ID, "tiny")


def test_resolve_cached_hugging_face_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hub = tmp_path / "hub"
    repo = hub / "models--acme--tiny-llm"
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123\n")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    home = tmp_path / "home"
    assert resolve_model("acme/tiny-llm", home) == ("acme/tiny-llm", snapshot)
    assert "acme/tiny-llm" in available_models(home)


def test_resolve_unknown_name_raises_model_not_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    with pytest.raises(ModelNotFound) as info:
        resolve_model("no-such-model", tmp_path)
    assert info.value.name == "no-such-model"
    assert info.value.available == (DEMO_MODEL_ID,)
    assert "no-such-model" in str(info.value) and DEMO_MODEL_ID in str(info.value)
    assert not (tmp_path / "models").exists()  # nothing generated on the way


def test_resolve_directory_without_config_raises(tmp_path: Path) -> None:
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    with pytest.raises(ModelNotFound, match=r"no config\.json"):
        resolve_model(str(empty), tmp_path)


@pytest.mark.parametrize("config", ["[]", '{"text_config": null}', '{"model_type": "llama"}'])
def test_a_config_that_describes_no_model_is_a_value_error(tmp_path: Path, config: str) -> None:
    (tmp_path / "config.json").write_text(config)
    with pytest.raises(ValueError, match=r"config\.json"):
        card_from_directory("m", tmp_path, PathSource(str(tmp_path)))


def test_the_demo_models_card(demo_dir: Path) -> None:
    card = card_from_directory("skulk-demo", demo_dir, DemoSource(1))
    assert card.architecture.layers >= 1 and card.weight_bytes > 0 and card.context_length > 0


@pytest.mark.parametrize("language", ["demo", "random"])
def test_a_generated_model_can_speak_the_demo_language(
    demo_dir: Path, tmp_path: Path, language: Language
) -> None:
    """``language="demo"`` fits the demo's bigram language at another shape: every bigram of
    its greedy output is one the demo corpus has (a random model's are not)."""
    from mlx_lm.generate import generate_step

    from skulk.models import ModelShape, write_generated_model
    from skulk.models._demo import demo_language

    shape = ModelShape(layers=3, hidden_size=64)
    out = write_generated_model(tmp_path / "m", shape, demo_dir, language=language, seed=3)
    model, tokenizer = mlx_lm.load(str(out))[:2]
    prompt = tokenizer.encode("Once upon a time the mill")
    steps = zip(generate_step(mx.array(prompt), model, max_tokens=48), range(48), strict=False)
    tokens = [prompt[-1], *(int(token) for (token, _), _ in steps)]
    counts = demo_language().table.counts
    seen = sum(counts[a, b] > 0 for a, b in itertools.pairwise(tokens))
    assert (seen == 48) if language == "demo" else (seen < 24)


def test_the_demo_language_needs_an_untied_llama_of_its_vocabulary(
    demo_dir: Path, tmp_path: Path
) -> None:
    from skulk.models import ModelShape, write_generated_model

    for shape in (ModelShape(family="qwen2"), ModelShape(vocab_size=2048)):
        with pytest.raises(ValueError, match="demo language"):
            write_generated_model(tmp_path / "m", shape, demo_dir, language="demo")
    assert not (tmp_path / "m").exists()  # refused before anything was written

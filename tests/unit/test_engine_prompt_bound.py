"""The characters-per-token bound that lets a runner refuse a huge prompt without tokenizing it.

Soundness is the point: a prompt may be refused by the bound only if tokenizing it would have
refused it too, so every test here checks ``len(text) <= bound * len(tokens)`` on real
``tokenizers`` pipelines, or that a pipeline which can drop or fuse input gets no bound at all.
"""

from __future__ import annotations

import json
import sys
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from skulk.engine._engine import Engine, RequestError
from skulk.engine._prompt_bound import MAX_COMPOSED, max_chars_per_token
from skulk.models import ensure_demo_model
from skulk.wire.runner import ChatMessage, ChatPrompt, TextPrompt

CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Ünïcödé tëxt, 日本語のテキスト, emoji 🎉🎉 and tabs\tand\nnewlines.",
    "def f(x):\n    return x ** 2  # code-like text with    spaces",
] * 20


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_demo_model(tmp_path_factory.mktemp("home"))


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Engine:
    return Engine.load(model_dir, lambda n, total: None)


def spec(tokenizer: Tokenizer) -> dict[str, Any]:
    return dict(json.loads(tokenizer.to_str()))


def gpt2_style() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|end|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return tok


def llama2_style() -> Tokenizer:
    """SentencePiece-like BPE: ▁ for spaces, byte fallback, fused unknowns (as Llama 2)."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trainer = trainers.BpeTrainer(
        vocab_size=600, show_progress=False,
        special_tokens=["<unk>", *(f"<0x{b:02X}>" for b in range(256))],
    )  # fmt: skip
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return tok


def metaspace_nfkc() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=False))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Metaspace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>"], show_progress=False)
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return tok


SOUND = {"gpt2": gpt2_style(), "llama2": llama2_style(), "metaspace-nfkc": metaspace_nfkc()}
#: Any text, with runs that fold (combining marks, Hangul jamo, half-width kana), whitespace and
#: an added token mixed in.
TEXT = st.lists(
    st.one_of(
        st.characters(codec="utf-8"),
        st.sampled_from(["<|end|>", " ", "  ", "\n", "e\u0301", "\u1100\u1161\u11a8", "ｶﾞ"]),
    ),
    max_size=200,
).map("".join)


@pytest.mark.parametrize("name", sorted(SOUND))
@settings(max_examples=300, deadline=None)
@given(text=TEXT)
def test_no_token_stands_for_more_characters_than_the_bound(name: str, text: str) -> None:
    tok = SOUND[name]
    bound = max_chars_per_token(spec(tok))
    assert bound is not None
    encoding = tok.encode(text)
    assert len(text) <= bound * len(encoding.ids)
    assert all(end - start <= bound for start, end in encoding.offsets)


def test_the_demo_tokenizer_has_a_tight_bound(model_dir: Path) -> None:
    bound = max_chars_per_token(json.loads((model_dir / "tokenizer.json").read_text()))
    assert bound == len("<|assistant|>")  # the longest token


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda s: s.update(normalizer={"type": "Strip", "strip_left": True, "strip_right": True}),
         "Strip drops any amount of whitespace"),
        (lambda s: s.update(normalizer={"type": "BertNormalizer"}), "drops control characters"),
        (lambda s: s.update(normalizer={"type": "Replace", "pattern": {"Regex": " +"},
                                        "content": " "}), "a regex folds any length"),
        (lambda s: s.update(normalizer={"type": "Replace", "pattern": {"String": "a"},
                                        "content": ""}), "replacing by nothing drops"),
        (lambda s: s.update(pre_tokenizer={"type": "Whitespace"}), "drops whitespace"),
        (lambda s: s.update(pre_tokenizer={"type": "Split", "pattern": {"String": " "},
                                           "behavior": "Removed", "invert": False}),
         "Removed drops the delimiter"),
        (lambda s: s["model"].update(type="WordPiece"), "an unknown word is one token"),
        (lambda s: s["model"].update(byte_fallback=False), "fused unknowns: any length"),
        (lambda s: s["added_tokens"].append({"id": 999, "content": "<x>", "lstrip": True,
                                             "rstrip": False}), "lstrip swallows whitespace"),
    ],
)  # fmt: skip
def test_pipelines_that_can_drop_or_fuse_input_get_no_bound(change: Any, why: str) -> None:
    s = spec(SOUND["llama2"])
    assert max_chars_per_token(s) is not None
    change(s)
    assert max_chars_per_token(s) is None, why


def test_folding_normalizers_multiply_the_bound() -> None:
    s = spec(SOUND["llama2"])
    base = max_chars_per_token(s)
    assert base is not None
    s["normalizer"] = {"type": "Replace", "pattern": {"String": "abc"}, "content": "x"}
    assert max_chars_per_token(s) == 3 * base
    s["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFC"}, s["normalizer"]]}
    assert max_chars_per_token(s) == 3 * MAX_COMPOSED * base


def test_composition_folds_at_most_max_composed_characters() -> None:
    longest = max(
        len(unicodedata.normalize("NFD", chr(c)))
        for c in range(sys.maxunicode + 1)
        if not 0xD800 <= c < 0xE000
    )
    assert longest == MAX_COMPOSED


class EncodeSpy:
    """The engine's tokenizer, recording what it is asked to encode."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.encoded: list[int] = []

    def encode(self, text: str, **kwargs: Any) -> Any:
        self.encoded.append(len(text))
        return self._inner.encode(text, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_a_prompt_that_cannot_fit_is_refused_before_it_is_tokenized(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = EncodeSpy(engine.tokenizer)
    monkeypatch.setattr(engine, "tokenizer", spy)
    assert engine.max_chars_per_token is not None
    limit = engine.context_length * engine.max_chars_per_token
    for prompt in (TextPrompt("x" * limit), ChatPrompt((ChatMessage("user", "x" * limit),))):
        with pytest.raises(RequestError) as info:
            engine.tokenize(prompt)
        assert info.value.reason == "prompt_too_long"
    assert spy.encoded == []
    # Just under the bound it is tokenized, and counted.
    with pytest.raises(RequestError) as info:
        engine.tokenize(TextPrompt("x " * (limit // 2 - 1)))
    assert info.value.reason == "prompt_too_long" and "tokens" in info.value.message
    assert len(spy.encoded) == 1


def test_a_chat_prompt_tokenizes_as_apply_chat_template_does(engine: Engine) -> None:
    messages = (ChatMessage("system", "Be brief."), ChatMessage("user", "Hi <|end|> there"))
    tokenizer: Any = engine.tokenizer
    expected = tokenizer.apply_chat_template(
        [{"role": m.role, "content": m.content} for m in messages], add_generation_prompt=True
    )
    assert engine.tokenize(ChatPrompt(messages)) == list(expected)

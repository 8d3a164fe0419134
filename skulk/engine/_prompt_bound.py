"""How many characters of a prompt one token can stand for, read off a ``tokenizer.json``.

If no token of a tokenizer ever consumes more than ``M`` characters of the text it encodes, a
text of ``n`` characters needs at least ``n / M`` tokens — so a prompt of
``context_length * M`` characters or more cannot fit the context, and the runner refuses it
without tokenizing it (tokenizing 16 MB takes tens of seconds on a CPU).

The bound must be *sound*: refusing a prompt that would have fitted is a bug. It holds only for
pipelines that never drop or fuse input, so :func:`max_chars_per_token` answers ``None``
(no bound: tokenize and count) for anything it does not understand. It understands:

* normalizers that only map characters to as many or more (``Prepend``, ``Lowercase``,
  ``NFD``/``NFKD``, ``ByteLevel``), ``NFC``/``NFKC`` (composition folds at most
  :data:`MAX_COMPOSED` characters into one) and ``Replace`` of a literal string by a non-empty
  one (``len(pattern) / len(content)`` characters into one, rounded up). ``Strip``,
  ``StripAccents``, ``Nmt``, ``BertNormalizer`` and ``Precompiled`` can drop characters: no bound;
* pre-tokenizers that keep every character (``ByteLevel``, ``Metaspace``, ``Digits``,
  ``UnicodeScripts``, ``FixedLength``, and ``Split``/``Punctuation`` unless their behaviour is
  ``Removed``). ``Whitespace``, ``WhitespaceSplit``, ``BertPreTokenizer`` and
  ``CharDelimiterSplit`` drop characters: no bound;
* ``BPE`` and byte-fallback ``Unigram`` models whose every character is representable (the
  byte-level alphabet, ``<0xNN>`` byte tokens, or a non-fused unknown token covering one
  character). ``WordPiece`` and ``WordLevel`` turn a whole unknown word into one token: no bound;
* added tokens (matched in the raw text) count with their length; one with ``lstrip`` or
  ``rstrip`` swallows any amount of whitespace: no bound.

A vocabulary entry of ``L`` symbols consumes at most ``L`` normalized characters (a byte-level
symbol is one byte, and a character is at least one byte), hence at most ``L * f`` characters of
the text, ``f`` being the normalizers' folding factor. Special tokens a post-processor adds only
make the count larger. Pure: no tokenizers library needed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: Most characters canonical composition folds into one (``len(NFD(c))`` over all of Unicode is
#: at most 4, e.g. U+1F82; a unit test checks it against ``unicodedata``).
MAX_COMPOSED = 4

_KEEPING_NORMALIZERS = frozenset({"Prepend", "Lowercase", "NFD", "NFKD", "ByteLevel"})
_COMPOSING_NORMALIZERS = frozenset({"NFC", "NFKC"})
_KEEPING_PRE_TOKENIZERS = frozenset(
    {"ByteLevel", "Metaspace", "Digits", "UnicodeScripts", "FixedLength"}
)
_SPLITTING_PRE_TOKENIZERS = frozenset({"Split", "Punctuation"})
_BYTE_TOKENS = frozenset(f"<0x{b:02X}>" for b in range(256))


def max_chars_per_token(spec: Mapping[str, Any]) -> int | None:
    """The most characters of input text any one token can consume under the tokenizer whose
    ``tokenizer.json`` is ``spec``, or ``None`` when no sound bound is known."""
    fold = _normalizer_fold(spec.get("normalizer"))
    if fold is None or not _pre_tokenizer_keeps(spec.get("pre_tokenizer")):
        return None
    model = spec.get("model")
    if not isinstance(model, Mapping):
        return None
    longest = _model_longest(model, _byte_level(spec))
    added = _added_longest(spec.get("added_tokens") or [])
    if longest is None or added is None:
        return None
    # An added token may be matched in the normalized text (``normalized: true``): fold it too.
    return max(longest, added, 1) * fold


def _normalizer_fold(node: object) -> int | None:
    """Most input characters one normalized character can come from; ``None``: may drop."""
    if node is None:
        return 1
    if not isinstance(node, Mapping):
        return None
    kind = node.get("type")
    if kind == "Sequence":
        fold = 1
        for child in node.get("normalizers") or []:
            factor = _normalizer_fold(child)
            if factor is None:
                return None
            fold *= factor
        return fold
    if kind in _KEEPING_NORMALIZERS:
        return 1
    if kind in _COMPOSING_NORMALIZERS:
        return MAX_COMPOSED
    if kind == "Replace":
        pattern, content = node.get("pattern"), node.get("content")
        if not isinstance(pattern, Mapping) or not isinstance(content, str) or not content:
            return None
        literal = pattern.get("String")
        if not isinstance(literal, str):
            return None  # a regex can match any length
        return max(1, -(-len(literal) // len(content)))
    return None


def _pre_tokenizer_keeps(node: object) -> bool:
    """Whether the pre-tokenizer keeps every character (it may only split and map them)."""
    if node is None:
        return True
    if not isinstance(node, Mapping):
        return False
    kind = node.get("type")
    if kind == "Sequence":
        return all(_pre_tokenizer_keeps(child) for child in node.get("pretokenizers") or [])
    if kind in _KEEPING_PRE_TOKENIZERS:
        return True
    if kind in _SPLITTING_PRE_TOKENIZERS:
        return node.get("behavior") != "Removed"
    return False


def _byte_level(spec: Mapping[str, Any]) -> bool:
    """Whether text reaches the model as byte-level symbols (GPT-2 style)."""

    def has(node: object, key: str) -> bool:
        if not isinstance(node, Mapping):
            return False
        if node.get("type") == "ByteLevel":
            return True
        return any(has(child, key) for child in node.get(key) or [])

    return has(spec.get("pre_tokenizer"), "pretokenizers") or has(
        spec.get("normalizer"), "normalizers"
    )


def _model_longest(model: Mapping[str, Any], byte_level: bool) -> int | None:
    """The longest vocabulary entry, if every character of the input can be represented."""
    kind = model.get("type")
    vocab = model.get("vocab")
    if kind == "BPE" and isinstance(vocab, Mapping):
        pieces: set[str] = {p for p in vocab if isinstance(p, str)}
        unk = model.get("unk_token")
        representable = (
            (byte_level and _byte_level_alphabet() <= pieces)
            or (bool(model.get("byte_fallback")) and _BYTE_TOKENS <= pieces)
            # Without fuse_unk an unknown character becomes one unknown token; with it a run
            # of any length does. Without an unknown token it is dropped.
            or (isinstance(unk, str) and unk in pieces and not model.get("fuse_unk"))
        )
    elif kind == "Unigram" and isinstance(vocab, Sequence):
        pieces = {entry[0] for entry in vocab if _is_piece(entry)}
        # Unigram always fuses runs of unknown characters; only byte fallback avoids them.
        representable = bool(model.get("byte_fallback")) and _BYTE_TOKENS <= pieces
    else:
        return None
    if not representable or not pieces:
        return None
    return max(len(p) for p in pieces)


def _added_longest(added: object) -> int | None:
    if not isinstance(added, Sequence):
        return None
    longest = 0
    for token in added:
        if not isinstance(token, Mapping) or not isinstance(token.get("content"), str):
            return None
        if token.get("lstrip") or token.get("rstrip"):
            return None
        longest = max(longest, len(token["content"]))
    return longest


def _is_piece(entry: object) -> bool:
    return isinstance(entry, Sequence) and len(entry) >= 1 and isinstance(entry[0], str)


def _byte_level_alphabet() -> frozenset[str]:
    """The 256 symbols GPT-2's byte-level encoding maps bytes to (printable bytes map to
    themselves, the others to U+0100 onwards, in order)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    extra = (b for b in range(256) if b not in keep)
    return frozenset([chr(b) for b in keep] + [chr(256 + i) for i, _ in enumerate(extra)])

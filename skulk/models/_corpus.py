"""The text the demo model's tokenizer and bigram table are built from.

The corpus is original text written for Skulk (public domain, CC0), shipped in the repository's
``resources/demo-model/`` folder. It is split into paragraphs; each paragraph is one example
"assistant message".
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import attrs

_RESOURCE = Path("resources") / "demo-model" / "corpus.txt"


def corpus_path() -> Path:
    """Where the shipped corpus lives: the repository's ``resources/`` folder (checkout or
    editable install), else ``<prefix>/share/skulk/`` where a wheel install puts it."""
    # skulk/models/_corpus.py -> repository root
    candidates = (
        Path(__file__).resolve().parents[2] / _RESOURCE,
        Path(sys.prefix) / "share" / "skulk" / "demo-model" / "corpus.txt",
    )
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"demo-model corpus not found (looked at {', '.join(map(str, candidates))}); "
        "reinstall Skulk"
    )


@attrs.frozen
class Corpus:
    """The corpus split into paragraphs, plus a digest of its exact bytes."""

    paragraphs: tuple[str, ...]
    sha256: str


def load_corpus(path: Path | None = None) -> Corpus:
    """Read the corpus: UTF-8, paragraphs separated by blank lines, whitespace normalised."""
    raw = (path or corpus_path()).read_bytes()
    text = raw.decode("utf-8").replace("\r\n", "\n")
    paragraphs = tuple(" ".join(block.split()) for block in text.split("\n\n") if block.strip())
    if not paragraphs:
        raise ValueError("demo-model corpus is empty")
    return Corpus(paragraphs=paragraphs, sha256=hashlib.sha256(raw).hexdigest())

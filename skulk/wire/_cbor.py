"""Strict CBOR: exactly one item per body, in the subset that frames use.

:func:`loads` accepts the CBOR data model our frames need (unsigned/negative integers, byte and
text strings, arrays, maps, ``false``/``true``/``null``, floats) and refuses, with a typed
:class:`MalformedFrame`:

* truncated input (:class:`TruncatedFrame`) and bytes after the item (:class:`TrailingBytes`):
  ``cbor2.loads`` silently ignores trailing bytes, so we decode from a stream and check where the
  decoder stopped;
* maps that repeat a key (:class:`DuplicateKey`);
* every semantic tag (:class:`ForbiddenTag`): cbor2 would otherwise turn tags into datetimes,
  bignums, shared references (cyclic values), string references, regexes, … Frames never use
  tags, so a tag is always a peer error;
* indefinite-length items (we never send them) and nesting deeper than ``max_depth``
  (:class:`NestingTooDeep`).

Simple values other than false/true/null (including ``undefined``) and non-finite floats are
well-formed CBOR; they decode here and are refused by the schema layer wherever they appear,
because no frame field accepts them.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import cbor2

from ._errors import (
    DuplicateKey,
    EncodeError,
    ForbiddenTag,
    MalformedFrame,
    NestingTooDeep,
    TrailingBytes,
    TruncatedFrame,
    excerpt,
)

# Tags cbor2 6.2 decodes itself (semantic decoders run before ``tag_hook`` is consulted):
# found by trying every tag in 0..70000 plus a few large ones. Each gets a decoder that refuses
# it; every other tag reaches ``_refuse_tag_hook``. tests/unit/test_wire_cbor.py re-checks a wide
# range of tags so a cbor2 upgrade that adds built-in tags is noticed.
BUILTIN_TAGS = (
    0, 1, 2, 3, 4, 5, 25, 28, 29, 30, 35, 36, 37, 52, 54, 100, 256, 258, 260, 261, 1004, 43000,
    55799,
)  # fmt: skip


class _TagSeen(Exception):
    """Raised inside cbor2 to abort decoding at a semantic tag (cbor2 wraps it; we unwrap)."""

    def __init__(self, tag: int) -> None:
        super().__init__(tag)
        self.tag = tag


def _refuse_semantic(tag: int) -> Callable[[object, bool], object]:
    def refuse(value: object, immutable: bool) -> object:
        raise _TagSeen(tag)

    return refuse


def _refuse_tag_hook(tag: cbor2.CBORTag, immutable: bool) -> object:
    raise _TagSeen(tag.tag)


_SEMANTIC_DECODERS = {tag: _refuse_semantic(tag) for tag in BUILTIN_TAGS}


def loads(body: bytes | bytearray | memoryview, *, max_depth: int) -> object:
    """Decode exactly one CBOR item that fills ``body``.

    Returns plain Python values only: ``int``, ``float``, ``str``, ``bytes``, ``bool``, ``None``,
    ``list``, ``dict`` (keys may be any hashable decoded value; arrays used as keys become
    tuples), plus ``cbor2.CBORSimpleValue`` / ``cbor2.undefined`` for the rare simple values.
    Raises only :class:`MalformedFrame` (or a subclass); never anything else, whatever ``body``.
    """
    size = len(body)
    fp = io.BytesIO(body)
    decoder = cbor2.CBORDecoder(
        fp,
        tag_hook=_refuse_tag_hook,
        semantic_decoders=_SEMANTIC_DECODERS,
        max_depth=max_depth,
        allow_indefinite=False,
        allow_duplicate_keys=False,
    )
    try:
        value = decoder.decode()
    except Exception as exc:  # untrusted input: every decoder failure is a malformed frame
        raise _classify(exc, max_depth) from None
    end = fp.tell()
    if end != size:
        raise TrailingBytes(end, size - end)
    return value


def _classify(exc: BaseException, max_depth: int) -> MalformedFrame:
    """Map a cbor2 failure to the most precise :class:`MalformedFrame` we can name."""
    chain: BaseException | None = exc
    while chain is not None:
        if isinstance(chain, _TagSeen):
            return ForbiddenTag(chain.tag)
        if isinstance(chain, cbor2.CBORDecodeEOF):
            return TruncatedFrame("input ends inside a CBOR item")
        if isinstance(chain, RecursionError):
            return NestingTooDeep(max_depth)
        chain = chain.__cause__ or chain.__context__
    text = str(exc)
    if "Duplicate map key" in text:
        return DuplicateKey(excerpt(text, 120))
    if "nesting depth" in text:
        return NestingTooDeep(max_depth)
    if isinstance(exc, cbor2.CBORDecodeError):
        return MalformedFrame(excerpt(text, 120))
    return MalformedFrame(f"invalid CBOR ({type(exc).__name__}: {excerpt(text, 120)})")


def dumps(value: object) -> bytes:
    """Encode a plain value (as produced by the converter's unstructure hooks) as one CBOR item.

    Raises :class:`EncodeError` if cbor2 refuses it (for example a ``str`` with lone
    surrogates, which has no UTF-8 encoding).
    """
    try:
        return cbor2.dumps(value)
    except Exception as exc:
        raise EncodeError("$", f"not encodable as CBOR ({type(exc).__name__}: {exc})") from None

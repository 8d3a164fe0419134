"""The errors the wire codec raises.

Contract: decoding untrusted bytes (:meth:`Codec.decode`, :meth:`FrameReader.feed`) raises only
:class:`WireError` subclasses, whatever the input. Every error is a value with a name and fields;
``str()`` is a one-line message fit for a log. Messages never embed more than a short excerpt of
peer-controlled data.

Hierarchy::

    WireError
    ├── FrameTooLarge(size, limit)         a frame over the size limit (checked before reading it)
    ├── MalformedFrame(detail)             not exactly one well-formed CBOR item
    │   ├── TruncatedFrame                 input ends inside an item / inside a frame
    │   ├── TrailingBytes(offset, extra)   bytes after the one item of a body
    │   ├── DuplicateKey                   a map repeats a key
    │   ├── ForbiddenTag(tag)              a CBOR semantic tag (frames never use tags)
    │   └── NestingTooDeep(limit)          containers nested deeper than the limit
    ├── SchemaError(path, message)         well-formed CBOR that is not a valid frame
    │   └── UnknownTag(tag, path, expected)
    ├── EncodeError(path, message)         a frame that cannot be encoded faithfully
    └── ReaderPoisoned                     a FrameReader used again after it failed
"""

from __future__ import annotations

_EXCERPT = 64


def excerpt(text: str, limit: int = _EXCERPT) -> str:
    """Shorten ``text`` (often peer-controlled) for use inside an error message."""
    if len(text) <= limit:
        return text
    return text[: limit - 1] + "…"


class WireError(Exception):
    """Base class of every error the wire codec raises."""


class FrameTooLarge(WireError):
    """A frame body of ``size`` bytes exceeds the limit of ``limit`` bytes.

    Raised by :class:`FrameReader` as soon as a length prefix announces such a frame (before any
    of the body is read), by :meth:`Codec.decode` for an oversized body, and by
    :meth:`Codec.encode` / :meth:`Codec.pack` when asked to build one.
    """

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(size, limit)
        self.size = size
        self.limit = limit

    def __str__(self) -> str:
        return f"frame of {self.size} bytes exceeds the limit of {self.limit} bytes"


class MalformedFrame(WireError):
    """The body is not exactly one well-formed CBOR item of the subset frames use."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail

    def __str__(self) -> str:
        return f"malformed frame: {self.detail}"


class TruncatedFrame(MalformedFrame):
    """The input ended inside a CBOR item or inside a length-prefixed frame."""


class TrailingBytes(MalformedFrame):
    """The body's CBOR item ends at ``offset`` and ``extra`` more bytes follow it."""

    def __init__(self, offset: int, extra: int) -> None:
        super().__init__(f"{extra} trailing byte(s) after the item ending at offset {offset}")
        self.args = (offset, extra)
        self.offset = offset
        self.extra = extra


class DuplicateKey(MalformedFrame):
    """A CBOR map repeats a key."""


class ForbiddenTag(MalformedFrame):
    """The body contains CBOR semantic tag ``tag``; frames never use tags."""

    def __init__(self, tag: int) -> None:
        super().__init__(f"CBOR tag {tag} is not allowed")
        self.args = (tag,)
        self.tag = tag


class NestingTooDeep(MalformedFrame):
    """Containers are nested more than ``limit`` levels deep."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"containers nested more than {limit} levels deep")
        self.args = (limit,)
        self.limit = limit


class SchemaError(WireError):
    """Well-formed CBOR that is not a valid frame.

    ``path`` locates the offending value from the root ``$`` (``$.params.top_k``,
    ``$.prompt.messages[2].role``, ``$.labels['zone']``); ``message`` says what was expected
    (``expected int``, ``missing required field``, ``unknown field``). ``str()`` gives
    ``"expected int @ $.params.top_k"``. When a frame has several problems, the first one in field
    order is reported.
    """

    def __init__(self, path: str, message: str) -> None:
        super().__init__(path, message)
        self.path = path
        self.message = message

    def __str__(self) -> str:
        return f"{self.message} @ {self.path}"


class UnknownTag(SchemaError):
    """A tagged union's ``"t"`` names no member. ``path`` is the path of the union value;
    ``expected`` lists the tags that would have been accepted."""

    def __init__(self, tag: str, path: str, expected: tuple[str, ...]) -> None:
        message = f"unknown tag {excerpt(tag)!r} (expected one of {', '.join(expected)})"
        super().__init__(path, message)
        self.args = (tag, path, expected)
        self.tag = tag
        self.expected = expected


class EncodeError(WireError):
    """A frame that cannot be encoded so that it decodes to an equal frame: a field holding a
    value of the wrong type (``expected int @ $.params.top_k``), an int outside the CBOR range
    ``[-2**64, 2**64 - 1]``, a non-finite float, a string with lone surrogates, a class outside
    the codec's union. ``str()`` reads like :class:`SchemaError`'s."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(path, message)
        self.path = path
        self.message = message

    def __str__(self) -> str:
        return f"cannot encode: {self.message} @ {self.path}"


class ReaderPoisoned(WireError):
    """A :class:`FrameReader` was fed after it had failed; its ``__cause__`` is the original
    error. A byte stream that failed once cannot be resynchronised."""

    def __init__(self, original: WireError) -> None:
        super().__init__(original)
        self.original = original

    def __str__(self) -> str:
        return f"frame reader already failed: {self.original}"

"""The codec for one union of frame classes: frames ⇄ CBOR bodies ⇄ length-prefixed frames."""

from __future__ import annotations

from typing import Any, Generic, TypeVar, cast

from . import _cbor
from ._convert import HookTable
from ._errors import EncodeError, FrameTooLarge, SchemaError, excerpt
from ._framing import LENGTH_PREFIX, MAX_PREFIXABLE
from ._schema import Invalid, schema_error, split_union, tagged_classes

F = TypeVar("F")

DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024
"""Default limit on a frame's CBOR body, in bytes (the length prefix is not counted)."""

DEFAULT_MAX_DEPTH = 32
"""Default limit on CBOR container nesting; frames are shallow, so deeper input is hostile."""


class Codec(Generic[F]):
    """Encodes and decodes the frames of one tagged union of frozen attrs classes.

    ``frames`` is a union of attrs classes (``ToRunner``) or a single attrs class. Each frame is a
    CBOR map of its fields plus ``"t": ClassName``; nested attrs fields are maps, nested unions of
    attrs classes are tagged the same way (:mod:`skulk.wire._convert` lists the type rules).
    Give the variable a type so mypy knows what ``decode`` returns::

        codec: Codec[ToRunner] = Codec(ToRunner)

    All hooks are built here, once; an unsupported field type raises ``TypeError`` now rather
    than on the wire. Instances are immutable after construction and safe to share.

    Limits: ``max_frame_size`` bounds a body (``1 .. 2**32 - 1`` bytes; the 4-byte prefix is not
    counted) on both the encode and the decode side; ``max_depth`` bounds CBOR nesting.

    Decoding raises only :class:`WireError` subclasses, whatever the input: :class:`FrameTooLarge`,
    :class:`MalformedFrame` (and subclasses) for bad CBOR, :class:`SchemaError` /
    :class:`UnknownTag` for CBOR that is not a valid frame. Encoding raises :class:`EncodeError`
    for a frame that would not decode back to an equal frame, :class:`FrameTooLarge` for one over
    the limit.
    """

    def __init__(
        self,
        frames: object,
        *,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_depth: int = DEFAULT_MAX_DEPTH,
    ) -> None:
        classes = tagged_classes(frames)
        if classes is None or split_union(frames)[1]:
            raise TypeError(f"Codec needs an attrs class or a union of them, not {frames!r}")
        if not 1 <= max_frame_size <= MAX_PREFIXABLE:
            raise ValueError(f"max_frame_size must be in 1..{MAX_PREFIXABLE}, not {max_frame_size}")
        if not 1 <= max_depth <= 1000:
            raise ValueError(f"max_depth must be in 1..1000, not {max_depth}")
        self._structure, self._unstructure = HookTable().tagged_union_hooks(classes, False)
        self._frame_types = classes
        self._max_frame_size = max_frame_size
        self._max_depth = max_depth

    @property
    def frame_types(self) -> tuple[type, ...]:
        """The classes this codec encodes and decodes; each one's tag is its ``__name__``."""
        return self._frame_types

    @property
    def max_frame_size(self) -> int:
        return self._max_frame_size

    @property
    def max_depth(self) -> int:
        return self._max_depth

    def encode(self, frame: F) -> bytes:
        """The CBOR body for ``frame`` (no length prefix): one WebSocket message's payload."""
        body = _cbor.dumps(self.unstructure(frame))
        if len(body) > self._max_frame_size:
            raise FrameTooLarge(len(body), self._max_frame_size)
        return body

    def pack(self, frame: F) -> bytes:
        """``frame`` as a 4-byte big-endian body length followed by the body (for byte
        streams: pipes, socketpairs). Read them back with :class:`FrameReader`."""
        body = self.encode(frame)
        return LENGTH_PREFIX.pack(len(body)) + body

    def decode(self, body: bytes | bytearray | memoryview) -> F:
        """The frame whose CBOR body is exactly ``body`` (trailing bytes are an error)."""
        size = len(body)
        if size > self._max_frame_size:
            raise FrameTooLarge(size, self._max_frame_size)
        return self.structure(_cbor.loads(body, max_depth=self._max_depth))

    def structure(self, value: object) -> F:
        """The frame for an already-decoded plain value (``dict`` with ``"t"``, …); raises
        :class:`SchemaError` / :class:`UnknownTag` (with a path) for anything else."""
        try:
            return cast(F, self._structure(value, None))
        except Exception as exc:  # untrusted input: every failure becomes a SchemaError
            error = _describe_failure(exc)
        raise error

    def unstructure(self, frame: F) -> Any:
        """``frame`` as plain ``dict/list/int/float/str/bytes/bool/None`` values (what
        :meth:`encode` hands to CBOR; also fine for JSON when the frame has no ``bytes``)."""
        try:
            return self._unstructure(frame)
        except Invalid as exc:
            raise EncodeError("$" + exc.suffix, exc.message) from None
        except Exception as exc:
            detail = excerpt(f"{type(exc).__name__}: {exc}", 160)
            raise EncodeError("$", f"not encodable ({detail})") from None


def _describe_failure(exc: Exception) -> SchemaError:
    try:
        return schema_error(exc)
    except Exception:  # pragma: no cover - a bug in path reporting must not leak either
        return SchemaError("$", f"invalid value ({type(exc).__name__})")

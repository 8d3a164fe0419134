"""Type introspection and error paths shared by the strict converter's hooks.

Hooks signal failure with the private :class:`Invalid` (a check failed; ``suffix`` extends the
path) and :class:`BadTag` (a tagged union's ``"t"`` named no member); for attrs classes and
containers cattrs' ``ClassValidationError`` / ``IterableValidationError`` groups carry notes
naming the attribute or index. :func:`schema_error` walks those to the first problem and returns
a public :class:`SchemaError` / :class:`UnknownTag` with a ``$.a.b[3]`` path.
"""

from __future__ import annotations

import collections.abc
import enum
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, Protocol, get_args, get_origin

import attrs
from cattrs.errors import (
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
    IterableValidationNote,
)

from ._errors import SchemaError, UnknownTag, excerpt

TAG_KEY = "t"
INT_MIN = -(2**64)
INT_MAX = 2**64 - 1

StructureFn = Callable[[Any, Any], Any]
UnstructureFn = Callable[[Any], Any]
HookPair = tuple[StructureFn, UnstructureFn]


class HookSource(Protocol):
    """Where hook factories get the hooks of nested types (``where`` names the enclosing type
    for error messages about unsupported types)."""

    def hooks(self, t: Any, where: str) -> HookPair: ...


class Invalid(Exception):
    """A value failed a check. ``suffix`` extends the path of the value being checked
    (``""`` for the value itself, ``".t"``, ``".params.top_k"``, ``"[3]"``)."""

    def __init__(self, message: str, suffix: str = "") -> None:
        super().__init__(message, suffix)
        self.message = message
        self.suffix = suffix


class BadTag(Exception):
    """A tagged union's ``"t"`` named no member."""

    def __init__(self, tag: str, expected: tuple[str, ...]) -> None:
        super().__init__(tag, expected)
        self.tag = tag
        self.expected = expected


# ---- type predicates ---------------------------------------------------------------------------

LEAVES: dict[Any, str] = {
    int: "int",
    float: "float",
    str: "str",
    bytes: "bytes",
    bool: "bool",
    type(None): "null",
}


def is_union(t: Any) -> bool:
    return get_origin(t) in (typing.Union, types.UnionType)


def is_literal(t: Any) -> bool:
    return get_origin(t) is Literal


def is_enum(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, enum.Enum)


def is_tuple(t: Any) -> bool:
    return get_origin(t) is tuple


def is_mapping(t: Any) -> bool:
    return get_origin(t) in (dict, collections.abc.Mapping)


def is_attrs(t: Any) -> bool:
    return isinstance(t, type) and attrs.has(t)


def is_supported(t: Any) -> bool:
    """Whether ``t`` is a field type the strict converter handles (shallow check)."""
    return t in LEAVES or any(
        p(t) for p in (is_union, is_literal, is_enum, is_tuple, is_mapping, is_attrs)
    )


def split_union(t: Any) -> tuple[tuple[Any, ...], bool]:
    """``A | B | None`` → ``((A, B), True)``; any other type ``T`` → ``((T,), False)``."""
    if not is_union(t):
        return (t,), False
    args = get_args(t)
    members = tuple(a for a in args if a is not type(None))
    return members, len(members) != len(args)


def tagged_classes(t: Any) -> tuple[type, ...] | None:
    """The member classes if ``t`` is an attrs class or a union of attrs classes (``None``
    allowed in the union), else ``None``."""
    members, _ = split_union(t)
    if members and all(is_attrs(m) for m in members):
        return members
    return None


def fields_of(cl: type) -> tuple[attrs.Attribute[Any], ...]:
    """The wire fields of an attrs class (``init=True`` ones), with resolved types."""
    attrs.resolve_types(cl)
    return tuple(a for a in attrs.fields(cl) if a.init)


def check_supported(t: Any, where: str) -> None:
    if not is_supported(t):
        raise TypeError(f"strict wire converter: unsupported type {t!r} in {where}")


def index_note(t: Any, index: int | str, elem: Any) -> IterableValidationNote:
    """The note cattrs attaches to an element's error inside an ``IterableValidationError``."""
    return IterableValidationNote(f"Structuring {t!r} @ index {index!r}", index, elem)


def raise_group(t: Any, errors: list[Exception]) -> typing.NoReturn:
    raise IterableValidationError(f"While structuring {t!r}", errors, t)


# ---- errors with paths --------------------------------------------------------------------------


def key_segment(key: object) -> str:
    """Path segment for a map key: ``.name`` for identifier-like strings, else ``[repr]``."""
    if isinstance(key, str) and key.isidentifier() and len(key) <= 64:
        return "." + key
    return "[" + excerpt(repr(key)) + "]"


def _sort_key(key: object) -> tuple[str, str]:
    return (type(key).__name__, excerpt(repr(key)))


def schema_error(exc: BaseException, path: str = "$") -> SchemaError:
    """The first problem recorded in ``exc`` (raised by a strict structure hook) as a
    :class:`SchemaError` / :class:`UnknownTag` with its path."""
    if isinstance(exc, ClassValidationError):
        with_notes, without = exc.group_exceptions()
        if with_notes:
            sub, note = with_notes[0]
            return schema_error(sub, f"{path}.{note.name}")
        if without:
            return schema_error(without[0], path)
    elif isinstance(exc, IterableValidationError):
        with_index, without_index = exc.group_exceptions()
        if with_index:
            sub, inote = with_index[0]
            index = inote.index
            segment = f"[{index}]" if isinstance(index, int) else key_segment(index)
            return schema_error(sub, path + segment)
        if without_index:
            return schema_error(without_index[0], path)
    elif isinstance(exc, Invalid):
        return SchemaError(path + exc.suffix, exc.message)
    elif isinstance(exc, BadTag):
        return UnknownTag(exc.tag, path, exc.expected)
    elif isinstance(exc, KeyError):
        # cattrs' generated code indexes ``o[name]`` for a required field; the attribute note
        # has already put the field's name on the path.
        return SchemaError(path, "missing required field")
    elif isinstance(exc, ForbiddenExtraKeysError):
        first = min(exc.extra_fields, key=_sort_key)
        return SchemaError(path + key_segment(first), "unknown field")
    message = excerpt(f"{type(exc).__name__}: {exc}", 160)
    return SchemaError(path, f"invalid value ({message})")

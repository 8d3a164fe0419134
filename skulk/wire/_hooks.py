"""Hooks for leaf types, literals, enums, tuples and maps (the strict rules are listed in
:mod:`skulk.wire._convert`). Each factory returns a ``(structure, unstructure)`` pair.

Containers have a fast path (one comprehension) and, only after a failure, a slow path that
re-checks element by element to record where the problem is.
"""

from __future__ import annotations

import enum
import math
from typing import Any, get_args

from ._schema import (
    INT_MAX,
    INT_MIN,
    HookPair,
    HookSource,
    Invalid,
    index_note,
    key_segment,
    raise_group,
)

# ---- leaf hooks ---------------------------------------------------------------------------------


def _s_int(v: Any, _: Any) -> Any:
    if type(v) is int and INT_MIN <= v <= INT_MAX:
        return v
    raise Invalid("expected int")


def _s_float(v: Any, _: Any) -> Any:
    t = type(v)
    if t is float:
        if math.isfinite(v):
            return v
        raise Invalid("expected finite float")
    if t is int and INT_MIN <= v <= INT_MAX:
        return float(v)
    raise Invalid("expected float")


def _s_str(v: Any, _: Any) -> Any:
    if type(v) is str:
        return v
    raise Invalid("expected str")


def _s_bytes(v: Any, _: Any) -> Any:
    if type(v) is bytes:
        return v
    raise Invalid("expected bytes")


def _s_bool(v: Any, _: Any) -> Any:
    if type(v) is bool:
        return v
    raise Invalid("expected bool")


def _s_none(v: Any, _: Any) -> None:
    if v is not None:
        raise Invalid("expected null")


def _u_int(v: Any) -> Any:
    return _s_int(v, int)


def _u_float(v: Any) -> Any:
    return _s_float(v, float)


def _u_str(v: Any) -> Any:
    return _s_str(v, str)


def _u_bytes(v: Any) -> Any:
    return _s_bytes(v, bytes)


def _u_bool(v: Any) -> Any:
    return _s_bool(v, bool)


def _u_none(v: Any) -> None:
    _s_none(v, None)


LEAF_HOOKS: dict[Any, HookPair] = {
    int: (_s_int, _u_int),
    float: (_s_float, _u_float),
    str: (_s_str, _u_str),
    bytes: (_s_bytes, _u_bytes),
    bool: (_s_bool, _u_bool),
    type(None): (_s_none, _u_none),
}


def literal_hooks(t: Any) -> HookPair:
    values = get_args(t)
    for value in values:
        if type(value) not in (str, int, bool, bytes):
            raise TypeError(f"strict wire converter: unsupported literal {value!r} in {t!r}")
    allowed = frozenset((type(value), value) for value in values)
    message = "expected one of " + ", ".join(repr(value) for value in values)

    def check(v: Any, _: Any = None) -> Any:
        kind = type(v)
        if kind in (str, int, bool, bytes) and (kind, v) in allowed:
            return v
        raise Invalid(message)

    return check, check


def enum_hooks(t: type[enum.Enum]) -> HookPair:
    by_value: dict[tuple[type, Any], enum.Enum] = {}
    for member in t:
        if type(member.value) not in (str, int):
            raise TypeError(f"strict wire converter: enum {t!r} must have str or int values")
        by_value[(type(member.value), member.value)] = member
    message = "expected one of " + ", ".join(repr(m.value) for m in t)

    def structure(v: Any, _: Any) -> enum.Enum:
        kind = type(v)
        if kind is str or kind is int:
            member = by_value.get((kind, v))
            if member is not None:
                return member
        raise Invalid(message)

    def unstructure(v: Any) -> Any:
        if type(v) is not t:
            raise Invalid(f"expected {t.__name__}")
        return v.value

    return structure, unstructure


def tuple_hooks(table: HookSource, t: Any) -> HookPair:
    args = get_args(t)
    if len(args) == 2 and args[1] is Ellipsis:
        return _homogeneous_tuple_hooks(table, t, args[0])
    if not args or Ellipsis in args:
        raise TypeError(f"strict wire converter: unsupported tuple type {t!r}")
    return _fixed_tuple_hooks(table, t, args)


def _homogeneous_tuple_hooks(table: HookSource, t: Any, elem: Any) -> HookPair:
    s_elem = table.hooks(elem, repr(t))[0]
    u_elem = table.hooks(elem, repr(t))[1]

    def structure(v: Any, _: Any) -> tuple[Any, ...]:
        if type(v) is not list:
            raise Invalid("expected array")
        try:
            return tuple([s_elem(e, elem) for e in v])
        except Exception:
            pass
        errors: list[Exception] = []  # slow path: find every bad element, with its index
        for i, e in enumerate(v):
            try:
                s_elem(e, elem)
            except Exception as exc:
                exc.__notes__ = [*getattr(exc, "__notes__", []), index_note(t, i, elem)]
                errors.append(exc)
        raise_group(t, errors)

    def unstructure(v: Any) -> list[Any]:
        if type(v) is not tuple:
            raise Invalid("expected tuple")
        try:
            return [u_elem(e) for e in v]
        except Exception:
            pass
        for i, e in enumerate(v):
            try:
                u_elem(e)
            except Invalid as exc:
                raise Invalid(exc.message, f"[{i}]{exc.suffix}") from None
        raise Invalid("not encodable")  # pragma: no cover - the fast path failed, so did one

    return structure, unstructure


def _fixed_tuple_hooks(table: HookSource, t: Any, args: tuple[Any, ...]) -> HookPair:
    s_elems = [(table.hooks(a, repr(t))[0], a) for a in args]
    u_elems = [table.hooks(a, repr(t))[1] for a in args]
    n = len(args)

    def structure(v: Any, _: Any) -> tuple[Any, ...]:
        if type(v) is not list or len(v) != n:
            raise Invalid(f"expected array of length {n}")
        out: list[Any] = []
        errors: list[Exception] = []
        for i, (e, (hook, a)) in enumerate(zip(v, s_elems, strict=True)):
            try:
                out.append(hook(e, a))
            except Exception as exc:
                exc.__notes__ = [*getattr(exc, "__notes__", []), index_note(t, i, a)]
                errors.append(exc)
        if errors:
            raise_group(t, errors)
        return tuple(out)

    def unstructure(v: Any) -> list[Any]:
        if type(v) is not tuple or len(v) != n:
            raise Invalid(f"expected tuple of length {n}")
        out: list[Any] = []
        for i, (e, hook) in enumerate(zip(v, u_elems, strict=True)):
            try:
                out.append(hook(e))
            except Invalid as exc:
                raise Invalid(exc.message, f"[{i}]{exc.suffix}") from None
        return out

    return structure, unstructure


def mapping_hooks(table: HookSource, t: Any) -> HookPair:
    args = get_args(t)
    if len(args) != 2:
        raise TypeError(f"strict wire converter: {t!r} needs key and value types")
    kt, vt = args
    if kt not in (str, int, bytes):
        raise TypeError(f"strict wire converter: map keys must be str, int or bytes in {t!r}")
    s_key, s_val = table.hooks(kt, repr(t))[0], table.hooks(vt, repr(t))[0]
    u_key, u_val = table.hooks(kt, repr(t))[1], table.hooks(vt, repr(t))[1]

    def structure(v: Any, _: Any) -> dict[Any, Any]:
        if type(v) is not dict:
            raise Invalid("expected map")
        try:
            return {s_key(k, kt): s_val(x, vt) for k, x in v.items()}
        except Exception:
            pass
        errors: list[Exception] = []
        for k, x in v.items():
            try:
                s_key(k, kt)
            except Invalid as exc:
                errors.append(Invalid(f"invalid key: {exc.message}", key_segment(k)))
                continue
            try:
                s_val(x, vt)
            except Exception as exc:
                exc.__notes__ = [*getattr(exc, "__notes__", []), index_note(t, k, vt)]
                errors.append(exc)
        raise_group(t, errors)

    def unstructure(v: Any) -> dict[Any, Any]:
        if type(v) is not dict:
            raise Invalid("expected dict")
        try:
            return {u_key(k): u_val(x) for k, x in v.items()}
        except Exception:
            pass
        for k, x in v.items():
            try:
                u_key(k)
                u_val(x)
            except Invalid as exc:
                raise Invalid(exc.message, f"{key_segment(k)}{exc.suffix}") from None
        raise Invalid("not encodable")  # pragma: no cover

    return structure, unstructure

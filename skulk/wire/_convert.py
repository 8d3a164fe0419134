"""The strict cattrs converter: plain CBOR values ⇄ frozen attrs frames.

:class:`HookTable` builds, per type, a pair of hooks that *check* instead of coercing; attrs
classes get cattrs-generated dict functions (``forbid_extra_keys`` and ``detailed_validation`` on)
whose every field hook is given explicitly, so cattrs' lenient built-in hooks (``str(1)``,
``int(1.7)``, any iterable as a tuple, ``IntEnum`` handled as ``int``) are never used.
Structuring (decode side) accepts exactly:

=============================  ==================================================================
field type                     accepted value
=============================  ==================================================================
``int``                        ``int`` in ``[-2**64, 2**64 - 1]`` (never ``bool``, ``float``,
                               ``str``)
``float``                      finite ``float``, or an ``int`` (clients send ``1`` for ``1.0``);
                               never ``bool``, ``str``, NaN or ±inf
``str`` / ``bytes``            exactly that type
``bool``                       exactly ``True`` / ``False`` (never ``0`` / ``1``)
``None``                       ``None``
``Literal[...]``               one of the literal values, with the literal's exact type
``Enum`` (str/int values)      one of the members' values
``tuple[T, ...]``              an array, each element checked as ``T``
``tuple[A, B]``                an array of exactly that length
``dict[K, V]``/``Mapping``     a map, keys checked as ``K``, values as ``V``
``X | None``                   ``None`` or an ``X`` (an attrs ``X`` stays untagged)
attrs class                    a map with no unknown keys; fields with defaults may be absent
union of attrs classes         a map whose ``"t"`` names the class (``{"t": "TextPrompt", …}``);
                               ``None`` too if it is a member
=============================  ==================================================================

Any other field type (``list``, ``set``, ``Any``, ``int | str``, …) is refused with ``TypeError``
when hooks are built, so an unsupported frame fails at start-up, not on the wire.

Unstructuring (encode side) is the mirror image: every value is checked with the same rules and
turned into plain ``int/float/str/bytes/bool/None/list/dict`` for cbor2. Hence a frame that
encodes always decodes to an equal frame.

Failures raise the private exceptions :class:`Invalid` / :class:`BadTag` (or cattrs'
``ClassValidationError`` / ``IterableValidationError`` groups carrying path notes); the codec
turns those into :class:`SchemaError` / :class:`UnknownTag` / :class:`EncodeError` with a path
(:func:`schema_error`). Hooks are generated once per table and type, then cached.
"""

from __future__ import annotations

from typing import Any

import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from ._hooks import LEAF_HOOKS, enum_hooks, literal_hooks, mapping_hooks, tuple_hooks
from ._schema import (
    TAG_KEY,
    BadTag,
    HookPair,
    Invalid,
    StructureFn,
    UnstructureFn,
    check_supported,
    fields_of,
    is_attrs,
    is_enum,
    is_literal,
    is_mapping,
    is_tuple,
    is_union,
    split_union,
    tagged_classes,
)


class HookTable:
    """Strict ``(structure, unstructure)`` hooks per type, built on first request and cached.

    ``structure(value, type)`` returns the typed value or raises; ``unstructure(value)`` returns
    plain data or raises :class:`Invalid`. Self-referencing attrs classes are supported (a
    forwarding pair stands in while the class's own hooks are being built). Not thread-safe while
    building; build everything up front (as :class:`Codec` does) and share freely afterwards.
    """

    def __init__(self) -> None:
        # Only used as the options holder for cattrs' code generation.
        self.converter = cattrs.Converter(
            forbid_extra_keys=True, detailed_validation=True, prefer_attrib_converters=False
        )
        self._pairs: dict[Any, HookPair] = dict(LEAF_HOOKS)
        self._building: set[Any] = set()

    def hooks(self, t: Any, where: str = "a frame") -> HookPair:
        pair = self._pairs.get(t)
        if pair is not None:
            return pair
        check_supported(t, where)
        if t in self._building:
            return self._forwarding(t)
        self._building.add(t)
        try:
            pair = self._build(t)
        finally:
            self._building.discard(t)
        self._pairs[t] = pair
        return pair

    def _forwarding(self, t: Any) -> HookPair:
        pairs = self._pairs

        def structure(v: Any, _: Any) -> Any:
            return pairs[t][0](v, t)

        def unstructure(v: Any) -> Any:
            return pairs[t][1](v)

        return structure, unstructure

    def _build(self, t: Any) -> HookPair:
        if is_literal(t):
            return literal_hooks(t)
        if is_enum(t):
            return enum_hooks(t)
        if is_tuple(t):
            return tuple_hooks(self, t)
        if is_mapping(t):
            return mapping_hooks(self, t)
        if is_union(t):
            return self._union_hooks(t)
        if is_attrs(t):
            return self._class_hooks(t)
        raise TypeError(f"strict wire converter: unsupported type {t!r}")  # pragma: no cover

    # ---- attrs classes ----------------------------------------------------------------------

    def _generated(self, cl: type) -> tuple[StructureFn, UnstructureFn]:
        """cattrs-generated dict functions for ``cl``, every field's hook given explicitly."""
        s_overrides: dict[str, Any] = {}
        u_overrides: dict[str, Any] = {}
        for a in fields_of(cl):
            s_hook, u_hook = self.hooks(a.type, f"{cl.__qualname__}.{a.name}")
            s_overrides[a.name] = override(struct_hook=s_hook)
            u_overrides[a.name] = override(unstruct_hook=u_hook)
        conv = self.converter
        structure: StructureFn = make_dict_structure_fn(cl, conv, **s_overrides)
        unstructure: UnstructureFn = make_dict_unstructure_fn(cl, conv, **u_overrides)
        return structure, unstructure

    def _class_hooks(self, cl: type) -> HookPair:
        """Hooks for an attrs class in an untagged position (a field typed as that class)."""
        generated, generated_u = self._generated(cl)
        unstructure = self._checked_unstructure(cl, generated_u)

        def structure(v: Any, _: Any) -> Any:
            if type(v) is not dict:
                raise Invalid("expected map")
            return generated(v, cl)

        return structure, unstructure

    def _checked_unstructure(self, cl: type, generated: UnstructureFn) -> UnstructureFn:
        fields = fields_of(cl)
        name = cl.__name__

        def unstructure(v: Any) -> Any:
            if type(v) is not cl:
                raise Invalid(f"expected {name}")
            try:
                return generated(v)
            except Exception:
                pass
            # Slow path, only on failure: re-run each field's hook to find which one failed.
            for a in fields:
                try:
                    self.hooks(a.type)[1](getattr(v, a.name))
                except Invalid as exc:
                    raise Invalid(exc.message, f".{a.name}{exc.suffix}") from None
                except Exception as exc:
                    raise Invalid(f"not encodable ({type(exc).__name__})", f".{a.name}") from None
            raise Invalid("not encodable")  # pragma: no cover

        return unstructure

    # ---- unions -------------------------------------------------------------------------------

    def _union_hooks(self, t: Any) -> HookPair:
        members, optional = split_union(t)
        if optional and len(members) == 1:  # X | None, including an untagged attrs class
            return self._optional_hooks(members[0])
        classes = tagged_classes(t)
        if classes is not None:
            return self.tagged_union_hooks(classes, optional)
        raise TypeError(
            f"strict wire converter: unsupported union {t!r} (only X | None and unions of attrs "
            "classes are supported)"
        )

    def tagged_union_hooks(self, members: tuple[type, ...], optional: bool) -> HookPair:
        """Hooks for a union of attrs classes (``optional``: ``None`` is a member too), tagged
        with ``"t": ClassName``. Used for union-typed fields and a codec's top-level union."""
        by_tag: dict[str, tuple[type, StructureFn]] = {}
        by_class: dict[type, tuple[str, UnstructureFn]] = {}
        for cl in members:
            if any(a.name == TAG_KEY for a in fields_of(cl)):
                raise TypeError(f"strict wire converter: {cl!r} has a field named {TAG_KEY!r}")
            tag = cl.__name__
            if tag in by_tag:
                raise TypeError(f"strict wire converter: two union members are named {tag!r}")
            generated, generated_u = self._generated(cl)
            by_tag[tag] = (cl, generated)
            by_class[cl] = (tag, self._checked_unstructure(cl, generated_u))
        expected = tuple(by_tag)
        not_map = "expected map or null" if optional else "expected map"
        not_member = "expected one of " + ", ".join(expected) + (" or None" if optional else "")

        def structure(v: Any, _: Any) -> Any:
            if type(v) is not dict:
                if v is None and optional:
                    return None
                raise Invalid(not_map)
            if TAG_KEY not in v:
                raise Invalid("missing required field", "." + TAG_KEY)
            tag = v[TAG_KEY]
            if type(tag) is not str:
                raise Invalid("expected str", "." + TAG_KEY)
            entry = by_tag.get(tag)
            if entry is None:
                raise BadTag(tag, expected)
            cl, generated = entry
            body = dict(v)
            del body[TAG_KEY]
            return generated(body, cl)

        def unstructure(v: Any) -> Any:
            entry = by_class.get(type(v))
            if entry is None:
                if v is None and optional:
                    return None
                raise Invalid(not_member)
            tag, unstructure_class = entry
            out = {TAG_KEY: tag}
            out.update(unstructure_class(v))
            return out

        return structure, unstructure

    def _optional_hooks(self, inner: Any) -> HookPair:
        s_inner, u_inner = self.hooks(inner)

        def structure(v: Any, _: Any) -> Any:
            if v is None:
                return None
            try:
                return s_inner(v, inner)
            except Invalid as exc:
                if exc.suffix:
                    raise
                raise Invalid(exc.message + " or null") from None

        def unstructure(v: Any) -> Any:
            if v is None:
                return None
            try:
                return u_inner(v)
            except Invalid as exc:
                if exc.suffix:
                    raise
                raise Invalid(exc.message + " or None") from None

        return structure, unstructure

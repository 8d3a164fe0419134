"""The type of a JSON document as Python builds it (what ``json.dumps`` takes), for the
``*_json()`` views that status endpoints serve."""

from __future__ import annotations

from typing import TypeAlias

JsonValue: TypeAlias = "str | int | float | bool | list[JsonValue] | dict[str, JsonValue] | None"

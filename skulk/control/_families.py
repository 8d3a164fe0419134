"""Which model families tensor sharding works for: those mlx-lm has a ``shard()`` for.

The planner is pure and imports nothing; the leader asks here, once per family for the life of
the process, and passes the answer in the placement policy. Finding out imports
``mlx_lm.models.<family>`` (about a second for the first family: it imports mlx-lm), so
:func:`tensor_families` runs the imports in a worker thread.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterable

import trio

log = logging.getLogger("skulk.control")


_KNOWN: dict[str, bool] = {}


def tensor_capable(family: str) -> bool:
    """Whether mlx-lm's model for ``family`` (a config's ``model_type``, remapped as mlx-lm
    remaps it) has ``shard()``. False for a family mlx-lm does not know, or when mlx-lm is not
    importable. Blocking (imports) the first time; cached."""
    known = _KNOWN.get(family)
    if known is None:
        known = _KNOWN[family] = _probe(family)
    return known


def _probe(family: str) -> bool:
    if not family.isascii() or not family.replace("_", "").isalnum():
        return False  # not a module name: never import what a model's config says blindly
    try:
        utils = importlib.import_module("mlx_lm.utils")
        remapping = getattr(utils, "MODEL_REMAPPING", {})
        name = remapping.get(family, family) if isinstance(remapping, dict) else family
        module = importlib.import_module(f"mlx_lm.models.{name}")
    except Exception as exc:  # ImportError, or a family module that fails to import
        log.debug("tensor sharding: family %r not importable: %s", family, exc)
        return False
    return hasattr(getattr(module, "Model", None), "shard")


async def tensor_families(families: Iterable[str]) -> frozenset[str]:
    """The members of ``families`` that tensor sharding works for (imports in a thread)."""
    wanted = sorted(set(families))
    if any(f not in _KNOWN for f in wanted):
        await trio.to_thread.run_sync(lambda: [tensor_capable(f) for f in wanted])
    return frozenset(f for f in wanted if _KNOWN[f])

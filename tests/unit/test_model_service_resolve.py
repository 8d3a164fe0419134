"""A model service whose weights cannot be got here fails with the fetch's typed reason (what
the node reports into the State for the leader to act on), and starts no runner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from skulk.transfer import DiskFull, NoHolderReachable
from skulk.worker import ModelService, phase_of


async def failing_with(exc: Exception) -> tuple[str, str | None]:
    async def resolve() -> Path:
        raise exc

    service = ModelService("m", resolve)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(service.run)
        while service.status().state != "failed":  # noqa: ASYNC110 - no event to wait on
            await trio.sleep(0.01)
        reported = phase_of(service.status())
        nursery.cancel_scope.cancel()
    assert service.recent_runners() == ()  # nothing was spawned
    return reported


async def test_a_fetch_failure_is_reported_with_its_reason(autojump_clock: Any) -> None:
    assert await failing_with(NoHolderReachable("m", {"a": "refused"})) == (
        "failed",
        "no_holder_reachable",
    )
    assert await failing_with(DiskFull("m", "/x", 10, 1)) == ("failed", "disk_full")
    assert await failing_with(OSError("boom")) == ("failed", "model_unavailable")

"""The serving end's item shaping: long deltas split, waiting deltas merged (no network)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, cast

import trio

from skulk.routing._hop import MAX_DELTA_CHARS, RouteTimeouts
from skulk.routing._serving import RouteServer, _merge
from skulk.wire.routing import RouteDelta, RouteEnd, RouteItem, RouteRequest
from skulk.wire.runner import GenerationEnd, SamplingParams, TextPrompt, Usage


def test_deltas_waiting_together_are_merged_up_to_the_first_other_item() -> None:
    send, receive = trio.open_memory_channel[RouteItem](10)
    end = RouteEnd(GenerationEnd("stop", Usage(1, 3)))
    for item in (RouteDelta("b"), RouteDelta("c"), end, RouteDelta("late")):
        send.send_nowait(item)
    assert _merge(RouteDelta("a"), receive) == (RouteDelta("abc"), end)
    assert receive.receive_nowait() == RouteDelta("late")
    assert _merge(RouteDelta("x"), receive) == (RouteDelta("x"), None)  # nothing waiting


def test_a_merge_stops_before_the_size_limit() -> None:
    send, receive = trio.open_memory_channel[RouteItem](10)
    big = RouteDelta("y" * (MAX_DELTA_CHARS - 1))
    send.send_nowait(RouteDelta("z"))
    send.send_nowait(big)
    merged, held = _merge(RouteDelta("x"), receive)
    assert merged == RouteDelta("xz") and held == big


class OneLongDelta:
    async def generate(
        self, prompt: object, params: object
    ) -> AsyncGenerator[str | GenerationEnd, None]:
        await trio.lowlevel.checkpoint()
        yield "é" * (2 * MAX_DELTA_CHARS + 5)
        yield GenerationEnd("stop", Usage(1, 1))


async def test_a_long_delta_is_split_into_items_under_the_size_limit() -> None:
    server = RouteServer(cast(Any, None), lambda i: None, cast(Any, None), RouteTimeouts())
    request = RouteRequest("r1", "i1", TextPrompt("hi"), SamplingParams())
    send, receive = trio.open_memory_channel[RouteItem](10)
    await server._pump(request, cast(Any, OneLongDelta()), send)
    items = [item async for item in receive]
    assert [len(i.text) for i in items if isinstance(i, RouteDelta)] == [
        MAX_DELTA_CHARS,
        MAX_DELTA_CHARS,
        5,
    ]
    assert items[-1] == RouteEnd(GenerationEnd("stop", Usage(1, 1)))

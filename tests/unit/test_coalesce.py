from __future__ import annotations

import trio
import trio.testing

from skulk.runner import RequestEvent
from skulk.wire.runner import Finished, GenerationEnd, RequestFailed, TokenChunk, Usage
from skulk.worker._coalesce import coalesce

END = Finished("r", GenerationEnd("stop", Usage(prompt_tokens=1, completion_tokens=4)))


def chunk(text: str) -> TokenChunk:
    return TokenChunk("r", (1,), text)


async def collect_timed(
    script: list[tuple[float, RequestEvent | None]], interval: float
) -> list[tuple[float, object]]:
    """Feed events at the given times (None closes the channel); record what comes out, when."""
    send, receive = trio.open_memory_channel[RequestEvent](100)
    out: list[tuple[float, object]] = []

    async def feed() -> None:
        async with send:
            for at, event in script:
                await trio.sleep_until(at)
                if event is None:
                    return
                await send.send(event)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(feed)
        async for item in coalesce(receive, interval):
            out.append((round(trio.current_time(), 9), item))
    return out


async def test_first_text_at_once_then_one_delta_per_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script: list[tuple[float, RequestEvent | None]] = [
        (0.0, chunk("a")),
        (0.001, chunk("b")),
        (0.002, chunk("c")),
        (0.030, chunk("d")),
        (0.031, END),
    ]
    out = await collect_timed(script, interval=0.02)
    assert out == [(0.0, "a"), (0.02, "bc"), (0.04, "d"), (0.04, END)]


async def test_zero_interval_sends_every_token(autojump_clock: trio.testing.MockClock) -> None:
    script: list[tuple[float, RequestEvent | None]] = [
        (0.0, chunk("a")),
        (0.01, chunk("b")),
        (0.02, END),
    ]
    out = await collect_timed(script, interval=0.0)
    assert [item for _, item in out] == ["a", "b", END]


async def test_empty_text_is_never_a_delta_and_failures_pass_through(
    autojump_clock: trio.testing.MockClock,
) -> None:
    failed = RequestFailed("r", "engine_error", "boom")
    script: list[tuple[float, RequestEvent | None]] = [
        (0.0, chunk("")),
        (0.0, chunk("x")),
        (0.5, chunk("")),
        (0.6, failed),
    ]
    out = await collect_timed(script, interval=0.02)
    assert [item for _, item in out] == ["x", failed]


async def test_channel_closing_without_an_end_just_stops(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script: list[tuple[float, RequestEvent | None]] = [(0.0, chunk("a")), (0.1, None)]
    out = await collect_timed(script, interval=0.02)
    assert [item for _, item in out] == ["a"]

"""Log-probability entries travel with their text: runner frames, the worker's coalesced deltas,
the mesh's route deltas (split and merged), the OpenAI renderers."""

from __future__ import annotations

import trio
import trio.testing

from skulk.api._openai_logprobs import chat_logprobs, completion_logprobs, token_text
from skulk.api._openai_render import OpenAIFormat
from skulk.routing._hop import ITEM_CODEC, MAX_DELTA_CHARS, MAX_DELTA_LOGPROBS
from skulk.routing._serving import _merge, _pieces
from skulk.runner import RequestEvent
from skulk.wire.routing import RouteDelta, RouteEnd, RouteItem
from skulk.wire.runner import Finished, GenerationEnd, TokenChunk, TokenLogprob, TopLogprob, Usage
from skulk.worker import ScoredText, join_scored, logprobs_of
from skulk.worker._coalesce import coalesce

END = Finished("r", GenerationEnd("stop", Usage(prompt_tokens=1, completion_tokens=3)))


def entry(i: int, token: bytes = b"x") -> TokenLogprob:
    return TokenLogprob(
        i, token, -0.5 * i, (TopLogprob(i, token, -0.5 * i), TopLogprob(9, b"z", -3.0))
    )


async def test_coalesced_deltas_keep_every_entry_even_for_held_back_text(
    autojump_clock: trio.testing.MockClock,
) -> None:
    send, receive = trio.open_memory_channel[RequestEvent](10)
    for frame in (
        TokenChunk("r", (1,), "a", (entry(1),)),
        TokenChunk("r", (2,), "", (entry(2, b"\xe2"),)),  # half a character: no text yet
        TokenChunk("r", (3,), "b", (entry(3),)),
        END,
    ):
        send.send_nowait(frame)
    send.close()
    out = [item async for item in coalesce(receive, 0.0)]
    assert out[-1] == END
    texts = [t for t in out[:-1] if isinstance(t, str)]
    assert "".join(texts) == "ab"
    assert [e.token_id for t in texts for e in logprobs_of(t)] == [1, 2, 3]


def test_plain_text_without_entries_stays_plain() -> None:
    assert type(join_scored(["a", "b"])) is str
    joined = join_scored(["a", ScoredText("", [entry(1)]), ScoredText("b", [entry(2)])])
    assert joined == "ab" and [e.token_id for e in logprobs_of(joined)] == [1, 2]


def test_route_deltas_split_and_merge_without_losing_entries() -> None:
    entries = [entry(i) for i in range(MAX_DELTA_LOGPROBS + 3)]
    text = ScoredText("y" * (MAX_DELTA_CHARS + 5), entries)
    pieces = _pieces(text)
    assert len(pieces) == 2
    assert all(len(p.text) <= MAX_DELTA_CHARS for p in pieces)
    assert all(len(p.logprobs) <= MAX_DELTA_LOGPROBS for p in pieces)
    assert "".join(p.text for p in pieces) == text
    assert [e for p in pieces for e in p.logprobs] == entries
    assert _pieces("") == [] and _pieces("abc") == [RouteDelta("abc")]
    # merging waiting deltas keeps entries in order, within the bound
    send, receive = trio.open_memory_channel[RouteItem](10)
    send.send_nowait(RouteDelta("", (entry(2),)))
    send.send_nowait(RouteDelta("c", (entry(3),)))
    merged, rest = _merge(RouteDelta("ab", (entry(1),)), receive)
    assert rest is None and merged == RouteDelta("abc", (entry(1), entry(2), entry(3)))
    # and they cross the mesh's codec intact
    assert ITEM_CODEC.decode(ITEM_CODEC.encode(merged)) == merged


def test_openai_chat_logprobs_object() -> None:
    text = ScoredText("é", [TokenLogprob(5, b"\xc3", -0.25, (TopLogprob(5, b"\xc3", -0.25),))])
    body = chat_logprobs(text)
    assert body == {
        "content": [
            {
                "token": "\\xc3",
                "logprob": -0.25,
                "bytes": [0xC3],
                "top_logprobs": [{"token": "\\xc3", "logprob": -0.25, "bytes": [0xC3]}],
            }
        ],
        "refusal": None,
    }
    assert token_text(b" hi") == " hi"


def test_openai_completion_logprobs_count_offsets_across_chunks() -> None:
    first, at = completion_logprobs(ScoredText("Hi", [entry(1, b"Hi")]), 0)
    second, at = completion_logprobs(ScoredText(" there", [entry(2, b" there")]), at)
    assert first["text_offset"] == [0] and second["text_offset"] == [2] and at == 8
    # the sampled token is listed among the alternatives too (up to logprobs + 1)
    assert second["top_logprobs"] == [{" there": -1.0, "z": -3.0}]


def test_renderers_put_logprobs_on_chunks_and_whole_responses() -> None:
    text = ScoredText("x", [entry(1)])
    end = GenerationEnd("stop", Usage(1, 1))
    chat = OpenAIFormat("chat", include_usage=False, logprobs=True).renderer("m")
    (event,) = chat.delta(text)
    assert isinstance(event.data, dict)
    choice = event.data["choices"][0]
    assert choice["logprobs"]["content"][0]["logprob"] == -0.5
    whole = OpenAIFormat("completion", include_usage=False, logprobs=True).renderer("m")
    body = whole.whole(text, end)
    assert body["choices"][0]["logprobs"]["tokens"] == ["x"]  # type: ignore[index]
    plain = OpenAIFormat("chat", include_usage=False).renderer("m").whole("x", end)
    assert plain["choices"][0]["logprobs"] is None  # type: ignore[index]


async def test_a_remote_answer_keeps_its_entries(autojump_clock: trio.testing.MockClock) -> None:
    from tests._doubles import FakeLink
    from tests.unit.test_routing_caller import answer_with, collect, request, routing

    link = FakeLink()
    r = routing(link)
    end = RouteEnd(GenerationEnd("stop", Usage(2, 2)))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer_with, r, link, RouteDelta("a", (entry(1),)), RouteDelta("b"), end)
        got = await collect(request(r))
    assert got == ["a", "b", GenerationEnd("stop", Usage(2, 2))]
    first = got[0]
    assert isinstance(first, ScoredText) and [e.token_id for e in first.logprobs] == [1]
    assert type(got[1]) is str

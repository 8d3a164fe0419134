"""``n`` > 1 choices (OpenAI chat completions and completions): parsing, seeds, usage, rendering,
and the fan-out through the app over a scripted fake service (see test_api_edge.py).

What must hold: the n choices are n generations on the one routed instance, each with its own
seed; a failure of any choice before the stream (or a refused admission place) is the whole
request's plain error with nothing left running; after the stream started, an error event then
``[DONE]``, the others cancelled; a client going away cancels all n.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import pytest
import trio

from skulk.api._choices import (
    choice_count,
    choice_params,
    choice_seed,
    combined_usage,
)
from skulk.api._fields import INT64_MAX, INT64_MIN
from skulk.api._openai import ApiError, parse_chat_completions, parse_completions
from skulk.api._openai_parse import MAX_CHOICES
from skulk.api._openai_render import OpenAIChoicesRenderer, OpenAIFormat
from skulk.routing import Admission
from skulk.wire.runner import GenerationEnd, Prompt, SamplingParams, Usage
from skulk.worker import RequestFailure

from .test_api_edge import (
    MODEL,
    USER,
    WAIT,
    FakeService,
    app_for,
    call,
    error,
    leave_as_the_response_starts,
)

SEED = 42
SEEDS = [choice_seed(SEED, i) for i in range(4)]


def end(reason: str = "stop", tokens: int = 2) -> GenerationEnd:
    return GenerationEnd(reason, Usage(prompt_tokens=5, completion_tokens=tokens))  # type: ignore[arg-type]


class ChoicesService(FakeService):
    """A fake service whose script is picked by the request's seed (each choice has its own),
    recording every request's sampling parameters and how many are running."""

    def __init__(self, by_seed: dict[int | None, Sequence[object]]) -> None:
        super().__init__()
        self.by_seed = by_seed
        self.params: list[SamplingParams] = []

    @property
    def running(self) -> int:
        return self.started - self.closed

    async def generate(
        self, prompt: Prompt, params: SamplingParams
    ) -> AsyncGenerator[str | GenerationEnd, None]:
        self.params.append(params)
        self.script = list(self.by_seed[params.seed])
        async for item in super().generate(prompt, params):
            yield item


def scripted(*scripts: Sequence[object]) -> ChoicesService:
    """Choice ``i`` of a request seeded with :data:`SEED` plays ``scripts[i]``."""
    return ChoicesService(dict(zip(SEEDS, scripts, strict=False)))


def sse(raw: bytes) -> list[Any]:
    """The events of an SSE body: JSON objects, and the string ``[DONE]``."""
    events = [e.removeprefix("data: ") for e in raw.decode().split("\n\n") if e]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


def chat(**fields: object) -> dict[str, object]:
    return {"model": MODEL, "messages": USER, **fields}


def comp(**fields: object) -> dict[str, object]:
    return {"model": MODEL, "prompt": "x", **fields}


# ---- parsing, seeds, usage (sans-IO) ---------------------------------------------------------


@pytest.mark.parametrize("n", [None, 1, 2, MAX_CHOICES])
def test_n_is_honoured_from_1_to_the_cap(n: int | None) -> None:
    fields = {} if n is None else {"n": n}
    for parsed in (parse_chat_completions(chat(**fields)), parse_completions(comp(**fields))):
        assert parsed.n == (n or 1)
        assert choice_count(parsed.generate_request()) == (n or 1)


@pytest.mark.parametrize(
    ("n", "code"),
    [
        (MAX_CHOICES + 1, "invalid_value"),
        (0, "invalid_value"),
        (-1, "invalid_value"),
        (2.0, "invalid_type"),
        (True, "invalid_type"),
        ("3", "invalid_type"),
    ],
)
def test_n_out_of_range_or_of_the_wrong_type_is_a_400_naming_it(n: object, code: str) -> None:
    for parse, body in ((parse_chat_completions, chat(n=n)), (parse_completions, comp(n=n))):
        with pytest.raises(ApiError) as info:
            parse(body)
        assert (info.value.status, info.value.param, info.value.code) == (400, "n", code)


@pytest.mark.parametrize("seed", [0, 1, -1, SEED, INT64_MIN, INT64_MAX])
def test_choice_seeds_differ_are_reproducible_and_fit_a_signed_64_bit_seed(seed: int) -> None:
    seeds = [choice_seed(seed, i) for i in range(MAX_CHOICES)]
    assert seeds[0] == seed  # choice 0 is what n: 1 gives
    assert len(set(seeds)) == MAX_CHOICES
    assert seeds == [choice_seed(seed, i) for i in range(MAX_CHOICES)]
    assert all(INT64_MIN <= s <= INT64_MAX for s in seeds)


def test_choice_params_seed_each_choice_or_leave_all_random() -> None:
    params = SamplingParams(temperature=0.5, seed=SEED, max_tokens=7)
    per_choice = choice_params(params, 3)
    assert [p.seed for p in per_choice] == SEEDS[:3]
    assert {(p.temperature, p.max_tokens) for p in per_choice} == {(0.5, 7)}
    unseeded = choice_params(SamplingParams(max_tokens=7), 3)
    assert [p.seed for p in unseeded] == [None, None, None]


def test_usage_counts_the_prompt_once_and_sums_the_completions() -> None:
    usage = combined_usage([Usage(10, 3, 4), Usage(10, 5, 10), Usage(10, 1, 10)])
    assert usage == Usage(prompt_tokens=10, completion_tokens=9, cached_tokens=4)


# ---- rendering (sans-IO) ---------------------------------------------------------------------


def test_whole_responses_have_one_choice_per_index() -> None:
    results = [("a", end("stop")), ("bb", end("length"))]
    usage = combined_usage([e.usage for _, e in results])
    chat_renderer = OpenAIFormat("chat", False, 2).choices_renderer(MODEL)
    whole = chat_renderer.whole(results, usage)
    assert whole["object"] == "chat.completion"
    assert whole["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "a"},
            "logprobs": None,
            "finish_reason": "stop",
        },
        {
            "index": 1,
            "message": {"role": "assistant", "content": "bb"},
            "logprobs": None,
            "finish_reason": "length",
        },
    ]
    assert whole["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    whole = OpenAIFormat("completion", False, 2).choices_renderer(MODEL).whole(results, usage)
    assert whole["object"] == "text_completion"
    choices = whole["choices"]
    assert isinstance(choices, list)
    assert [(c["index"], c["text"], c["finish_reason"]) for c in choices] == [
        (0, "a", "stop"),
        (1, "bb", "length"),
    ]


def test_stream_events_carry_their_choice_index() -> None:
    r = OpenAIFormat("chat", True, 2).choices_renderer(MODEL)
    assert isinstance(r, OpenAIChoicesRenderer)
    events = [
        *r.opening(1),
        *r.delta(1, "x"),
        *r.finish(1, end("length")),
        *r.closing(Usage(5, 4)),
    ]
    data = [e.data for e in events]
    assert data[-1] == "[DONE]"
    role, content, finish, usage = data[:-1]
    assert isinstance(role, dict) and isinstance(content, dict) and isinstance(finish, dict)
    assert [c["choices"][0]["index"] for c in (role, content, finish)] == [1, 1, 1]
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert finish["choices"][0]["finish_reason"] == "length"
    assert all(c["usage"] is None for c in (role, content, finish))
    assert (
        isinstance(usage, dict) and usage["choices"] == [] and usage["usage"]["total_tokens"] == 9
    )
    legacy = OpenAIFormat("completion", False, 2).choices_renderer(MODEL)
    assert legacy.opening(0) == []  # legacy completions have no opening chunk
    [chunk] = legacy.delta(1, "y")
    assert isinstance(chunk.data, dict) and "usage" not in chunk.data
    assert chunk.data["choices"][0]["index"] == 1 and chunk.data["choices"][0]["text"] == "y"
    assert [e.data for e in legacy.closing(Usage(5, 4))] == ["[DONE]"]


# ---- through the app -------------------------------------------------------------------------


async def post(
    fake: FakeService, path: str, body: object, admission: Admission | None = None
) -> Any:
    async with app_for(fake, admission).test_app() as test_app:
        return await call(test_app.test_client(), "POST", path, body)


async def stream(fake: FakeService, path: str, body: object) -> list[Any]:
    """The events of a streamed response, read as they come (the test client's ``open`` holds
    at most 10 body messages before the app's sends block)."""
    raw = b""
    async with app_for(fake).test_app() as test_app:
        client = test_app.test_client()
        with trio.fail_after(10):
            async with client.request(
                path, method="POST", headers={"content-type": "application/json"}
            ) as connection:
                await connection.send(json.dumps(body).encode())
                await connection.send_complete()
                while part := await connection.receive():
                    raw += part
    return sse(raw)


async def test_plain_chat_choices_are_n_seeded_generations_with_summed_usage() -> None:
    fake = scripted(["A", end("stop", 1)], ["B", "b", end("length", 3)], ["C", end("stop", 2)])
    response = await post(fake, "/v1/chat/completions", chat(n=3, seed=SEED))
    assert response.status_code == 200, await response.get_data()
    body = json.loads(await response.get_data())
    assert [(c["index"], c["message"]["content"], c["finish_reason"]) for c in body["choices"]] == [
        (0, "A", "stop"),
        (1, "Bb", "length"),
        (2, "C", "stop"),
    ]
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}
    assert sorted(p.seed for p in fake.params if p.seed is not None) == sorted(SEEDS[:3])
    assert fake.started == fake.closed == 3
    assert response.headers["x-skulk-instance"] == "i1"


async def test_plain_completion_choices_without_a_seed_are_each_random() -> None:
    fake = ChoicesService({None: ["z", end()]})
    response = await post(fake, "/v1/completions", comp(n=2))
    body = json.loads(await response.get_data())
    assert [(c["index"], c["text"]) for c in body["choices"]] == [(0, "z"), (1, "z")]
    assert [p.seed for p in fake.params] == [None, None]
    assert body["usage"]["completion_tokens"] == 4


async def test_streamed_chat_choices_interleave_each_with_its_index() -> None:
    fake = scripted(["A", end("stop", 1)], ["B", "b", end("length", 3)], ["C", end("stop", 2)])
    body = chat(n=3, seed=SEED, stream=True, stream_options={"include_usage": True})
    events = await stream(fake, "/v1/chat/completions", body)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    *chunks, usage = events[:-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 6
    assert usage["usage"]["prompt_tokens"] == 5
    assert len({c["id"] for c in [*chunks, usage]}) == 1
    assert all(c["usage"] is None and len(c["choices"]) == 1 for c in chunks)
    by_index: dict[int, list[dict[str, Any]]] = {}
    for c in chunks:
        by_index.setdefault(c["choices"][0]["index"], []).append(c["choices"][0])
    assert sorted(by_index) == [0, 1, 2]
    for index, text, reason in [(0, "A", "stop"), (1, "Bb", "length"), (2, "C", "stop")]:
        own = by_index[index]
        assert own[0]["delta"] == {"role": "assistant", "content": ""}  # a role chunk each
        assert "".join(c["delta"].get("content", "") for c in own) == text
        assert [c["finish_reason"] for c in own] == [None] * (len(own) - 1) + [reason]
    assert fake.started == fake.closed == 3


async def test_streamed_completion_choices() -> None:
    fake = scripted(["one", end()], ["two", end()])
    events = await stream(fake, "/v1/completions", comp(n=2, seed=SEED, stream=True))
    assert events[-1] == "[DONE]"
    texts: dict[int, str] = {}
    for c in events[:-1]:
        [choice] = c["choices"]
        texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    assert texts == {0: "one", 1: "two"}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_a_choice_failing_before_the_stream_fails_the_request_and_stops_the_others(
    stream: bool, path: str
) -> None:
    crash = RequestFailure("runner_crashed", "gone")
    fake = scripted([WAIT], [crash], ["early", WAIT])
    body = (chat if "chat" in path else comp)(n=3, seed=SEED, stream=stream)
    err = await error(await post(fake, path, body), 500)
    assert err["code"] == "runner_crashed"
    assert fake.running == 0  # the other choices were cancelled, on the runner too
    assert fake.started >= 1


@pytest.mark.parametrize("stream", [False, True])
async def test_n_choices_take_n_admission_places_all_or_nothing(stream: bool) -> None:
    fake = scripted(["a", end()], ["b", end()], ["c", end()])
    admission = Admission(max_in_flight=2)
    async with app_for(fake, admission).test_app() as test_app:
        client = test_app.test_client()
        body = chat(n=3, seed=SEED, stream=stream)
        response = await call(client, "POST", "/v1/chat/completions", body)
        err = await error(response, 429)
        assert err["code"] == "over_capacity" and response.headers["Retry-After"] == "1"
        assert fake.running == 0 and admission.statistics().in_flight == {}
        response = await call(client, "POST", "/v1/chat/completions", chat(n=2, seed=SEED))
        assert response.status_code == 200
        assert len(json.loads(await response.get_data())["choices"]) == 2
    assert admission.statistics().in_flight == {}


async def test_a_choice_failing_mid_stream_ends_it_with_an_error_and_stops_the_others() -> None:
    fake = scripted(["a", WAIT], ["b", RequestFailure("runner_crashed", "gone")], ["c", WAIT])
    events = await stream(fake, "/v1/chat/completions", chat(n=3, seed=SEED, stream=True))
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    assert events[-2]["error"]["code"] == "runner_crashed"
    assert {c["choices"][0]["index"] for c in events[:-2]} == {0, 1, 2}
    assert fake.started == fake.closed == 3


async def test_a_client_going_away_cancels_every_choice() -> None:
    """The client goes away as the response starts (every choice has begun; the body is never
    iterated): all n generations are closed by the time the request has ended."""
    fake = scripted(["a", WAIT], ["b", WAIT], ["c", WAIT])
    app = app_for(fake)
    async with app.test_app():  # the app's nursery, where a stream's choices run
        await leave_as_the_response_starts(app, chat(n=3, seed=SEED))
        assert fake.started == fake.closed == 3


async def test_websocket_requests_may_ask_for_choices() -> None:
    fake = scripted(["a", end()], ["b", end()])
    failing = scripted(["a", WAIT], [RequestFailure("prompt_too_long", "too long")])
    for service, n_messages in ((fake, None), (failing, 1)):
        async with (
            app_for(service).test_app() as test_app,
            test_app.test_client().websocket("/v1/ws") as ws,
        ):
            body = chat(n=2, seed=SEED)
            await ws.send(json.dumps({"id": "r", "type": "chat.completions", "body": body}))
            messages: list[dict[str, Any]] = []
            with trio.fail_after(10):
                while not messages or messages[-1]["type"] == "chunk":
                    messages.append(json.loads(await ws.receive()))
        if n_messages == 1:  # failed before the stream: the error is the only message
            [only] = messages
            assert only["type"] == "error" and only["error"]["code"] == "prompt_too_long"
        else:
            assert messages[-1] == {"id": "r", "type": "done"}
            indexes = {m["data"]["choices"][0]["index"] for m in messages[:-1]}
            assert indexes == {0, 1}
        assert service.running == 0

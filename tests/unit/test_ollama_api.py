"""The Ollama format: parsing (every honoured field mapped, every refused one a 400 naming it)
and the routes in process over a fake model service (NDJSON lines, the final statistics line,
errors in Ollama's ``{"error": …}`` envelope before and after a stream started)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from skulk.api._errors import ApiError
from skulk.api._ollama_format import Clock
from skulk.api._ollama_parse import (
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    parse_chat,
    parse_generate,
    parse_options,
    parse_show,
)
from skulk.wire.runner import (
    ChatMessage,
    ChatPrompt,
    GenerationEnd,
    SamplingParams,
    TextPrompt,
    Usage,
)
from skulk.worker import ModelStatus, ModelUnavailable, RequestFailure
from tests.unit.test_api_edge import DONE, MODEL, WAIT, FakeService, app_for, call

USER = [{"role": "user", "content": "hi"}]


def refused(parse: Any, body: object) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse(body)
    assert info.value.status == 400
    return info.value


# ---- parsing ---------------------------------------------------------------------------------


def test_options_map_onto_our_sampling() -> None:
    options = {
        "temperature": 0.2,
        "top_p": 0.5,
        "top_k": 7,
        "seed": 42,
        "num_predict": 12,
        "stop": ["\n\n", "END"],
    }
    assert parse_options(options) == SamplingParams(
        temperature=0.2, top_p=0.5, top_k=7, seed=42, max_tokens=12, stop=("\n\n", "END")
    )


def test_absent_options_are_ollamas_defaults_and_minus_one_means_none() -> None:
    defaults = SamplingParams(
        temperature=DEFAULT_TEMPERATURE, top_p=DEFAULT_TOP_P, top_k=DEFAULT_TOP_K
    )
    assert parse_options(None) == parse_options({}) == defaults
    assert (DEFAULT_TEMPERATURE, DEFAULT_TOP_P, DEFAULT_TOP_K) == (0.8, 0.9, 40)
    assert parse_options({"seed": -1, "num_predict": -1}) == defaults  # random, no limit
    assert parse_options({"num_predict": -2}).max_tokens is None
    assert parse_options({"temperature": 0, "top_k": 0}).temperature == 0.0  # greedy
    assert parse_options({"stop": "x"}).stop == ("x",)  # Modelfile's one-string form


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"mirostat": 2}, "options.mirostat"),
        ({"repeat_penalty": 1.1}, "options.repeat_penalty"),
        ({"presence_penalty": 0.5}, "options.presence_penalty"),
        ({"min_p": 0.05}, "options.min_p"),
        ({"num_ctx": 8192}, "options.num_ctx"),
        ({"num_thread": 4}, "options.num_thread"),
        ({"penalize_newline": False}, "options.penalize_newline"),
        ({"no_such_option": 1}, "options.no_such_option"),
        ({"temperature": -0.1}, "options.temperature"),
        ({"temperature": "hot"}, "options.temperature"),
        ({"top_p": 0}, "options.top_p"),
        ({"top_p": 1.5}, "options.top_p"),
        ({"top_k": -1}, "options.top_k"),
        ({"top_k": 2.5}, "options.top_k"),
        ({"seed": True}, "options.seed"),
        ({"seed": 2**64}, "options.seed"),
        ({"num_predict": 0}, "options.num_predict"),
        ({"num_predict": -3}, "options.num_predict"),
        ({"stop": [""]}, "options.stop[0]"),
        ({"stop": [1]}, "options.stop[0]"),
        ({"stop": ["x"] * 17}, "options.stop"),
        ({"stop": {"a": 1}}, "options.stop"),
    ],
)
def test_each_option_we_cannot_honour_is_a_400_naming_it(
    options: dict[str, object], param: str
) -> None:
    body = {"model": MODEL, "messages": USER, "options": options}
    assert refused(parse_chat, body).param == param


def test_options_with_the_value_that_changes_nothing_are_accepted() -> None:
    noops = {
        "mirostat": 0,
        "repeat_penalty": 1,  # an integer is the same number
        "presence_penalty": 0.0,
        "frequency_penalty": 0,
        "num_thread": 0,
        "num_gpu": -1,
        "use_mmap": True,
        "num_keep": 4,
        "repeat_last_n": 64,
        "typical_p": 1.0,
        "min_p": 0,
        "num_ctx": None,
    }
    assert parse_options(noops) == parse_options({})


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"format": "xml"}, "format"),
        ({"format": {"type": "string", "not": {}}}, "format"),
        ({"format": 3}, "format"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        ({"think": True}, "think"),
        ({"think": "high"}, "think"),
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"stream": "yes"}, "stream"),
        ({"keep_alive": [1]}, "keep_alive"),
        ({"options": [1]}, "options"),
        ({"surprise": 1}, "surprise"),
        ({"model": ""}, "model"),
        ({"model": 3}, "model"),
        ({"messages": [{"role": "function", "content": "42"}]}, "messages[0].role"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 1}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "images": ["aGk="]}]}, "messages[0].images"),
        (
            {"messages": [{"role": "assistant", "tool_calls": [{}]}]},
            "messages[0].tool_calls[0].function",
        ),
        ({"messages": [{"role": "assistant", "thinking": "hm"}]}, "messages[0].thinking"),
        ({"messages": [{"role": "user", "mood": "ok"}]}, "messages[0].mood"),
        ({"messages": "hi"}, "messages"),
    ],
)
def test_each_chat_field_we_cannot_honour_is_a_400_naming_it(
    extra: dict[str, object], param: str
) -> None:
    assert refused(parse_chat, {"model": MODEL, "messages": USER, **extra}).param == param


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"template": "{{ .Prompt }}"}, "template"),
        ({"context": [1, 2, 3]}, "context"),
        ({"suffix": "end"}, "suffix"),
        ({"images": ["aGk="]}, "images"),
        ({"raw": True, "system": "be brief"}, "system"),
        ({"raw": "yes"}, "raw"),
        ({"prompt": ["a"]}, "prompt"),
        ({"width": 512}, "width"),
        ({"format": {"type": "object", "propertyNames": {}}}, "format"),
        ({"messages": USER}, "messages"),  # a chat field
    ],
)
def test_each_generate_field_we_cannot_honour_is_a_400_naming_it(
    extra: dict[str, object], param: str
) -> None:
    assert refused(parse_generate, {"model": MODEL, "prompt": "x", **extra}).param == param


def test_format_json_or_a_schema_becomes_the_runners_schema() -> None:
    chat = parse_chat({"model": MODEL, "messages": USER, "format": "json"})
    assert chat.params.json_schema == '{"type": "object"}'
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    generate = parse_generate({"model": MODEL, "prompt": "x", "format": schema})
    # As pydantic writes it (no additionalProperties): the runner's grammar admits no other key.
    closed = '{"type":"object","properties":{"n":{"type":"integer"}},"additionalProperties":false}'
    assert generate.params.json_schema == closed
    assert parse_chat({"model": MODEL, "messages": USER, "format": ""}).params.json_schema is None


def test_tools_and_tool_turns_reach_the_prompt_and_calls_come_back() -> None:
    tool = {"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}
    messages = [
        *USER,
        {"role": "assistant", "tool_calls": [{"function": {"name": "w", "arguments": {"a": 1}}}]},
        {"role": "tool", "content": "sunny", "tool_name": "w"},
    ]
    req = parse_chat({"model": MODEL, "messages": messages, "tools": [tool]})
    assert req.prompt is not None and isinstance(req.prompt, ChatPrompt)
    assert (
        req.prompt.tools is not None and json.loads(req.prompt.tools)[0]["function"]["name"] == "w"
    )
    assert req.prompt.messages[1].tool_calls[0].name == "w"
    assert req.prompt.messages[2] == ChatMessage("tool", "sunny", tool_call_id="w")
    renderer = req.generate_request(Clock()).format.renderer(MODEL)
    assert renderer.delta('{"name": "w", "arguments": {"a": 2}}') == []
    lines = [e.data for e in renderer.closing(GenerationEnd("stop", Usage(1, 2)))]
    call_line, last = lines
    assert isinstance(call_line, dict) and isinstance(last, dict)
    (call,) = call_line["message"]["tool_calls"]
    assert call["function"]["name"] == "w" and call["function"]["arguments"] == {"a": 2}
    assert last["done"] is True


def test_what_the_ollama_client_sends_by_default_is_accepted() -> None:
    """The client always sends ``tools: []``, and its empty-value defaults."""
    body = {"model": MODEL, "messages": USER, "tools": [], "stream": False, "format": ""}
    req = parse_chat({**body, "keep_alive": "5m", "think": False, "logprobs": False})
    assert req.stream is False
    assert req.prompt == ChatPrompt((ChatMessage("user", "hi"),))
    assert parse_chat({**body, "keep_alive": 0}).model == MODEL


def test_chat_streams_by_default_and_keeps_every_turn() -> None:
    req = parse_chat(
        {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi"},
                {"role": "assistant"},  # the client drops an empty content
                {"role": "user", "content": "again", "images": []},
            ],
        }
    )
    assert req.kind == "chat" and req.stream is True
    assert req.prompt == ChatPrompt(
        (
            ChatMessage("system", "be brief"),
            ChatMessage("user", "hi"),
            ChatMessage("assistant", ""),
            ChatMessage("user", "again"),
        )
    )


def test_generate_goes_through_the_template_unless_raw() -> None:
    templated = parse_generate({"model": MODEL, "prompt": "hi", "system": "be brief"})
    assert templated.prompt == ChatPrompt(
        (ChatMessage("system", "be brief"), ChatMessage("user", "hi"))
    )
    raw = parse_generate({"model": MODEL, "prompt": "hi", "raw": True, "stream": False})
    assert raw.prompt == TextPrompt("hi") and raw.stream is False


def test_no_prompt_is_a_load_request() -> None:
    assert parse_chat({"model": MODEL}).prompt is None
    assert parse_chat({"model": MODEL, "messages": []}).prompt is None
    assert parse_generate({"model": MODEL, "prompt": ""}).prompt is None
    with pytest.raises(ValueError, match="generates nothing"):
        parse_generate({"model": MODEL}).generate_request(Clock())


def test_a_prompt_failure_is_blamed_on_the_formats_prompt_field() -> None:
    chat = parse_chat({"model": MODEL, "messages": USER}).generate_request(Clock())
    generate = parse_generate({"model": MODEL, "prompt": "x"}).generate_request(Clock())
    assert (chat.format.prompt_param, generate.format.prompt_param) == ("messages", "prompt")


def test_show_takes_model_or_the_older_name() -> None:
    assert parse_show({"model": MODEL}) == MODEL
    assert parse_show({"name": MODEL, "verbose": True}) == MODEL
    assert refused(parse_show, {}).param == "model"
    assert refused(parse_show, {"model": MODEL, "verbose": 1}).param == "verbose"
    assert refused(parse_show, []).param is None


# ---- the routes ------------------------------------------------------------------------------


@pytest.fixture
async def fake() -> FakeService:
    return FakeService()


async def post(fake: FakeService, path: str, body: object) -> Any:
    async with app_for(fake).test_app() as test_app:
        return await call(test_app.test_client(), "POST", path, body)


async def lines(response: Any) -> list[dict[str, Any]]:
    assert response.status_code == 200, await response.get_data()
    assert response.mimetype == "application/x-ndjson"
    data = (await response.get_data()).decode()
    assert data.endswith("\n")
    return [json.loads(line) for line in data.splitlines()]


def assert_statistics(line: dict[str, Any], reason: str) -> None:
    assert line["done"] is True and line["done_reason"] == reason
    assert (line["prompt_eval_count"], line["eval_count"]) == (2, 2)
    durations = [line[k] for k in ("prompt_eval_duration", "eval_duration", "load_duration")]
    assert all(isinstance(d, int) and d >= 0 for d in durations)
    assert line["total_duration"] == line["prompt_eval_duration"] + line["eval_duration"]


@pytest.mark.parametrize(("path", "key"), [("/api/chat", "message"), ("/api/generate", "response")])
async def test_a_stream_is_ndjson_ending_with_the_statistics(
    fake: FakeService, path: str, key: str
) -> None:
    # No "stream" field: Ollama streams by default.
    asks: dict[str, dict[str, Any]] = {"message": {"messages": USER}, "response": {"prompt": "x"}}
    got = await lines(await post(fake, path, {"model": MODEL, **asks[key]}))
    texts = [line[key]["content"] if key == "message" else line[key] for line in got]
    assert texts == ["Hel", "lo", ""]
    assert [line["done"] for line in got] == [False, False, True]
    assert all(line["model"] == MODEL and line["created_at"].endswith("Z") for line in got)
    if key == "message":
        assert {line["message"]["role"] for line in got} == {"assistant"}
    assert_statistics(got[-1], "stop")
    assert fake.started == fake.closed == 1


async def test_a_whole_answer_is_one_object(fake: FakeService) -> None:
    fake.script = ["Hel", "lo", GenerationEnd("length", DONE.usage)]
    response = await post(fake, "/api/chat", {"model": MODEL, "messages": USER, "stream": False})
    assert response.status_code == 200 and response.mimetype == "application/json"
    body = json.loads(await response.get_data())
    assert body["message"] == {"role": "assistant", "content": "Hello"}
    assert_statistics(body, "length")
    assert response.headers["x-skulk-instance"] == "i1"


async def test_a_load_request_answers_load_without_generating(fake: FakeService) -> None:
    response = await post(fake, "/api/generate", {"model": MODEL, "stream": False})
    body = json.loads(await response.get_data())
    assert (body["done"], body["done_reason"], body["response"]) == (True, "load", "")
    [line] = await lines(await post(fake, "/api/chat", {"model": MODEL}))
    assert line["done_reason"] == "load" and line["message"]["content"] == ""
    assert fake.started == 0
    response = await post(fake, "/api/chat", {"model": "nope"})
    assert response.status_code == 404
    assert json.loads(await response.get_data()) == {
        "error": "The model 'nope' does not exist.",
        "request_id": response.headers["x-request-id"],  # Ollama's envelope, and the id
    }


@pytest.mark.parametrize(
    ("failure", "status"),
    [
        (RequestFailure("prompt_too_long", "too long"), 400),
        (RequestFailure("runner_crashed", "gone"), 500),
        (ModelUnavailable(ModelStatus(MODEL, "restarting")), 503),
    ],
)
async def test_a_failure_before_the_first_token_is_a_plain_error(
    fake: FakeService, failure: Exception, status: int
) -> None:
    fake.script = [failure]
    response = await post(fake, "/api/chat", {"model": MODEL, "messages": USER})
    assert response.status_code == status and response.mimetype == "application/json"
    body = json.loads(await response.get_data())
    assert list(body) == ["error", "request_id"] and isinstance(body["error"], str)
    assert fake.closed == fake.started == 1


async def test_a_failure_mid_stream_ends_it_with_an_error_line(fake: FakeService) -> None:
    fake.script = ["Hel", RequestFailure("runner_crashed", "gone")]
    got = await lines(await post(fake, "/api/generate", {"model": MODEL, "prompt": "x"}))
    assert got[0]["response"] == "Hel"
    assert list(got[-1]) == ["error", "request_id"] and "runner_crashed" in got[-1]["error"]
    assert fake.closed == 1


async def test_a_bad_field_is_a_400_in_ollamas_envelope(fake: FakeService) -> None:
    body = {"model": MODEL, "messages": USER, "options": {"mirostat": 1}}
    response = await post(fake, "/api/chat", body)
    assert response.status_code == 400
    message = json.loads(await response.get_data())["error"]
    assert "options.mirostat" in message
    assert fake.started == 0


async def test_a_stream_whose_client_leaves_cancels_its_generation(fake: FakeService) -> None:
    """The client goes away after the first line, while the stream waits for the next token:
    the generation (a runner request) is closed."""
    fake.script = ["Hel", WAIT]
    body = json.dumps({"model": MODEL, "prompt": "x"}).encode()
    scope = {
        "type": "http", "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/api/generate", "raw_path": b"/api/generate", "query_string": b"",
        "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
        "headers": [(b"content-type", b"application/json")], "extensions": {},
    }  # fmt: skip
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    gone = trio.Event()
    sent: list[bytes] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            sent.append(message["body"])
            gone.set()  # the client leaves once it has the first line

    with trio.fail_after(10):
        app: Any = app_for(fake)
        await app(scope, receive, send)
    assert json.loads(b"".join(sent).splitlines()[0])["response"] == "Hel"
    assert fake.started == fake.closed == 1


async def test_listing_routes_in_ollamas_shapes(fake: FakeService) -> None:
    async with app_for(fake).test_app() as test_app:
        client = test_app.test_client()
        tags = json.loads(await (await call(client, "GET", "/api/tags")).get_data())
        ps = json.loads(await (await call(client, "GET", "/api/ps")).get_data())
        shown = await call(client, "POST", "/api/show", {"model": MODEL})
        unknown = await call(client, "POST", "/api/show", {"model": "nope"})
        version = json.loads(await (await call(client, "GET", "/api/version")).get_data())
        embed = await call(client, "POST", "/api/embed", {"model": MODEL, "input": 1})
    [model] = tags["models"]
    assert (model["name"], model["model"], model["details"]["family"]) == (MODEL, MODEL, "llama")
    [running] = ps["models"]
    assert running["context_length"] == 64 and running["size_vram"] == 0
    info = json.loads(await shown.get_data())["model_info"]
    assert info["general.architecture"] == "llama" and info["llama.context_length"] == 64
    assert unknown.status_code == 404
    assert isinstance(version["version"], str)
    assert embed.status_code == 400  # served (tests/unit/test_embed_api.py), in its envelope
    assert set(json.loads(await embed.get_data())) == {"error", "request_id"}


async def test_ps_lists_only_ready_models(fake: FakeService) -> None:
    fake.state = "loading"
    async with app_for(fake).test_app() as test_app:
        client = test_app.test_client()
        ps = json.loads(await (await call(client, "GET", "/api/ps")).get_data())
        tags = json.loads(await (await call(client, "GET", "/api/tags")).get_data())
    assert ps == {"models": []}
    assert [m["name"] for m in tags["models"]] == [MODEL]

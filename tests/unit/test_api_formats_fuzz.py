"""The Responses and Anthropic parsers under generated bodies: near-valid requests (every field
the official SDKs know, with plausible and arbitrary values) either parse into a request a
runner can take, or are a 400 :class:`ApiError` — never another exception."""

from __future__ import annotations

import json
import typing
from collections.abc import Callable

from anthropic.types import message_count_tokens_params, message_create_params
from hypothesis import given
from hypothesis import strategies as st
from openai.types.responses import response_create_params

from skulk.api._anthropic import parse_count_tokens, parse_messages
from skulk.api._errors import ApiError
from skulk.api._request import GenerateRequest
from skulk.api._responses_parse import parse_responses
from skulk.engine.protocol import TO_RUNNER
from skulk.wire.runner import Generate
from tests.unit.test_openai_schema import FAST, field_values, json_values, mostly


def check(parse: Callable[[object], GenerateRequest], body: object) -> None:
    try:
        request = parse(body)
    except ApiError as error:
        assert error.status == 400
        assert error.param is None or isinstance(error.param, str)
        json.dumps(error.envelope())
        return
    params = request.params
    assert 0 <= params.temperature <= 2 and 0 < params.top_p <= 1 and params.top_k >= 0
    assert params.max_tokens is None or params.max_tokens >= 1
    assert all(isinstance(s, str) and s for s in params.stop)
    TO_RUNNER.encode(Generate(request_id="r", prompt=request.prompt, params=params))
    renderer = request.format.renderer(request.model)
    json.dumps([e.data for e in renderer.opening()])


def fields(params: type) -> list[str]:
    return sorted({*typing.get_type_hints(params), "foo", "top_k", "stream"})


text_part = st.fixed_dictionaries(
    {"type": st.sampled_from(["input_text", "output_text", "text", "input_image", 3])},
    optional={"text": mostly(st.text(max_size=3), field_values)},
)
item = st.fixed_dictionaries(
    {
        "role": mostly(st.sampled_from(["user", "assistant", "system", "developer"]), field_values),
        "content": mostly(st.text(max_size=4) | st.lists(text_part, max_size=2), field_values),
    },
    optional={"type": st.sampled_from(["message", "function_call", None])},
)
RESPONSE_FIELDS = fields(response_create_params.ResponseCreateParamsBase)
near_valid_response = st.builds(
    lambda input_, extra: {"model": "m", "input": input_, **extra},
    mostly(st.text(max_size=4) | st.lists(item, min_size=1, max_size=2), field_values),
    st.dictionaries(st.sampled_from(RESPONSE_FIELDS), field_values, max_size=3),
)

MESSAGE_FIELDS = fields(message_create_params.MessageCreateParamsBase)
COUNT_FIELDS = fields(message_count_tokens_params.MessageCountTokensParams)
turn = st.fixed_dictionaries(
    {
        "role": mostly(st.sampled_from(["user", "assistant"]), field_values),
        "content": mostly(st.text(max_size=4) | st.lists(text_part, max_size=2), field_values),
    }
)


def near_valid_messages(names: list[str]) -> st.SearchStrategy[dict[str, object]]:
    return st.builds(
        lambda messages, extra: {"model": "m", "max_tokens": 4, "messages": messages, **extra},
        mostly(st.lists(turn, min_size=1, max_size=2), field_values),
        st.dictionaries(st.sampled_from(names), field_values, max_size=3),
    )


@FAST
@given(body=json_values)
def test_arbitrary_json_only_raises_api_error(body: object) -> None:
    check(parse_responses, body)
    check(parse_messages, body)
    check(parse_count_tokens, body)


@FAST
@given(body=near_valid_response)
def test_near_valid_responses_only_raise_api_error(body: object) -> None:
    check(parse_responses, body)


@FAST
@given(body=near_valid_messages(MESSAGE_FIELDS))
def test_near_valid_messages_only_raise_api_error(body: object) -> None:
    check(parse_messages, body)


@FAST
@given(body=near_valid_messages(COUNT_FIELDS))
def test_near_valid_count_tokens_only_raise_api_error(body: object) -> None:
    check(parse_count_tokens, body)

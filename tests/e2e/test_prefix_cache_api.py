"""The runner's prefix cache as an OpenAI client sees it: a chat's next turn reports the prompt
tokens it reused in ``usage.prompt_tokens_details.cached_tokens``, and answers as it would
without them."""

from __future__ import annotations

import openai
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam

from skulk.harness import NodeProcess

MODEL = "skulk-demo"
SYSTEM: ChatCompletionMessageParam = {
    "role": "system",
    "content": "You answer briefly and kindly, in one line. " * 6,
}


def ask(client: openai.OpenAI, messages: list[ChatCompletionMessageParam]) -> ChatCompletion:
    return client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=10, temperature=0, seed=3
    )


def test_a_chats_next_turn_reports_its_cached_prompt_tokens(server: NodeProcess) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    first_turn: list[ChatCompletionMessageParam] = [
        SYSTEM,
        {"role": "user", "content": "hello there, fox"},
    ]
    first = ask(client, first_turn)
    answer = first.choices[0].message.content or ""
    second_turn: list[ChatCompletionMessageParam] = [
        *first_turn,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "and then?"},
    ]
    second = ask(client, second_turn)
    again = ask(client, second_turn)
    assert first.usage is not None and second.usage is not None and again.usage is not None
    details = second.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens is not None
    assert first.usage.prompt_tokens <= details.cached_tokens < second.usage.prompt_tokens
    repeated = again.usage.prompt_tokens_details
    assert repeated is not None and repeated.cached_tokens == again.usage.prompt_tokens - 1
    assert again.choices[0].message.content == second.choices[0].message.content

"""``n`` > 1 choices on a real server, through the official ``openai`` client.

Seeded, so every assertion is exact: choice ``i`` of a request seeded with ``s`` is the
generation an ``n: 1`` request seeded with ``choice_seed(s, i)`` gives (choice 0: ``s``
itself), streamed or not, and the same request gives the same choices again.
"""

from __future__ import annotations

from collections import defaultdict

import openai
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam

from skulk.api._choices import choice_seed
from skulk.harness import NodeProcess

MODEL = "skulk-demo"
SEED = 11
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me a story"}]


def client(server: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_chat_choices_are_seeded_generations_reproducible_and_counted(
    server: NodeProcess,
) -> None:
    c = client(server)

    def ask(n: int, seed: int) -> ChatCompletion:
        return c.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=12, temperature=1.0, seed=seed, n=n
        )

    reply = ask(3, SEED)
    assert [ch.index for ch in reply.choices] == [0, 1, 2]
    texts = [ch.message.content for ch in reply.choices]
    assert len(set(texts)) > 1  # each choice draws with its own seed
    again = ask(3, SEED)
    assert [ch.message.content for ch in again.choices] == texts  # reproducible
    singles = [ask(1, choice_seed(SEED, i)) for i in range(3)]
    assert texts == [s.choices[0].message.content for s in singles]
    assert [ch.finish_reason for ch in reply.choices] == [
        s.choices[0].finish_reason for s in singles
    ]
    usages = [s.usage for s in singles]
    assert reply.usage is not None and all(u is not None for u in usages)
    # The prompt counted once, the completions summed.
    assert reply.usage.prompt_tokens == singles[0].usage.prompt_tokens  # type: ignore[union-attr]
    completions = [u.completion_tokens for u in usages if u is not None]
    assert reply.usage.completion_tokens == sum(completions)


def test_streamed_chat_choices_interleave_with_their_indexes(server: NodeProcess) -> None:
    c = client(server)
    whole = c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, seed=SEED, n=3)
    chunks = list(
        c.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=12,
            seed=SEED,
            n=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    usage_chunks = [ch for ch in chunks if ch.usage is not None]
    assert len(usage_chunks) == 1 and usage_chunks[0] is chunks[-1] and chunks[-1].choices == []
    assert chunks[-1].usage == whole.usage
    roles: dict[int, int] = defaultdict(int)
    texts: dict[int, str] = defaultdict(str)
    finishes: dict[int, list[str | None]] = defaultdict(list)
    for chunk in chunks[:-1]:
        [choice] = chunk.choices
        roles[choice.index] += choice.delta.role == "assistant"
        texts[choice.index] += choice.delta.content or ""
        finishes[choice.index].append(choice.finish_reason)
    assert dict(roles) == {0: 1, 1: 1, 2: 1}
    assert [texts[i] for i in range(3)] == [ch.message.content for ch in whole.choices]
    for i in range(3):
        assert finishes[i][-1] == whole.choices[i].finish_reason
        assert all(f is None for f in finishes[i][:-1])


def test_completion_choices_plain_and_streamed(server: NodeProcess) -> None:
    c = client(server)
    reply = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, seed=3, n=2)
    assert [ch.index for ch in reply.choices] == [0, 1]
    single = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, seed=3)
    assert reply.choices[0].text == single.choices[0].text  # choice 0 uses the seed as given
    texts: dict[int, str] = defaultdict(str)
    for chunk in c.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=8, seed=3, n=2, stream=True
    ):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert [texts[0], texts[1]] == [ch.text for ch in reply.choices]


def test_too_many_choices_is_a_400_naming_n(server: NodeProcess) -> None:
    try:
        client(server).chat.completions.create(model=MODEL, messages=MESSAGES, n=9)
    except openai.BadRequestError as exc:
        assert (exc.status_code, exc.param, exc.code) == (400, "n", "invalid_value")
    else:
        raise AssertionError("n=9 was accepted")

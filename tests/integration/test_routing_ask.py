"""One-answer requests over the remote hop (rpc ``route.ask``): a token count and embeddings
served on node B for node A, over real loopback links (B's instance is a fake service)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing

import pytest
import trio

from skulk.routing import Admission, Overloaded, RemoteUnavailable
from skulk.wire.runner import EmbedInput, GenerationEnd, Prompt, TextPrompt, TokenIds, Usage
from skulk.worker import Embedding, ModelUnavailable, RequestFailure

from .test_routing_remote import FakeService, pair


class AskingService(FakeService):
    """A fake service that also counts and embeds; ``failure`` fails both."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0
        self.gate: trio.Event | None = None

    async def count_tokens(self, prompt: Prompt) -> int:
        self.asked += 1
        if self.failure is not None:
            raise self.failure
        assert isinstance(prompt, TextPrompt)
        return len(prompt.text)

    async def embed(self, inputs: tuple[EmbedInput, ...], truncate: bool = False) -> Embedding:
        self.asked += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.failure is not None:
            raise self.failure
        vectors = tuple((float(i), 1.0 if truncate else 0.0) for i, _ in enumerate(inputs))
        return Embedding(vectors, len(inputs))


async def test_count_and_embed_are_answered_by_the_serving_node() -> None:
    async with pair() as p:
        service = AskingService()
        p.services["i1"] = service
        assert await p.at_a.count_tokens("node-b", "i1", TextPrompt("hello")) == 5
        inputs: tuple[EmbedInput, ...] = (TextPrompt("a"), TokenIds((1, 2)))
        done = await p.at_a.embed("node-b", "i1", inputs, truncate=True)
        assert done == Embedding(((0.0, 1.0), (1.0, 1.0)), 2)
        assert service.asked == 2
        assert sum(p.admission.statistics().in_flight.values()) == 0


async def test_failures_arrive_typed() -> None:
    async with pair() as p:
        service = AskingService()
        p.services["i1"] = service
        service.failure = RequestFailure("prompt_too_long", "too long")
        with pytest.raises(RequestFailure) as failed:
            await p.at_a.embed("node-b", "i1", (TextPrompt("a"),), truncate=False)
        assert failed.value.reason == "prompt_too_long"
        service.failure = ModelUnavailable(service.status())
        with pytest.raises(RemoteUnavailable):
            await p.at_a.count_tokens("node-b", "i1", TextPrompt("a"))
        with pytest.raises(RemoteUnavailable):  # no such instance on B
            await p.at_a.count_tokens("node-b", "i9", TextPrompt("a"))


async def test_the_serving_nodes_admission_bound_applies() -> None:
    async with pair(admission=Admission(max_in_flight=1)) as p:
        service = AskingService()
        service.gate = trio.Event()
        p.services["i1"] = service
        async with trio.open_nursery() as nursery:
            nursery.start_soon(p.at_a.embed, "node-b", "i1", (TextPrompt("a"),), False)
            with trio.fail_after(5):
                while service.asked == 0:  # noqa: ASYNC110 - polling with a deadline
                    await trio.sleep(0.01)
            with pytest.raises(Overloaded):
                await p.at_a.count_tokens("node-b", "i1", TextPrompt("b"))
            service.gate.set()


class StoppingService(FakeService):
    async def generate(
        self, prompt: object, params: object
    ) -> AsyncGenerator[str | GenerationEnd, None]:
        yield "Hello"
        yield GenerationEnd("stop", Usage(1, 1), stop_sequence="END")


async def test_the_stop_sequence_crosses_the_hop() -> None:
    async with pair() as p:
        p.services["i1"] = StoppingService()
        async with aclosing(p.generate()) as items:
            got = [item async for item in items]
        assert got == ["Hello", GenerationEnd("stop", Usage(1, 1), stop_sequence="END")]

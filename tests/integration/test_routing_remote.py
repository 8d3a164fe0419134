"""The remote hop of any-node routing over real loopback links: node A (the API side) serves a
request on an instance whose rank 0 runs on node B, each a :class:`RemoteRouting` over its
own mesh, in one Trio run. B's instance is a fake service (no runner processes)."""

from __future__ import annotations

import random
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from typing import Any, cast

import attrs
import pytest
import trio

from skulk.federation import (
    DataReceiver,
    DataSender,
    Mesh,
    RpcFailed,
    StreamStopped,
)
from skulk.routing import (
    ASK_METHOD,
    ROUTE_METHOD,
    Admission,
    NodeUnreachable,
    Overloaded,
    RemoteRouting,
    RemoteUnavailable,
    RouteTimeouts,
)
from skulk.tracing import current_request_id, request_scope
from skulk.wire import Codec
from skulk.wire.routing import RouteDelta, RouteHeader, RouteItem, RouteRequest
from skulk.wire.runner import GenerationEnd, SamplingParams, TextPrompt, Usage
from skulk.worker import ModelService, ModelStatus, ModelUnavailable, RequestFailure
from tests._doubles import LINK_CONFIG as CONFIG
from tests._doubles import SECRET

#: Long enough that none fires by accident on a loaded machine: a test that wants one to fire
#: shortens it. ``idle`` especially: a lost link must be noticed without it.
TIMEOUTS = RouteTimeouts(admit=10.0, header=10.0, send=30.0, keepalive=2.0, idle=60.0)
WITHIN = 5.0  # seconds for what should happen promptly
PROMPT = TextPrompt("hello")
PARAMS = SamplingParams(max_tokens=8)
ITEMS: Codec[RouteItem] = Codec(RouteItem)
REQUESTS: Codec[RouteRequest] = Codec(RouteRequest)


class FakeService:
    """A ModelService stand-in: yields ``texts``, then ``hold`` (an event to wait for) if
    set, then ``failure`` (raised) or a GenerationEnd; counts starts and finished generators."""

    def __init__(self, texts: list[str] | None = None) -> None:
        self.state = "ready"
        self.texts = texts if texts is not None else ["Hello world"]
        self.hold: trio.Event | None = None
        self.pause = 0.0
        self.failure: Exception | None = None
        self.started = 0
        self.closed = 0
        self.aborted = 0  # generators closed before their end (cancelled, or closed)
        self.ended = trio.Event()  # a generator's finally ran
        self.request_ids: list[str | None] = []  # the API request each generation ran under

    def status(self) -> ModelStatus:
        return ModelStatus("m", self.state)  # type: ignore[arg-type]

    async def generate(
        self, prompt: object, params: object
    ) -> AsyncGenerator[str | GenerationEnd, None]:
        self.started += 1
        self.request_ids.append(current_request_id())
        try:
            if self.failure is not None and isinstance(self.failure, ModelUnavailable):
                raise self.failure
            await trio.sleep(self.pause)  # a prefill that takes a while
            for text in self.texts:
                yield text
            if self.hold is not None:
                await self.hold.wait()
            if self.failure is not None:
                raise self.failure
            yield GenerationEnd("stop", Usage(1, len(self.texts)))
        except (trio.Cancelled, GeneratorExit):
            self.aborted += 1
            raise
        finally:
            self.closed += 1
            self.ended.set()


@attrs.define
class Pair:
    a: Mesh
    b: Mesh
    at_a: RemoteRouting
    at_b: RemoteRouting
    admission: Admission  # B's
    services: dict[str, FakeService]  # B's instances
    stop_b_mesh: trio.CancelScope
    stop_b_routing: trio.CancelScope

    def generate(self, instance: str = "i1") -> AsyncGenerator[str | GenerationEnd, None]:
        return self.at_a.generate("node-b", instance, PROMPT, PARAMS)

    def b_stream_to_a(self) -> DataSender:
        link = self.b.link("node-a")
        assert link is not None
        return link.open_stream()


@asynccontextmanager
async def pair(
    *,
    timeouts: RouteTimeouts = TIMEOUTS,
    admission: Admission | None = None,
    b_rpc: Callable[[str, bytes], Any] | None = None,
) -> AsyncIterator[Pair]:
    """Nodes A and B, linked, each with its RemoteRouting; B runs instance ``i1``. ``b_rpc``
    replaces B's rpc handler (a misbehaving serving node)."""
    services = {"i1": FakeService()}
    admission = admission or Admission()
    routings: dict[str, RemoteRouting] = {}

    def node(node_id: str, join: list[str], rpc: Callable[[str, bytes], Any] | None) -> Mesh:
        async def default_rpc(method: str, body: bytes) -> bytes:
            assert method in (ROUTE_METHOD, ASK_METHOD)
            return await routings[node_id].handle_rpc(method, body)

        async def streams(peer: str, receiver: DataReceiver) -> None:
            await routings[node_id].handle_stream(peer, receiver)

        return Mesh(
            node_id,
            SECRET,
            listen=("127.0.0.1", 0),
            join=join,
            link_config=CONFIG,
            rpc_handler=rpc or default_rpc,
            stream_handler=streams,
            rng=random.Random(node_id),
        )

    async with trio.open_nursery() as nursery:
        b = node("node-b", [], b_rpc)
        lookup = cast(Callable[[str], ModelService | None], services.get)
        routings["node-b"] = RemoteRouting(b, lookup, admission, timeouts=timeouts)
        stop_b_mesh, stop_b_routing = trio.CancelScope(), trio.CancelScope()
        host, port = await nursery.start(_under, stop_b_mesh, b.run)
        await nursery.start(_under, stop_b_routing, routings["node-b"].run)
        a = node("node-a", [f"ws://{host}:{port}"], None)
        routings["node-a"] = RemoteRouting(a, lambda i: None, Admission(), timeouts=timeouts)
        await nursery.start(a.run)
        await nursery.start(routings["node-a"].run)
        await until(lambda: a.link("node-b") is not None and b.link("node-a") is not None)
        yield Pair(
            a,
            b,
            routings["node-a"],
            routings["node-b"],
            admission,
            services,
            stop_b_mesh,
            stop_b_routing,
        )
        nursery.cancel_scope.cancel()


async def _under(
    scope: trio.CancelScope, run: Callable[..., Any], *, task_status: trio.TaskStatus[Any]
) -> None:
    with scope:
        await run(task_status=task_status)


async def collect(items: AsyncGenerator[str | GenerationEnd, None]) -> list[str | GenerationEnd]:
    async with aclosing(items):
        return [item async for item in items]


async def until(predicate: Callable[[], bool], within: float = WITHIN) -> None:
    with trio.fail_after(within):
        while not predicate():  # noqa: ASYNC110 - polling with a deadline, on purpose
            await trio.sleep(0.01)


async def sends_until_stopped(sender: DataSender) -> None:
    with trio.fail_after(WITHIN), pytest.raises(StreamStopped):
        while True:
            await sender.send(ITEMS.encode(RouteDelta("x")))
            await trio.sleep(0.01)


def no_leaks(p: Pair) -> bool:
    """Nothing left behind on either side: places, waiting requests, streams."""
    link_a, link_b = p.a.link("node-b"), p.b.link("node-a")
    return (
        p.admission.statistics().in_flight == {}
        and p.at_a.statistics().waiting == 0
        and p.at_b.statistics().serving == 0
        and (link_a is None or link_a.statistics().streams_in == 0)
        and (link_b is None or link_b.statistics().streams_out == 0)
    )


# ---- the answer arrives -------------------------------------------------------------------


async def test_every_delta_and_the_end_arrive_in_order() -> None:
    async with pair() as p:
        texts = [f"t{i} " for i in range(200)]  # many times the stream's initial credit
        p.services["i1"].texts = texts
        with trio.fail_after(WITHIN):
            got = await collect(p.generate())
        *deltas, last = got
        assert all(isinstance(d, str) for d in deltas)
        assert "".join(cast(list[str], deltas)) == "".join(texts)
        assert last == GenerationEnd("stop", Usage(1, 200))
        assert p.services["i1"].closed == 1
        await until(lambda: no_leaks(p))
        assert p.at_b.statistics().served == 1
        assert p.admission.statistics().admitted == 1


async def test_a_runner_failure_arrives_typed_after_the_deltas_before_it() -> None:
    async with pair() as p:
        p.services["i1"].texts = ["partial"]
        p.services["i1"].failure = RequestFailure("runner_crashed", "the runner died")
        got: list[str | GenerationEnd] = []
        with trio.fail_after(WITHIN), pytest.raises(RequestFailure) as info:
            async with aclosing(p.generate()) as items:
                async for item in items:
                    got.append(item)
        assert got == ["partial"]
        assert type(info.value) is RequestFailure  # the runner's, not a routing failure
        assert (info.value.reason, info.value.message) == ("runner_crashed", "the runner died")
        await until(lambda: no_leaks(p))


async def test_an_instance_that_is_not_ready_is_refused_typed() -> None:
    async with pair() as p:
        p.services["i1"].state = "loading"
        with trio.fail_after(WITHIN), pytest.raises(RemoteUnavailable) as info:
            await collect(p.generate())
        assert info.value.node == "node-b" and info.value.instance == "i1"
        assert "loading" in info.value.message
        assert p.services["i1"].started == 0
        assert p.at_b.statistics().refused == 1


async def test_an_instance_that_stopped_being_ready_after_admission_is_unavailable() -> None:
    async with pair() as p:
        p.services["i1"].failure = ModelUnavailable(ModelStatus("m", "restarting"))
        with trio.fail_after(WITHIN), pytest.raises(RemoteUnavailable) as info:
            await collect(p.generate())
        assert "restarting" in info.value.message
        await until(lambda: no_leaks(p))


async def test_an_instance_not_on_the_node_is_unavailable() -> None:
    async with pair() as p:
        with trio.fail_after(WITHIN), pytest.raises(RemoteUnavailable, match="does not run"):
            await collect(p.generate("elsewhere"))


async def test_beyond_the_admission_bound_the_request_is_overloaded_with_retry_after() -> None:
    async with pair(admission=Admission(max_in_flight=1, retry_after=2.5)) as p:
        service = p.services["i1"]
        service.hold = trio.Event()
        async with aclosing(p.generate()) as first:
            with trio.fail_after(WITHIN):
                assert await anext(first) == "Hello world"
            with trio.fail_after(WITHIN), pytest.raises(Overloaded) as info:
                await collect(p.generate())
            assert info.value.retry_after == 2.5 and info.value.instance == "i1"
            assert service.started == 1  # refused before it reached the service
            service.hold.set()
            with trio.fail_after(WITHIN):
                assert (await collect(first))[-1] == GenerationEnd("stop", Usage(1, 1))
        await until(lambda: no_leaks(p))
        with trio.fail_after(WITHIN):  # the place was given back
            assert (await collect(p.generate()))[-1] == GenerationEnd("stop", Usage(1, 1))
        assert p.admission.statistics().refused == 1


# ---- cancellation and loss ----------------------------------------------------------------


async def test_closing_the_client_generator_cancels_the_remote_generation() -> None:
    # While the service is silent, B notices the stop with its next keepalive.
    async with pair(timeouts=attrs.evolve(TIMEOUTS, keepalive=0.2)) as p:
        service = p.services["i1"]
        service.hold = trio.Event()  # never set: generates until cancelled
        items = p.generate()
        with trio.fail_after(WITHIN):
            assert await anext(items) == "Hello world"
        await items.aclose()  # the client disconnected
        with trio.fail_after(WITHIN):
            await service.ended.wait()
        assert service.aborted == 1
        await until(lambda: no_leaks(p))
        assert p.at_b.statistics().abandoned == 1


async def test_a_link_closed_mid_stream_ends_the_request_typed_and_cancels_it() -> None:
    async with pair() as p:
        service = p.services["i1"]
        service.hold = trio.Event()
        async with aclosing(p.generate()) as items:
            with trio.fail_after(WITHIN):
                assert await anext(items) == "Hello world"
            link = p.a.link("node-b")
            assert link is not None
            link.close()
            with trio.fail_after(WITHIN), pytest.raises(NodeUnreachable) as info:
                while True:
                    await anext(items)
        assert info.value.reason == "node_unreachable" and info.value.node == "node-b"
        with trio.fail_after(WITHIN):  # B saw its link close and cancelled the generation
            await service.ended.wait()
        assert service.aborted == 1


async def test_a_serving_node_that_stops_ends_the_request_typed_promptly() -> None:
    async with pair() as p:
        p.services["i1"].hold = trio.Event()
        async with aclosing(p.generate()) as items:
            with trio.fail_after(WITHIN):
                assert await anext(items) == "Hello world"
            p.stop_b_mesh.cancel()  # B's links close (far sooner than TIMEOUTS.idle)
            with trio.fail_after(WITHIN), pytest.raises(NodeUnreachable):
                while True:
                    await anext(items)


async def test_routing_stopping_on_the_serving_node_tells_the_caller() -> None:
    async with pair() as p:
        service = p.services["i1"]
        service.hold = trio.Event()
        async with aclosing(p.generate()) as items:
            with trio.fail_after(WITHIN):
                assert await anext(items) == "Hello world"
            p.stop_b_routing.cancel()  # B shuts down its routing; its links stay up
            with trio.fail_after(WITHIN), pytest.raises(RequestFailure) as info:
                while True:
                    await anext(items)
        assert info.value.reason == "runner_stopped"
        assert service.aborted == 1


async def test_no_link_to_the_node_is_unreachable_at_once() -> None:
    async with pair() as p:
        with trio.fail_after(WITHIN), pytest.raises(NodeUnreachable, match="no link"):
            await collect(p.at_a.generate("node-z", "i1", PROMPT, PARAMS))


# ---- deadlines ----------------------------------------------------------------------------


async def test_keepalives_carry_a_long_silence_past_the_idle_deadline() -> None:
    timeouts = attrs.evolve(TIMEOUTS, keepalive=0.1, idle=0.5)
    async with pair(timeouts=timeouts) as p:
        p.services["i1"].pause = 1.5  # three idle deadlines without a delta
        with trio.fail_after(WITHIN):
            got = await collect(p.generate())
        assert got[-1] == GenerationEnd("stop", Usage(1, 1))


async def test_a_stalled_receiver_is_given_up_after_the_send_deadline() -> None:
    timeouts = attrs.evolve(TIMEOUTS, send=0.5, keepalive=0.2, idle=1.0)
    async with pair(timeouts=timeouts) as p:
        service = p.services["i1"]
        service.texts = [f"{i} " for i in range(2000)]  # far more than the stream's credit
        async with aclosing(p.generate()) as items:
            with trio.fail_after(WITHIN):
                first = await anext(items)
                assert isinstance(first, str) and first.startswith("0 ")
                await service.ended.wait()  # the client stalled: B cancelled the generation
            assert service.aborted == 1
            await until(lambda: p.at_b.statistics().abandoned == 1)
            with trio.fail_after(WITHIN), pytest.raises(NodeUnreachable, match="nothing on"):
                while True:  # what arrived is delivered, then the idle deadline ends it
                    await anext(items)
        await until(lambda: no_leaks(p))


async def test_a_node_that_never_answers_the_rpc_is_unreachable_after_admit() -> None:
    async def silent(method: str, body: bytes) -> bytes:
        await trio.sleep_forever()
        raise AssertionError

    async with pair(timeouts=attrs.evolve(TIMEOUTS, admit=0.3), b_rpc=silent) as p:
        with trio.fail_after(WITHIN), pytest.raises(NodeUnreachable, match="no answer"):
            await collect(p.generate())
        assert p.at_a.statistics().waiting == 0


async def test_an_admitted_request_whose_stream_never_opens_is_unreachable() -> None:
    async def admit_only(method: str, body: bytes) -> bytes:
        await trio.lowlevel.checkpoint()
        return b"admitted"

    async with pair(timeouts=attrs.evolve(TIMEOUTS, admit=0.3), b_rpc=admit_only) as p:
        with trio.fail_after(WITHIN), pytest.raises(NodeUnreachable, match="did not open"):
            await collect(p.generate())


async def test_a_stream_that_goes_silent_after_its_header_ends_at_the_idle_deadline() -> None:
    p_box: list[Pair] = []

    async def admit_then_silence(method: str, body: bytes) -> bytes:
        """A serving node that admits, sends the header, then nothing (no keepalives)."""
        request = REQUESTS.decode(body)
        await p_box[0].b_stream_to_a().send(ITEMS.encode(RouteHeader(request.request_id)))
        return b"admitted"

    timeouts = attrs.evolve(TIMEOUTS, keepalive=0.1, idle=0.5)
    async with pair(timeouts=timeouts, b_rpc=admit_then_silence) as p:
        p_box.append(p)
        with trio.fail_after(WITHIN), pytest.raises(NodeUnreachable, match="nothing on"):
            await collect(p.generate())
        await until(lambda: no_leaks(p))


# ---- what a peer may send -----------------------------------------------------------------


async def test_a_garbage_rpc_body_is_a_bad_request() -> None:
    async with pair() as p:
        link = p.a.link("node-b")
        assert link is not None
        with trio.fail_after(WITHIN), pytest.raises(RpcFailed) as info:
            await link.call(ROUTE_METHOD, b"\xa1atgarbage", timeout=WITHIN)
        assert info.value.reason == "bad_request"
        assert p.at_b.statistics().refused == 1 and p.at_b.statistics().served == 0


async def test_the_api_requests_id_travels_to_the_serving_node() -> None:
    async with pair() as p:
        with request_scope("client-7"):
            await collect(p.generate())
        await collect(p.generate())  # outside an API request: nothing to carry
        assert p.services["i1"].request_ids == ["client-7", None]


@pytest.mark.parametrize("trace_id", ["x" * 129, "two words", "", "nl\n"])
async def test_a_malformed_trace_id_is_a_bad_request(trace_id: str) -> None:
    async with pair() as p:
        link = p.a.link("node-b")
        assert link is not None
        ask = RouteRequest("r1", "i1", PROMPT, PARAMS, trace_id)
        with trio.fail_after(WITHIN), pytest.raises(RpcFailed) as info:
            await link.call(ROUTE_METHOD, Codec(RouteRequest).encode(ask), timeout=WITHIN)
        assert info.value.reason == "bad_request" and "request id" in info.value.message
        assert p.services["i1"].started == 0


@pytest.mark.parametrize(
    "first_chunk",
    [
        ITEMS.encode(RouteHeader("no-such-request")),
        ITEMS.encode(RouteDelta("not a header")),
        b"\xff\x00 not cbor",
        b"",
    ],
    ids=["unknown request", "not a header", "garbage", "empty"],
)
async def test_a_stream_without_a_header_naming_an_awaited_request_is_closed(
    first_chunk: bytes,
) -> None:
    async with pair() as p:
        sender = p.b_stream_to_a()
        await sender.send(first_chunk)
        await sends_until_stopped(sender)
        assert p.at_a.statistics().streams_refused == 1
        await until(lambda: no_leaks(p))

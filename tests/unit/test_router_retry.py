"""A request the chosen instance refuses before any output moves to the next ready instance:
at most once per instance, within ``retry_within`` of its arrival, never after output."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

import pytest
import trio
import trio.testing

from skulk.api._stream import routing_error
from skulk.cluster import State, apply
from skulk.metrics import NodeMetrics
from skulk.routing import (
    Admission,
    NodeUnreachable,
    NoReadyInstance,
    Overloaded,
    RemoteUnavailable,
    Route,
    Router,
    Served,
)
from skulk.tracing import RequestJournal, node_scope, request_scope
from skulk.wire.cluster import (
    Applied,
    Architecture,
    ClusterCommand,
    ModelCard,
    PathSource,
    PlaceInstance,
    RegisterModel,
    ReportRunner,
    Shard,
    UpsertNode,
)
from skulk.wire.runner import GenerationEnd, SamplingParams, TextPrompt, Usage
from skulk.worker import Embedding, ModelStatus, ModelUnavailable, RequestFailure

CARD = ModelCard("m", PathSource("/m"), Architecture("llama", 2, 8, 2, 2, 10), 1, 64)
PROMPT = TextPrompt("hello")
PARAMS = SamplingParams(max_tokens=2)


def run(state: State, *commands: ClusterCommand) -> State:
    for command in commands:
        state, result = apply(state, command)
        assert result == Applied(), result
    return state


def cluster(*placed: tuple[str, str]) -> State:
    """Nodes me, b, c up; an instance of m on each (instance, node) given, reported ready."""
    state = run(State(), *(UpsertNode(n, n, n, 0) for n in ("me", "b", "c")), RegisterModel(CARD))
    for instance, node in placed:
        state = run(state, PlaceInstance(instance, "m", "single", (Shard(0, node, 0, 2),), 0),
                    ReportRunner(instance, 0, node, "ready", None, 1))  # fmt: skip
    return state


Behaviour = Exception | tuple[str, Exception] | None
"""How a fake instance answers: fail at once, yield one delta then fail, or serve."""


async def behave(behaviour: Behaviour) -> AsyncGenerator[str | GenerationEnd, None]:
    if isinstance(behaviour, Exception):
        raise behaviour
    if isinstance(behaviour, tuple):
        yield behaviour[0]
        raise behaviour[1]
    yield "hi"
    yield GenerationEnd("stop", Usage(1, 1))


async def slow_refusal() -> AsyncGenerator[str | GenerationEnd, None]:
    await trio.sleep(20)
    raise NodeUnreachable("b", "nothing on its answer stream for 20 s")
    yield ""  # pragma: no cover


class Local:
    """A ready local service answering as told; ``calls`` counts its requests, and ``log``
    (when given) gets ``name`` for each."""

    def __init__(
        self, behaviour: Behaviour = None, name: str = "", log: list[str] | None = None
    ) -> None:
        self.behaviour = behaviour
        self.ready = True
        self.calls = 0
        self.name = name
        self.log = log

    def status(self) -> ModelStatus:
        return ModelStatus("m", "ready" if self.ready else "loading")

    def generate(self, prompt: object, params: object) -> AsyncGenerator[str | GenerationEnd]:
        self.calls += 1
        if self.log is not None:
            self.log.append(self.name)
        return behave(self.behaviour)


class Remote:
    """The remote hop, answering per instance as told; ``calls`` lists the instances asked
    (one-answer requests: a :class:`Behaviour` exception fails them, else they answer)."""

    def __init__(self, slow: bool = False, **behaviours: Behaviour) -> None:
        self.behaviours = behaviours
        self.slow = slow  # every instance refuses after 20 s: past RETRY_WITHIN (15 s)
        self.calls: list[str] = []

    def generate(
        self, node: str, instance: str, prompt: object, params: object
    ) -> AsyncGenerator[str | GenerationEnd]:
        self.calls.append(instance)
        return slow_refusal() if self.slow else behave(self.behaviours.get(instance))

    async def count_tokens(self, node: str, instance: str, prompt: object) -> int:
        self.calls.append(instance)
        if isinstance(failure := self.behaviours.get(instance), Exception):
            raise failure
        return 7

    async def embed(self, node: str, instance: str, inputs: object, truncate: bool) -> Embedding:
        self.calls.append(instance)
        if isinstance(failure := self.behaviours.get(instance), Exception):
            raise failure
        return Embedding(((1.0,),), 1)


def router(
    state: State, local: dict[str, Local] | None = None, remote: Remote | None = None, **kw: Any
) -> Router:
    return Router(
        "me",
        lambda: state,
        lambda i: (local or {}).get(i),  # type: ignore[arg-type,return-value]
        lambda node: True,
        remote or Remote(),  # type: ignore[arg-type]
        Admission(),
        metrics=NodeMetrics(),
        **kw,
    )


async def collect(r: Router, route: Route, served: Served | None = None) -> list[object]:
    got: list[object] = []
    async with aclosing(r.generate(route, PROMPT, PARAMS, served)) as items:
        async for item in items:
            got.append(item)
    return got


def sample(r: Router, name: str, **labels: str) -> float:
    value = r.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


@pytest.mark.parametrize(
    "refusal",
    [
        Overloaded("ib", 1.0),
        NodeUnreachable("b", "no link to it"),
        RemoteUnavailable("b", "ib", "instance ib is loading"),
        RequestFailure("kv_cache_full", "the KV queue is full"),
        RequestFailure("runner_stopped", "the runner was stopped"),
    ],
    ids=lambda e: type(e).__name__ + getattr(e, "reason", ""),
)
async def test_a_refusal_before_output_moves_the_request_to_the_next_instance(
    refusal: Exception,
) -> None:
    remote = Remote(ib=refusal)
    r = router(cluster(("ib", "b"), ("ic", "c")), remote=remote)
    first = Route("m", "ib", "b", False, "affinity")
    served = Served(first)
    got = await collect(r, first, served)
    assert got == ["hi", GenerationEnd("stop", Usage(1, 1))]  # once: nothing duplicated
    assert remote.calls == ["ib", "ic"]
    assert served.instance == "ic" and served.node == "c"
    reason = getattr(refusal, "reason", None) or {
        Overloaded: "overloaded", RemoteUnavailable: "not_ready"
    }[type(refusal)]  # fmt: skip
    assert sample(r, "skulk:route_moves_total", model="m", instance="ib", reason=reason) == 1
    # The request counts once, on the instance that served it.
    ok = {"model": "m", "route": "remote", "finish_reason": "stop"}
    assert sample(r, "skulk:request_success_total", instance="ic", **ok) == 1
    assert sample(r, "skulk:request_success_total", instance="ib", **ok) == 0
    assert r._in_flight == {}


async def test_a_local_runner_restarting_moves_the_request_to_a_remote_instance() -> None:
    restarting = Local(ModelUnavailable(ModelStatus("m", "loading")))
    remote = Remote()
    r = router(cluster(("ime", "me"), ("ib", "b")), {"ime": restarting}, remote)
    route = r.route("m")
    assert route.instance == "ime"  # no prompt: local first
    assert len(await collect(r, route)) == 2
    assert restarting.calls == 1 and remote.calls == ["ib"]


async def test_a_failure_after_output_started_is_never_retried() -> None:
    remote = Remote(ib=("partial", NodeUnreachable("b", "the link closed")))
    r = router(cluster(("ib", "b"), ("ic", "c")), remote=remote)
    got: list[object] = []
    with pytest.raises(NodeUnreachable):
        async with aclosing(r.generate(Route("m", "ib", "b", False), PROMPT, PARAMS)) as items:
            async for item in items:
                got.append(item)
    assert got == ["partial"] and remote.calls == ["ib"]


async def test_each_instance_is_tried_at_most_once_and_the_last_failure_is_raised() -> None:
    failures = {
        "ime": Overloaded("ime"),
        "ib": Overloaded("ib"),
        "ic": NodeUnreachable("c", "gone"),
    }
    remote = Remote(ib=failures["ib"], ic=failures["ic"])
    local = Local(failures["ime"], "ime", remote.calls)
    r = router(cluster(("ime", "me"), ("ib", "b"), ("ic", "c")), {"ime": local}, remote)
    with pytest.raises(Exception) as raised:
        await collect(r, Route("m", "ib", "b", False))
    assert sorted(remote.calls) == ["ib", "ic", "ime"] and remote.calls[0] == "ib"
    last = remote.calls[-1]
    assert raised.value is failures[last]
    errors = r.metrics.registry.get_sample_value
    counted = [
        (i, w)
        for i in failures
        for w in ("local", "remote")
        for reason in ("overloaded", "node_unreachable")
        if errors(
            "skulk:request_errors_total",
            {"model": "m", "instance": i, "route": w, "reason": reason},
        )
    ]
    assert counted == [(last, "local" if last == "ime" else "remote")]  # the request, once
    assert r._in_flight == {}


async def test_a_failure_the_request_may_cause_is_not_retried() -> None:
    for failure in (
        RequestFailure("runner_crashed", "the runner died"),
        RequestFailure("prompt_too_long", "too long"),
    ):
        remote = Remote(ib=failure)
        r = router(cluster(("ib", "b"), ("ic", "c")), remote=remote)
        with pytest.raises(RequestFailure) as raised:
            await collect(r, Route("m", "ib", "b", False))
        assert raised.value is failure and remote.calls == ["ib"]


async def test_only_instances_ready_now_are_tried() -> None:
    remote = Remote(ib=Overloaded("ib"))
    state = cluster(("ib", "b"), ("ic", "c"))
    state = run(state, ReportRunner("ic", 0, "c", "loading", None, 2))
    r = router(state, remote=remote)
    with pytest.raises(Overloaded):
        await collect(r, Route("m", "ib", "b", False))
    assert remote.calls == ["ib"]


async def test_no_move_once_the_retry_window_has_passed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    remote = Remote(slow=True)
    r = router(cluster(("ib", "b"), ("ic", "c")), remote=remote)
    with pytest.raises(NodeUnreachable):
        await collect(r, Route("m", "ib", "b", False))
    assert remote.calls == ["ib"]
    r = router(cluster(("ib", "b"), ("ic", "c")), remote=remote, retry_within=30.0)
    remote.calls.clear()
    with pytest.raises(NodeUnreachable):  # moved once, refused slowly there too
        await collect(r, Route("m", "ib", "b", False))
    assert remote.calls == ["ib", "ic"]


async def test_a_move_is_noted_in_the_request_timeline() -> None:
    remote = Remote(ib=Overloaded("ib"))
    r = router(cluster(("ib", "b"), ("ic", "c")), remote=remote)
    journal = RequestJournal()
    with node_scope("me", journal), request_scope("moved", received="POST /v1/completions"):
        await collect(r, Route("m", "ib", "b", False))
    events = journal.events("moved")
    assert [e.kind for e in events] == [
        "request.received",
        "request.routed",
        "request.moved",
        "request.routed",
        "request.done",
    ]
    assert "ib" in events[1].detail and "ib" in events[2].detail and "ic" in events[3].detail
    assert "overloaded" in events[2].detail and events[-1].instance == "ic"


async def test_token_counts_and_embeddings_move_too() -> None:
    remote = Remote(ib=Overloaded("ib"))
    r = router(cluster(("ib", "b"), ("ic", "c")), remote=remote)
    served = Served(Route("m", "ib", "b", False))
    assert await r.count_tokens(served.route, PROMPT, served) == 7
    assert remote.calls == ["ib", "ic"] and served.instance == "ic"
    remote.calls.clear()
    served = Served(Route("m", "ib", "b", False))
    assert (await r.embed(served.route, (), False, served)).prompt_tokens == 1
    assert remote.calls == ["ib", "ic"] and served.instance == "ic"
    assert sample(r, "skulk:route_moves_total", model="m", instance="ib", reason="overloaded") == 2
    # Not moved: a failure the request causes, and the last instance's refusal.
    remote = Remote(ib=RequestFailure("prompt_too_long", "too long"))
    r = router(cluster(("ib", "b"), ("ic", "c")), remote=remote)
    with pytest.raises(RequestFailure):
        await r.count_tokens(Route("m", "ib", "b", False), PROMPT)
    assert remote.calls == ["ib"]
    remote = Remote(ib=Overloaded("ib"), ic=Overloaded("ic"))
    r = router(cluster(("ib", "b"), ("ic", "c")), remote=remote)
    with pytest.raises(Overloaded):
        await r.embed(Route("m", "ib", "b", False), ())
    assert remote.calls == ["ib", "ic"] and r._in_flight == {}


async def test_a_remote_instance_the_state_shows_loading_is_asked_when_none_is_ready() -> None:
    """A runner's ready phase reaches this node's State a commit after its own node sees it
    (a repro run asked through a third node in that window and got 503): with no instance
    ready here, the serving node is asked, and its word is final."""
    state = cluster(("ib", "b"))
    state = run(state, ReportRunner("ib", 0, "b", "loading", None, 2))
    remote = Remote()
    r = router(state, remote=remote)
    route = r.route("m", PROMPT)
    assert (route.instance, route.node, route.local) == ("ib", "b", False)
    assert await collect(r, route) == ["hi", GenerationEnd("stop", Usage(1, 1))]
    # Not started there yet: the client gets the 503 it got before the node was asked.
    still = RemoteUnavailable("b", "ib", "instance ib does not run here")
    remote = Remote(ib=still)
    r = router(state, remote=remote)
    with pytest.raises(NoReadyInstance) as raised:
        await collect(r, r.route("m", PROMPT))
    assert raised.value.states == {"ib": "loading"} and raised.value.__cause__ is still
    assert remote.calls == ["ib"]
    assert routing_error(raised.value).code == "model_not_ready"
    with pytest.raises(NoReadyInstance):  # a one-answer request the same
        await r.count_tokens(r.route("m", PROMPT), PROMPT)
    assert remote.calls == ["ib", "ib"]


async def test_ready_beats_a_loading_hint_and_local_or_failed_ones_are_never_asked() -> None:
    state = cluster(("ib", "b"), ("ic", "c"))
    state = run(state, ReportRunner("ib", 0, "b", "loading", None, 2))
    assert router(state).route("m", PROMPT).instance == "ic"  # ready beats a loading hint
    state = run(state, ReportRunner("ic", 0, "c", "failed", "crash_loop", 2))
    assert router(state).route("m", PROMPT).instance == "ib"  # failed: never asked
    state = cluster()  # this node's own loading runner: its view is final, nothing to ask
    state = run(state, PlaceInstance("ime", "m", "single", (Shard(0, "me", 0, 2),), 0))
    loading = Local()
    loading.ready = False
    with pytest.raises(NoReadyInstance) as none:
        router(state, {"ime": loading}).route("m", PROMPT)
    assert none.value.states == {"ime": "loading"} and loading.calls == 0

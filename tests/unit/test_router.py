"""The router's choice: a ready instance, local first, else the fewest requests in flight from
this node, then the lower gossiped load; typed failures when nothing can serve."""

from __future__ import annotations

from contextlib import aclosing
from typing import Any

import pytest

from skulk.api._stream import routing_error
from skulk.cluster import State, apply
from skulk.routing import Admission, ModelNotPlaced, NoReadyInstance, Router
from skulk.tracing import RequestJournal, node_scope, request_scope
from skulk.wire.cluster import (
    Applied,
    Architecture,
    ClusterCommand,
    ModelCard,
    NodeStatusChanged,
    PathSource,
    PlaceInstance,
    RegisterModel,
    ReportRunner,
    Shard,
    UpsertNode,
)
from skulk.wire.runner import GenerationEnd, SamplingParams, TextPrompt, Usage
from skulk.worker import ModelStatus

CARD = ModelCard("m", PathSource("/m"), Architecture("llama", 2, 8, 2, 2, 10), 1, 64)


def run(state: State, *commands: ClusterCommand) -> State:
    for command in commands:
        state, result = apply(state, command)
        assert result == Applied(), result
    return state


class Local:
    def __init__(self, state: str) -> None:
        self.state = state

    def status(self) -> ModelStatus:
        return ModelStatus("m", self.state)  # type: ignore[arg-type]


def cluster() -> State:
    """Nodes me, b, c up; m placed as ib on b and ic on c, both reported ready."""
    state = run(State(), *(UpsertNode(n, n, n, 0) for n in ("me", "b", "c")), RegisterModel(CARD))
    for node in ("b", "c"):
        state = run(state, PlaceInstance(f"i{node}", "m", "single", (Shard(0, node, 0, 2),), 0),
                    ReportRunner(f"i{node}", 0, node, "ready", None, 1))  # fmt: skip
    return state


def router(state: State, local: dict[str, Any] | None = None, **load: float) -> Router:
    return Router(
        "me",
        lambda: state,
        lambda i: (local or {}).get(i),
        lambda node: True,
        None,  # type: ignore[arg-type]  # route() never goes remote
        Admission(),
        load=lambda node: load.get(node, 0.0),
    )


def test_a_ready_local_instance_wins_and_a_loading_one_does_not() -> None:
    state = run(cluster(), PlaceInstance("ime", "m", "single", (Shard(0, "me", 0, 2),), 0))
    assert router(state, {"ime": Local("ready")}).route("m").instance == "ime"
    assert router(state, {"ime": Local("loading")}).route("m").node in ("b", "c")


def test_remote_choice_follows_in_flight_then_load_then_id() -> None:
    state = cluster()
    assert router(state).route("m").instance == "ib"
    assert router(state, b=2.0, c=0.5).route("m").instance == "ic"
    r = router(state)
    r._in_flight["ib"] = 1  # one request of ours runs there already
    assert r.route("m").instance == "ic"


def test_unreachable_or_down_nodes_are_not_chosen_and_failures_are_typed() -> None:
    state = run(cluster(), NodeStatusChanged("b", "down", 2))
    assert router(state).route("m").instance == "ic"
    state = run(state, NodeStatusChanged("c", "down", 2))
    with pytest.raises(NoReadyInstance) as none:
        router(state).route("m")
    assert none.value.states == {"ib": "unreachable", "ic": "unreachable"}
    with pytest.raises(ModelNotPlaced) as unknown:
        router(state).route("other")
    assert not unknown.value.registered
    bare = run(State(), RegisterModel(CARD))
    with pytest.raises(ModelNotPlaced) as placed_nowhere:
        router(bare).route("m")
    assert placed_nowhere.value.registered
    assert unknown.value.loaded  # a State that knows this node: the model is unknown


def test_a_state_still_loading_never_calls_a_model_unknown() -> None:
    """Before this node's State includes this node (restarted, joining, Raft storage not open
    yet: a chaos run saw two such 404s for a model the cluster had), a model missing from it may
    exist: 503 state_loading with Retry-After, never 404."""
    with pytest.raises(ModelNotPlaced) as loading:
        router(State()).route("m")
    assert not loading.value.registered and not loading.value.loaded
    err = routing_error(loading.value)
    assert (err.status, err.code, err.headers) == (503, "state_loading", {"Retry-After": "1"})
    with pytest.raises(ModelNotPlaced) as unknown:
        router(cluster()).route("other")
    assert routing_error(unknown.value).status == 404


class Serving(Local):
    """A ready local service generating one delta, then the end, or failing."""

    def __init__(self, failure: Exception | None = None) -> None:
        super().__init__("ready")
        self.failure = failure

    async def generate(self, prompt: object, params: object) -> Any:
        if self.failure is not None:
            raise self.failure
        yield "hi"
        yield GenerationEnd("stop", Usage(1, 1))


async def test_a_traced_request_notes_where_it_went_and_how_it_ended() -> None:
    state = run(cluster(), PlaceInstance("ime", "m", "single", (Shard(0, "me", 0, 2),), 0))
    journal = RequestJournal()
    with node_scope("me", journal):
        for rid, service in (("ok", Serving()), ("bad", Serving(RuntimeError("boom")))):
            r = router(state, {"ime": service})
            with request_scope(rid, received="POST /v1/chat/completions"):
                items = r.generate(r.route("m"), TextPrompt("x"), SamplingParams(max_tokens=1))
                async with aclosing(items):
                    try:
                        async for item in items:
                            if isinstance(item, GenerationEnd):
                                break  # the API closes the generator at the end
                    except RuntimeError:
                        pass
    kinds = {rid: [e.kind for e in journal.events(rid)] for rid in ("ok", "bad")}
    assert kinds["ok"] == ["request.received", "request.routed", "request.admitted", "request.done"]
    assert kinds["bad"][-1] == "request.error" and "boom" in journal.events("bad")[-1].detail
    assert {e.instance for e in journal.events()} == {"ime"}

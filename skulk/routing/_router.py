"""Any-node routing: which instance serves a request for a model, and serving it there.

The API asks :meth:`Router.route` for a model and the request's prompt: the router orders the
*ready* instances from the cluster State (when none is, the instances on other nodes the State
shows loading: their ready phase reaches this node a commit after their own node sees it, so
that node is asked) by prefix affinity with a balance bound
(:mod:`skulk.routing._policy`: rendezvous hashing of the prompt's head, so a conversation
asked through any node lands on the instance whose prefix cache holds it, unless that instance
has more than ``affinity_slack`` more of this node's requests in flight than the least loaded
one). Without a prompt (token counting, embeddings) it picks the least loaded: a local one
first (served in-process, no network hop), else the one this node has the fewest requests in
flight to (ties: the lower gossiped load, then instance id). :meth:`Router.generate` serves the
request there: locally through the admission bound and the instance's
:class:`~skulk.worker.ModelService`, remotely through :class:`RemoteRouting` (rpc admission,
then a credit-controlled data stream back; never through the leader, never in the log).

A generation the chosen instance refuses *before any output* (429, ``kv_cache_full``, not
ready — a runner restarting —, ``node_unreachable``, ``runner_stopped``) moves to the next
ready instance in the same order: each instance is tried at most once, and a move starts only
within ``retry_within`` seconds of the request's arrival. Once output has started nothing is
retried, so nothing reaches the client twice. Token counts and embeddings (one answer, no
partial output) move the same way. A :class:`Served` record, when given, follows the move
(the API's ``x-skulk-instance``).

Every generation the router serves, and every request it cannot route, is observed in the
node's :class:`~skulk.metrics.NodeMetrics` (``route``: ``local`` or ``remote``), here where
the request was received, so each request counts once in the cluster (on the instance that
served it last), with how its instance was chosen and each move.

Failures are typed: :class:`ModelNotPlaced` (no instance of the model anywhere; 404 when the
model is unknown, 503 when it is registered or when this node's State is still loading),
:class:`NoReadyInstance` (instances exist, none is ready: 503 with their states; also when
the serving node of an instance this node's State shows loading confirms it), and what
serving raises (``Overloaded`` → 429 with
``Retry-After``, ``RequestFailure``/``ModelUnavailable`` as for a local runner): the last
instance's failure when every move was spent.
"""

from __future__ import annotations

import collections
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from typing import TypeVar

import attrs
import trio

from skulk.cluster import Instance, State
from skulk.metrics import NodeMetrics
from skulk.tracing import note, serving
from skulk.wire.cluster import ModelCard
from skulk.wire.runner import EmbedInput, GenerationEnd, Prompt, SamplingParams
from skulk.worker import Embedding, ModelService, ModelUnavailable, RequestFailure

from ._admission import Admission
from ._errors import Overloaded, RemoteUnavailable
from ._policy import AFFINITY_SLACK, RETRY_WITHIN, choose, prefix_key, retry_reason
from ._remote import RemoteRouting

T = TypeVar("T")


class ModelNotPlaced(Exception):
    """No instance of ``model`` exists; ``registered``: its card is in the State; ``loaded``:
    this node's State includes this node. Until it does, the State is still loading (the node
    restarted or is joining, or its Raft storage has not opened yet) and cannot tell a model the
    cluster does not have from one it has not heard of yet."""

    def __init__(self, model: str, registered: bool, loaded: bool = True) -> None:
        if registered:
            why = "has no instance in the cluster"
        elif loaded:
            why = "is not in the cluster"
        else:
            why = "is not known here yet: this node is still loading the cluster's State"
        super().__init__(f"model {model!r} {why}")
        self.model = model
        self.registered = registered
        self.loaded = loaded


class NoReadyInstance(Exception):
    """Instances of ``model`` exist but none can serve now; ``states`` says what each is."""

    def __init__(self, model: str, states: dict[str, str]) -> None:
        listed = ", ".join(f"{i} {s}" for i, s in sorted(states.items()))
        super().__init__(f"model {model} is not ready: {listed}")
        self.model = model
        self.states = states


@attrs.frozen
class Route:
    """Where one request runs: ``instance``'s rank 0 on ``node`` (``local``: this node);
    ``how`` it was chosen (``affinity``, ``override``, ``least_loaded`` or ``only``: see
    :mod:`skulk.routing._policy`)."""

    model: str
    instance: str
    node: str
    local: bool
    how: str = "only"


@attrs.define
class Served:
    """Where a request is served: its :class:`Route`, moved by :meth:`Router.generate` when
    the first instance refused it before any output."""

    route: Route

    @property
    def instance(self) -> str:
        return self.route.instance

    @property
    def node(self) -> str:
        return self.route.node


@attrs.frozen
class ModelListing:
    """A model with at least one instance: ``status`` is ``ready`` if any instance is,
    else the best of theirs (``loading``, then ``failed``)."""

    id: str
    status: str
    instances: tuple[str, ...]
    failure: str | None


class Router:
    """See the module doc. ``state()`` is the applied cluster State; ``local(instance)`` the
    service running an instance's rank 0 here (or None); ``linked(node)``: a live link;
    ``load(node)``: the node's gossiped load (1-minute load average; 0 when unknown);
    ``metrics``: where requests are observed (a registry of its own when not given);
    ``affinity_slack``: the balance bound; ``prefix_affinity=False`` routes every request to
    the least loaded instance (the policy before prefix affinity, for comparison);
    ``retry_within``: how long after its arrival a refused request may still move (seconds)."""

    def __init__(
        self,
        node_id: str,
        state: Callable[[], State],
        local: Callable[[str], ModelService | None],
        linked: Callable[[str], bool],
        remote: RemoteRouting,
        admission: Admission,
        load: Callable[[str], float] = lambda node: 0.0,
        metrics: NodeMetrics | None = None,
        *,
        affinity_slack: int = AFFINITY_SLACK,
        prefix_affinity: bool = True,
        retry_within: float = RETRY_WITHIN,
    ) -> None:
        if isinstance(affinity_slack, bool) or affinity_slack < 0:
            raise ValueError(f"affinity_slack must be >= 0, not {affinity_slack!r}")
        if not retry_within >= 0:
            raise ValueError(f"retry_within must be >= 0, not {retry_within!r}")
        self.node_id = node_id
        self._state = state
        self._local = local
        self._linked = linked
        self._remote = remote
        self._admission = admission
        self._load = load
        self._in_flight: collections.Counter[str] = collections.Counter()
        self.metrics = metrics if metrics is not None else NodeMetrics()
        self.affinity_slack = affinity_slack
        self.prefix_affinity = prefix_affinity
        self.retry_within = retry_within

    def instance_state(self, state: State, instance: Instance) -> str:
        """``ready``, ``loading``, ``failed`` or ``unreachable`` as this node sees it."""
        rank0 = instance.shards[0]
        if rank0.node == self.node_id:
            service = self._local(instance.id)
            if service is None:
                return "loading"
            s = service.status()
            return "ready" if s.ready else ("failed" if s.state == "failed" else "loading")
        node = state.node(rank0.node)
        if node is None or node.status != "up" or not self._linked(rank0.node):
            return "unreachable"
        if instance.status == "failed":
            return "failed"
        runner = next((r for r in state.runners if r.instance == instance.id and r.rank == 0), None)
        phase = runner.phase if runner is not None else "pending"
        return {"ready": "ready", "failed": "failed"}.get(phase, "loading")

    def models(self) -> list[ModelListing]:
        """Every model with an instance anywhere in the cluster, by id."""
        state = self._state()
        by_model: dict[str, list[tuple[Instance, str]]] = {}
        for instance in state.instances:
            by_model.setdefault(instance.model, []).append(
                (instance, self.instance_state(state, instance))
            )
        listings = []
        for model, pairs in sorted(by_model.items()):
            states = [s for _, s in pairs]
            status = next(
                (s for s in ("ready", "loading", "unreachable", "failed") if s in states),
                "failed",
            )
            failure = next(
                (
                    r.failure
                    for i, _ in pairs
                    for r in state.runners
                    if r.instance == i.id and r.failure is not None
                ),
                None,
            )
            listings.append(ModelListing(model, status, tuple(i.id for i, _ in pairs), failure))
        return listings

    def card(self, model: str) -> ModelCard | None:
        """The card the cluster registered for ``model`` (architecture, sizes), if any."""
        return self._state().model(model)

    def route(self, model: str, prompt: Prompt | None = None) -> Route:
        """The instance to serve ``model`` now, for ``prompt`` when given (see the module
        doc)."""
        state = self._state()
        instances, states = self._of_model(state, model)
        if not instances:
            registered = state.model(model) is not None
            loaded = state.node(self.node_id) is not None
            # An unknown name is not a label value: clients choose it (unbounded series).
            reason = (
                "no_instance" if registered else "model_not_found" if loaded else "state_loading"
            )
            self.metrics.requests.refused(model if registered else "", "", "none", reason)
            raise ModelNotPlaced(model, registered=registered, loaded=loaded)
        servable = self._servable(instances, states)
        if not servable:
            self.metrics.requests.refused(model, "", "none", "not_ready")
            raise NoReadyInstance(model, states)
        route = self._choose(model, servable, prompt)
        assert route is not None
        return route

    def _of_model(self, state: State, model: str) -> tuple[list[Instance], dict[str, str]]:
        """``model``'s instances in ``state``, and each one's :meth:`instance_state`."""
        instances = [i for i in state.instances if i.model == model]
        return instances, {i.id: self.instance_state(state, i) for i in instances}

    def _servable(self, instances: list[Instance], states: dict[str, str]) -> list[Instance]:
        """The ``instances`` a request may go to: the ready ones; when none is, those whose
        rank 0 is on another node and that the State shows ``loading``. A runner's ready phase
        reaches this node's State a commit after its own node saw it (proposed, replicated,
        applied here): in that window the serving node, whose word is final, is asked, and a
        runner still loading there refuses at once (``not_ready``, a 503 as before)."""
        ready = [i for i in instances if states[i.id] == "ready"]
        if ready:
            return ready
        return [
            i for i in instances if states[i.id] == "loading" and i.shards[0].node != self.node_id
        ]

    def _choose(
        self,
        model: str,
        ready: list[Instance],
        prompt: Prompt | None,
        tried: frozenset[str] = frozenset(),
    ) -> Route | None:
        """The first of the ``ready`` instances not ``tried`` in the policy's order."""
        nodes = {i.id: i.shards[0].node for i in ready if i.id not in tried}
        if not nodes:
            return None
        key = prefix_key(prompt) if self.prefix_affinity else None
        choice = choose(
            key,
            list(nodes),
            lambda i: self._in_flight[i],
            lambda i: (nodes[i] != self.node_id, self._load(nodes[i])),
            self.affinity_slack,
        )
        best = choice.order[0]
        node = nodes[best]
        return Route(model, best, node, node == self.node_id, choice.how)

    def _next(self, route: Route, prompt: Prompt | None, tried: frozenset[str]) -> Route | None:
        """Where a request refused by ``tried`` instances goes next: the next servable one
        (see :meth:`_servable`) in the same order, as the State stands now."""
        instances, states = self._of_model(self._state(), route.model)
        return self._choose(route.model, self._servable(instances, states), prompt, tried)

    async def generate(
        self,
        route: Route,
        prompt: Prompt,
        params: SamplingParams,
        served: Served | None = None,
    ) -> AsyncGenerator[str | GenerationEnd, None]:
        """Serve one request on ``route``: text deltas, then one :class:`GenerationEnd`.
        Refused before any output, it moves to the next ready instance (see the module doc;
        ``served`` follows it).

        Under a request (:func:`skulk.tracing.request_scope`) it notes where the request went
        (``request.routed``, ``request.admitted`` for a local instance, ``request.moved`` for
        each move) and how it ended here (``request.done``, ``request.error``)."""
        requests = self.metrics.requests
        observed = requests.start(route.model, route.instance, _where(route))
        requests.chosen(route.model, route.instance, route.how)
        arrived = trio.current_time()
        tried: set[str] = set()
        output = False
        try:
            while True:
                tried.add(route.instance)
                try:
                    async with aclosing(self._attempt(route, prompt, params)) as items:
                        async for item in items:
                            output = True
                            observed.item(item)
                            yield item
                    return
                except Exception as exc:
                    following = None if output else self._move(route, prompt, exc, arrived, tried)
                    if following is None:
                        if (refusal := self._still_not_ready(route.model, exc)) is not None:
                            raise refusal from exc
                        raise
                    route = following
                    observed.instance, observed.route = route.instance, _where(route)
                    if served is not None:
                        served.route = route
        except BaseException as exc:
            observed.failed(failure_reason(exc))
            if isinstance(exc, Exception):
                note("request.error", f"{type(exc).__name__}: {str(exc)[:200]}")
            raise

    def _move(
        self,
        route: Route,
        prompt: Prompt | None,
        exc: Exception,
        arrived: float,
        tried: set[str],
    ) -> Route | None:
        """Where a request ``route``'s instance refused with ``exc`` before any output goes
        next (counted and noted), or ``None`` when it must not move (see the module doc)."""
        why = "not_ready" if isinstance(exc, NoReadyInstance) else retry_reason(exc)
        if why is None or trio.current_time() - arrived > self.retry_within:
            return None
        following = self._next(route, prompt, frozenset(tried))
        if following is None:
            return None
        self.metrics.requests.moved(route.model, route.instance, why)
        note("request.moved", f"instance {route.instance} refused ({why})")
        return following

    async def _attempt(
        self, route: Route, prompt: Prompt, params: SamplingParams
    ) -> AsyncGenerator[str | GenerationEnd, None]:
        """One instance's try at the request (see :meth:`generate`)."""
        self._in_flight[route.instance] += 1
        serving(route.instance, route.model)
        where = "this node" if route.local else f"node {route.node}"
        note("request.routed", f"instance {route.instance} on {where}")
        try:
            if route.local:
                service = self._service(route)
                with self._admission.admit(route.instance):
                    note("request.admitted", f"instance {route.instance}")
                    async with aclosing(service.generate(prompt, params)) as items:
                        async for item in items:
                            if isinstance(item, GenerationEnd):
                                note("request.done", item.finish_reason)
                            yield item
            else:
                async with aclosing(
                    self._remote.generate(route.node, route.instance, prompt, params)
                ) as items:
                    async for item in items:
                        if isinstance(item, GenerationEnd):  # noted now: the consumer may
                            note("request.done", item.finish_reason)  # close us at the end
                        yield item
        finally:
            self._done(route)

    async def count_tokens(self, route: Route, prompt: Prompt, served: Served | None = None) -> int:
        """How many tokens ``prompt`` is for ``route``'s model, counted where it is served
        (nothing decoded). Refused, it moves as a generation does (``served`` follows it);
        raises as :meth:`generate` does before any output."""

        async def count(at: Route) -> int:
            if at.local:
                service = self._service(at)
                with self._admission.admit(at.instance):
                    return await service.count_tokens(prompt)
            return await self._remote.count_tokens(at.node, at.instance, prompt)

        return await self._answer(route, prompt, count, served)

    async def embed(
        self,
        route: Route,
        inputs: tuple[EmbedInput, ...],
        truncate: bool = False,
        served: Served | None = None,
    ) -> Embedding:
        """``inputs`` embedded by ``route``'s instance (see :mod:`skulk.engine._embed`);
        refused, the request moves as a generation does (``served`` follows it)."""

        async def embed(at: Route) -> Embedding:
            if at.local:
                service = self._service(at)
                with self._admission.admit(at.instance):
                    return await service.embed(inputs, truncate)
            return await self._remote.embed(at.node, at.instance, inputs, truncate)

        return await self._answer(route, None, embed, served)

    async def _answer(
        self,
        route: Route,
        prompt: Prompt | None,
        ask: Callable[[Route], Awaitable[T]],
        served: Served | None,
    ) -> T:
        """``ask(route)``'s one answer, moved to the next instance when refused."""
        arrived = trio.current_time()
        tried: set[str] = set()
        while True:
            tried.add(route.instance)
            self._in_flight[route.instance] += 1
            try:
                return await ask(route)
            except Exception as exc:
                following = self._move(route, prompt, exc, arrived, tried)
                if following is None:
                    if (refusal := self._still_not_ready(route.model, exc)) is not None:
                        raise refusal from exc
                    raise
            finally:
                self._done(route)
            route = following
            if served is not None:
                served.route = route

    def _still_not_ready(self, model: str, exc: Exception) -> NoReadyInstance | None:
        """A serving node's refusal (``exc``) as :class:`NoReadyInstance`, when this node's
        State still shows no instance of ``model`` ready: the node was asked because the State
        showed its instance loading (:meth:`_servable`), it said so too, and the client gets
        the answer it would have got without asking (each instance's state, not the serving
        node's word alone: "does not run here" for an instance its node has not started
        yet)."""
        if not isinstance(exc, RemoteUnavailable):
            return None
        _, states = self._of_model(self._state(), model)
        if not states or "ready" in states.values():
            return None
        return NoReadyInstance(model, states)

    def _service(self, route: Route) -> ModelService:
        service = self._local(route.instance)
        if service is None:
            raise NoReadyInstance(route.model, {route.instance: "stopped"})
        return service

    def _done(self, route: Route) -> None:
        self._in_flight[route.instance] -= 1
        if self._in_flight[route.instance] <= 0:
            del self._in_flight[route.instance]


def _where(route: Route) -> str:
    return "local" if route.local else "remote"


def failure_reason(exc: BaseException) -> str:
    """The typed reason a generation ended without its end, as the metrics count it:
    the runner's own reason, ``overloaded`` (429), ``not_ready``, ``abandoned`` (the
    consumer closed the generation before its end: a client that left a stream),
    ``cancelled`` (its task was cancelled: a client that left a whole response, the node
    stopping) or ``internal``."""
    if isinstance(exc, RequestFailure):
        return exc.reason
    if isinstance(exc, Overloaded):
        return "overloaded"
    if isinstance(exc, ModelUnavailable | RemoteUnavailable | NoReadyInstance):
        return "not_ready"
    if isinstance(exc, GeneratorExit):
        return "abandoned"
    if not isinstance(exc, Exception):  # trio.Cancelled (the node stops), KeyboardInterrupt
        return "cancelled"
    return "internal"

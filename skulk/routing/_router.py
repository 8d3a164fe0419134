"""Any-node routing: which instance serves a request for a model, and serving it there.

The API asks :meth:`Router.route` for a model: the router picks a *ready* instance from the
cluster State — a local one first (served in-process, no network hop), else the one this node
has the fewest requests in flight to (ties: the lower gossiped load, then instance id) — and
:meth:`Router.generate` serves the request there: locally through the admission bound and
the instance's :class:`~skulk.worker.ModelService`, remotely through :class:`RemoteRouting`
(rpc admission, then a credit-controlled data stream back; never through the leader, never in
the log).

Every generation the router serves, and every request it cannot route, is observed in the
node's :class:`~skulk.metrics.NodeMetrics` (``route``: ``local`` or ``remote``), here where
the request was received, so each request counts once in the cluster.

Failures are typed: :class:`ModelNotPlaced` (no instance of the model anywhere; 404 when the
model is unknown, 503 when it is registered), :class:`NoReadyInstance` (instances exist, none
is ready: 503 with their states), and what serving raises (``Overloaded`` → 429 with
``Retry-After``, ``RequestFailure``/``ModelUnavailable`` as for a local runner).
"""

from __future__ import annotations

import collections
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing

import attrs

from skulk.cluster import Instance, State
from skulk.metrics import NodeMetrics
from skulk.tracing import note, serving
from skulk.wire.cluster import ModelCard
from skulk.wire.runner import EmbedInput, GenerationEnd, Prompt, SamplingParams
from skulk.worker import Embedding, ModelService, ModelUnavailable, RequestFailure

from ._admission import Admission
from ._errors import Overloaded, RemoteUnavailable
from ._remote import RemoteRouting


class ModelNotPlaced(Exception):
    """No instance of ``model`` exists; ``registered``: its card is in the State."""

    def __init__(self, model: str, registered: bool) -> None:
        why = "has no instance in the cluster" if registered else "is not in the cluster"
        super().__init__(f"model {model!r} {why}")
        self.model = model
        self.registered = registered


class NoReadyInstance(Exception):
    """Instances of ``model`` exist but none can serve now; ``states`` says what each is."""

    def __init__(self, model: str, states: dict[str, str]) -> None:
        listed = ", ".join(f"{i} {s}" for i, s in sorted(states.items()))
        super().__init__(f"model {model} is not ready: {listed}")
        self.model = model
        self.states = states


@attrs.frozen
class Route:
    """Where one request runs: ``instance``'s rank 0 on ``node`` (``local``: this node)."""

    model: str
    instance: str
    node: str
    local: bool


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
    ``metrics``: where requests are observed (a registry of its own when not given)."""

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
    ) -> None:
        self.node_id = node_id
        self._state = state
        self._local = local
        self._linked = linked
        self._remote = remote
        self._admission = admission
        self._load = load
        self._in_flight: collections.Counter[str] = collections.Counter()
        self.metrics = metrics if metrics is not None else NodeMetrics()

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

    def route(self, model: str) -> Route:
        """The instance to serve ``model`` now (see the module doc)."""
        state = self._state()
        instances = [i for i in state.instances if i.model == model]
        if not instances:
            registered = state.model(model) is not None
            # An unknown name is not a label value: clients choose it (unbounded series).
            reason = "no_instance" if registered else "model_not_found"
            self.metrics.requests.refused(model if registered else "", "", "none", reason)
            raise ModelNotPlaced(model, registered=registered)
        states = {i.id: self.instance_state(state, i) for i in instances}
        ready = [i for i in instances if states[i.id] == "ready"]
        if not ready:
            self.metrics.requests.refused(model, "", "none", "not_ready")
            raise NoReadyInstance(model, states)
        local = [i for i in ready if i.shards[0].node == self.node_id]
        pool = local or ready
        best = min(pool, key=lambda i: (self._in_flight[i.id], self._load(i.shards[0].node), i.id))
        node = best.shards[0].node
        return Route(model, best.id, node, node == self.node_id)

    async def generate(
        self, route: Route, prompt: Prompt, params: SamplingParams
    ) -> AsyncGenerator[str | GenerationEnd, None]:
        """Serve one request on ``route``: text deltas, then one :class:`GenerationEnd`.

        Under a request (:func:`skulk.tracing.request_scope`) it notes where the request went
        (``request.routed``, ``request.admitted`` for a local instance) and how it ended here
        (``request.done``, ``request.error``)."""
        observed = self.metrics.requests.start(
            route.model, route.instance, "local" if route.local else "remote"
        )
        self._in_flight[route.instance] += 1
        serving(route.instance, route.model)
        where = "this node" if route.local else f"node {route.node}"
        note("request.routed", f"instance {route.instance} on {where}")
        try:
            if route.local:
                service = self._local(route.instance)
                if service is None:
                    raise NoReadyInstance(route.model, {route.instance: "stopped"})
                with self._admission.admit(route.instance):
                    note("request.admitted", f"instance {route.instance}")
                    async with aclosing(service.generate(prompt, params)) as items:
                        async for item in items:
                            observed.item(item)
                            if isinstance(item, GenerationEnd):
                                note("request.done", item.finish_reason)
                            yield item
            else:
                async with aclosing(
                    self._remote.generate(route.node, route.instance, prompt, params)
                ) as items:
                    async for item in items:
                        observed.item(item)
                        if isinstance(item, GenerationEnd):  # noted now: the consumer may
                            note("request.done", item.finish_reason)  # close us at the end
                        yield item
        except BaseException as exc:
            observed.failed(failure_reason(exc))
            if isinstance(exc, Exception):
                note("request.error", f"{type(exc).__name__}: {str(exc)[:200]}")
            raise
        finally:
            self._done(route)

    async def count_tokens(self, route: Route, prompt: Prompt) -> int:
        """How many tokens ``prompt`` is for ``route``'s model, counted where it is served
        (nothing decoded). Raises as :meth:`generate` does before any output."""
        self._in_flight[route.instance] += 1
        try:
            if route.local:
                with self._admission.admit(route.instance):
                    return await self._service(route).count_tokens(prompt)
            return await self._remote.count_tokens(route.node, route.instance, prompt)
        finally:
            self._done(route)

    async def embed(
        self, route: Route, inputs: tuple[EmbedInput, ...], truncate: bool = False
    ) -> Embedding:
        """``inputs`` embedded by ``route``'s instance (see :mod:`skulk.engine._embed`)."""
        self._in_flight[route.instance] += 1
        try:
            if route.local:
                with self._admission.admit(route.instance):
                    return await self._service(route).embed(inputs, truncate)
            return await self._remote.embed(route.node, route.instance, inputs, truncate)
        finally:
            self._done(route)

    def _service(self, route: Route) -> ModelService:
        service = self._local(route.instance)
        if service is None:
            raise NoReadyInstance(route.model, {route.instance: "stopped"})
        return service

    def _done(self, route: Route) -> None:
        self._in_flight[route.instance] -= 1
        if self._in_flight[route.instance] <= 0:
            del self._in_flight[route.instance]


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

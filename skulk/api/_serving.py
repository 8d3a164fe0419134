"""What every generating route family shares (HTTP side): reading the JSON body, routing a
request to an instance, starting its generation(s) and answering whole or as SSE.

:class:`Generations` is handed to each family's ``install_*`` function, so OpenAI, Anthropic,
Ollama and the WebSocket route a request, seed its choices and own its stream the same way.
"""

from __future__ import annotations

import attrs
import trio
from quart import Response, request
from quart_trio import QuartTrio

from skulk.api._choices import choice_count, choice_params, complete_choices, open_choices
from skulk.api._errors import ApiError
from skulk.api._guard import close_with_request
from skulk.api._http_errors import json_response
from skulk.api._json_body import LARGE_BODY, parse_json_body
from skulk.api._stream import (
    ROUTING_ERRORS,
    Items,
    Opened,
    Request,
    complete,
    open_stream,
    routing_error,
    sse_body,
)
from skulk.routing import Route, Router, Served

#: Content types whose bodies are read as JSON (besides ``…+json`` and none at all).
_READ_AS_JSON = frozenset({"application/json", "text/plain", "application/x-www-form-urlencoded"})


async def read_body() -> object:
    """The request's JSON body, checked by :func:`parse_json_body` (400 otherwise); 415 for a
    body declared as something JSON cannot be (a form upload, an image). No Content-Type,
    ``text/plain`` and ``application/x-www-form-urlencoded`` — what ``curl -d`` sends unless
    told otherwise — are read as JSON."""
    mimetype = request.mimetype
    if mimetype and mimetype not in _READ_AS_JSON and not mimetype.endswith("+json"):
        raise ApiError.unsupported_media_type(mimetype)
    raw = await request.get_data(as_text=False)
    if len(raw) >= LARGE_BODY:  # megabytes of JSON would stall every stream on the loop
        return await trio.to_thread.run_sync(parse_json_body, raw)
    return parse_json_body(raw)


def routed(response: Response, route: Route | Served) -> Response:
    """``response`` saying which instance and node served it (where the request ended up,
    once the router has moved it off an instance that refused it)."""
    response.headers["x-skulk-instance"] = route.instance
    response.headers["x-skulk-node"] = route.node
    return response


def sse_response(opened: Opened) -> Response:
    """The ``text/event-stream`` response of a committed stream."""
    response = Response(sse_body(opened), status=200, content_type="text/event-stream")
    response.headers["Cache-Control"] = "no-cache"
    response.timeout = None  # Quart's RESPONSE_TIMEOUT would cut long streams
    return response


@attrs.frozen
class Generations:
    """Starts requests' generations on the instances ``router`` picks, for ``app``."""

    app: QuartTrio
    router: Router

    def route(self, req: Request) -> Route:
        """The instance for ``req`` (its prompt's prefix decides among several);
        :class:`ApiError` when none can take it."""
        try:
            return self.router.route(req.model, req.prompt)
        except ROUTING_ERRORS as exc:
            raise routing_error(exc) from None

    def start(self, req: Request) -> tuple[Served, Items]:
        """Route ``req`` and make its generation (not started); :class:`ApiError` when no
        instance can take it. The :class:`Served` follows the request if it moves."""
        served = Served(self.route(req))
        return served, self.router.generate(served.route, req.prompt, req.params, served)

    def start_choices(self, req: Request) -> tuple[Served, list[Items]]:
        """Route ``req`` once and make the generation of each of its choices (not started),
        all on that instance (they batch on its runner), each with its own seed; a choice
        that instance refuses moves on its own (the :class:`Served` shows the last move)."""
        served = Served(self.route(req))
        params = choice_params(req.params, choice_count(req))
        return served, [self.router.generate(served.route, req.prompt, p, served) for p in params]

    async def answer(self, req: Request) -> Response:
        """Generate ``req`` and answer it: a whole JSON object, or an SSE stream."""
        if choice_count(req) > 1:
            return await self._answer_choices(req)
        route, items = self.start(req)
        if not req.stream:
            response = json_response(await complete(items, req), 200)
        else:
            # Commit to a stream only once the first token (or the end) is here: an earlier
            # failure is a plain error response. The request owns the generation from here on,
            # so it is cancelled on the runner even if the response body is never iterated.
            opened = await open_stream(items, req)
            close_with_request(opened.aclose)
            response = sse_response(opened)
        return routed(response, route)

    async def _answer_choices(self, req: Request) -> Response:
        """As :meth:`answer`, for a request with several choices (:mod:`skulk.api._choices`)."""
        route, choices = self.start_choices(req)
        if not req.stream:
            response = json_response(await complete_choices(choices, req), 200)
        else:
            # The choices run in tasks of the app's nursery, since the response body outlives
            # this handler; the request owns them, as a single generation above.
            opened = await open_choices(self.app.nursery, choices, req)
            close_with_request(opened.aclose)
            response = sse_response(opened)
        return routed(response, route)

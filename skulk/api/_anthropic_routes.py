"""Anthropic's routes: ``/v1/messages`` and ``/v1/messages/count_tokens`` (parsed by
:mod:`skulk.api._anthropic`, answered through :class:`~skulk.api._serving.Generations`)."""

from __future__ import annotations

from quart import Response
from quart_trio import QuartTrio

from skulk.api._anthropic import parse_count_tokens, parse_messages
from skulk.api._http_errors import json_response
from skulk.api._serving import Generations, read_body, routed
from skulk.api._stream import count_prompt_tokens
from skulk.routing import Router, Served


def install_anthropic_routes(app: QuartTrio, router: Router, generations: Generations) -> None:
    """Add Anthropic's Messages routes to ``app``."""

    @app.post("/v1/messages")
    async def messages() -> Response:
        # ``anthropic-version`` is accepted whatever its value: we serve one shape of the
        # Messages API (see docs/api.md).
        return await generations.answer(parse_messages(await read_body()))

    @app.post("/v1/messages/count_tokens")
    async def count_tokens() -> Response:
        req = parse_count_tokens(await read_body())
        served = Served(generations.route(req))
        count = await count_prompt_tokens(
            router.count_tokens(served.route, req.prompt, served), req
        )
        return routed(json_response({"input_tokens": count}, 200), served)

"""OpenAI's routes: ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions`` and
``/v1/responses`` (parsed by :mod:`skulk.api._openai_parse` and
:mod:`skulk.api._responses_parse`, answered through :class:`~skulk.api._serving.Generations`)."""

from __future__ import annotations

from quart import Response
from quart_trio import QuartTrio

from skulk.api._errors import ApiError
from skulk.api._http_errors import json_response
from skulk.api._openai_parse import parse_chat_completions, parse_completions
from skulk.api._responses_parse import parse_responses
from skulk.api._serving import Generations, read_body
from skulk.routing import ModelListing, Router


def install_openai_routes(app: QuartTrio, router: Router, generations: Generations) -> None:
    """Add OpenAI's model listing and generating routes to ``app``."""

    def model_card(listing: ModelListing) -> dict[str, object]:
        card: dict[str, object] = {
            "id": listing.id,
            "object": "model",
            "created": 0,
            "owned_by": "skulk",
            "status": listing.status,
            "instances": list(listing.instances),
        }
        if listing.failure:
            card["failure"] = listing.failure
        if (registered := router.card(listing.id)) is not None:
            # the length of its embeddings (/v1/embeddings): the model's hidden size
            card["embedding_dimensions"] = registered.architecture.hidden_size
        return card

    @app.get("/v1/models")
    async def models() -> Response:
        body = {"object": "list", "data": [model_card(m) for m in router.models()]}
        return json_response(body, 200)

    @app.get("/v1/models/<path:model_id>")
    async def model(model_id: str) -> Response:
        """One model card (``models.retrieve``); ids may contain slashes (``org/name``)."""
        found = next((m for m in router.models() if m.id == model_id), None)
        if found is None:
            raise ApiError.model_not_found(model_id)
        return json_response(model_card(found), 200)

    @app.post("/v1/chat/completions")
    async def chat_completions() -> Response:
        return await generations.answer(
            parse_chat_completions(await read_body()).generate_request()
        )

    @app.post("/v1/completions")
    async def completions() -> Response:
        return await generations.answer(parse_completions(await read_body()).generate_request())

    @app.post("/v1/responses")
    async def responses() -> Response:
        return await generations.answer(parse_responses(await read_body()))

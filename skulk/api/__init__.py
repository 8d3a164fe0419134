"""The HTTP API (Quart-Trio on Hypercorn): OpenAI-compatible routes and a WebSocket stream."""

from skulk.api._app import create_app

__all__ = ["create_app"]

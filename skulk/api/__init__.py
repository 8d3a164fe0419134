"""The HTTP API (Quart-Trio on Hypercorn): OpenAI-compatible routes and a WebSocket stream."""

from skulk.api._app import create_app
from skulk.api._auth import exposure_warning
from skulk.api._protocol_errors import envelope_hypercorn_errors

__all__ = ["create_app", "envelope_hypercorn_errors", "exposure_warning"]

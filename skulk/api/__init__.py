"""The HTTP API (Quart-Trio on Hypercorn): every client format, through the router, to any
model of the cluster.

Entry points: :func:`create_app` builds a node's app (each route family installs itself:
OpenAI Chat Completions, Completions and Responses, Anthropic Messages, Ollama, embeddings,
the ``/v1/ws`` WebSocket, health and diagnostics, the cluster routes, ``/openapi.json``);
:func:`envelope_hypercorn_errors` makes Hypercorn's own protocol errors the JSON envelope and
:func:`close_on_client_eof` closes a connection when its client has (not a keep-alive later);
:func:`exposure_warning` says when a node listens beyond loopback without API keys;
:func:`routing_families` and :func:`transfer_families` are the ``/metrics`` sources of the
parts the app does not hold.

Inside, the formats are sans-IO parsers and renderers sharing one field-check kit
(``_fields``), one error type (``_errors.ApiError``), SSE framing (``_sse``) and one
format-neutral stream driver (``_stream``).
"""

from skulk.api._app import create_app
from skulk.api._auth import exposure_warning
from skulk.api._hypercorn_eof import close_on_client_eof
from skulk.api._metric_sources import routing_families, transfer_families
from skulk.api._protocol_errors import envelope_hypercorn_errors

__all__ = [
    "close_on_client_eof",
    "create_app",
    "envelope_hypercorn_errors",
    "exposure_warning",
    "routing_families",
    "transfer_families",
]

"""Schemathesis against a real ``python -m skulk serve``: every operation of ``/openapi.json``,
valid and invalid requests generated from the document (the one the parsers' tables build), and
every answer checked — never a 5xx, a documented status, a documented content type, and a body
that matches the documented schema (the error envelope of the path's format included).

The node runs with an API key (the document's security schemes) and on its own: the run must
not change the cluster, so ``POST /v1/placements`` is sent as a dry run, the pulls name no Hub
id (they are refused before any Hub call) and the ``DELETE`` routes name ids no instance, node
or stored model has. Generated token limits are capped (and set where a
body leaves them out) so each generation is a few tokens. The run is bounded (a few examples
per operation, no coverage or stateful phase) and deterministic (derandomized hypothesis, a
fixed schemathesis seed): a failure reproduces with the same command.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from skulk.api._openapi import openapi_document
from skulk.harness import NodeProcess
from skulk.models import DEMO_MODEL_ID

pytestmark = pytest.mark.e2e

KEY = "openapi-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
#: Examples per operation: enough to reach each route's errors and answers, few enough that
#: the whole run stays well under a minute and a half on two shared cores.
EXAMPLES = 12
#: The most tokens any generated request may ask for.
MAX_TOKENS = 3
TOKEN_LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
#: Routes whose bodies carry a token limit (set when absent: "up to the context" is slow).
LIMITED = {
    "/v1/chat/completions": "max_tokens",
    "/v1/completions": "max_tokens",
    "/v1/responses": "max_output_tokens",
}

CONFIG = schemathesis.Config.from_dict(
    {
        "seed": 1,
        "generation": {"max-examples": EXAMPLES, "deterministic": True},
        "phases": {"coverage": {"enabled": False}, "stateful": {"enabled": False}},
    }
)
SCHEMA = schemathesis.openapi.from_dict(openapi_document(), config=CONFIG)
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
def node(skulk_home: Path) -> Iterator[NodeProcess]:
    with NodeProcess(skulk_home, "--api-key", KEY) as srv:
        srv.wait_for(lambda: _get(srv, "/health").status_code == 200, 120, "ready")
        yield srv


def _get(node: NodeProcess, path: str) -> httpx.Response:
    return node.get(path, headers=AUTH)


def test_the_node_serves_the_document_the_run_uses(node: NodeProcess) -> None:
    assert node.get("/openapi.json").status_code == 401  # behind the key, like every route
    served = _get(node, "/openapi.json")
    assert served.status_code == 200
    assert served.json() == openapi_document()


def _bounded(case: schemathesis.Case[Any]) -> None:
    """Make ``case`` cheap and harmless: the demo model, a few tokens, no cluster change."""
    path, method = case.operation.path, case.method.upper()
    if method == "DELETE" and isinstance(case.path_parameters, dict):
        for name, value in case.path_parameters.items():  # never an existing id
            case.path_parameters[name] = f"no-such-{value}"
    body = case.body
    if not isinstance(body, dict):
        return
    if isinstance(body.get("model"), str):
        body["model"] = DEMO_MODEL_ID
    if path in ("/v1/pulls", "/api/pull"):  # never a Hub id: no pull, no call to the Hub
        for name in ("model", "name"):
            if isinstance(body.get(name), str):
                body[name] = DEMO_MODEL_ID
        return
    if path == "/v1/placements":
        body["dry_run"] = True
        return
    for name in TOKEN_LIMITS:
        limit = body.get(name)
        if isinstance(limit, int) and not isinstance(limit, bool):
            body[name] = min(limit, MAX_TOKENS)
    if path in LIMITED and body.get(LIMITED[path]) is None:
        body[LIMITED[path]] = MAX_TOKENS
    if path in ("/api/chat", "/api/generate"):
        options = body.get("options")
        if options is None:
            body["options"] = options = {}
        if isinstance(options, dict):
            predict = options.get("num_predict")
            if not isinstance(predict, int) or isinstance(predict, bool) or predict < 1:
                predict = MAX_TOKENS
            options["num_predict"] = min(predict, MAX_TOKENS)


@SCHEMA.parametrize()
@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_every_answer_matches_the_document(case: schemathesis.Case[Any], node: NodeProcess) -> None:
    _bounded(case)
    response: Any = case.call(base_url=node.url, headers=AUTH, timeout=60)
    case.validate_response(response, checks=CHECKS)

"""Pulls as the API shows them, sans-IO: a pull's status as JSON, its typed failures as
:class:`ApiError`, and the body of ``POST /v1/pulls`` / ``POST /api/pull`` parsed.

What a route needs from the cluster is written as protocols (:class:`PullControl`,
:class:`PullStatusView`), met by :class:`skulk.control.ClusterControl` and its ``PullStatus``
and by the tests' fakes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Protocol

import attrs

from skulk.api._errors import SERVER, ApiError, clip
from skulk.api._fields import checked_body
from skulk.api._schema import Schema, honoured
from skulk.cluster import State
from skulk.hub import Gated, HubError, parse_hub_ref
from skulk.wire.telemetry import ModelTransfer


class PullStatusView(Protocol):
    """Where a pull stands (``skulk.control.PullStatus``): ``phase`` is ``checking``,
    ``downloading``, ``spreading`` or ``done``; ``done_bytes`` counts toward
    ``target_bytes``; ``transfers`` are (node, transfer of this model) from telemetry."""

    @property
    def model(self) -> str: ...
    @property
    def phase(self) -> str: ...
    @property
    def repo(self) -> str: ...
    @property
    def commit(self) -> str: ...
    @property
    def total_bytes(self) -> int: ...
    @property
    def downloader(self) -> str | None: ...
    @property
    def holders(self) -> tuple[str, ...]: ...
    @property
    def nodes(self) -> tuple[str, ...]: ...
    @property
    def transfers(self) -> tuple[tuple[str, ModelTransfer], ...]: ...
    @property
    def done_bytes(self) -> int: ...
    @property
    def target_bytes(self) -> int: ...


class PullControl(Protocol):
    """What the model routes use of :class:`skulk.control.ClusterControl`."""

    @property
    def node_id(self) -> str: ...
    @property
    def state(self) -> State: ...

    def pull(self, name: str) -> AsyncIterator[PullStatusView]:
        """An async generator of statuses until the model is everywhere it can be; raises
        a :class:`~skulk.hub.HubError`, ``PullFailed`` or ``ControlUnavailable``."""
        ...


#: The HTTP status of a pull's failure, by its ``reason`` (others: 502, the cluster or the
#: Hub failed). ``gated`` is 403 instead when the Hub refused a token it was given.
PULL_STATUS = {
    "repo_not_found": 404,
    "revision_not_found": 404,
    "offline_missing": 404,
    "gated": 401,
    "unsupported_architecture": 422,
    "no_weights": 422,
    "hub_unreachable": 502,
    "hash_mismatch": 502,
    "disk_full": 507,
    # the leader's refusals of the download (races: pulling again answers)
    "placement_info_pending": 503,  # no node has published its store yet
    "unknown_node": 503,
    "node_not_up": 503,  # the chosen node left as it was chosen
    "duplicate_download": 409,
    "model_exists": 409,
}

#: The fields of ``POST /v1/pulls`` (the OpenAPI document's).
PULL_FIELDS: dict[str, Schema] = {
    "model": honoured(
        "Required: a Hugging Face Hub id, ORG/REPO or ORG/REPO@REVISION.",
        type="string",
        minLength=1,
    ),
    "stream": honoured(
        "NDJSON status lines until the model is everywhere (default true); false: one JSON "
        "answer when it is done.",
        type="boolean",
    ),
}
#: The fields of Ollama's ``POST /api/pull``.
OLLAMA_PULL_FIELDS: dict[str, Schema] = {
    "model": honoured(
        "The Hub id, ORG/REPO[@REVISION] (also hf.co/ORG/REPO, and ORG/REPO:latest).",
        type=["string", "null"],
        minLength=1,
    ),
    "name": honoured("The older name of model.", type=["string", "null"], minLength=1),
    "stream": honoured("NDJSON progress lines unless false (default true).", type="boolean"),
    "insecure": honoured(
        "Informational: Ollama's registry option; the Hub is reached as the nodes are "
        "configured (HF_ENDPOINT), whatever its value.",
        type="boolean",
    ),
}


@attrs.frozen
class PullRequest:
    """A parsed pull: the Hub id as given, and whether to stream."""

    model: str
    stream: bool


def parse_pull(body: object) -> PullRequest:
    """A ``POST /v1/pulls`` body; :class:`ApiError` (400 naming the field) otherwise."""
    obj = checked_body(body, PULL_FIELDS)
    return PullRequest(_hub_id(obj.get("model"), "model"), _stream(obj))


def parse_ollama_pull(body: object) -> PullRequest:
    """A ``POST /api/pull`` body (``model``, or the older ``name``). Ollama's spellings of a
    Hub model are taken too: an ``hf.co/`` or ``huggingface.co/`` prefix, and the tag
    ``:latest`` (Ollama's default); another ``:TAG`` is refused (a Hub revision is
    ``@REVISION``)."""
    obj = checked_body(body, OLLAMA_PULL_FIELDS)
    insecure = obj.get("insecure")
    if insecure is not None and not isinstance(insecure, bool):
        raise ApiError.invalid_type("insecure", "a boolean", insecure)
    key = "name" if obj.get("model") is None and obj.get("name") is not None else "model"
    value = obj.get(key)
    if isinstance(value, str):
        value = _ollama_spelling(value.strip(), key)
    return PullRequest(_hub_id(value, key), _stream(obj))


def _ollama_spelling(name: str, param: str) -> str:
    for prefix in ("hf.co/", "huggingface.co/"):
        if name.lower().startswith(prefix):
            name = name[len(prefix) :]
    repo, colon, tag = name.partition(":")
    if not colon:
        return name
    if tag == "latest":
        return repo
    raise ApiError.invalid(
        param,
        f"'{param}' has the Ollama tag {clip(tag)!r}: name a Hub revision as "
        "ORG/REPO@REVISION (only :latest is taken, meaning the default revision)",
    )


def _stream(obj: Mapping[str, object]) -> bool:
    value = obj.get("stream")
    if value is None:
        return True
    if not isinstance(value, bool):
        raise ApiError.invalid_type("stream", "a boolean", value)
    return value


def _hub_id(value: object, param: str) -> str:
    if value is None:
        raise ApiError.missing(param)
    if not isinstance(value, str):
        raise ApiError.invalid_type(param, "a string", value)
    try:
        parse_hub_ref(value)
    except ValueError as exc:
        raise ApiError.invalid(
            param, f"'{param}' must be a Hub id ORG/REPO[@REVISION]: {clip(str(exc), 200)}"
        ) from None
    return value.strip()


def pull_error(exc: Exception) -> ApiError | None:
    """The API's answer to a failed pull: a :class:`~skulk.hub.HubError` or any failure with a
    stable ``reason`` and a message (``skulk.control.PullFailed``, a store refusal), by
    :data:`PULL_STATUS`; ``None`` for anything else (a bug: the app answers 500)."""
    reason = getattr(exc, "reason", None)
    if not isinstance(reason, str) or not reason:
        return None
    message = getattr(exc, "message", None)
    text = message if isinstance(message, str) and message else str(exc)
    status = PULL_STATUS.get(reason, 502)
    if isinstance(exc, Gated) and exc.status == 403:
        status = 403
    param = "model" if status < 500 or isinstance(exc, HubError) else None
    kind = SERVER if status >= 500 else "invalid_request_error"
    error = ApiError(status, text, type=kind, param=param, code=reason)
    if status == 503:
        error.headers = {"Retry-After": "1"}
    return error


def transfer_json(node: str, transfer: ModelTransfer) -> dict[str, object]:
    """A model transfer onto ``node`` (telemetry), as the routes show it."""
    return {
        "node": node,
        "model": transfer.model,
        "source": transfer.source,
        "file": transfer.file,
        "file_done": transfer.file_done,
        "file_total": transfer.file_total,
        "bytes_done": transfer.bytes_done,
        "bytes_total": transfer.bytes_total,
        "rate_bps": transfer.rate_bps,
        "eta_s": transfer.eta_s,
        "started_at": transfer.started_at,
    }


def status_json(status: PullStatusView) -> dict[str, object]:
    """One status line of ``POST /v1/pulls``."""
    return {
        "model": status.model,
        "phase": status.phase,
        "repo": status.repo,
        "commit": status.commit,
        "total_bytes": status.total_bytes,
        "done_bytes": status.done_bytes,
        "target_bytes": status.target_bytes,
        "downloader": status.downloader,
        "holders": list(status.holders),
        "nodes": list(status.nodes),
        "transfers": [transfer_json(node, t) for node, t in status.transfers],
    }

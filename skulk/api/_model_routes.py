"""The model routes: pulling Hub models into the cluster, the downloads, the model stores.

* ``POST /v1/pulls`` ``{"model": "ORG/REPO[@REV]", "stream": true}``: runs the cluster's pull
  (:meth:`skulk.control.ClusterControl.pull`): NDJSON status lines (:func:`status_json`) until
  the model is on every node that can hold it, the last ``"phase": "done"``, or one JSON
  answer (the last status) with ``"stream": false``.
* ``POST /api/pull``: the same as Ollama's pull stream (:mod:`skulk.api._ollama_pull`).
* ``GET /v1/downloads``: the State's downloads (node, status, failure reason) and every
  node's model transfers from telemetry (bytes, rate, ETA, file).
* ``GET /v1/store``: this node's store, every node's store readings, the State's holders.
* ``DELETE /v1/store/{model}``: remove a model from this node's store (409 ``model_in_use``
  while an instance in the State uses it).

A pull's typed failures (the Hub check: ``repo_not_found``, ``gated``, ...; the cluster:
``disk_full``, a download failed on every candidate) are answered with their status
(:data:`~skulk.api._pull_format.PULL_STATUS`) before the stream starts when they happen
during the check, as a last ``{"error": …}`` line after. A client that goes away closes its
pull's status generator only: the download goes on in the cluster (it is in the State), and
other pulls are untouched.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping

import attrs
import trio
from quart import Response
from quart_trio import QuartTrio

from skulk.api._error_formats import render_error
from skulk.api._errors import ApiError, clip
from skulk.api._guard import close_with_request
from skulk.api._http_errors import json_response
from skulk.api._ollama_pull import Line, OllamaPullLines
from skulk.api._pull_format import (
    PullControl,
    PullStatusView,
    parse_ollama_pull,
    parse_pull,
    pull_error,
    status_json,
    transfer_json,
)
from skulk.cluster import State
from skulk.control import ControlUnavailable
from skulk.store import ModelInUse, ModelStore, NotStored, StoredModel
from skulk.wire.cluster import (
    DemoSource,
    HubSource,
    ImportedSource,
    ModelCard,
    ModelSource,
    PathSource,
)
from skulk.wire.telemetry import NodeReadings, StoredModelReading

log = logging.getLogger("skulk.api")

NDJSON = "application/x-ndjson"
Readings = Callable[[], Mapping[str, NodeReadings]]
Body = Callable[[], Awaitable[object]]
Statuses = AsyncIterator[PullStatusView]


def install_model_routes(
    app: QuartTrio,
    control: PullControl,
    body_of: Body,
    *,
    store: ModelStore | None = None,
    readings: Readings | None = None,
) -> None:
    """Add the model routes to ``app``: ``control`` pulls and knows the State, ``store`` is
    this node's model store (``None``: the node has none; ``DELETE`` answers 404),
    ``readings`` the telemetry snapshot (transfers, other nodes' stores)."""

    def snapshot() -> Mapping[str, NodeReadings]:
        return readings() if readings is not None else {}

    @app.post("/v1/pulls")
    async def pulls() -> Response:
        asked = parse_pull(await body_of())
        statuses = _owned(control.pull(asked.model))
        first = await _past_check(statuses)
        if not asked.stream:
            last = await _last(statuses, first)
            return json_response(status_json(last), 200)
        return _ndjson(_v1_lines(first, statuses))

    @app.post("/api/pull")
    async def ollama_pull() -> Response:
        asked = parse_ollama_pull(await body_of())
        statuses = _owned(control.pull(asked.model))
        first = await _past_check(statuses)
        if not asked.stream:
            await _last(statuses, first)
            return json_response({"status": "success"}, 200)
        return _ndjson(_ollama_lines(first, statuses))

    @app.get("/v1/downloads")
    async def downloads() -> Response:
        seen = snapshot()
        body = {
            "downloads": [attrs.asdict(d) for d in control.state.downloads],
            "transfers": [
                transfer_json(node, t) for node in sorted(seen) for t in seen[node].transfers
            ],
        }
        return json_response(body, 200)

    @app.get("/v1/store")
    async def stores() -> Response:
        state = control.state
        local: dict[str, object] | None = None
        if store is not None:
            local = await trio.to_thread.run_sync(_local_store, store, state)
        seen = snapshot()
        nodes = [
            {"node": node, **_reading_json(seen[node], state)}
            for node in sorted(seen)
            if seen[node].store is not None
        ]
        cards = [_card_json(c) for c in state.models if c.manifest_sha256 is not None]
        return json_response(
            {"node": control.node_id, "store": local, "nodes": nodes, "models": cards}, 200
        )

    @app.delete("/v1/store/<path:model>")
    async def remove(model: str) -> Response:
        if store is None:
            raise ApiError.not_found("this node has no model store", code="model_not_found")
        state = control.state
        in_use = _in_use(state)
        try:
            removed = await trio.to_thread.run_sync(store.remove, model, in_use)
        except NotStored:
            raise ApiError(
                404,
                f"no model {clip(model)!r} in the store of node {control.node_id}",
                type="not_found_error",
                param="model",
                code="model_not_found",
            ) from None
        except ModelInUse as exc:
            users = sorted(
                i.id
                for i in state.instances
                if (card := state.model(i.model)) is not None
                and card.manifest_sha256 == exc.manifest_sha256
            )
            raise ApiError(
                409,
                f"model {clip(model)!r} is in use by instance(s) {', '.join(users) or '?'}: "
                "delete them first (skulk rm INSTANCE)",
                param="model",
                code="model_in_use",
            ) from None
        return json_response({"node": control.node_id, "removed": _stored_json(removed)}, 200)


# ---- pulls -------------------------------------------------------------------------------


def _owned(statuses: Statuses) -> Statuses:
    """``statuses``, closed when the request ends however it ends (the client went away)."""

    async def close() -> None:
        aclose = getattr(statuses, "aclose", None)  # an async generator's; a plain iterator
        if aclose is not None:  # has nothing to close
            await aclose()

    close_with_request(close)
    return statuses


def _failure(exc: Exception) -> ApiError:
    """A pull's failure as the API answers it; re-raises what is not a typed failure."""
    if isinstance(exc, ControlUnavailable):
        busy = ApiError.unavailable(exc.message, code=exc.code)
        busy.headers = {"Retry-After": "1"}
        return busy
    if (err := pull_error(exc)) is not None:
        return err
    raise exc


async def _past_check(statuses: Statuses) -> list[PullStatusView]:
    """The statuses up to the first past the Hub check (or all, if the pull ends first): a
    failure until then is a plain error response with its status, not a failed stream."""
    first: list[PullStatusView] = []
    try:
        async for status in statuses:
            first.append(status)
            if status.phase != "checking":
                break
    except Exception as exc:
        raise _failure(exc) from None
    return first


async def _last(statuses: Statuses, first: list[PullStatusView]) -> PullStatusView:
    """The last status of a pull (read to its end)."""
    last = first[-1] if first else None
    try:
        async for status in statuses:
            last = status
    except Exception as exc:
        raise _failure(exc) from None
    if last is None:
        raise ApiError.server_error("the pull ended without a status", code="internal")
    return last


def _ndjson(lines: AsyncGenerator[bytes, None]) -> Response:
    response = Response(lines, status=200, content_type=NDJSON)
    response.timeout = None  # Quart's RESPONSE_TIMEOUT would cut a long download
    return response


def _line(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


async def _v1_lines(first: list[PullStatusView], statuses: Statuses) -> AsyncGenerator[bytes, None]:
    async for status in _then(first, statuses):
        if isinstance(status, ApiError):
            yield _line(render_error("/v1/pulls", status))
            return
        yield _line(status_json(status))


async def _ollama_lines(
    first: list[PullStatusView], statuses: Statuses
) -> AsyncGenerator[bytes, None]:
    lines = OllamaPullLines()
    async for status in _then(first, statuses):
        if isinstance(status, ApiError):
            yield _line(render_error("/api/pull", status))
            return
        if chunk := _lines(lines.feed(status)):  # the lines of one status: one write
            yield chunk
    yield _lines(lines.finish())


def _lines(lines: list[Line]) -> bytes:
    return b"".join(_line(line) for line in lines)


async def _then(
    first: list[PullStatusView], statuses: Statuses
) -> AsyncGenerator[PullStatusView | ApiError, None]:
    """``first``, then the rest of ``statuses``; a failure after the stream started is its
    last item (an :class:`ApiError`: a bug is logged and answered as ``internal``)."""
    for status in first:
        yield status
    try:
        async for status in statuses:
            yield status
    except Exception as exc:
        try:
            yield _failure(exc)
        except Exception:
            log.exception("a pull failed after its stream started")
            yield ApiError.server_error("internal server error", code="internal")


# ---- stores ------------------------------------------------------------------------------


def _in_use(state: State) -> set[str]:
    """Manifest hashes of the cards an instance in ``state`` uses."""
    used = set()
    for instance in state.instances:
        card = state.model(instance.model)
        if card is not None and card.manifest_sha256 is not None:
            used.add(card.manifest_sha256)
    return used


def _holders_by_manifest(state: State) -> dict[str, tuple[list[str], list[str]]]:
    """Manifest hash → (card ids, holders) from the State."""
    found: dict[str, tuple[list[str], list[str]]] = {}
    for card in state.models:
        if card.manifest_sha256 is None:
            continue
        ids, holders = found.setdefault(card.manifest_sha256, ([], []))
        ids.append(card.id)
        holders.extend(h for h in card.holders if h not in holders)
    return found


def _with_cards(
    entry: dict[str, object], sha256: str, cards: Mapping[str, tuple[list[str], list[str]]]
) -> dict[str, object]:
    ids, holders = cards.get(sha256, ([], []))
    return {**entry, "models": sorted(ids), "holders": sorted(holders)}


def _stored_json(model: StoredModel) -> dict[str, object]:
    return {
        "sha256": model.sha256,
        "names": list(model.names),
        "size": model.size,
        "last_used": model.last_used,
    }


def _local_store(store: ModelStore, state: State) -> dict[str, object]:
    """This node's store (blocking: run in a worker thread)."""
    stats = store.statistics()
    cards = _holders_by_manifest(state)
    return {
        "used_bytes": stats.used_bytes,
        "budget_bytes": stats.budget_bytes,
        "available_bytes": stats.available_bytes,
        "stored": [_with_cards(_stored_json(m), m.sha256, cards) for m in store.models()],
    }


def _reading_json(readings: NodeReadings, state: State) -> dict[str, object]:
    reading = readings.store
    assert reading is not None
    cards = _holders_by_manifest(state)

    def stored(m: StoredModelReading) -> dict[str, object]:
        entry: dict[str, object] = {
            "sha256": m.sha256,
            "names": list(m.names),
            "size": m.size,
            "last_used": m.last_used,
        }
        return _with_cards(entry, m.sha256, cards)

    return {
        "used_bytes": reading.used_bytes,
        "budget_bytes": reading.budget_bytes,
        "available_bytes": reading.available_bytes,
        "stored": [stored(m) for m in reading.models],
    }


_SOURCE_KINDS: dict[type, str] = {
    HubSource: "hub",
    ImportedSource: "imported",
    PathSource: "path",
    DemoSource: "demo",
}


def _source_json(source: ModelSource) -> dict[str, object]:
    return {"kind": _SOURCE_KINDS.get(type(source), "other"), **attrs.asdict(source)}


def _card_json(card: ModelCard) -> dict[str, object]:
    return {
        "model": card.id,
        "manifest_sha256": card.manifest_sha256,
        "weight_bytes": card.weight_bytes,
        "source": _source_json(card.source),
        "holders": list(card.holders),
    }

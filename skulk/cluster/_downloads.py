"""Who downloads a Hub model, and what the leader does when a download fails (pure functions).

* :func:`choose_downloader`: the up node with the most room in its model store (from
  telemetry: ``StoreReading.available_bytes``) at least the download's size; among nodes
  within 10 % of the most room, a preferred one (the node asked, the placement's nodes)
  first; nodes without a store reading are not candidates.
* :func:`download_commands` (part of the leader's duties, :func:`next_commands`): a running
  download whose node is no longer up fails ``node_down``; a model whose downloads all failed
  (no card, none running) is downloaded again on the best node that has not failed it, until
  every usable node has: the failures stay in the State for people to see, and a new pull
  (``PullAsk``) tries the failed nodes again.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from skulk.wire.cluster import ClusterCommand, DownloadFailed, StartDownload
from skulk.wire.telemetry import NodeReadings

from ._state import State

#: Nodes with at least this share of the best node's room count as equally good.
PREFERENCE_MARGIN = 0.9


def choose_downloader(
    room: Mapping[str, int],
    total_bytes: int,
    usable: Collection[str],
    *,
    prefer: Iterable[str] = (),
    exclude: Collection[str] = (),
) -> str | None:
    """The node to download ``total_bytes`` on (see the module doc), or ``None``."""
    fits = {n: r for n, r in room.items() if n in usable and n not in exclude and r >= total_bytes}
    if not fits:
        return None
    best = max(fits.values())
    for node in prefer:
        if node in fits and fits[node] >= best * PREFERENCE_MARGIN:
            return node
    return min(fits, key=lambda n: (-fits[n], n))


def download_commands(
    state: State, usable: Collection[str], room: Mapping[str, int], now_ms: int
) -> list[ClusterCommand]:
    """The leader's download duties now (see the module doc). ``usable``: the up nodes that
    stay up this round."""
    commands: list[ClusterCommand] = []
    failed_now: set[tuple[str, str]] = set()
    for d in state.downloads:
        if d.status == "downloading" and d.node not in usable:
            known = state.node(d.node)
            why = f"node {d.node} is {known.status if known else 'gone'}"
            commands.append(DownloadFailed(d.model, d.node, "node_down", why, now_ms))
            failed_now.add((d.model, d.node))
    for model in sorted({d.model for d in state.downloads}):
        entries = state.downloads_of(model)
        running = [d for d in entries if d.status == "downloading"]
        still = [d for d in running if (model, d.node) not in failed_now]
        if state.model(model) is not None or still:
            continue
        last = max(entries, key=lambda d: d.changed_at)
        failed = {d.node for d in entries}
        chosen = choose_downloader(room, last.total_bytes, usable, exclude=failed)
        if chosen is not None:
            commands.append(
                StartDownload(model, last.repo, last.commit, chosen, last.total_bytes, now_ms)
            )
    return commands


def store_room(readings: Mapping[str, NodeReadings]) -> dict[str, int]:
    """Room per node in its model store, from telemetry (a node without a store reading is
    left out)."""
    return {n: r.store.available_bytes for n, r in readings.items() if r.store is not None}

"""The model commands: ``pull`` (follows ``POST /v1/pulls``), ``models`` (``GET /v1/store``)
and ``rm-model`` (``DELETE /v1/store/{model}``).

``pull`` shows its progress on stderr (stdout keeps the result alone): on a terminal a rich
bar (the phase, bytes done of the target, rate and ETA of the download), elsewhere one plain
line per phase and per tenth of the way. A failure, before the stream or as its last line, is
the server's typed error (``skulk: repo_not_found: …``, exit 1).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from skulk.cli._http import ApiClient, ApiRefused, BadResponse
from skulk.cli._tables import NONE, JsonObject, age, render_table, size, text

MODEL_HEADERS = ("MODEL", "SIZE", "HOLDERS", "HERE", "LAST USED", "SOURCE")


def follow_pull(
    client: ApiClient,
    model: str,
    report: Callable[[JsonObject], None],
) -> JsonObject:
    """Stream the pull of ``model``, handing each status to ``report``; the last status
    (``phase`` ``done``). Raises :class:`ApiRefused` with the server's typed error, and
    :class:`BadResponse` if the stream ends before the pull is done."""
    url = client.api + "/v1/pulls"
    last: JsonObject | None = None
    for line in client.stream_lines("POST", "/v1/pulls", {"model": model, "stream": True}):
        error = line.get("error")
        if isinstance(error, Mapping):
            code, message = error.get("code"), error.get("message")
            raise ApiRefused(
                200,
                code if isinstance(code, str) and code else "pull_failed",
                message if isinstance(message, str) else "",
                line,
            )
        report(line)
        last = line
    if last is None or last.get("phase") != "done":
        raise BadResponse(url, "the stream ended before the pull was done")
    return last


def status_summary(status: JsonObject) -> str:
    """One line: the phase and where it stands (``downloading 1.2 GiB/3.4 GiB on a``)."""
    phase = text(status.get("phase"))
    done, target = status.get("done_bytes"), status.get("target_bytes")
    where = f" {size(done)}/{size(target)}" if isinstance(target, int) and target > 0 else ""
    if phase == "downloading" and isinstance(status.get("downloader"), str):
        where += f" on {status['downloader']}"
    if phase in ("spreading", "done"):
        holders, nodes = status.get("holders"), status.get("nodes")
        if isinstance(holders, list) and isinstance(nodes, list):
            where += f" ({len(holders)}/{len(nodes)} nodes hold it)"
    return phase + where


def _fraction(status: JsonObject) -> float:
    done, target = status.get("done_bytes"), status.get("target_bytes")
    if isinstance(done, int) and isinstance(target, int) and target > 0:
        return max(0.0, min(1.0, done / target))
    return 1.0 if status.get("phase") == "done" else 0.0


@contextlib.contextmanager
def pull_reporter(
    stream: TextIO, model: str, *, terminal: bool | None = None
) -> Iterator[Callable[[JsonObject], None]]:
    """A reporter of pull statuses on ``stream``: a bar on a terminal (``terminal``
    overrides the check), else a plain line per phase and per tenth of the way."""
    is_tty = stream.isatty() if terminal is None else terminal
    if not is_tty:
        last: list[tuple[str, int]] = []

        def line(status: JsonObject) -> None:
            key = (text(status.get("phase")), int(_fraction(status) * 10))
            if last != [key]:
                last[:] = [key]
                print(f"{model}: {status_summary(status)}", file=stream, flush=True)

        yield line
        return
    console = Console(file=stream, force_terminal=True)
    with Progress(
        TextColumn("[bold]{task.fields[model]}"),
        TextColumn("{task.fields[phase]}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TextColumn("{task.fields[speed]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as bar:
        task = bar.add_task("pull", total=None, model=model, phase="checking", speed="")

        def draw(status: JsonObject) -> None:
            target, done = status.get("target_bytes"), status.get("done_bytes")
            bar.update(
                task,
                total=target if isinstance(target, int) and target > 0 else None,
                completed=done if isinstance(done, int) else 0,
                phase=text(status.get("phase")),
                speed=_speed(status),
            )

        yield draw


def _speed(status: JsonObject) -> str:
    """The transfers' summed rate and the slowest ETA, e.g. ``52.1 MiB/s, 1m20s left``."""
    transfers = status.get("transfers")
    if not isinstance(transfers, list):
        return ""
    rate = sum(
        t["rate_bps"]
        for t in transfers
        if isinstance(t, Mapping) and isinstance(t.get("rate_bps"), int | float)
    )
    etas = [
        t["eta_s"]
        for t in transfers
        if isinstance(t, Mapping) and isinstance(t.get("eta_s"), int | float)
    ]
    if rate <= 0:
        return ""
    shown = f"{size(int(rate))}/s"
    if etas:
        left = int(max(etas))
        shown += f", {left // 60}m{left % 60:02d}s left" if left >= 60 else f", {left}s left"
    return shown


def done_line(status: JsonObject) -> str:
    """What ``pull`` prints on stdout when done: the holders, and the up nodes that are not
    (a pull is also done when the spreading stalls: no room there, or its fetch failed)."""
    holders = status.get("holders")
    holders = [str(h) for h in holders] if isinstance(holders, list) else []
    nodes = status.get("nodes")
    lacking = [str(n) for n in nodes if str(n) not in holders] if isinstance(nodes, list) else []
    commit = text(status.get("commit"))[:12]
    line = (
        f"pulled {text(status.get('model'))} ({text(status.get('repo'))}@{commit}, "
        f"{size(status.get('total_bytes'))}); held by {', '.join(holders) or NONE}"
    )
    if lacking:
        why = "no room, or its fetch failed: see GET /v1/downloads"
        line += f"; not on {', '.join(lacking)} ({why})"
    return line


def models_table(answer: JsonObject, now: float) -> str:
    """``skulk models``: the cluster's models with a manifest (from the State, with their
    holders), then models only this node's store holds; HERE says whether this node holds
    it, LAST USED when it last served here."""
    local = answer.get("store")
    stored = local.get("stored") if isinstance(local, Mapping) else None
    here = {
        text(m.get("sha256")): m for m in (stored or []) if isinstance(m, Mapping)
    }  # sha256 → this node's entry
    rows: list[tuple[str, ...]] = []
    seen: set[str] = set()
    for card in _list(answer.get("models")):
        sha = text(card.get("manifest_sha256"))
        seen.add(sha)
        mine = here.get(sha)
        holders = card.get("holders")
        source = card.get("source")
        rows.append(
            (
                text(card.get("model")),
                size(card.get("weight_bytes")),
                ",".join(str(h) for h in holders) if isinstance(holders, list) else NONE,
                "yes" if mine is not None else "no",
                _ago(mine.get("last_used"), now) if mine is not None else NONE,
                text(source.get("kind")) if isinstance(source, Mapping) else NONE,
            )
        )
    for sha, mine in here.items():
        if sha in seen:
            continue
        names = mine.get("names")
        name = ",".join(str(n) for n in names) if isinstance(names, list) and names else sha[:16]
        rows.append(
            (name, size(mine.get("size")), NONE, "yes", _ago(mine.get("last_used"), now), "store")
        )
    table = render_table(MODEL_HEADERS, rows)
    if isinstance(local, Mapping):
        budget = local.get("budget_bytes")
        table += (
            f"\n\nthis node ({text(answer.get('node'))}): {size(local.get('used_bytes'))} used, "
            f"{size(local.get('available_bytes'))} available"
            + (f", budget {size(budget)}" if isinstance(budget, int) else "")
        )
    return table


def _ago(when: object, now: float) -> str:
    if not isinstance(when, int | float) or when <= 0:
        return NONE
    return age(max(0.0, now - float(when)))


def _list(value: object) -> Sequence[JsonObject]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []
